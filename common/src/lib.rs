//! Types that cross Trainyard's process boundaries.
//!
//! The API validates what users submit, the scheduler plans with it and the
//! executors train from it, so the definitions live here once:
//!
//! * [`spec`] — the job spec as users write it ([`spec::UncheckedJobSpec`]) and the
//!   validated [`spec::JobSpec`] that can only be made by [`spec::JobSpec::parse`],
//!   so a spec that exists in memory is a valid one;
//! * [`state`] — the job lifecycle states and which transitions are legal;
//! * [`cluster`] — executor registration, heartbeats and assignments;
//! * [`checkpoint`] — the checkpoint layout, manifests and re-sharding;
//! * [`api`] — the REST API's resources (response bodies, the token request)
//!   that the server sends and the typed client decodes;
//! * [`artifact`] — users' uploaded files and the data policy of a job;
//! * [`event`] — the kinds of a job's event log;
//! * [`sweep`] — hyperparameter sweeps: their spec, trials and ASHA's rule;
//! * [`divergence`] — whether a job's loss curve diverged, by its policy;
//! * [`host`] — what the machine offers (its available memory);
//! * [`model`] — parameter counts of the built-in models and the per-role
//!   memory arithmetic of ../shared/DESIGN.md that `strategy: auto` uses.
//!
//! This crate has no async code and no I/O beyond [`host`]'s one read of
//! `/proc/meminfo`; it builds in seconds.

pub mod api;
pub mod artifact;
pub mod checkpoint;
pub mod cluster;
pub mod divergence;
pub mod event;
pub mod host;
pub mod model;
pub mod spec;
pub mod state;
pub mod sweep;

pub use event::{EventData, EventKind};
pub use spec::{JobSpec, UncheckedJobSpec, Violation};
pub use state::JobState;
