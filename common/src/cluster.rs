//! Messages between executors and the control plane: registration,
//! heartbeats, and the assignments a heartbeat answers with.
//!
//! An executor registers once (with the cluster join token) and receives its
//! id and its own credential; it then heartbeats about every second,
//! reporting the roles it runs, and gets back every role assigned to it at
//! the job's current generation with the peers it must talk to. The
//! generation is the fencing token of the data plane.
//!
//! A PS shard's hot standby (the spec's `replicas`) is a role of its own
//! kind, [`RoleKind::Standby`], whose index is the shard it stands by for;
//! it stands in the assignment's `parameter_servers` beside the primaries
//! ([`PsPeer::standby`]), and [`Assignment::primaries`] and
//! [`Assignment::standby_of`] tell them apart. The API's JSON (and the data
//! plane's handshake) still name a standby a `ps` role numbered
//! [`wire_index`] (above every shard): the serde forms of [`RoleKind`],
//! [`RoleKey`] and [`PsPeer`] translate, here and nowhere else, so every
//! reader that knows only primaries sees it as a PS role of its own.

pub use crate::checkpoint::Range;
use crate::spec::{Device, JobSpecInput, Strategy, Violation};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;
use uuid::Uuid;

/// Most devices one executor may report.
pub const MAX_DEVICES: usize = 64;
/// Largest memory of one device (16 TiB).
pub const MAX_DEVICE_MEMORY: u64 = 16 << 40;
/// Largest RAM of one executor (64 TiB).
pub const MAX_RAM: u64 = 64 << 40;
/// Smallest RAM of one executor (64 MiB).
pub const MIN_RAM: u64 = 64 << 20;
/// Most CPU cores of one executor.
pub const MAX_CORES: u32 = 4096;
/// Most labels.
pub const MAX_LABELS: usize = 32;
/// Most roles one heartbeat may report.
pub const MAX_REPORTED_ROLES: usize = 1024;

/// One device of an executor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceInfo {
    /// `cpu` (the host) or `cuda`.
    pub kind: Device,
    /// Index among devices of that kind.
    pub index: u32,
    /// Human name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Memory in bytes (for `cpu`: usable host RAM).
    pub memory_bytes: u64,
}

/// What an executor offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutorResources {
    /// Its devices: one worker can run on each.
    pub devices: Vec<DeviceInfo>,
    /// CPU cores.
    pub cpu_cores: u32,
    /// Host RAM in bytes (PS shards and CPU workers draw from it).
    pub ram_bytes: u64,
}

/// `POST /v1/executors`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// A human name (1–128 characters).
    pub name: String,
    /// `host:port` of its data-plane listener.
    #[schema(example = "127.0.0.1:7070")]
    pub address: String,
    /// What it offers.
    pub resources: ExecutorResources,
    /// Labels, e.g. `{"host": "gpu-node-3"}`; `host` keeps ring ranks adjacent.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// How it confines users' code (absent: an executor from before
    /// sandboxes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxReport>,
}

/// How an executor runs users' code (their models).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SandboxReport {
    /// `confined`, `unconfined` (started with `--sandbox off`) or
    /// `unavailable` (the kernel cannot confine: users' code is refused).
    pub state: SandboxState,
    /// The layers in force, or why there are none (at most 512 characters).
    pub detail: String,
}

/// Whether users' code is confined on an executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// In a sandboxed child process.
    Confined,
    /// In a child process, unconfined (a trusted single-user setup).
    Unconfined,
    /// Refused: the kernel lacks what the sandbox needs.
    Unavailable,
}

/// Longest [`SandboxReport::detail`].
pub const MAX_SANDBOX_DETAIL: usize = 512;

