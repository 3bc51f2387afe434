//! The roles an executor runs, started and stopped as assignments change.
//!
//! A role is keyed by job, kind and index and stamped with the generation it
//! was started for; a new generation restarts it (its peers may have
//! changed), and a role no longer assigned is stopped. Each role runs on a
//! thread of its own with a [`Role`] ([`crate::role`]): a worker of an
//! allreduce job is a ring rank ([`crate::ring::worker`]), a worker of a
//! parameter-server job pulls and pushes through the shards
//! ([`crate::ps::run_worker`]), and a PS role serves its shard
//! ([`crate::ps::serve_shard`]) or stands by for it
//! ([`crate::ps::serve_standby`]).
//!
//! Elasticity: a role's state outlives its generation. When the next
//! generation arrives, the old role's thread stops and hands what it holds
//! (`Parked`: a worker's replica, a shard's values and optimizer state)
//! to the new role on the same device, or of the same shard. A shard's
//! standby keeps its state under its shard's number too, so when the
//! scheduler promotes it (the standby's role ends, the shard's starts on
//! this executor at the next generation) the shard takes the standby's
//! copy. [`inspect`] answers the API's requests to list a TorchScript
//! file's parameters.

pub mod inspect;
pub mod screen;

use crate::context::{CheckpointRequest, Context, StepProgress};
use crate::ps::{KeptWorker, LastStep, Shard};
use crate::replica::Replica;
use crate::reports::Reporter;
use crate::ring::worker::Kept;
use crate::role::Role;
use crate::storage::{OpenedStorage, Storage};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::unbounded_channel;
use trainyard_common::cluster::{
    Assignment, HeldDevice, Inspection, InspectionReport, InspectionResult, LogLevel, RoleKey,
    RoleKind, RoleProgress,
};
use trainyard_common::spec::{Device, Strategy};
use trainyard_dataplane::DataPlane;
use trainyard_shutdown::Shutdown;
use uuid::Uuid;

struct Running {
    key: RoleKey,
    stop: Shutdown,
    /// The scheduler's request for a checkpoint, as the role's policy sees it.
    checkpoint_wanted: CheckpointRequest,
    /// Its step progress (workers).
    progress: StepProgress,
}

/// What a worker's thread leaves for the next generation on its device.
#[derive(Default)]
struct Parked {
    replica: Option<Replica>,
    broke_at: Option<Instant>,
    shard: Option<Shard>,
    /// A PS worker's last sync step (its gradient per shard), for shards
    /// a lost primary left a version behind.
    ps_step: Option<LastStep>,
}

/// Whose state a hand-over carries: a worker's (by device) or a PS shard's
/// (by shard: its standby's state is the shard's too).
type Slot = (Uuid, RoleKind, u32);

/// The last thread of a slot, with the kind of device its worker used.
struct Handover {
    thread: JoinHandle<Parked>,
    device: Device,
}

/// A role let go whose thread (a drain checkpoint) or sandboxed model
/// process has not ended yet: its reaper joins the thread and drops what
/// it left, which kills the model process and waits for it.
struct Exiting {
    held: Option<HeldDevice>,
    /// Set by the reaper once what the role left is dropped.
    done: Arc<AtomicBool>,
    /// None when no thread could be started for it (its handle was
    /// dropped: the role's thread still ends on its stop).
    reaper: Option<JoinHandle<()>>,
}

