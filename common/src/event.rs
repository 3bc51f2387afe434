//! What a job's event log records: one [`EventKind`] per entry, with the
//! typed details of its kind ([`EventData`]). The API answers with these
//! names (`GET /v1/jobs/{id}/events`), the web UI and the SDK read them, and
//! Postgres stores them as the enum `event_kind` (feature `sqlx`), so a
//! writer cannot invent a kind no reader knows.
//!
//! Writers build an [`EventData`], whose variant fixes the kind, and store
//! [`EventData::to_json`] (the `data` of the event's JSON, unchanged from
//! the untyped log the API always served); readers (the CLI, the tests)
//! decode it with [`EventData::from_json`] and match variants instead of
//! the prose of `reason`.

use crate::cluster::{ExecutorState, SuspectVerdict};
use crate::spec::{DivergenceAction, Strategy};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

/// The kind of an entry of a job's event log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type))]
#[cfg_attr(
    feature = "sqlx",
    sqlx(type_name = "event_kind", rename_all = "snake_case")
)]
pub enum EventKind {
    /// The job was stored (`to_state` is `queued`).
    Submitted,
    /// A state change (`from_state` → `to_state`).
    Transition,
    /// How `strategy: auto` was decided.
    Strategy,
    /// A new generation's roles (`data`: the generation and its roles).
    Placement,
    /// The TorchScript model's inspection moved to another executor.
    Inspection,
    /// A checkpoint committed (`data`: its step and manifest).
    Checkpoint,
    /// The job's result (`data`: its figures and weights).
    Result,
    /// The provisioner started or could not start an executor for it.
    Provisioning,
    /// A data-plane peer's report that an executor is gone, and the verdict.
    Suspect,
    /// Preemption: asked for a checkpoint, shrunk, held back or released.
    Preemption,
    /// A rank stuck in its own work; its executor leaves the job.
    Stuck,
    /// A rank that holds the others back; left out where the spec asks.
    Straggler,
    /// The process running the job's model died; the job tries again.
    Crash,
    /// The loss diverged (not finite, or above the spec's `divergence`
    /// bound for its window); the job fails, or goes on with a warning.
    Diverged,
    /// An experiment tracker (MLflow) could not be reached or refused
    /// what was sent: a warning, the job trains on.
    Tracking,
    /// A script job's own packages on one rank: resolving, installing,
    /// ready (made or from the executor's cache), or failed.
    Packages,
}

impl EventKind {
    /// Every kind, in the order the enum declares them.
    pub const ALL: [EventKind; 16] = [
        EventKind::Submitted,
        EventKind::Transition,
        EventKind::Strategy,
        EventKind::Placement,
        EventKind::Inspection,
        EventKind::Checkpoint,
        EventKind::Result,
        EventKind::Provisioning,
        EventKind::Suspect,
        EventKind::Preemption,
        EventKind::Stuck,
        EventKind::Straggler,
        EventKind::Crash,
        EventKind::Diverged,
        EventKind::Tracking,
        EventKind::Packages,
    ];

    /// The name on the wire and in Postgres.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Submitted => "submitted",
            EventKind::Transition => "transition",
            EventKind::Strategy => "strategy",
            EventKind::Placement => "placement",
            EventKind::Inspection => "inspection",
            EventKind::Checkpoint => "checkpoint",
            EventKind::Result => "result",
            EventKind::Provisioning => "provisioning",
            EventKind::Suspect => "suspect",
            EventKind::Preemption => "preemption",
            EventKind::Stuck => "stuck",
            EventKind::Straggler => "straggler",
            EventKind::Crash => "crash",
            EventKind::Diverged => "diverged",
            EventKind::Tracking => "tracking",
            EventKind::Packages => "packages",
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so that a width such as `{:<8}` applies.
        f.pad(self.as_str())
    }
}

/// The details of one event, by kind: the typed `data` of a job event.
#[derive(Debug, Clone, PartialEq)]
pub enum EventData {
    /// The job was stored.
    Submitted(Submitted),
    /// A state change (the states are the event's own fields).
    Transition,
    /// How `strategy: auto` was decided (the reason says it).
    Strategy,
    /// A new generation's roles.
    Placement(Placement),
    /// The model's inspection moved to another executor.
    Inspection,
    /// A checkpoint committed.
    Checkpoint(Checkpoint),
    /// The job's result.
    Result(Outcome),
    /// What the provisioner did for the job.
    Provisioning(Provisioning),
    /// A peer's report that an executor is gone, and the verdict.
    Suspect(Suspect),
    /// A step of a preemption.
    Preemption(Preemption),
    /// A rank stuck in one phase of its step.
    Stuck(Stuck),
    /// A rank that holds the others back.
    Straggler(Straggler),
    /// A role's model process died, and the job tries again.
    Crash(Crash),
    /// The loss diverged.
    Diverged(Diverged),
    /// A tracker could not take the job's export.
    Tracking(TrackingWarning),
    /// `packages`.
    Packages(PackagesEvent),
}