impl RegisterRequest {
    /// Every violation of the request's bounds.
    pub fn violations(&self) -> Vec<Violation> {
        let mut v = Vec::new();
        let mut fail = |field: String, message: String| v.push(Violation { field, message });
        let n = self.name.chars().count();
        if self.name.trim().is_empty() || n > 128 || self.name.chars().any(char::is_control) {
            fail(
                "name".into(),
                "must be 1 to 128 characters without control characters".into(),
            );
        }
        match self.address.rsplit_once(':') {
            Some((host, port))
                if !host.is_empty()
                    && self.address.len() <= 256
                    && !host.chars().any(|c| c.is_whitespace() || c.is_control())
                    && port.parse::<u16>().is_ok_and(|p| p > 0) => {}
            _ => fail(
                "address".into(),
                format!(
                    "must be host:port with a port 1–65535, got {:?}",
                    self.address
                ),
            ),
        }
        if let Some(s) = &self.sandbox {
            if s.detail.chars().count() > MAX_SANDBOX_DETAIL
                || s.detail.chars().any(char::is_control)
            {
                fail(
                    "sandbox.detail".into(),
                    format!("must be at most {MAX_SANDBOX_DETAIL} characters without control characters"),
                );
            }
        }
        let r = &self.resources;
        if r.devices.is_empty() || r.devices.len() > MAX_DEVICES {
            fail(
                "resources.devices".into(),
                format!(
                    "must list 1 to {MAX_DEVICES} devices, got {}",
                    r.devices.len()
                ),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, d) in r.devices.iter().enumerate() {
            if !seen.insert((d.kind == Device::Cuda, d.index)) {
                fail(
                    format!("resources.devices[{i}].index"),
                    "duplicate index for this kind".into(),
                );
            }
            if d.memory_bytes == 0 || d.memory_bytes > MAX_DEVICE_MEMORY {
                fail(
                    format!("resources.devices[{i}].memory_bytes"),
                    format!(
                        "must be between 1 and {MAX_DEVICE_MEMORY}, got {}",
                        d.memory_bytes
                    ),
                );
            }
            if d.name.chars().count() > 128 || d.name.chars().any(char::is_control) {
                fail(
                    format!("resources.devices[{i}].name"),
                    "must be at most 128 characters without control characters".into(),
                );
            }
        }
        if r.cpu_cores == 0 || r.cpu_cores > MAX_CORES {
            fail(
                "resources.cpu_cores".into(),
                format!("must be between 1 and {MAX_CORES}, got {}", r.cpu_cores),
            );
        }
        if r.ram_bytes < MIN_RAM || r.ram_bytes > MAX_RAM {
            fail(
                "resources.ram_bytes".into(),
                format!(
                    "must be between {MIN_RAM} and {MAX_RAM}, got {}",
                    r.ram_bytes
                ),
            );
        }
        if self.labels.len() > MAX_LABELS {
            fail("labels".into(), format!("at most {MAX_LABELS} labels"));
        }
        for (k, val) in &self.labels {
            if k.is_empty()
                || k.len() > 63
                || !k
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                fail(
                    format!("labels.{k}"),
                    "keys are 1–63 characters of [A-Za-z0-9-_./]".into(),
                );
            }
            if val.len() > 255 || val.chars().any(char::is_control) {
                fail(
                    format!("labels.{k}"),
                    "values are at most 255 characters without control characters".into(),
                );
            }
        }
        v
    }
}

/// Answer to a registration.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RegisterResponse {
    /// The executor's id.
    pub id: Uuid,
    /// Its credential for heartbeats, drain and leave (shown only here).
    pub token: String,
    /// How often to heartbeat.
    pub heartbeat_interval_ms: u64,
    /// Missed heartbeats after which it is declared lost.
    pub heartbeat_misses: u32,
    /// Object-store URL for weights and checkpoints.
    pub object_store: String,
}

/// On the wire a standby's index is this plus its shard (above every shard
/// number: a job has at most [`crate::spec::MAX_PARAMETER_SERVERS`]
/// shards).
const STANDBY_INDEX_BASE: u32 = 1 << 16;