impl Exiting {
    fn ended(&self) -> bool {
        self.reaper.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Whether it holds worker device `index` of `kind`.
    fn holds(&self, kind: Device, index: u32) -> bool {
        self.held
            .is_some_and(|h| h.kind == kind && h.index == index)
    }
}

/// The set of running roles.
pub struct Roles {
    running: BTreeMap<(Uuid, RoleKind, u32), Running>,
    sink: Arc<dyn Reporter>,
    /// Inspections started here, each with its cancel flag (set when the
    /// API stops asking: the job was cancelled or moved).
    inspecting: BTreeMap<Uuid, Shutdown>,
    plane: Arc<DataPlane>,
    /// The last worker thread of each (job, device): its replica goes to
    /// the next generation's worker there.
    handovers: Arc<Mutex<HashMap<Slot, Handover>>>,
    ctx: Context,
    /// Roles let go, still finishing (a drain checkpoint, a model process
    /// being killed); their devices are reported held until they end.
    finishing: Vec<Exiting>,
    /// The store opened for the URL the API gave.
    opened: Mutex<Option<(String, Arc<Storage>)>>,
    /// Jobs with roles here (whose folders are removed when they leave).
    jobs_here: std::collections::BTreeSet<Uuid>,
}

impl Roles {
    /// Roles that report to `sink`, talk to peers through `plane` and
    /// share `ctx` (its fetcher reaches the object stores).
    pub fn new(sink: Arc<dyn Reporter>, plane: Arc<DataPlane>, ctx: Context) -> Roles {
        Roles {
            running: BTreeMap::new(),
            sink,
            inspecting: Default::default(),
            plane,
            handovers: Default::default(),
            ctx,
            finishing: Vec::new(),
            opened: Mutex::new(None),
            jobs_here: Default::default(),
        }
    }

    /// What the roles share.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The store at `url`, opened once.
    fn storage(&self, url: &str) -> OpenedStorage {
        let mut opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((u, s)) = opened.as_ref() {
            if u == url {
                return Ok(s.clone());
            }
        }
        let s = Arc::new(self.ctx.fetcher.open(url).map_err(Arc::new)?);
        *opened = Some((url.to_owned(), s.clone()));
        Ok(s)
    }

    /// Starts inspecting the TorchScript files it was asked to, once each,
    /// and stops (kills the child of) those it is no longer asked to.
    pub fn inspect(&mut self, inspections: &[Inspection]) {
        // One the API no longer lists was answered, cancelled or moved:
        // its child (if still running) is killed and it is forgotten, so
        // that the job is inspected again if it comes back here.
        self.inspecting.retain(|job, cancel| {
            let listed = inspections.iter().any(|i| i.job_id == *job);
            if !listed {
                cancel.trigger();
            }
            listed
        });
        for i in inspections {
            if self.inspecting.contains_key(&i.job_id) {
                continue;
            }
            let cancel = Shutdown::new();
            self.inspecting.insert(i.job_id, cancel.clone());
            let (job_id, ins) = (i.job_id, i.clone());
            let sink = self.sink.clone();
            let fetcher = self.ctx.fetcher.with_policy(i.data_policy.clone());
            let (sandbox, limit) = (self.ctx.sandbox.clone(), self.ctx.inspection_timeout);
            tokio::spawn(async move {
                // The model runs in a child process that is killed at the
                // limit (a loop in TorchScript); the thread only waits.
                let work = tokio::task::spawn_blocking(move || {
                    inspect::inspect(&ins, &fetcher, &sandbox, limit, &cancel)
                });
                let result = match work.await {
                    Ok(found) => found,
                    Err(e) => InspectionResult::Error(format!("inspection crashed: {e}")),
                };
                sink.deliver_inspection(InspectionReport { job_id, result });
            });
        }
    }