/// `submitted`: how the job was stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Submitted {
    /// The strategy of its spec.
    pub strategy: Strategy,
    /// The submit's `Idempotency-Key`, if it had one.
    pub idempotency_key: Option<String>,
    /// Its owner.
    pub owner: String,
}

/// `placement`: the generation's roles, and the executors that left it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    /// The generation these roles are.
    pub generation: i64,
    /// The pattern they run (absent when nothing is placed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<String>,
    /// Its workers (none: every role released).
    pub workers: Vec<PlacedWorker>,
    /// Its parameter-server shards.
    pub parameter_servers: Vec<PlacedShard>,
    /// Executors that held a role of the previous generation and are no
    /// longer live, with their state (`lost`, `draining`, `left`).
    #[serde(default)]
    pub departed: Vec<Departed>,
}

/// A worker of a [`Placement`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlacedWorker {
    /// Its rank.
    pub rank: u32,
    /// Its executor.
    pub executor: Uuid,
    /// The executor's device index.
    pub device: u32,
}

/// A parameter-server shard of a [`Placement`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlacedShard {
    /// Its number.
    pub shard: u32,
    /// The executor serving it.
    pub executor: Uuid,
    /// Its standby's executor, if it has one.
    pub standby: Option<Uuid>,
}

/// An executor that left a job between two placements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Departed {
    /// The executor.
    pub executor: Uuid,
    /// Its name.
    pub name: String,
    /// Why its roles moved: its state then (`lost` also when the scheduler
    /// no longer knows it).
    pub state: ExecutorState,
}

/// `checkpoint`: a committed checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Its step.
    pub step: u64,
    /// Where its manifest is.
    pub manifest_url: String,
}

/// `result`: a success's figures, or nothing for a failure (its reason is
/// the event's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Outcome {
    /// Trained to the end.
    Trained {
        /// Steps trained.
        steps: u64,
        /// The last loss, when the reporting rank knows it.
        final_loss: Option<f64>,
        /// Held-out loss, when evaluated.
        eval_loss: Option<f64>,
        /// Held-out accuracy (classification).
        eval_accuracy: Option<f64>,
        /// Where the final weights are.
        weights_url: String,
    },
    /// A script job's script finished; its outputs are stored.
    Ran {
        /// Output files.
        outputs: u64,
        /// Their bytes.
        bytes: u64,
    },
    /// Failed (or cancelled): no figures.
    Failed {},
}

/// `provisioning`: the provisioner starts executors for the job, or cannot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Provisioning {
    /// Executors are starting.
    Starting {
        /// Their names.
        executors: Vec<String>,
        /// How many new executors this job alone needs.
        needed: u32,
    },
    /// The provisioner cannot supply what the job needs (the reason says why).
    Blocked,
}

/// `suspect`: a peer's report, the probe, and the verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suspect {
    /// What the scheduler decided.
    pub verdict: SuspectVerdict,
    /// The generation the report was about.
    pub generation: i64,
    /// Who reported.
    pub reporter: Uuid,
    /// Its name.
    pub reporter_name: String,
    /// Whom it reported.
    pub suspect: Uuid,
    /// Its name.
    pub suspect_name: String,
    /// The reporter's words.
    pub reason: String,
    /// The scheduler's own probe of the suspect's data plane.
    pub probe: Probe,
    /// The suspect's last heartbeat's age.
    pub heartbeat_age_s: f64,
    /// Its heartbeat interval.
    pub heartbeat_interval_s: f64,
}

/// The scheduler's probe of a suspect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    /// The data-plane address probed.
    pub address: String,
    /// `answered`, `refused` or `silent`.
    pub outcome: String,
    /// How long it took.
    pub ms: f64,
}

