//! The REST API's resources as clients see them: every response body (and
//! the request bodies that are not already in [`crate::cluster`]) of the
//! `/v1` routes.
//!
//! The server (`trainyard-api`) builds these from its rows and serializes
//! them; the typed client (`trainyard-client`) and everything built on it
//! (the `trainyard` command line, the executor, the tests and benchmarks)
//! decode the same definitions, so a renamed field breaks the build instead
//! of printing `?`. The `ToSchema` derives (and the doc comments, which
//! become the schema's descriptions) make `openapi/openapi.json`: names
//! and docs here are part of the published document.
//!
//! * jobs: [`Job`], [`JobPage`], [`JobEvent`], [`EventPage`],
//!   [`JobAssignments`] (with [`PsShard`], [`WorkerRole`], [`RoleHost`]);
//! * telemetry: [`MetricSeries`] of [`MetricSample`]s, [`LogPage`] of
//!   [`JobLogLine`]s, and the [`ReportAck`] an executor's report gets;
//! * checkpoints: [`CheckpointList`] of [`CheckpointInfo`]s; the model's
//!   tensors: [`ModelTensors`];
//! * executors: [`ExecutorList`] of [`ExecutorInfo`]s with their
//!   [`RoleInfo`]s;
//! * the provisioner: [`ProvisionerStatus`];
//! * tokens: [`NewToken`] (the request), [`CreatedToken`], [`TokenList`] of
//!   [`TokenInfo`]s, the [`Role`] a token has, and [`WhoAmI`];
//! * sharing: [`QuotaLimits`] (the request), [`QuotaInfo`] with its
//!   [`QuotaUse`], [`QuotaList`]; [`UsageReport`] of [`OwnerUsage`] and
//!   [`JobUsage`] over [`UsageFigures`].

use crate::checkpoint::CursorState;
use crate::cluster::{ExecutorResources, ExecutorState, Range, RoleKind};
use crate::model::{MemoryEstimate, ParamInfo};
use crate::spec::{Strategy, UncheckedJobSpec};
use crate::{EventKind, JobState};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
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

/// What a report did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReportAck {
    /// Metric points stored (duplicates of earlier reports are not).
    pub metrics_stored: u64,
    /// Log lines stored.
    pub logs_stored: u64,
    /// Whether the outcome ended the job.
    pub outcome_applied: bool,
}

/// One (possibly averaged) point of a job's training curve.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MetricSample {
    /// Last step of the bucket.
    pub step: i64,
    /// Mean training loss over the bucket.
    pub loss: f64,
    /// Mean learning rate.
    pub lr: f64,
    /// Mean samples per second (of rank 0).
    pub samples_per_sec: f64,
    /// Mean seconds waiting for data per step.
    pub data_seconds: f64,
    /// Mean seconds computing per step.
    pub compute_seconds: f64,
    /// Mean seconds exchanging gradients per step.
    pub comm_seconds: f64,
    /// Mean bytes rank 0 sent on the data plane per step.
    pub comm_bytes: f64,
    /// Bus bandwidth in GB/s: bytes sent over seconds communicating (for a
    /// ring, nccl-tests' busbw); absent without communication.
    pub bus_gbps: Option<f64>,
    /// Latest held-out loss in the bucket.
    pub eval_loss: Option<f64>,
    /// Latest held-out accuracy in the bucket.
    pub eval_accuracy: Option<f64>,
    /// Sharded datasets: mean bytes rank 0's loader read per step (0 for
    /// data in memory).
    #[serde(default)]
    pub data_bytes_read: f64,
    /// Sharded datasets: the share of rank 0's shard reads in the bucket
    /// that its local cache answered; absent without shard reads.
    #[serde(default)]
    pub cache_hit_rate: Option<f64>,
    /// Sharded datasets: mean shards fetched ahead of rank 0's loader.
    #[serde(default)]
    pub prefetch_depth: f64,
    /// The newest membership generation that measured a step of the
    /// bucket (a step measured again after a recovery is the newer one).
    #[serde(default)]
    pub generation: i64,
}

