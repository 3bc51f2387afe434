//! The Trainyard executor: the agent that runs training roles on one machine.
//!
//! * [`agent`] — registration, heartbeats with backoff, drain and leave;
//! * [`roles`] — the roles assigned to this executor, started and stopped
//!   as generations change;
//! * [`train`] — the training runtime on libtorch (models, data, loop);
//! * [`ps`] — parameter-server shard servers and the workers that use them;
//! * [`report`] — delivery of metrics, logs and outcomes to the API;
//! * [`probe`] — proof of the libtorch link (`--probe`).

pub mod agent;
pub mod checkpoint;
pub mod probe;
pub mod ps;
pub mod report;
pub mod roles;
pub mod train;