/// `preemption`: one step of making room for a job of higher priority
/// (`by` the job that needs the room, `victim` the one that yields it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Preemption {
    /// On the job that needs room: it shrank `victim`.
    Shrink {
        /// The job shrunk.
        victim: Uuid,
        /// Its workers before.
        from: u32,
        /// Its workers after.
        to: u32,
    },
    /// On the job shrunk, by `by`.
    Shrunk {
        /// The job that needed the room.
        by: Uuid,
        /// Workers before.
        from: u32,
        /// Workers after.
        to: u32,
    },
    /// On the job that needs room: it preempted `victim`.
    Preempt {
        /// The job preempted.
        victim: Uuid,
    },
    /// On the job preempted (back to queued), by `by`.
    Preempted {
        /// The job that needed the room.
        by: Uuid,
    },
    /// A preemption announced: the victim is asked for a checkpoint first.
    /// On the victim's log it names `by`, on the other's `victim`.
    Pending {
        /// The job that needs the room (on the victim's log).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Uuid>,
        /// The job asked to yield (on the other's log).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        victim: Option<Uuid>,
        /// How long the victim has to commit its checkpoint.
        grace_secs: u64,
    },
    /// The preemption was called off: `by` no longer needs the room.
    CalledOff {
        /// The job that no longer needs it.
        by: Uuid,
    },
}

/// `stuck`: a rank stuck in one phase of its step, left out of the job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stuck {
    /// The rank.
    pub rank: u32,
    /// Its generation.
    pub generation: i64,
    /// Its executor.
    pub executor: Uuid,
    /// The executor's name.
    pub executor_name: String,
    /// The phase it is stuck in.
    pub phase: String,
    /// How long it has been in that phase.
    pub phase_seconds: f64,
    /// Its step.
    pub step: u64,
    /// The job's median step time.
    pub median_step_seconds: f64,
    /// The bound it passed.
    pub bound_seconds: f64,
    /// The spec's `watchdog.stuck_factor`.
    pub stuck_factor: f64,
    /// The spec's `watchdog.stuck_floor_seconds`.
    pub stuck_floor_seconds: f64,
}

/// `straggler`: a rank that holds the others back, left out of the job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Straggler {
    /// The rank.
    pub rank: u32,
    /// Its generation.
    pub generation: i64,
    /// Its executor.
    pub executor: Uuid,
    /// The executor's name.
    pub executor_name: String,
    /// Its busy time per step over the window.
    pub busy_ms: f64,
    /// Steps in the window.
    pub window_steps: u64,
    /// The other ranks' busy times.
    pub others_busy_ms: Vec<f64>,
    /// The spec's `watchdog.straggler_factor`.
    pub straggler_factor: f64,
}

/// `crash`: a role's model process died (the event's reason names the
/// signal or limit); the job's roles restart in a new generation, from
/// their peers' state or the latest checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Crash {
    /// The role's kind, as the API names it (`worker`).
    pub role: String,
    /// Its rank.
    pub index: u32,
    /// The generation it crashed in.
    pub generation: i64,
    /// Its executor.
    pub executor: Uuid,
    /// The generation the job now trains in.
    pub retry_generation: i64,
    /// Which try this crash ended (1 for the first).
    pub attempt: u32,
    /// How many tries the job has in all.
    pub tries: u32,
}

/// `diverged`: rank 0's loss diverged (see [`crate::divergence`]); the
/// event's reason says it in words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diverged {
    /// The step where it was found.
    pub step: u64,
    /// The loss at that step (absent when it is not finite).
    pub loss: Option<f64>,
    /// Whether the loss was not finite (which always fails the job).
    pub not_finite: bool,
    /// The window's first step, when the loss stayed above the bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_step: Option<u64>,
    /// The curve's early value (the smallest loss of its first five
    /// steps), when known.
    pub early: Option<f64>,
    /// A collapse: the lowest mean of `window_steps` losses in a row the
    /// curve had come down to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<f64>,
    /// The spec's `divergence.factor`.
    pub factor: f64,
    /// The spec's `divergence.window_steps`.
    pub window_steps: u32,
    /// What the job did: `fail` (always for a loss that is not finite) or
    /// `warn` (it goes on).
    pub action: DivergenceAction,
}

/// `tracking`: an experiment tracker could not be reached, or refused what
/// was sent; the job trains on, and the export goes on as `action` says
/// (the event's reason says it in words).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrackingWarning {
    /// The tracker: `mlflow`.
    pub tracker: String,
    /// Its URL.
    pub uri: String,
    /// What went wrong, in the network's or the tracker's words.
    pub error: String,
    /// What the export does now: `retrying` (with backoff, from where it
    /// was), `skipped` (what was refused is left out, the rest goes on)
    /// or `gave_up` (the job has ended and the tracker stayed away).
    pub action: String,
}

/// `packages`: a phase of installing a script job's own packages on one
/// rank, as its executor reported it (the event's reason says it in words).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackagesEvent {
    /// The rank.
    pub rank: u32,
    /// The generation it was starting.
    pub generation: i64,
    /// The executor installing.
    pub executor: Uuid,
    /// The phase and its figures.
    #[serde(flatten)]
    pub phase: crate::cluster::PackagesPhase,
}

