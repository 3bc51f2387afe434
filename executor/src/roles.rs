//! The roles an executor runs, started and stopped as assignments change.
//!
//! A role is keyed by job, kind and index and stamped with the generation it
//! was started for; a new generation restarts it (its peers may have
//! changed), and a role no longer assigned is stopped.
//!
//! A worker of a single-worker job (allreduce with one rank: nothing to
//! exchange) trains the whole job with [`crate::train::run`] on a thread of
//! its own, reporting metrics, logs and the outcome through
//! [`crate::report`], and writes the final weights as safetensors to the
//! object store. Roles of multi-worker jobs need the PS or ring data plane,
//! which is not built yet: such a role holds its assignment and says so in
//! the job's logs.

use crate::report::{self, Item, Sink};
use crate::train;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use trainyard_common::cluster::{
    Assignment, Inspection, InspectionReport, InspectionResult, LogLevel, RoleKey, RoleKind,
    RoleOutcome,
};
use trainyard_common::model::ParamInfo;
use trainyard_common::spec::{Device, Strategy};
use uuid::Uuid;

struct Running {
    key: RoleKey,
    stop: Arc<AtomicBool>,
}

/// The set of running roles.
#[derive(Default)]
pub struct Roles {
    running: BTreeMap<(Uuid, RoleKind, u32), Running>,
    sink: Option<Sink>,
    inspecting: std::collections::BTreeSet<Uuid>,
}

impl Roles {
    /// Roles that report to `sink`.
    pub fn new(sink: Sink) -> Roles {
        Roles {
            running: BTreeMap::new(),
            sink: Some(sink),
            inspecting: Default::default(),
        }
    }

    /// Starts inspecting the TorchScript files it was asked to, once each.
    pub fn inspect(&mut self, inspections: &[Inspection]) {
        let Some(sink) = self.sink.clone() else {
            return;
        };
        for i in inspections {
            if !self.inspecting.insert(i.job_id) {
                continue;
            }
            let (job_id, url) = (i.job_id, i.url.clone());
            let sink = sink.clone();
            tokio::spawn(async move {
                let result = tokio::task::spawn_blocking(move || inspect_file(&url))
                    .await
                    .unwrap_or_else(|e| {
                        InspectionResult::Error(format!("inspection crashed: {e}"))
                    });
                let report = InspectionReport { job_id, result };
                for attempt in 0..20u32 {
                    let (id, token) = sink.session.read().map(|s| s.clone()).unwrap_or_default();
                    let res = sink
                        .client
                        .post(format!("{}/v1/executors/{id}/inspections", sink.api))
                        .bearer_auth(token)
                        .json(&report)
                        .send()
                        .await;
                    match res {
                        Ok(r) if r.status().is_success() || r.status().is_client_error() => {
                            tracing::info!(job = %job_id, status = %r.status(), "inspection reported");
                            return;
                        }
                        _ => {
                            tokio::time::sleep(std::time::Duration::from_millis(
                                200 << attempt.min(4),
                            ))
                            .await
                        }
                    }
                }
            });
        }
    }

    /// The roles running now, as reported in heartbeats.
    pub fn running(&self) -> Vec<RoleKey> {
        self.running.values().map(|r| r.key).collect()
    }

    /// Whether no role runs.
    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Makes the running set equal to `assignments`.
    pub fn apply(&mut self, assignments: &[Assignment]) {
        let wanted: BTreeMap<(Uuid, RoleKind, u32), &Assignment> = assignments
            .iter()
            .map(|a| ((a.key.job_id, a.key.role, a.key.index), a))
            .collect();
        let stale: Vec<_> = self
            .running
            .iter()
            .filter(|(k, r)| {
                wanted
                    .get(*k)
                    .is_none_or(|a| a.key.generation != r.key.generation)
            })
            .map(|(k, _)| *k)
            .collect();
        for k in stale {
            if let Some(r) = self.running.remove(&k) {
                r.stop.store(true, Ordering::Relaxed);
                tracing::info!(job = %r.key.job_id, role = ?r.key.role, index = r.key.index, generation = r.key.generation, "role stopped");
            }
        }
        for (k, a) in wanted {
            if self.running.contains_key(&k) {
                continue;
            }
            let stop = Arc::new(AtomicBool::new(false));
            self.start(a.clone(), stop.clone());
            self.running.insert(k, Running { key: a.key, stop });
        }
    }

    fn start(&self, a: Assignment, stop: Arc<AtomicBool>) {
        let (tx, rx) = unbounded_channel();
        if let Some(sink) = &self.sink {
            tokio::spawn(report::deliver(sink.clone(), a.key, rx));
        }
        let trains = a.key.role == RoleKind::Worker
            && a.strategy == Strategy::Allreduce
            && a.workers.len() == 1;
        if !trains {
            let msg = format!(
                "{:?} {} of generation {} started; training with {} worker(s) and {} PS shard(s) needs the data plane, which this executor does not have yet: holding the assignment",
                a.key.role, a.key.index, a.key.generation, a.workers.len(), a.parameter_servers.len()
            );
            tracing::info!(job = %a.key.job_id, "{msg}");
            let _ = tx.send(Item::Log(LogLevel::Warn, msg));
            return;
        }
        let object_store = self
            .sink
            .as_ref()
            .and_then(|s| s.object_store.read().ok().map(|o| o.clone()))
            .unwrap_or_default();
        std::thread::spawn(move || train_role(a, stop, tx, object_store));
    }
}

