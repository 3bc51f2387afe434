//! What one role's thread is given, and what every pattern's role does
//! alike.
//!
//! [`crate::roles::Roles`] starts each assigned role on a thread of its own
//! with a [`Role`]: its assignment, its stop signal (a
//! [`Shutdown`](trainyard_shutdown::Shutdown), triggered when its generation
//! ends), the channel its reports go through ([`crate::reports::Item`]s,
//! which [`crate::control::report`] delivers), the job's object store, the executor's data plane and the executor's
//! [`Context`]. The ring and PS loops use its shared steps: the job's log,
//! failing the job, the device and rank of a worker, checkpointing, loading
//! the committed checkpoint into a fresh replica, and rank 0's end (the
//! final weights to the object store and the job's outcome).

use crate::context::Context;
use crate::error::RoleError;
use crate::replica::optim::FlatOptimizer;
use crate::replica::{Outcome, Replica};
use crate::reports::Item;
use crate::storage::checkpoint::{self, Checkpointing, Policy, Uploader};
use crate::storage::{write_weights, OpenedStorage, Storage};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;
use trainyard_common::checkpoint::torchscript_key;
use trainyard_common::cluster::{Assignment, LogLevel, RoleOutcome, WorkerPeer};
use trainyard_common::spec::Device;
use trainyard_dataplane::DataPlane;
use trainyard_shutdown::Shutdown;

/// One role's thread's world.
pub struct Role {
    /// What the scheduler assigned.
    pub assignment: Assignment,
    /// Set when the role's generation ends or the role is let go.
    pub stop: Shutdown,
    /// The role's reports.
    pub tx: UnboundedSender<Item>,
    /// The job's object store (why not, when it cannot be opened).
    pub storage: OpenedStorage,
    /// This executor's data plane.
    pub plane: Arc<DataPlane>,
    /// What the executor's roles share.
    pub ctx: Context,
}

impl Role {
    /// A line of the job's log (and of this executor's).
    pub fn log(&self, level: LogLevel, msg: String) {
        tracing::info!(job = %self.assignment.key.job_id, "{msg}");
        let _ = self.tx.send(Item::Log(level, msg));
    }

    /// A phase of installing the job's packages (one of its events).
    pub fn packages(&self, phase: trainyard_common::cluster::PackagesPhase) {
        let _ = self.tx.send(Item::Packages(phase));
    }

    /// Fails the job with `reason`.
    pub fn fail(&self, reason: String) {
        self.log(LogLevel::Error, reason.clone());
        let _ = self.tx.send(Item::Outcome(RoleOutcome::Failed { reason }));
    }

    /// Ends the role with error `e`: a crash of its model's process is
    /// reported as one (the API retries the job a bounded number of
    /// times), a loss that is not finite as a divergence (the API fails the
    /// job with a `diverged` event); anything else fails the job.
    pub fn end(&self, e: &crate::error::RoleError) {
        let reason = e.to_string();
        if e.is_crash() {
            self.log(LogLevel::Error, reason.clone());
            let _ = self.tx.send(Item::Outcome(RoleOutcome::Crashed { reason }));
        } else if let Some(step) = e.diverged_at() {
            self.log(LogLevel::Error, reason.clone());
            let _ = self
                .tx
                .send(Item::Outcome(RoleOutcome::Diverged { step, reason }));
        } else {
            self.fail(reason);
        }
    }

    /// Where its replica's user module runs: this executor's sandbox, the
    /// per-call limit, this role's stop signal.
    pub fn host(&self) -> crate::replica::process::Host {
        crate::replica::process::Host {
            sandbox: self.ctx.sandbox.clone(),
            timeout: self.ctx.inspection_timeout,
            stop: self.stop.clone(),
            grace: crate::replica::process::STOP_GRACE,
        }
    }

    /// Whether the role was told to stop.
    pub fn stopping(&self) -> bool {
        self.stop.is_triggered()
    }

    /// The device a worker trains on.
    pub fn device(&self) -> Result<tch::Device, RoleError> {
        let a = &self.assignment;
        match a.spec.resources.device {
            Device::Cuda if tch::Cuda::is_available() => {
                Ok(tch::Device::Cuda(a.device.unwrap_or(0) as usize))
            }
            Device::Cuda => Err(RoleError::Assignment(
                "the job asks for cuda but libtorch sees no CUDA device on this executor".into(),
            )),
            Device::Cpu => Ok(tch::Device::Cpu),
        }
    }