/// One worker rank of the job's current generation, as its executor's
/// last heartbeat described it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RankProgress {
    /// The rank.
    pub rank: i32,
    /// Its generation (the job's current one).
    pub generation: i64,
    /// The executor holding it.
    pub executor_id: Uuid,
    /// That executor's name.
    pub executor_name: String,
    /// The last step it completed.
    pub step: i64,
    /// `setup`, `data`, `compute`, `comm` (waiting on peers), `eval` or
    /// `checkpoint`.
    pub phase: String,
    /// Seconds it had been in that phase.
    pub phase_seconds: f64,
    /// Median wall time of its recent steps.
    pub median_step_seconds: f64,
    /// Median milliseconds of its own work per recent step (wall time minus
    /// waiting on peers): what tells a straggler.
    pub busy_ms: f64,
    /// Recent steps those figures are over.
    pub window_steps: i32,
    /// Sync jobs: its own work is at least the spec's
    /// `watchdog.straggler_factor` × the other ranks' median.
    pub straggler: bool,
    /// When its executor said so.
    pub reported_at: DateTime<Utc>,
}

/// A job's training curve.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MetricSeries {
    /// Steps recorded (by rank 0).
    pub steps_recorded: i64,
    /// Whether points are averages over buckets of steps.
    pub downsampled: bool,
    /// The points, by step.
    pub points: Vec<MetricSample>,
    /// Parameter-server jobs: accepted pushes by staleness (index = versions
    /// behind; the last entry counts that many or more), over all workers.
    pub staleness_histogram: Vec<i64>,
    /// Parameter-server jobs: pushes rejected as too stale, over all workers.
    pub rejected_pushes: i64,
    /// Every worker rank of the current generation, by rank (empty before
    /// any heartbeat described one).
    #[serde(default)]
    pub ranks: Vec<RankProgress>,
}

/// One stored log line.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobLogLine {
    /// Position in the job's log.
    pub id: i64,
    /// When.
    pub at: DateTime<Utc>,
    /// Executor that ran the role.
    pub executor_id: Uuid,
    /// `ps` or `worker`.
    pub role: String,
    /// Shard or rank.
    pub index: i32,
    /// Generation of the role.
    pub generation: i64,
    /// `info`, `warn` or `error`.
    pub level: String,
    /// The line.
    pub message: String,
}

/// A page of a job's logs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LogPage {
    /// Lines, oldest first.
    pub lines: Vec<JobLogLine>,
    /// Pass as `after` for the next page; absent when there are no more yet.
    pub next_after: Option<i64>,
}

/// One committed checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CheckpointInfo {
    /// Global step. A script job's: the commit's number, as its log
    /// (`checkpoint n committed`) and `resume_from.step` name it.
    pub step: u64,
    /// Generation whose cluster wrote it.
    pub generation: i64,
    /// Shards (a script job's checkpoint: its files).
    pub shards: u32,
    /// Bytes of all shards.
    pub bytes: u64,
    /// The data cursor after the step.
    pub cursor: CursorState,
    /// The manifest's URL.
    pub manifest_url: String,
    /// When it was committed.
    pub committed_at: DateTime<Utc>,
}

/// Where a job's tensor list comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TensorSource {
    /// A built-in model: its tensors follow from the spec.
    Spec,
    /// A TorchScript module: as its inspection found them.
    Inspection,
    /// A TorchScript module not inspected yet (or whose inspection failed):
    /// no tensors known.
    Pending,
}

/// `GET /v1/jobs/{id}/tensors`: every tensor of the job's model.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelTensors {
    /// Job id.
    pub job_id: Uuid,
    /// Where the list comes from.
    pub source: TensorSource,
    /// The tensors of the model's `state_dict()`, by PyTorch name, in the
    /// order training lays them out (at most 10000 of them).
    pub tensors: Vec<ParamInfo>,
    /// Tensors in all (more than `tensors` holds when the list is cut).
    pub count: u64,
    /// Elements of the trainable parameters.
    pub parameters: u64,
    /// Elements of the buffers (e.g. BatchNorm's running statistics).
    pub buffers: u64,
    /// Elements of the frozen parameters (`requires_grad=False`).
    pub frozen: u64,
}

/// `GET /v1/jobs/{id}/checkpoints`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CheckpointList {
    /// Job id.
    pub job_id: Uuid,
    /// How many the job keeps.
    pub keep: u32,
    /// Committed checkpoints, newest first.
    pub checkpoints: Vec<CheckpointInfo>,
}

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

/// Declares a closed set of names stored as Postgres `text` (a `CHECK`
/// lists the same names): the enum, its wire names, `ALL` and `parse`.
macro_rules! text_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $wire:literal,)+ }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vm])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The name on the wire and in the database.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire,)+
                }
            }

            /// The value named `s`, if any.
            pub fn parse(s: &str) -> Option<$name> {
                $name::ALL.iter().copied().find(|v| v.as_str() == s)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }
    };
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

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Manages tokens and executors; sees and controls every job.
    Admin,
    /// Sees and controls only its own jobs.
    User,
}