fn train_role(
    a: Assignment,
    stop: Arc<AtomicBool>,
    tx: UnboundedSender<Item>,
    object_store: String,
) {
    let log = |level, msg: String| {
        tracing::info!(job = %a.key.job_id, "{msg}");
        let _ = tx.send(Item::Log(level, msg));
    };
    let device = match a.spec.resources.device {
        Device::Cuda if tch::Cuda::is_available() => {
            tch::Device::Cuda(a.device.unwrap_or(0) as usize)
        }
        Device::Cuda => {
            let reason = "the job asks for cuda but libtorch sees no CUDA device on this executor"
                .to_owned();
            log(LogLevel::Error, reason.clone());
            let _ = tx.send(Item::Outcome(RoleOutcome::Failed { reason }));
            return;
        }
        Device::Cpu => tch::Device::Cpu,
    };
    log(
        LogLevel::Info,
        format!(
            "worker 0 of 1 starts training on {device:?} (generation {})",
            a.key.generation
        ),
    );
    let mut last_eval = std::time::Instant::now();
    let mut on_step = |s: &train::StepStats| {
        let _ = tx.send(Item::Metric(*s));
        if s.eval_loss.is_some() || last_eval.elapsed().as_secs() >= 10 {
            last_eval = std::time::Instant::now();
            let acc = s.eval_accuracy.map_or(String::new(), |a| {
                format!(", held-out accuracy {:.1}%", a * 100.0)
            });
            let _ = tx.send(Item::Log(
                LogLevel::Info,
                format!(
                    "step {}: loss {:.4}, {:.0} samples/s{}",
                    s.step, s.loss, s.samples_per_sec, acc
                ),
            ));
        }
    };
    // A bug or a libtorch assertion must fail the job, not kill the executor.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        train::run(&a.spec, device, 0, 1, &stop, &mut on_step)
    }))
    .unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        Err(train::TrainError::Unsupported(format!(
            "training failed inside libtorch: {}",
            what.lines().next().unwrap_or("")
        )))
    });
    let outcome = match result {
        Ok(out) => match write_weights(&object_store, a.key.job_id, &out.weights) {
            Ok(url) => {
                log(
                    LogLevel::Info,
                    format!("done after {} steps; weights written to {url}", out.steps),
                );
                RoleOutcome::Succeeded {
                    steps: out.steps,
                    final_loss: out.final_loss,
                    eval_loss: out.eval_loss,
                    eval_accuracy: out.eval_accuracy,
                    weights_url: url,
                }
            }
            Err(reason) => RoleOutcome::Failed { reason },
        },
        Err(train::TrainError::Stopped) => {
            log(
                LogLevel::Info,
                "stopped: the role was moved or the job ended".into(),
            );
            return;
        }
        Err(e) => RoleOutcome::Failed {
            reason: e.to_string(),
        },
    };
    if let RoleOutcome::Failed { reason } = &outcome {
        log(LogLevel::Error, reason.clone());
    }
    let _ = tx.send(Item::Outcome(outcome));
}

/// Writes the final weights to `{store}/{job}/final/model.safetensors`.
fn write_weights(
    store: &str,
    job: Uuid,
    weights: &[(String, tch::Tensor)],
) -> Result<String, String> {
    let root = store.strip_prefix("file://").ok_or_else(|| {
        format!("this executor writes to file:// object stores only so far, got {store}")
    })?;
    let dir = std::path::Path::new(root)
        .join(job.to_string())
        .join("final");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join("model.safetensors");
    tch::Tensor::write_safetensors(weights, &path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(format!("file://{}", path.display()))
}

/// Loads a TorchScript file and lists its trainable tensors.
fn inspect_file(url: &str) -> InspectionResult {
    let path = match crate::train::data::local_path(url) {
        Ok(p) => p,
        Err(e) => return InspectionResult::Error(e),
    };
    if !path.is_file() {
        return InspectionResult::Error(format!("{url}: no such file"));
    }
    let loaded =
        std::panic::catch_unwind(|| tch::CModule::load(&path).and_then(|m| m.named_parameters()));
    match loaded {
        Ok(Ok(params)) => InspectionResult::Parameters(
            params
                .into_iter()
                .map(|(name, t)| ParamInfo {
                    name,
                    shape: t.size().iter().map(|&d| d.max(0) as u64).collect(),
                })
                .collect(),
        ),
        Ok(Err(e)) => InspectionResult::Error(
            e.to_string()
                .lines()
                .next()
                .unwrap_or("unreadable")
                .to_owned(),
        ),
        Err(_) => InspectionResult::Error("libtorch crashed while loading the file".into()),
    }
}