/// The index role `index` of `kind` has on the wire — the API's JSON and
/// the data plane's handshake, where a standby is a `ps` role numbered
/// above every shard.
pub fn wire_index(kind: RoleKind, index: u32) -> u32 {
    match kind {
        RoleKind::Standby => STANDBY_INDEX_BASE + index,
        RoleKind::Ps | RoleKind::Worker => index,
    }
}

/// The role a wire (`ps` or `worker`, index) names.
fn from_wire(kind: RoleKind, index: u32) -> (RoleKind, u32) {
    match kind {
        RoleKind::Ps if index >= STANDBY_INDEX_BASE => {
            (RoleKind::Standby, index - STANDBY_INDEX_BASE)
        }
        other => (other, index),
    }
}

/// A role kind. The API's JSON knows `ps` and `worker`: a standby is
/// written `ps` (its index or flag says which; see [`wire_index`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RoleKind {
    /// A parameter-server shard (index = shard).
    Ps,
    /// A worker (index = rank).
    Worker,
    /// A PS shard's hot standby (index = its shard).
    Standby,
}

/// A role kind.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum ApiRoleKind {
    Ps,
    Worker,
}

impl RoleKind {
    /// The name used in Postgres.
    pub fn as_str(self) -> &'static str {
        match self {
            RoleKind::Ps => "ps",
            RoleKind::Worker => "worker",
            RoleKind::Standby => "standby",
        }
    }

    /// The kind Postgres names `s`.
    pub fn parse(s: &str) -> Option<RoleKind> {
        [RoleKind::Ps, RoleKind::Worker, RoleKind::Standby]
            .into_iter()
            .find(|k| k.as_str() == s)
    }

    /// The name the API's JSON uses (a standby is a `ps` role there).
    pub fn api_name(self) -> &'static str {
        match self {
            RoleKind::Worker => "worker",
            RoleKind::Ps | RoleKind::Standby => "ps",
        }
    }

    /// Whether it serves a PS shard (as the shard or its standby).
    pub fn is_ps(self) -> bool {
        self != RoleKind::Worker
    }
}

impl Serialize for RoleKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RoleKind::Worker => ApiRoleKind::Worker,
            RoleKind::Ps | RoleKind::Standby => ApiRoleKind::Ps,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for RoleKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RoleKind, D::Error> {
        Ok(match ApiRoleKind::deserialize(d)? {
            ApiRoleKind::Ps => RoleKind::Ps,
            ApiRoleKind::Worker => RoleKind::Worker,
        })
    }
}

impl utoipa::PartialSchema for RoleKind {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <ApiRoleKind as utoipa::PartialSchema>::schema()
    }
}

impl ToSchema for RoleKind {
    fn name() -> std::borrow::Cow<'static, str> {
        "RoleKind".into()
    }
}

/// A role an executor runs, as it reports it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(from = "RoleKeyJson", into = "RoleKeyJson", deny_unknown_fields)]
pub struct RoleKey {
    /// Job id.
    pub job_id: Uuid,
    /// Generation the role was started for.
    pub generation: i64,
    /// Kind.
    pub role: RoleKind,
    /// Shard or rank.
    pub index: u32,
}

impl RoleKey {
    /// Its index on the wire (see [`wire_index`]).
    pub fn wire_index(&self) -> u32 {
        wire_index(self.role, self.index)
    }
}

/// A [`RoleKey`] as the API's JSON has it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleKeyJson {
    job_id: Uuid,
    generation: i64,
    role: RoleKind,
    index: u32,
}

impl From<RoleKeyJson> for RoleKey {
    fn from(j: RoleKeyJson) -> RoleKey {
        let (role, index) = from_wire(j.role, j.index);
        RoleKey {
            job_id: j.job_id,
            generation: j.generation,
            role,
            index,
        }
    }
}

impl From<RoleKey> for RoleKeyJson {
    fn from(k: RoleKey) -> RoleKeyJson {
        RoleKeyJson {
            job_id: k.job_id,
            generation: k.generation,
            role: k.role,
            index: k.wire_index(),
        }
    }
}

