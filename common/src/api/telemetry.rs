//! What executors report and users read back: the acknowledgement of a
//! report, a job's training curve and its ranks' progress, its log lines.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

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
