//! Role reports: the metrics, epoch accounts and log lines a role sends,
//! and how it ended.

use super::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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
    /// A script job's script finished on rank 0; its output folder is in
    /// the object store.
    Ran {
        /// Output files stored.
        outputs: u64,
        /// Their bytes.
        bytes: u64,
    },
    /// Training failed.
    Failed {
        /// Why, naming the problem.
        reason: String,
    },
    /// The process that ran the job's model (a user's TorchScript module)
    /// died: a signal, a resource limit, or no answer in time. The API
    /// retries the job from its peers' state or its latest checkpoint, up
    /// to [`MODEL_CRASH_TRIES`] times in all, then fails it.
    Crashed {
        /// How it died, naming the signal or limit.
        reason: String,
    },
    /// A step's loss was not finite: the API records a `diverged` event
    /// and fails the job, whatever its spec's `divergence.action`.
    Diverged {
        /// The step.
        step: u64,
        /// What the role saw, naming the step.
        reason: String,
    },
}

/// How many times in all a job's model may crash (a
/// [`RoleOutcome::Crashed`]) before the job fails (a script job: its
/// spec's `max_restarts` + 1): a model that crashes
/// every time is not retried for ever, a one-off (a host's OOM killer, a
/// flaky device) costs a restart, not the job.
pub const MODEL_CRASH_TRIES: u32 = 3;

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
    /// A script job's script finished; its outputs are stored.
    #[schema(title = "RanOutcome")]
    Ran(RoleRan),
    /// Training failed.
    #[schema(title = "FailedOutcome")]
    Failed(RoleFailure),
    /// The process that ran the job's model died; the API retries a
    /// bounded number of times.
    #[schema(title = "CrashedOutcome")]
    Crashed(RoleFailure),
    /// A step's loss was not finite: the job fails with a `diverged` event.
    #[schema(title = "DivergedOutcome")]
    Diverged(RoleDivergence),
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

/// What a script job's rank 0 reports when its script finished.
#[derive(Serialize, ToSchema)]
pub(crate) struct RoleRan {
    /// Output files stored.
    pub outputs: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// What a role whose training failed reports.
#[derive(Serialize, ToSchema)]
pub(crate) struct RoleFailure {
    /// Why, naming the problem.
    pub reason: String,
}

/// What a role whose loss was not finite reports.
#[derive(Serialize, ToSchema)]
pub(crate) struct RoleDivergence {
    /// The step.
    pub step: u64,
    /// What the role saw, naming the step.
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
            RoleOutcome::Ran { outputs, bytes } => {
                RoleOutcomeSchema::Ran(RoleRan { outputs, bytes })
            }
            RoleOutcome::Failed { reason } => RoleOutcomeSchema::Failed(RoleFailure { reason }),
            RoleOutcome::Crashed { reason } => RoleOutcomeSchema::Crashed(RoleFailure { reason }),
            RoleOutcome::Diverged { step, reason } => {
                RoleOutcomeSchema::Diverged(RoleDivergence { step, reason })
            }
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
        let crashed = RoleOutcome::Crashed {
            reason: "the model process was killed by SIGSEGV".into(),
        };
        let ran = RoleOutcome::Ran {
            outputs: 2,
            bytes: 1024,
        };
        let diverged = RoleOutcome::Diverged {
            step: 7,
            reason: "the loss is not finite at step 7".into(),
        };
        for o in [succeeded, ran, failed, crashed, diverged] {
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
    /// Phases of installing a script job's own packages before this rank
    /// started (at most [`MAX_PACKAGES_PHASES`]); each is a `packages`
    /// event of the job, once per rank, generation and stage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<PackagesPhase>,
}

impl RoleReport {
    /// A report of role `key` that says nothing yet.
    pub fn empty(key: RoleKey) -> RoleReport {
        RoleReport {
            key,
            metrics: Vec::new(),
            logs: Vec::new(),
            outcome: None,
            checkpoints: Vec::new(),
            packages: Vec::new(),
        }
    }
}

/// Most package phases one report may carry.
pub const MAX_PACKAGES_PHASES: usize = 16;
/// Longest `detail` of a package phase, characters.
pub const MAX_PACKAGES_DETAIL: usize = 2048;

/// A phase of installing a script job's own packages on one rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PackagesPhase {
    /// Which phase.
    pub stage: PackagesStage,
    /// What was asked or done, in words (at most 2048 characters).
    pub detail: String,
    /// Packages installed over the runtime (`ready`, `cached`) or to be
    /// installed (`installing`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<u32>,
    /// Seconds the phase took, from the rank's request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// The environment's key (a prefix of the SHA-256 of the resolved set
    /// and the runtime): the same for every rank given the same set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
}

/// The phases of a job's packages on a rank, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PackagesStage {
    /// The resolver runs against the package index.
    Resolving,
    /// What the runtime lacks is downloaded and installed.
    Installing,
    /// A new environment is ready.
    Ready,
    /// The executor had the environment already.
    Cached,
    /// Resolution or installation failed: the job fails.
    Failed,
}

impl PackagesStage {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            PackagesStage::Resolving => "resolving",
            PackagesStage::Installing => "installing",
            PackagesStage::Ready => "ready",
            PackagesStage::Cached => "cached",
            PackagesStage::Failed => "failed",
        }
    }
}