/// `POST /v1/executors/{id}/heartbeat`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// The roles it runs now.
    #[serde(default)]
    pub roles: Vec<RoleKey>,
    /// Long-poll: while its assignments are exactly `roles` (and nothing
    /// is to be inspected), the API may hold the answer up to this long
    /// (at most the heartbeat interval, and [`MAX_HEARTBEAT_WAIT_MS`]) and
    /// answers as soon as a membership change gives it other roles. The
    /// liveness clock starts when the request arrives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// What each training role is doing now (at most one entry per role
    /// in `roles`; roles that have not stepped yet may be absent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub progress: Vec<RoleProgress>,
}

/// Where in its step a training role is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepPhase {
    /// Before its first step: loading the model, the data, its peers.
    Setup,
    /// Waiting for its next batch.
    Data,
    /// Forward, backward, applying an update.
    Compute,
    /// Exchanging with peers (all-reduce, PS pull or push): waiting on
    /// others, not on itself.
    Comm,
    /// Evaluating held-out data.
    Eval,
    /// Writing a checkpoint.
    Checkpoint,
}

impl StepPhase {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            StepPhase::Setup => "setup",
            StepPhase::Data => "data",
            StepPhase::Compute => "compute",
            StepPhase::Comm => "comm",
            StepPhase::Eval => "eval",
            StepPhase::Checkpoint => "checkpoint",
        }
    }

    /// Whether a role in this phase waits on itself alone, so that time
    /// spent here without a step is the role's own (what the stuck check
    /// judges): not waiting on peers, not a phase whose length is not a
    /// step's (setup, evaluation, checkpoint).
    pub fn own_work(self) -> bool {
        matches!(self, StepPhase::Data | StepPhase::Compute)
    }
}

/// One training role's progress as its executor sees it, sent with each
/// heartbeat: the stuck check and the straggler figures come from it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RoleProgress {
    /// The role.
    pub key: RoleKey,
    /// The last step it completed (0 before any).
    pub step: u64,
    /// What it is doing now.
    pub phase: StepPhase,
    /// Milliseconds it has been in `phase`.
    pub phase_ms: u64,
    /// Median wall time of its recent steps (ms; 0 before any).
    pub median_step_ms: f64,
    /// Median time of its recent steps it spent on its own work (ms):
    /// wall time minus the time it waited on peers.
    pub busy_ms: f64,
    /// Steps those figures are over.
    pub window: u32,
}

/// Longest an API holds a long-polling heartbeat.
pub const MAX_HEARTBEAT_WAIT_MS: u64 = 2000;

/// `POST /v1/executors/{id}/suspects`: a data-plane peer of `suspect` saw
/// its connection reset, closed or time out while both held roles of
/// `job_id` at `generation`, and could not reach it again.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SuspectReport {
    /// The job both executors serve.
    pub job_id: Uuid,
    /// The generation the reporter's role belongs to.
    pub generation: i64,
    /// The executor suspected dead.
    pub suspect: Uuid,
    /// What the reporter saw (at most [`MAX_SUSPECT_REASON_CHARS`]).
    pub reason: String,
}

/// Longest reason a suspect report may carry.
pub const MAX_SUSPECT_REASON_CHARS: usize = 1000;

/// What the scheduler decided about a [`SuspectReport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SuspectVerdict {
    /// Confirmed: the suspect was declared lost and its roles re-placed.
    Confirmed,
    /// Not confirmed (it answered, or its heartbeat is fresh): nothing
    /// changes; the heartbeat timeout still applies.
    Rejected,
    /// Moot: the job moved to another generation or ended, the suspect
    /// holds no role of it, or it is already lost or gone.
    Stale,
}

/// Answer to a [`SuspectReport`].
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SuspectAnswer {
    /// The decision.
    pub verdict: SuspectVerdict,
    /// Its evidence, as the job's event says it.
    pub evidence: String,
}