    /// The job's workers in rank order and this worker's rank among them.
    pub fn peers(&self) -> Result<(u32, Vec<&WorkerPeer>), RoleError> {
        let a = &self.assignment;
        let mut peers: Vec<&WorkerPeer> = a.workers.iter().collect();
        peers.sort_by_key(|p| p.rank);
        let rank = peers
            .iter()
            .position(|p| p.rank == a.key.index)
            .ok_or_else(|| {
                RoleError::Assignment(format!(
                    "worker {} is not among the job's workers in its own assignment",
                    a.key.index
                ))
            })?;
        Ok((rank as u32, peers))
    }

    /// The job's checkpoint policy and a writer into its object store; none
    /// (with a warning in the job's log) when the store cannot be opened.
    pub fn checkpointing(&self) -> Option<Checkpointing> {
        match &self.storage {
            Ok(s) => Some(Checkpointing {
                policy: self.policy(),
                uploader: self.uploader(s.clone()),
                generation: self.assignment.key.generation,
            }),
            Err(e) => {
                self.log(
                    LogLevel::Warn,
                    format!("no checkpoints: the object store cannot be opened: {e}"),
                );
                None
            }
        }
    }

    /// The job's checkpoint policy, which a drain of this executor and the
    /// scheduler's request (before a preemption) move.
    pub fn policy(&self) -> Policy {
        Policy::new(self.assignment.spec.checkpoint, self.ctx.drain.clone())
            .asked_by(self.ctx.checkpoint_wanted.clone())
    }

    /// A checkpoint writer into `storage` for this role's job.
    pub fn uploader(&self, storage: Arc<Storage>) -> Uploader {
        Uploader::start(
            storage,
            self.assignment.key.job_id,
            self.tx.clone(),
            self.ctx.uploads.clone(),
            self.ctx.hooks.upload_delay,
        )
    }

    /// Loads the checkpoint the assignment resumes from (the job's newest
    /// committed one, or the one its spec names) into `r`.
    pub fn resume_into(&self, r: &mut Replica) -> Result<(), RoleError> {
        let a = &self.assignment;
        let (Some(at), Ok(s)) = (a.resume.as_ref(), self.storage.as_ref()) else {
            return Err(RoleError::Assignment("no checkpoint to resume from".into()));
        };
        let states = FlatOptimizer::state_tensors(a.spec.optimizer().kind);
        let all = r.ranges(0, r.numel());
        let hits = s.cache.hits.load(Ordering::Relaxed);
        let loaded = checkpoint::load(s, at, &all, r.numel() as u64, states)?;
        r.restore(&loaded)?;
        let warm = s.cache.hits.load(Ordering::Relaxed) - hits;
        self.log(
            LogLevel::Info,
            format!(
                "resumed from the checkpoint of step {} (job {}){}",
                loaded.step,
                at.job_id,
                if warm > 0 {
                    format!(", {warm} shard(s) read from the local cache")
                } else {
                    String::new()
                }
            ),
        );
        Ok(())
    }

    /// Rank 0's end: the weights (and, for a TorchScript job, the trained
    /// module, saved from `replica` here alone, not on every rank) to the
    /// object store, and the job's outcome.
    pub fn finish(&self, out: &Outcome, replica: Option<&Replica>) {
        let module = replica.map_or(Ok(None), |r| r.torchscript().map_err(|e| e.to_string()));
        let written = self
            .storage
            .as_ref()
            .map_err(|e| format!("cannot open the object store: {e}"))
            .and_then(|s| {
                let job = self.assignment.key.job_id;
                // The module first: the safetensors' URL is what says the
                // job's model is there.
                match module {
                    Ok(Some(bytes)) => s
                        .put(&torchscript_key(job), bytes.into())
                        .map_err(|e| format!("cannot write the trained module: {e}"))?,
                    Ok(None) => {}
                    Err(e) => return Err(format!("cannot save the trained module: {e}")),
                }
                write_weights(s, job, &out.weights).map_err(|e| e.to_string())
            });
        let outcome = match written {
            Ok(url) => {
                let _ = self.tx.send(Item::Log(
                    LogLevel::Info,
                    format!("done after {} steps; weights written to {url}", out.steps),
                ));
                RoleOutcome::Succeeded {
                    steps: out.steps,
                    final_loss: out.final_loss,
                    eval_loss: out.eval_loss,
                    eval_accuracy: out.eval_accuracy,
                    weights_url: url,
                }
            }
            Err(reason) => {
                let _ = self.tx.send(Item::Log(LogLevel::Error, reason.clone()));
                RoleOutcome::Failed { reason }
            }
        };
        let _ = self.tx.send(Item::Outcome(outcome));
    }
}
