//! Sweeps (hyperparameter searches) and their trials.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

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