/// Executor states.
// The same set is the Postgres enum `executor_state`, read and bound as
// this type (feature `sqlx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type))]
#[cfg_attr(
    feature = "sqlx",
    sqlx(type_name = "executor_state", rename_all = "snake_case")
)]
pub enum ExecutorState {
    /// Heartbeating; takes roles.
    Live,
    /// Leaving: its roles are moved off, it takes no new ones.
    Draining,
    /// Missed too many heartbeats; must register again.
    Lost,
    /// Left gracefully.
    Left,
}

impl ExecutorState {
    /// The name used on the wire and in Postgres.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutorState::Live => "live",
            ExecutorState::Draining => "draining",
            ExecutorState::Lost => "lost",
            ExecutorState::Left => "left",
        }
    }

    /// Parses the Postgres name.
    pub fn parse(s: &str) -> Option<ExecutorState> {
        [
            ExecutorState::Live,
            ExecutorState::Draining,
            ExecutorState::Lost,
            ExecutorState::Left,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }
}

/// A worker peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkerPeer {
    /// Rank.
    pub rank: u32,
    /// Executor id.
    pub executor_id: Uuid,
    /// Its data-plane address.
    pub address: String,
    /// Device index on it.
    pub device: u32,
}

/// A PS peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(from = "PsPeerJson", into = "PsPeerJson")]
pub struct PsPeer {
    /// Shard.
    pub shard: u32,
    /// Whether it is the shard's hot standby (on the wire: its index, see
    /// [`wire_index`]).
    #[serde(skip)]
    pub standby: bool,
    /// Executor id.
    pub executor_id: Uuid,
    /// Its data-plane address.
    pub address: String,
    /// Tensor ranges it owns.
    pub ranges: Vec<Range>,
}

/// A [`PsPeer`] as the API's JSON has it.
#[derive(Serialize, Deserialize)]
struct PsPeerJson {
    shard: u32,
    executor_id: Uuid,
    address: String,
    ranges: Vec<Range>,
}

impl From<PsPeerJson> for PsPeer {
    fn from(j: PsPeerJson) -> PsPeer {
        let (kind, shard) = from_wire(RoleKind::Ps, j.shard);
        PsPeer {
            shard,
            standby: kind == RoleKind::Standby,
            executor_id: j.executor_id,
            address: j.address,
            ranges: j.ranges,
        }
    }
}

impl From<PsPeer> for PsPeerJson {
    fn from(p: PsPeer) -> PsPeerJson {
        let kind = if p.standby {
            RoleKind::Standby
        } else {
            RoleKind::Ps
        };
        PsPeerJson {
            shard: wire_index(kind, p.shard),
            executor_id: p.executor_id,
            address: p.address,
            ranges: p.ranges,
        }
    }
}

/// One role assigned to an executor, with everything needed to run it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Assignment {
    /// Which role.
    pub key: RoleKey,
    /// Device index for a worker.
    pub device: Option<u32>,
    /// The job's resolved strategy.
    pub strategy: Strategy,
    /// The job's data-plane secret (hex).
    pub secret: String,
    /// The job spec.
    pub spec: JobSpecInput,
    /// All workers of the job in rank order.
    pub workers: Vec<WorkerPeer>,
    /// All PS shards of the job in shard order.
    pub parameter_servers: Vec<PsPeer>,
    /// The committed checkpoint a role without state starts from: the
    /// job's newest, or the one its spec resumes from.
    #[serde(default)]
    pub resume: Option<crate::checkpoint::CheckpointRef>,
    /// The URLs the job may read (its spec's `artifact:` URLs are already
    /// resolved to the objects listed here). Absent, nothing may be read.
    #[serde(default)]
    pub data_policy: crate::artifact::DataPolicy,
    /// The scheduler asks the job for a checkpoint at its next step: the
    /// job is about to be preempted and resumes from that checkpoint when
    /// it is placed again. Every role of the job gets it; the roles vote
    /// for one checkpoint as they do for a drain.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpoint_wanted: bool,
}

