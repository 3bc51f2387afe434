//! A user's TorchScript module in a confined process of its own.
//!
//! A module is code: its operators may read files, loop forever or crash
//! libtorch. So a replica never loads one in the executor's process. It
//! starts a child (`trainyard-confined model`, [`trainyard_confined::serve`]) that
//! confines itself ([`crate::sandbox`]) before it loads the module, and
//! keeps it for the replica's life. The role's thread stays in the
//! executor with everything the child must not hold: the job's data, the
//! data plane, the object store and its keys, the join token.
//!
//! The two share one sealed memfd ([`trainyard_confined::shm`]): the flat vector of
//! the replica (the module's parameters, then its buffers) and, after it,
//! the gradient. The child's module parameters are views of that memory
//! (on a CPU; on a GPU the child copies them in before each call), so an
//! optimizer step in the executor is the module's new weights with no
//! copy. A step sends the batch down the child's stdin and gets the loss
//! back on its stdout; the gradient is already in place.
//!
//! Every answer is awaited with a deadline (`--inspection-timeout-secs`,
//! per call) and with the role's stop signal: a module that hangs is killed
//! at the deadline, or [`STOP_GRACE`] after its role is told to stop, so
//! its core is free again; one that crashes or outgrows its memory ends
//! its job with the signal or limit, never the executor.
//!
//! Frames, both ways, are the confined crate's
//! ([`trainyard_confined::protocol::frames`]), the one place that says
//! what crosses the boundary.
//!
//! **Files.** `timed` is the pipe I/O with its deadline and stop signal;
//! `mirror` the executor's checked copy of the tensors the child
//! describes; `conversation` the executor's side (start, calls, the
//! child's ending). Each uses only files before it in this list.

mod conversation;
mod mirror;
mod timed;

pub use conversation::{lock, Conversation, Host, Process, Remote, Started, STOP_GRACE};
pub use trainyard_confined::protocol::frames::{Load, Meta};
