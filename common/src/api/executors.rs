//! Executors as users see them, and the provisioner that starts some of
//! them: its settings, the executors it runs and its decisions.

use crate::cluster::{ExecutorResources, ExecutorState, RoleKind};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;
use uuid::Uuid;

/// An executor as users see it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExecutorInfo {
    /// Executor id.
    pub id: Uuid,
    /// Its name.
    pub name: String,
    /// Data-plane address.
    pub address: String,
    /// `live`, `draining`, `lost` or `left`.
    pub state: ExecutorState,
    /// What it offers.
    pub resources: ExecutorResources,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// How it confines users' code (`null`: it did not say, an executor
    /// from before sandboxes).
    pub sandbox: Option<crate::cluster::SandboxReport>,
    /// Its cache of script jobs' Python environments, as its last
    /// heartbeat listed it (`null`: it keeps none or has not said).
    #[serde(default)]
    pub environments: Option<crate::cluster::EnvironmentCache>,
    /// Roles assigned to it now.
    pub roles: Vec<RoleInfo>,
    /// When it registered.
    pub registered_at: DateTime<Utc>,
    /// When it last heartbeat.
    pub last_heartbeat_at: DateTime<Utc>,
    /// Seconds since its last heartbeat.
    pub seconds_since_heartbeat: f64,
}

/// A role held by an executor.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RoleInfo {
    /// Job id.
    pub job_id: Uuid,
    /// The job's generation.
    pub generation: i64,
    /// `ps` or `worker`.
    pub role: RoleKind,
    /// Shard or rank.
    pub index: u32,
    /// Whether this PS role is its shard's hot standby (jobs with
    /// `replicas`) rather than the shard itself.
    pub standby: bool,
    /// Device index, for workers.
    pub device: Option<u32>,
}

/// Executors, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExecutorList {
    /// The executors.
    pub executors: Vec<ExecutorInfo>,
}

/// The provisioner's settings, as the server runs it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProvisionerSettings {
    /// `local` (executor processes on the API's machine) or `none`.
    pub kind: String,
    /// Most executors it runs at once (its own limit, clamped to the CPU
    /// and memory budget).
    pub max_executors: u32,
    /// Most new executors one job may need; larger jobs stay queued.
    pub max_per_job: u32,
    /// Seconds an executor it started may hold no role before it goes.
    pub idle_timeout_secs: u64,
    /// Seconds a started executor may take to register.
    pub start_timeout_secs: u64,
    /// CPU cores it may use for executors.
    pub cpu_budget: f64,
    /// Memory it may give executors, in MiB.
    pub memory_budget_mb: u64,
    /// CPU cores each executor gets (its libtorch threads, rounded down).
    pub executor_cpus: f64,
    /// RAM each executor offers, in MiB.
    pub executor_memory_mb: u64,
}

text_enum! {
    /// Where an executor the provisioner started is in its life
    /// (`provisioned_executors.state`).
    ProvisionedState {
        /// Started; not registered yet.
        Starting = "starting",
        /// Registered and serving.
        Running = "running",
        /// Asked to drain and leave.
        Stopping = "stopping",
        /// Left after a stop.
        Stopped = "stopped",
        /// Exited without being asked.
        Exited = "exited",
        /// Could not start, or did not stop in time.
        Failed = "failed",
        /// Not running when a new leader looked for it.
        Gone = "gone",
    }
}

impl ProvisionedState {
    /// Whether the executor may still be running.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            ProvisionedState::Starting | ProvisionedState::Running | ProvisionedState::Stopping
        )
    }
}

text_enum! {
    /// What a provisioning decision was (`provisioner_events.kind`).
    ProvisionerEventKind {
        /// Executors started for waiting jobs.
        Start = "start",
        /// An idle executor released.
        Release = "release",
        /// A released executor has left.
        Stopped = "stopped",
        /// An executor exited on its own.
        Exited = "exited",
        /// A start or a stop failed.
        Failed = "failed",
        /// A job waits that no executor it may start can serve.
        Blocked = "blocked",
        /// An earlier leader's executor, still running, managed again.
        Adopted = "adopted",
    }
}

/// An executor the provisioner started.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProvisionedExecutor {
    /// The name it registers under.
    pub name: String,
    /// Where it is in its life.
    pub state: ProvisionedState,
    /// Its process id on the provisioner's host.
    pub pid: Option<i32>,
    /// The machine that started it.
    pub host: String,
    /// Its executor id once it registered.
    pub executor_id: Option<Uuid>,
    /// Why it is in its state, where known.
    pub reason: Option<String>,
    /// When it was started.
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// When it ended.
    pub stopped_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// One provisioning decision.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProvisionerEvent {
    /// Increasing id.
    pub id: i64,
    /// When.
    pub at: chrono::DateTime<chrono::Utc>,
    /// What was decided or seen.
    pub kind: ProvisionerEventKind,
    /// The executor concerned.
    pub executor: Option<String>,
    /// The job concerned (a `blocked` decision).
    pub job_id: Option<Uuid>,
    /// Why, in a sentence.
    pub reason: String,
    /// Details (`start`: the executors and the jobs they are for).
    pub data: serde_json::Value,
}

/// The provisioner's state.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProvisionerStatus {
    /// Its settings (`kind: none` when executors are only started by hand).
    pub settings: ProvisionerSettings,
    /// Executors it runs, then the most recent ended ones (up to 50).
    pub executors: Vec<ProvisionedExecutor>,
    /// Its decisions, newest first.
    pub events: Vec<ProvisionerEvent>,
}