impl Assignment {
    /// The job's PS shards without their standbys, in shard order.
    pub fn primaries(&self) -> Vec<&PsPeer> {
        let mut v: Vec<&PsPeer> = self
            .parameter_servers
            .iter()
            .filter(|p| !p.standby)
            .collect();
        v.sort_by_key(|p| p.shard);
        v
    }

    /// Where shard `shard`'s standby runs, if it has one.
    pub fn standby_of(&self, shard: u32) -> Option<&PsPeer> {
        self.parameter_servers
            .iter()
            .find(|p| p.standby && p.shard == shard)
    }
}

/// A TorchScript model file to inspect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Inspection {
    /// The job.
    pub job_id: Uuid,
    /// The model file's URL.
    pub url: String,
    /// The job's spec: the executor tries a forward pass on one batch of
    /// its dataset, so that a model that cannot train on that data fails
    /// the job before any worker starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Box<crate::spec::JobSpecInput>>,
    /// The URLs the job may read, as in an [`Assignment`].
    #[serde(default)]
    pub data_policy: crate::artifact::DataPolicy,
}

/// What inspecting a TorchScript file found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InspectionResult {
    /// The module's trainable tensors.
    #[schema(title = "InspectionParameters")]
    Parameters(Vec<crate::model::ParamInfo>),
    /// The file is not a loadable TorchScript module.
    #[schema(title = "InspectionError")]
    Error(String),
}

/// `POST /v1/executors/{id}/inspections`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InspectionReport {
    /// The job.
    pub job_id: Uuid,
    /// What was found.
    pub result: InspectionResult,
}

/// Answer to a heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HeartbeatResponse {
    /// The executor's state (`draining` while it is being emptied).
    pub state: ExecutorState,
    /// How often to heartbeat.
    pub heartbeat_interval_ms: u64,
    /// Every role assigned to it now.
    pub assignments: Vec<Assignment>,
    /// TorchScript files it is asked to inspect.
    #[serde(default)]
    pub inspections: Vec<Inspection>,
}

/// Most metric points or log lines in one report.
pub const MAX_REPORT_ITEMS: usize = 10_000;
/// Longest log line.
pub const MAX_LOG_CHARS: usize = 4096;

/// One training step as a worker measured it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricPoint {
    /// Step (1-based).
    pub step: u64,
    /// Training loss of the step.
    pub loss: f64,
    /// Learning rate.
    pub lr: f64,
    /// Samples per second.
    pub samples_per_sec: f64,
    /// Seconds waiting for data.
    pub data_seconds: f64,
    /// Seconds computing.
    pub compute_seconds: f64,
    /// Seconds exchanging gradients.
    pub comm_seconds: f64,
    /// Bytes this rank sent on the data plane in the step.
    #[serde(default)]
    pub comm_bytes: u64,
    /// PS workers: the largest staleness among the step's accepted pushes.
    #[serde(default)]
    pub staleness: Option<u32>,
    /// PS workers: pushes rejected as too stale since the previous step.
    #[serde(default)]
    pub rejected: u32,
    /// Held-out loss, on evaluation steps.
    #[serde(default)]
    pub eval_loss: Option<f64>,
    /// Held-out accuracy, on evaluation steps of classification jobs.
    #[serde(default)]
    pub eval_accuracy: Option<f64>,
    /// Sharded datasets: bytes this rank's loader read in the step (from
    /// the store, or from local files).
    #[serde(default)]
    pub data_bytes_read: u64,
    /// Sharded datasets: shard reads of the step the local cache tier
    /// answered.
    #[serde(default)]
    pub data_cache_hits: u32,
    /// Sharded datasets: shard reads of the step that went to the store.
    #[serde(default)]
    pub data_cache_misses: u32,
    /// Sharded datasets: shards fetched ahead of the loader, not yet read.
    #[serde(default)]
    pub prefetch_depth: u32,
    /// The epoch this step completed, with what it consumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch_done: Option<EpochAccount>,
}

