//! The heartbeat: what an executor reports about the roles it runs (their
//! progress through each step) and what the API answers, every role
//! assigned to it with its peers and the models it is asked to inspect.

use super::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Most roles one heartbeat may report.
pub const MAX_REPORTED_ROLES: usize = 1024;

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
    /// Devices still held by roles it was told to stop: their thread or
    /// their sandboxed model process has not exited yet. The scheduler
    /// places no other job on them until they are gone from this list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<HeldDevice>,
    /// Its cache of script jobs' Python environments (absent: it keeps
    /// none, or did not say; the last one reported stays listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environments: Option<EnvironmentCache>,
}

/// An executor's cache of Python environments (a script job's own
/// packages, installed over a runtime): on its disk, bounded, evicted
/// least recently used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentCache {
    /// Environments kept.
    pub environments: u32,
    /// Those that ranks are running in now (never evicted).
    pub in_use: u32,
    /// Bytes they take on its disk.
    pub bytes: u64,
    /// Most bytes they may take (`--env-cache-mb`).
    pub budget_bytes: u64,
}

/// A device a stopped role still holds (at most [`MAX_REPORTED_ROLES`] in
/// one heartbeat).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeldDevice {
    /// The job whose role it was.
    pub job_id: uuid::Uuid,
    /// `cpu` or `cuda`.
    pub kind: crate::spec::Device,
    /// Its index among the executor's devices of that kind.
    pub index: u32,
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
