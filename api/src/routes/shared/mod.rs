//! What several resource modules need, so that none of them imports
//! another: the resource modules (`jobs`, `executors`, `telemetry`, …)
//! depend on these, and nothing here depends on a resource module.
//!
//! * [`params`] — query parameters and JSON bodies decoded with problem
//!   details, and executor text made storable;
//! * [`job_rows`] — reading a job's row into [`Job`](trainyard_common::api::Job),
//!   and the 404 for a missing one;
//! * [`access`] — an executor's credential (or an admin's token) checked
//!   against its row;
//! * [`data_access`] — what a job may read: `artifact:` URLs resolved at
//!   submit, the data policy sent to executors, superseded versions swept;
//! * [`fencing`] — a role report accepted only from the executor that held
//!   the role it names, in the generation it names;
//! * [`checkpointing`] — committing checkpoints from shard reports, retention
//!   and clean-up, and the checkpoint a job's roles start from;
//! * [`wakeup`] — long-polling heartbeats woken by job changes.

pub mod access;
pub mod checkpointing;
pub mod data_access;
pub mod fencing;
pub mod job_rows;
pub mod params;
pub mod wakeup;
