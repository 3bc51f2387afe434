//! Trainyard's scheduler library.
//!
//! The scheduler owns the job lifecycle in Postgres. Today it provides
//! [`lifecycle`]: the one function through which every job state change is
//! made — checked against [`JobState::can_move_to`](trainyard_common::JobState::can_move_to),
//! written together with its event row in one transaction and announced with
//! a Postgres notification. The API uses it for cancellation; the placement
//! loop (executors, gang admission, generations) builds on it.

pub mod lifecycle;
pub mod plan;
pub mod shard;

pub use lifecycle::{transition, Transition, TransitionError};
