//! Trainyard's scheduler library: who runs which role of which job.
//!
//! * [`plan`] — the pure planning core (`plan(jobs, live executors, current
//!   assignments) → new assignments`): gang admission, placement, growth,
//!   ring order, `strategy: auto`; property-tested without a database.
//! * [`shard`] — the byte-balanced PS shard map.
//! * [`share`] — sharing the cluster: the fair-share usage formula and the
//!   preemption pass (shrink elastic lower-priority jobs, then preempt
//!   whole ones), pure like the planner.
//! * [`service`] — the loop around the planner: leader lease (Postgres
//!   advisory lock), lost-executor detection, one transaction per
//!   membership change (new assignments, generation + 1, event). Its parts:
//!   `world` (what a round reads), `describe` (the sentence of a placement
//!   event), `membership` (writing one job's change, `→ running` once its
//!   roles run), `inspection` (TorchScript jobs to an inspector), `metrics`
//!   and `error`; `service/mod.rs` holds the lease and the round.
//! * [`provision`] — capacity on demand: how many executors the queue's
//!   unmet demand needs, which idle ones to release (pure, property-tested);
//!   [`fleet`] carries it out through a [`fleet::Provisioner`], of which
//!   [`local`] starts executor processes on this machine and [`slurm`]
//!   submits them as Slurm batch jobs.
//! * [`lifecycle`] — the one function through which every job state change
//!   is made, checked against [`JobState::can_move_to`](trainyard_common::JobState::can_move_to)
//!   and written with its event row; the other event rows and the job
//!   channel's notifications.
//!
//! The API runs the loop in-process by default.

pub mod fleet;
pub mod lifecycle;
pub mod local;
pub mod plan;
pub mod provision;
pub mod service;
pub mod shard;
pub mod share;
pub mod slurm;

pub use lifecycle::{transition, Transition, TransitionError};