impl EventData {
    /// The kind this data is of.
    pub fn kind(&self) -> EventKind {
        match self {
            EventData::Submitted(_) => EventKind::Submitted,
            EventData::Transition => EventKind::Transition,
            EventData::Strategy => EventKind::Strategy,
            EventData::Placement(_) => EventKind::Placement,
            EventData::Inspection => EventKind::Inspection,
            EventData::Checkpoint(_) => EventKind::Checkpoint,
            EventData::Result(_) => EventKind::Result,
            EventData::Provisioning(_) => EventKind::Provisioning,
            EventData::Suspect(_) => EventKind::Suspect,
            EventData::Preemption(_) => EventKind::Preemption,
            EventData::Stuck(_) => EventKind::Stuck,
            EventData::Straggler(_) => EventKind::Straggler,
            EventData::Crash(_) => EventKind::Crash,
            EventData::Diverged(_) => EventKind::Diverged,
            EventData::Tracking(_) => EventKind::Tracking,
            EventData::Packages(_) => EventKind::Packages,
        }
    }

    /// The event's `data` as stored and served.
    pub fn to_json(&self) -> Value {
        fn json(v: &impl Serialize) -> Value {
            // Plain structs of numbers, strings and ids: cannot fail.
            serde_json::to_value(v).unwrap_or_else(|_| Value::Object(Default::default()))
        }
        // The watchdog's two verdicts carry their name, as they always did.
        fn with_verdict(mut v: Value, verdict: &str) -> Value {
            if let Value::Object(m) = &mut v {
                m.insert("verdict".into(), verdict.into());
            }
            v
        }
        match self {
            EventData::Transition | EventData::Strategy | EventData::Inspection => {
                Value::Object(Default::default())
            }
            EventData::Submitted(d) => json(d),
            EventData::Placement(d) => json(d),
            EventData::Checkpoint(d) => json(d),
            EventData::Result(d) => json(d),
            EventData::Provisioning(d) => json(d),
            EventData::Suspect(d) => json(d),
            EventData::Preemption(d) => json(d),
            EventData::Stuck(d) => with_verdict(json(d), "stuck"),
            EventData::Straggler(d) => with_verdict(json(d), "straggler"),
            EventData::Crash(d) => json(d),
            EventData::Diverged(d) => json(d),
            EventData::Tracking(d) => json(d),
            EventData::Packages(d) => json(d),
        }
    }

