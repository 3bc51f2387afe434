//! Jobs as the API shows them: the job, its pages of jobs and events, its
//! roles at the current generation, and the files a script job left.

use super::sweeps::SweepRef;
use crate::cluster::{ExecutorState, Range};
use crate::model::MemoryEstimate;
use crate::spec::{Strategy, UncheckedJobSpec};
use crate::{EventKind, JobState};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// A job as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Job {
    /// Job id.
    pub id: Uuid,
    /// The spec's name.
    pub name: String,
    /// The user who submitted it (`admin` for the bootstrap token and open
    /// mode).
    pub owner: String,
    /// Lifecycle state.
    pub state: JobState,
    /// Why the job is in this state.
    pub state_reason: String,
    /// Membership generation (the data plane's fencing token).
    pub generation: i64,
    /// The strategy the job runs with: the scheduler's decision once placed
    /// (`auto` is decided then, by the memory arithmetic over the live
    /// devices), before that the spec's.
    pub strategy: Strategy,
    /// Memory each role needs (built-in models only).
    pub estimate: Option<MemoryEstimate>,
    /// The spec as submitted, with defaults filled in.
    pub spec: UncheckedJobSpec,
    /// The artifact versions its `artifact:` URLs resolved to at submit:
    /// what the job reads, whatever the names point at later.
    #[serde(default)]
    pub artifacts: Vec<crate::artifact::ResolvedArtifact>,
    /// When it was submitted.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// When it first ran.
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// The sweep it is a trial of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<SweepRef>,
}

/// A page of jobs, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobPage {
    /// The jobs.
    pub jobs: Vec<Job>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// One entry of a job's event log.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobEvent {
    /// Position in the log (increasing).
    pub id: i64,
    /// When it happened.
    pub at: DateTime<Utc>,
    /// What happened.
    pub kind: EventKind,
    /// The state left, for transitions.
    pub from_state: Option<JobState>,
    /// The state entered, for transitions and the submit.
    pub to_state: Option<JobState>,
    /// Why.
    pub reason: String,
    /// Details of the event.
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
}

impl JobEvent {
    /// Its `data`, typed by its kind.
    pub fn typed(&self) -> Result<crate::EventData, serde_json::Error> {
        crate::EventData::from_json(self.kind, &self.data)
    }
}

/// A page of a job's events, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventPage {
    /// The events.
    pub events: Vec<JobEvent>,
    /// Pass as `after` for the next page; absent when there are no more yet.
    pub next_after: Option<i64>,
}

/// A job's roles at its current generation.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobAssignments {
    /// Job id.
    pub job_id: Uuid,
    /// The job's state.
    pub state: JobState,
    /// The job's current generation (0 before its first placement).
    pub generation: i64,
    /// The strategy the job runs with (the spec's until it is placed).
    pub strategy: Strategy,
    /// Parameter-server shards in shard order (empty for a ring).
    pub parameter_servers: Vec<PsShard>,
    /// Workers in rank order: for `allreduce`, the ring's order.
    pub workers: Vec<WorkerRole>,
}

/// The executor a role runs on.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RoleHost {
    /// Executor id.
    pub id: Uuid,
    /// Its name.
    pub name: String,
    /// Its data-plane address.
    pub address: String,
    /// Its state (`live`, `draining`, `lost`, `left`).
    pub state: ExecutorState,
}

/// One PS shard.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PsShard {
    /// Shard number.
    pub shard: u32,
    /// Where it runs.
    pub executor: RoleHost,
    /// The tensor ranges it owns.
    pub ranges: Vec<Range>,
    /// Elements it owns in all (the sum of its ranges).
    pub elements: u64,
    /// Where its hot standby runs (jobs with `replicas`; none while it has
    /// no standby).
    pub standby: Option<RoleHost>,
}

/// One worker.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkerRole {
    /// Rank.
    pub rank: u32,
    /// Where it runs.
    pub executor: RoleHost,
    /// Device index on that executor.
    pub device: u32,
}

/// `GET /v1/jobs/{id}/outputs`: the files a script job's rank 0 left in
/// its `TRAINYARD_OUTPUT_DIR`, stored when the job succeeded.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OutputList {
    /// Job id.
    pub job_id: Uuid,
    /// Each file, by its path in the output folder, in path order.
    pub outputs: Vec<OutputFile>,
}

/// One output file.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OutputFile {
    /// Its path relative to the output folder (`GET
    /// /v1/jobs/{id}/outputs/{path}` downloads it).
    pub path: String,
    /// Bytes.
    pub size: u64,
}