    /// Waits up to `timeout` for the threads of roles let go to end (a
    /// draining rank writes its checkpoint on the way out).
    pub fn wait_stopped(&mut self, timeout: Duration) {
        let until = Instant::now() + timeout;
        while Instant::now() < until && self.finishing.iter().any(|t| !t.ended()) {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.finishing.retain(|t| !t.ended());
    }

    /// The devices of roles let go whose thread or model process has not
    /// ended yet (sent with each heartbeat: no other job is placed there
    /// until they are free).
    pub fn held(&mut self) -> Vec<HeldDevice> {
        self.finishing.retain(|t| !t.ended());
        let mut held: Vec<HeldDevice> = Vec::new();
        for d in self.finishing.iter().filter_map(|t| t.held) {
            if !held.contains(&d) {
                held.push(d);
            }
        }
        held
    }

    /// The roles running now, as reported in heartbeats.
    pub fn running(&self) -> Vec<RoleKey> {
        self.running.values().map(|r| r.key).collect()
    }

    /// What each running worker role is doing, for the heartbeat.
    pub fn progress(&self) -> Vec<RoleProgress> {
        self.running
            .values()
            .filter(|r| r.key.role == RoleKind::Worker)
            .map(|r| r.progress.snapshot(r.key))
            .collect()
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
                r.stop.trigger();
                tracing::info!(job = %r.key.job_id, role = ?r.key.role, index = r.key.index, generation = r.key.generation, "role stopped");
            }
        }
        // Replicas of jobs no longer assigned here are let go.
        if let Ok(mut h) = self.handovers.lock() {
            // A worker's state follows the job on its device; a shard's
            // only its own shard (as the shard or its standby).
            let gone: Vec<Slot> = h
                .keys()
                .filter(|(job, kind, index)| {
                    !wanted.iter().any(|((j, k, i), a)| {
                        j == job
                            && if *kind == RoleKind::Worker {
                                *k == RoleKind::Worker && a.device.unwrap_or(0) == *index
                            } else {
                                k.is_ps() && i == index
                            }
                    })
                })
                .copied()
                .collect();
            for slot in gone {
                if let Some(t) = h.remove(&slot) {
                    self.finishing.push(reap(slot, t));
                }
            }
            // A job with no role left here takes its folders (a script
            // rank's checkpoints) with it.
            let left: std::collections::BTreeSet<Uuid> = self
                .running
                .keys()
                .map(|k| k.0)
                .chain(wanted.keys().map(|k| k.0))
                .collect();
            for job in std::mem::take(&mut self.jobs_here) {
                if left.contains(&job) {
                    self.jobs_here.insert(job);
                } else {
                    crate::script::warm::spares().forget(job);
                    crate::script::relay::forget(job);
                    self.ctx.sandbox.forget_job(job);
                }
            }
            self.jobs_here.extend(wanted.keys().map(|k| k.0));
        }
        self.finishing.retain(|t| !t.ended());
        for (k, a) in wanted {
            if let Some(r) = self.running.get(&k) {
                r.checkpoint_wanted.set(a.checkpoint_wanted);
                continue;
            }
            let stop = Shutdown::new();
            let checkpoint_wanted = CheckpointRequest::default();
            checkpoint_wanted.set(a.checkpoint_wanted);
            let progress = StepProgress::new(a.spec.watchdog.window_steps);
            self.start(
                a.clone(),
                stop.clone(),
                checkpoint_wanted.clone(),
                progress.clone(),
            );
            self.running.insert(
                k,
                Running {
                    key: a.key,
                    stop,
                    checkpoint_wanted,
                    progress,
                },
            );
        }
    }

    fn start(
        &self,
        a: Assignment,
        stop: Shutdown,
        checkpoint_wanted: CheckpointRequest,
        progress: StepProgress,
    ) {
        let (tx, rx) = unbounded_channel();
        self.sink.deliver(a.key, rx);
        let storage = self.storage(&self.sink.object_store());
        let slot = match a.key.role {
            RoleKind::Worker => (a.key.job_id, RoleKind::Worker, a.device.unwrap_or(0)),
            // Kept by shard: a promoted standby's copy is the shard's state.
            _ => (a.key.job_id, RoleKind::Ps, a.key.index),
        };
        let Ok(mut handovers) = self.handovers.lock() else {
            return;
        };
        let previous = handovers.remove(&slot);
        let device = a.spec.resources.device;
        // A worker starts on its device once the roles let go there (another
        // job's, cancelled or moved) have ended, model process included.
        let before: Vec<Arc<AtomicBool>> = match a.key.role {
            RoleKind::Worker => self
                .finishing
                .iter()
                .filter(|e| e.holds(device, slot.2) && !e.ended())
                .map(|e| e.done.clone())
                .collect(),
            _ => Vec::new(),
        };
        // The role reads only what its job may (the API's data policy).
        let mut ctx = self.ctx.clone();
        ctx.fetcher = ctx.fetcher.with_policy(a.data_policy.clone());
        ctx.checkpoint_wanted = checkpoint_wanted;
        ctx.progress = progress;
        let role = Role {
            assignment: a,
            stop,
            tx,
            storage,
            plane: self.plane.clone(),
            ctx,
        };
        let handle = std::thread::Builder::new()
            .name(format!("worker-{}", role.assignment.key.index))
            .spawn(move || {
                let parked = previous
                    .and_then(|h| h.thread.join().ok())
                    .unwrap_or_default();
                while !role.stop.is_triggered() && before.iter().any(|d| !d.load(Ordering::Acquire))
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                run(&role, parked)
            });
        if let Ok(thread) = handle {
            handovers.insert(slot, Handover { thread, device });
        }
    }
}