/// What one epoch consumed, as the ranks that trained it summed it: a
/// sample count and an order-independent hash of the sample ids (the
/// wrapping sum of SplitMix64's finaliser of each id; see
/// docs/users/datasets.md). Equal to the whole training set's exactly when
/// every sample was used once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EpochAccount {
    /// The epoch, from 0.
    pub epoch: u64,
    /// Samples consumed.
    pub samples: u64,
    /// The hash of their ids.
    pub id_hash: u64,
}

/// Log severities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    /// Information.
    Info,
    /// Something odd.
    Warn,
    /// A failure.
    Error,
}

/// One log line of a role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LogLine {
    /// Sequence number within the role instance (retries are idempotent).
    pub seq: u64,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// Severity.
    pub level: LogLevel,
    /// The line (at most 4096 characters).
    pub message: String,
}

/// How a role ended. Its OpenAPI schema is `RoleOutcomeSchema`'s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoleOutcome {
    /// Training finished.
    Succeeded {
        /// Steps run.
        steps: u64,
        /// Loss of the last step; `None` when the reporting rank knows none
        /// (it joined after the last step and received the finished state).
        #[serde(default)]
        final_loss: Option<f64>,
        /// Held-out loss.
        eval_loss: Option<f64>,
        /// Held-out accuracy.
        eval_accuracy: Option<f64>,
        /// Where the final weights (safetensors) were written.
        weights_url: String,
    },
    /// Training failed.
    Failed {
        /// Why, naming the problem.
        reason: String,
    },
}

// The schema `RoleOutcome` publishes: the same wire format, each variant's
// fields a named schema of their own (utoipa would inline them, and client
// generators then fail to name a model for them; see `ConsistencySchema` in
// `spec/input.rs`). Only its schema and, in tests, its serialization
// (checked equal to `RoleOutcome`'s) are used. Its doc comment is the
// published description.
/// How a role ended.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)] // Built only by the wire-format test.
pub(crate) enum RoleOutcomeSchema {
    /// Training finished.
    #[schema(title = "SucceededOutcome")]
    Succeeded(RoleSuccess),
    /// Training failed.
    #[schema(title = "FailedOutcome")]
    Failed(RoleFailure),
}

/// What a role that finished training reports.
#[derive(Serialize, ToSchema)]
pub(crate) struct RoleSuccess {
    /// Steps run.
    pub steps: u64,
    /// Loss of the last step; `None` when the reporting rank knows none
    /// (it joined after the last step and received the finished state).
    #[serde(default)]
    pub final_loss: Option<f64>,
    /// Held-out loss.
    pub eval_loss: Option<f64>,
    /// Held-out accuracy.
    pub eval_accuracy: Option<f64>,
    /// Where the final weights (safetensors) were written.
    pub weights_url: String,
}

/// What a role whose training failed reports.
#[derive(Serialize, ToSchema)]
pub(crate) struct RoleFailure {
    /// Why, naming the problem.
    pub reason: String,
}

impl utoipa::PartialSchema for RoleOutcome {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <RoleOutcomeSchema as utoipa::PartialSchema>::schema()
    }
}

impl ToSchema for RoleOutcome {
    fn name() -> std::borrow::Cow<'static, str> {
        "RoleOutcome".into()
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        <RoleOutcomeSchema as ToSchema>::schemas(schemas)
    }
}

#[cfg(test)]
mod outcome_schema_tests {
    use super::*;
    use serde_json::json;

    /// The published form of each outcome; exhaustive, so a new outcome (or
    /// field) does not compile until the schema has it too.
    fn published(o: RoleOutcome) -> RoleOutcomeSchema {
        match o {
            RoleOutcome::Succeeded {
                steps,
                final_loss,
                eval_loss,
                eval_accuracy,
                weights_url,
            } => RoleOutcomeSchema::Succeeded(RoleSuccess {
                steps,
                final_loss,
                eval_loss,
                eval_accuracy,
                weights_url,
            }),
            RoleOutcome::Failed { reason } => RoleOutcomeSchema::Failed(RoleFailure { reason }),
        }
    }

