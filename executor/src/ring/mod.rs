//! The ring all-reduce pattern on top of [`crate::replica`].
//!
//! Every worker holds a whole replica; after each backward pass the workers
//! sum their gradients around a ring ([`trainyard_dataplane::Ring`]:
//! reduce-scatter then all-gather) so that every replica applies the same
//! update and all hold the same bits. A gradient's path, file by file:
//!
//! * [`worker`] — a rank's life in one generation: connect the ring, join
//!   its state, train, report, and keep the replica through a broken ring;
//! * [`mod@join`] — a new ring's members take the most advanced member's state
//!   (or the committed checkpoint, when nobody has one);
//! * [`mod@train`] — the loop: batches from the global data cursor, a step,
//!   checkpoint slices, evaluation on rank 0;
//! * [`step`] — one step: forward and backward on the replica, the
//!   gradient with the sample count, loss and checkpoint vote summed over
//!   the ring, the mean applied by the replica.

pub mod join;
pub mod step;
pub mod train;
pub mod worker;

use std::time::Duration;

pub use join::{join, Resume};
pub use step::{step_on, RingStep, StepFigures};
pub use train::{run, train, train_with, write_slice};

/// How long a rank waits for its neighbours to connect before it retries.
pub const RING_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one collective waits for a silent peer (a dead peer's closed
/// connection is noticed at once; this bounds a hung one).
pub const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests;