impl Role {
    /// The name stored in Postgres.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
        }
    }

    /// The role named `s` as stored in Postgres.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "user" => Some(Role::User),
            _ => None,
        }
    }
}

/// What a new token is for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// The user the token acts as: 1–64 of `a-z 0-9 . _ -`, starting with
    /// a letter or digit. Jobs it submits belong to this user.
    #[schema(example = "alice")]
    pub owner: String,
    /// `user` (its own jobs only) or `admin`.
    pub role: Role,
    /// What it is for, shown in listings (at most 128 characters).
    #[serde(default)]
    #[schema(example = "alice's laptop")]
    pub label: String,
    /// Seconds until it stops working (none: until revoked).
    #[serde(default)]
    pub expires_in_secs: Option<u64>,
}

/// A token as listings show it (never the token itself).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenInfo {
    /// Token id (for revoking).
    pub id: Uuid,
    /// The user it acts as.
    pub owner: String,
    /// What it may do.
    pub role: Role,
    /// What it is for.
    pub label: String,
    /// Who made it.
    pub created_by: String,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When it stops working, if ever.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A new token: its details, and the token itself (shown only here).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    /// The token's details.
    #[serde(flatten)]
    pub info: TokenInfo,
    /// The bearer token. Store it now: only its hash is kept.
    pub token: String,
}

/// Every token, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    /// The tokens (revoked ones too, with `revoked_at`).
    pub tokens: Vec<TokenInfo>,
}

/// Who the server takes the caller for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WhoAmI {
    /// The user name (`admin` for the bootstrap token and open mode).
    pub user: String,
    /// The role.
    pub role: Role,
    /// The token's id, when the caller used one made by `POST /v1/tokens`.
    pub token_id: Option<Uuid>,
    /// Whether the server runs without an admin token (every caller is the
    /// admin; loopback only).
    pub open: bool,
}

/// A user's quota as set by an admin (`PUT /v1/quotas/{owner}`): limits on
/// what the user's placed jobs hold at once. An absent or `null` field is
/// unlimited, so `{}` removes every limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimits {
    /// Most workers on CUDA devices (0–1,000,000).
    #[serde(default)]
    pub cuda_devices: Option<u32>,
    /// Most workers on CPU devices (0–1,000,000).
    #[serde(default)]
    pub cpu_workers: Option<u32>,
    /// Most RAM of PS shards and their standbys, in bytes (at most 2^50).
    #[serde(default)]
    pub ps_ram_bytes: Option<u64>,
}

/// A user's quota, and what its placed jobs hold now.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QuotaInfo {
    /// The user.
    pub owner: String,
    // The limits are fields of their own, not a flattened `QuotaLimits`:
    // that one refuses unknown fields (a request body), which the document
    // would then say of this answer too.
    /// Most workers on CUDA devices (`null`: unlimited).
    pub cuda_devices: Option<u32>,
    /// Most workers on CPU devices (`null`: unlimited).
    pub cpu_workers: Option<u32>,
    /// Most RAM of PS shards and their standbys, in bytes (`null`:
    /// unlimited).
    pub ps_ram_bytes: Option<u64>,
    /// What its jobs hold now.
    pub in_use: QuotaUse,
    /// The admin who set it (`null`: never set, unlimited).
    pub updated_by: Option<String>,
    /// When it was set.
    pub updated_at: Option<DateTime<Utc>>,
}

impl QuotaInfo {
    /// Its limits, as a `PUT` would set them.
    pub fn limits(&self) -> QuotaLimits {
        QuotaLimits {
            cuda_devices: self.cuda_devices,
            cpu_workers: self.cpu_workers,
            ps_ram_bytes: self.ps_ram_bytes,
        }
    }
}

/// What a user's placed jobs hold at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QuotaUse {
    /// Workers on CUDA devices.
    pub cuda_devices: u64,
    /// Workers on CPU devices.
    pub cpu_workers: u64,
    /// RAM of PS shards and standbys, in bytes.
    pub ps_ram_bytes: u64,
}

/// Every user with a quota.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QuotaList {
    /// The quotas, by user name.
    pub quotas: Vec<QuotaInfo>,
}