    /// The schema-only type serializes exactly as the wire type does.
    #[test]
    fn the_published_schema_has_the_wire_format() {
        let succeeded = RoleOutcome::Succeeded {
            steps: 12,
            final_loss: Some(0.5),
            eval_loss: None,
            eval_accuracy: Some(0.97),
            weights_url: "file:///w/model.safetensors".into(),
        };
        let failed = RoleOutcome::Failed {
            reason: "out of memory".into(),
        };
        for o in [succeeded, failed] {
            let wire = serde_json::to_value(&o).unwrap();
            assert_eq!(serde_json::to_value(published(o.clone())).unwrap(), wire);
            assert_eq!(serde_json::from_value::<RoleOutcome>(wire).unwrap(), o);
        }
        assert_eq!(
            serde_json::to_value(RoleOutcome::Failed { reason: "x".into() }).unwrap(),
            json!({"failed": {"reason": "x"}})
        );
    }
}

/// `POST /v1/executors/{id}/reports`: what a role measured and logged, and
/// how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RoleReport {
    /// The role.
    pub key: RoleKey,
    /// Step figures.
    #[serde(default)]
    pub metrics: Vec<MetricPoint>,
    /// Log lines.
    #[serde(default)]
    pub logs: Vec<LogLine>,
    /// Set once, when the role ends.
    #[serde(default)]
    pub outcome: Option<RoleOutcome>,
    /// Checkpoint shards this role has finished uploading.
    #[serde(default)]
    pub checkpoints: Vec<crate::checkpoint::ShardUploaded>,
}

#[cfg(test)]
mod role_wire_tests {
    use super::*;
    use serde_json::json;

    /// A standby is a `ps` role numbered above every shard on the wire,
    /// and its own kind, numbered by its shard, in Rust.
    #[test]
    fn a_standby_keeps_its_wire_form_and_is_typed_in_rust() {
        let key = RoleKey {
            job_id: Uuid::nil(),
            generation: 4,
            role: RoleKind::Standby,
            index: 2,
        };
        let wire = serde_json::to_value(key).unwrap();
        assert_eq!(
            wire,
            json!({"job_id": Uuid::nil(), "generation": 4, "role": "ps", "index": 65538})
        );
        assert_eq!(serde_json::from_value::<RoleKey>(wire).unwrap(), key);
        for (role, index) in [(RoleKind::Ps, 2), (RoleKind::Worker, 70_000)] {
            let k = RoleKey { role, index, ..key };
            let wire = serde_json::to_value(k).unwrap();
            assert_eq!(wire["index"], index);
            assert_eq!(serde_json::from_value::<RoleKey>(wire).unwrap(), k);
        }
        assert!(serde_json::from_value::<RoleKey>(
            json!({"job_id": Uuid::nil(), "generation": 4, "role": "standby", "index": 2})
        )
        .is_err());
        assert!(serde_json::from_value::<RoleKey>(
            json!({"job_id": Uuid::nil(), "generation": 4, "role": "ps", "index": 2, "extra": 1})
        )
        .is_err());
        let peer = PsPeer {
            shard: 1,
            standby: true,
            executor_id: Uuid::nil(),
            address: "a:1".into(),
            ranges: Vec::new(),
        };
        let wire = serde_json::to_value(&peer).unwrap();
        assert_eq!(wire["shard"], 65537);
        assert_eq!(wire.as_object().unwrap().len(), 4);
        assert_eq!(serde_json::from_value::<PsPeer>(wire).unwrap(), peer);
        for kind in [RoleKind::Ps, RoleKind::Worker, RoleKind::Standby] {
            assert_eq!(RoleKind::parse(kind.as_str()), Some(kind));
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.api_name());
        }
    }
}