/// Lets a slot's last thread finish on a thread of its own, which then
/// drops what it left (a replica's model process is killed and waited
/// for), so that the device counts as held until that is done.
fn reap(slot: Slot, h: Handover) -> Exiting {
    let (job_id, kind, index) = slot;
    let held = (kind == RoleKind::Worker).then_some(HeldDevice {
        job_id,
        kind: h.device,
        index,
    });
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    let reaper = std::thread::Builder::new()
        .name("reaper".into())
        .spawn(move || {
            drop(h.thread.join());
            flag.store(true, Ordering::Release);
        })
        .ok();
    if reaper.is_none() {
        done.store(true, Ordering::Release);
    }
    Exiting { held, done, reaper }
}

/// Runs one role for its generation; returns what it leaves for the next.
fn run(role: &Role, mut parked: Parked) -> Parked {
    let a = &role.assignment;
    // A replica whose module's process was killed (its last generation
    // ended mid-call) is not handed on: the new generation builds one and
    // takes the state from a peer or the checkpoint, as a new member does.
    parked.replica = parked.replica.filter(Replica::usable);
    if let Some(r) = parked.replica.as_mut() {
        // Its module's process now answers to this generation's stop.
        r.watch(role.stop.clone());
    }
    if a.key.role != RoleKind::Worker {
        let plane = &role.plane;
        let (stop, tx) = (&role.stop, &role.tx);
        let shard = match a.key.role {
            RoleKind::Standby => {
                crate::ps::serve_standby(a, a.key.index, stop, tx, plane, parked.shard)
            }
            _ => crate::ps::serve_shard(
                a,
                stop,
                tx,
                plane,
                parked.shard,
                role.storage.clone(),
                &role.ctx,
            ),
        };
        return Parked {
            shard,
            ..Parked::default()
        };
    }
    let placed = role
        .device()
        .and_then(|device| role.peers().map(|(rank, peers)| (device, rank, peers)));
    let (device, rank, peers) = match placed {
        Ok(p) => p,
        Err(e) => {
            role.fail(e.to_string());
            return Parked::default();
        }
    };
    let world = peers.len() as u32;
    role.log(
        LogLevel::Info,
        format!(
            "rank {rank} of {world} starts on {device:?} (generation {})",
            a.key.generation
        ),
    );
    if a.spec.is_script() {
        // A script's state is its own (its checkpoint folder): nothing is
        // handed to the next generation.
        crate::script::run(role, rank, &peers);
        return Parked::default();
    }
    if a.strategy == Strategy::ParameterServer {
        let kept = crate::ps::run_worker(
            role,
            rank,
            device,
            KeptWorker {
                replica: parked.replica,
                last_step: parked.ps_step,
            },
        );
        return Parked {
            replica: kept.replica,
            ps_step: kept.last_step,
            ..Parked::default()
        };
    }
    let kept = crate::ring::worker::run(
        role,
        rank,
        &peers,
        device,
        Kept {
            replica: parked.replica,
            broke_at: parked.broke_at,
        },
    );
    Parked {
        replica: kept.replica,
        broke_at: kept.broke_at,
        ..Parked::default()
    }
}