/// Resources used over a time window, from the assignment history.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageFigures {
    /// Seconds × workers on CUDA devices.
    pub device_seconds: f64,
    /// Seconds × workers on CPU devices.
    pub cpu_worker_seconds: f64,
    /// GiB × hours of PS shard (and standby) RAM.
    pub ps_ram_gib_hours: f64,
}

/// One job's usage in the window.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobUsage {
    /// The job.
    pub job_id: Uuid,
    /// Its name.
    pub name: String,
    /// Its owner.
    pub owner: String,
    /// Its state now.
    pub state: JobState,
    /// What it used.
    #[serde(flatten)]
    pub usage: UsageFigures,
}

/// One user's usage in the window.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OwnerUsage {
    /// The user.
    pub owner: String,
    /// How many of its jobs held roles in the window.
    pub jobs: u64,
    /// What they used.
    #[serde(flatten)]
    pub usage: UsageFigures,
}

/// Usage accounting over `[from, to)`: per user and per job (`GET /v1/usage`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    /// Start of the window.
    pub from: DateTime<Utc>,
    /// End of the window (at most now).
    pub to: DateTime<Utc>,
    /// Per user, most device-seconds first.
    pub owners: Vec<OwnerUsage>,
    /// Per job, most device-seconds first (at most 1,000).
    pub jobs: Vec<JobUsage>,
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

/// The sweep a job is a trial of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SweepRef {
    /// The sweep.
    pub id: Uuid,
    /// The trial's index in it.
    pub trial: u32,
}

/// A sweep's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SweepState {
    /// Trials run or wait to start.
    Running,
    /// Every trial ended and at least one completed.
    Succeeded,
    /// Every trial ended and none completed.
    Failed,
    /// Cancelled by its owner (running trials are cancelled too).
    Cancelled,
}

/// A trial's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TrialState {
    /// Not submitted yet (the sweep's concurrency is taken).
    Pending,
    /// Its job was submitted and has not ended.
    Running,
    /// Stopped early by ASHA.
    Stopped,
    /// Its job succeeded.
    Completed,
    /// Its job failed.
    Failed,
    /// Its job was cancelled (by its owner, or with the sweep).
    Cancelled,
}

/// One trial of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SweepTrial {
    /// Its index in the sweep.
    pub index: u32,
    /// Its job, once submitted.
    pub job_id: Option<Uuid>,
    /// The values of the sweep's parameters, by path.
    #[schema(value_type = Object)]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// Where it stands.
    pub state: TrialState,
    /// The metric at each rung it reached.
    pub rung_metrics: Vec<f64>,
    /// The latest value of the metric.
    pub metric: Option<f64>,
    /// The step of that value.
    pub step: Option<i64>,
    /// Workers its job holds now (0 when not running).
    pub workers: u32,
    /// Why it stopped early, or how its job ended.
    pub reason: Option<String>,
}

/// The best trial of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SweepBest {
    /// The trial's index.
    pub index: u32,
    /// Its job.
    pub job_id: Option<Uuid>,
    /// Its parameters.
    #[schema(value_type = Object)]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// Its metric: the final value of a completed trial (while none has
    /// completed, the best latest value of any).
    pub metric: f64,
}

/// A surviving trial that grew onto executors a stopped trial freed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SweepGrowth {
    /// The trial that grew.
    pub trial: u32,
    /// The stopped trial whose executors it took.
    pub from_trial: u32,
    /// Its workers before.
    pub workers_before: u32,
    /// Its workers after.
    pub workers_after: u32,
    /// When it was seen.
    pub at: DateTime<Utc>,
}

/// A hyperparameter sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Sweep {
    /// Sweep id.
    pub id: Uuid,
    /// Its name.
    pub name: String,
    /// The user who made it (its trials are this user's jobs).
    pub owner: String,
    /// Where it stands.
    pub state: SweepState,
    /// Why it is in this state.
    pub reason: String,
    /// The spec as submitted, with defaults filled in.
    pub spec: crate::sweep::SweepSpec,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When its last trial ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// The step counts of ASHA's rungs (empty without early stopping).
    pub rungs: Vec<u64>,
    /// Its trials, by index.
    pub trials: Vec<SweepTrial>,
    /// The best trial so far.
    pub best: Option<SweepBest>,
    /// Survivors that grew onto stopped trials' executors.
    pub growths: Vec<SweepGrowth>,
}

/// A user's sweeps, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SweepList {
    /// The sweeps.
    pub sweeps: Vec<Sweep>,
}