    /// Decodes the `data` of an event of `kind`.
    pub fn from_json(kind: EventKind, data: &Value) -> Result<EventData, serde_json::Error> {
        fn de<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, serde_json::Error> {
            T::deserialize(v)
        }
        Ok(match kind {
            EventKind::Submitted => EventData::Submitted(de(data)?),
            EventKind::Transition => EventData::Transition,
            EventKind::Strategy => EventData::Strategy,
            EventKind::Placement => EventData::Placement(de(data)?),
            EventKind::Inspection => EventData::Inspection,
            EventKind::Checkpoint => EventData::Checkpoint(de(data)?),
            EventKind::Result => EventData::Result(de(data)?),
            EventKind::Provisioning => EventData::Provisioning(de(data)?),
            EventKind::Suspect => EventData::Suspect(de(data)?),
            EventKind::Preemption => EventData::Preemption(de(data)?),
            EventKind::Stuck => EventData::Stuck(de(data)?),
            EventKind::Straggler => EventData::Straggler(de(data)?),
            EventKind::Crash => EventData::Crash(de(data)?),
            EventKind::Diverged => EventData::Diverged(de(data)?),
            EventKind::Tracking => EventData::Tracking(de(data)?),
            EventKind::Packages => EventData::Packages(de(data)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_serde_names_and_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for k in EventKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
            assert_eq!(
                serde_json::from_value::<EventKind>(k.as_str().into()).unwrap(),
                k
            );
            assert!(seen.insert(k.as_str()));
        }
        assert!(serde_json::from_value::<EventKind>("exploded".into()).is_err());
    }

    fn samples() -> Vec<EventData> {
        let e = Uuid::from_u128(7);
        vec![
            EventData::Submitted(Submitted {
                strategy: Strategy::Auto,
                idempotency_key: None,
                owner: "ada".into(),
            }),
            EventData::Transition,
            EventData::Strategy,
            EventData::Placement(Placement {
                generation: 3,
                strategy: Some("allreduce".into()),
                workers: vec![PlacedWorker {
                    rank: 0,
                    executor: e,
                    device: 0,
                }],
                parameter_servers: vec![],
                departed: vec![Departed {
                    executor: e,
                    name: "gpu-1".into(),
                    state: ExecutorState::Lost,
                }],
            }),
            EventData::Inspection,
            EventData::Checkpoint(Checkpoint {
                step: 40,
                manifest_url: "s3://b/m.json".into(),
            }),
            EventData::Result(Outcome::Trained {
                steps: 9,
                final_loss: Some(0.5),
                eval_loss: None,
                eval_accuracy: Some(0.9),
                weights_url: "s3://b/w".into(),
            }),
            EventData::Result(Outcome::Failed {}),
            EventData::Provisioning(Provisioning::Starting {
                executors: vec!["a".into()],
                needed: 1,
            }),
            EventData::Provisioning(Provisioning::Blocked),
            EventData::Preemption(Preemption::Pending {
                by: Some(e),
                victim: None,
                grace_secs: 30,
            }),
            EventData::Preemption(Preemption::CalledOff { by: e }),
            EventData::Stuck(Stuck {
                rank: 1,
                generation: 2,
                executor: e,
                executor_name: "x".into(),
                phase: "compute".into(),
                phase_seconds: 9.0,
                step: 4,
                median_step_seconds: 0.1,
                bound_seconds: 5.0,
                stuck_factor: 20.0,
                stuck_floor_seconds: 5.0,
            }),
            EventData::Straggler(Straggler {
                rank: 1,
                generation: 2,
                executor: e,
                executor_name: "x".into(),
                busy_ms: 90.0,
                window_steps: 20,
                others_busy_ms: vec![10.0],
                straggler_factor: 3.0,
            }),
            EventData::Crash(Crash {
                role: "worker".into(),
                index: 1,
                generation: 2,
                executor: e,
                retry_generation: 3,
                attempt: 1,
                tries: 3,
            }),
            EventData::Diverged(Diverged {
                step: 60,
                loss: Some(9.5),
                not_finite: false,
                first_step: Some(11),
                early: Some(2.0),
                best: None,
                factor: 3.0,
                window_steps: 50,
                action: DivergenceAction::Warn,
            }),
            EventData::Diverged(Diverged {
                step: 900,
                loss: Some(2.3),
                not_finite: false,
                first_step: Some(851),
                early: Some(2.3),
                best: Some(0.04),
                factor: 3.0,
                window_steps: 50,
                action: DivergenceAction::Fail,
            }),
            EventData::Diverged(Diverged {
                step: 7,
                loss: None,
                not_finite: true,
                first_step: None,
                early: None,
                best: None,
                factor: 3.0,
                window_steps: 50,
                action: DivergenceAction::Fail,
            }),
            EventData::Tracking(TrackingWarning {
                tracker: "mlflow".into(),
                uri: "http://127.0.0.1:5000".into(),
                error: "connection refused".into(),
                action: "retrying".into(),
            }),
            EventData::Packages(PackagesEvent {
                rank: 1,
                generation: 2,
                executor: e,
                phase: crate::cluster::PackagesPhase {
                    stage: crate::cluster::PackagesStage::Ready,
                    detail: "3 installed over the runtime".into(),
                    packages: Some(3),
                    seconds: Some(2.5),
                    environment: Some("0123456789ab".into()),
                },
            }),
        ]
    }

    #[test]
    fn every_kind_of_data_reads_back_as_written() {
        for d in samples() {
            let back = EventData::from_json(d.kind(), &d.to_json()).unwrap();
            assert_eq!(back, d);
        }
    }

    #[test]
    fn the_json_is_the_untyped_log_s() {
        let e = Uuid::from_u128(7);
        // As the scheduler wrote them before the data was typed.
        assert_eq!(
            EventData::Preemption(Preemption::Shrink {
                victim: e,
                from: 3,
                to: 1
            })
            .to_json(),
            serde_json::json!({"action": "shrink", "victim": e, "from": 3, "to": 1})
        );
        assert_eq!(
            EventData::Result(Outcome::Failed {}).to_json(),
            serde_json::json!({})
        );
        let old_placement =
            serde_json::json!({"generation": 1, "workers": [], "parameter_servers": []});
        assert!(matches!(
            EventData::from_json(EventKind::Placement, &old_placement).unwrap(),
            EventData::Placement(Placement { generation: 1, ref departed, .. }) if departed.is_empty()
        ));
        let v = samples()
            .into_iter()
            .find(|d| d.kind() == EventKind::Stuck)
            .unwrap()
            .to_json();
        assert_eq!(v["verdict"], "stuck");
        assert_eq!(
            EventData::Provisioning(Provisioning::Blocked).to_json(),
            serde_json::json!({"action": "blocked"})
        );
    }
}
