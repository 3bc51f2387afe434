//! The roles an executor runs, started and stopped as assignments change.
//!
//! A role is keyed by job, kind and index and stamped with the generation it
//! was started for; a new generation restarts it (its peers may have
//! changed), and a role no longer assigned is stopped.
//!
//! A worker of an allreduce job is a rank of a ring ([`trainyard_dataplane`];
//! a ring of one for a single worker) and trains on a thread of its own:
//! it connects to its neighbours through this executor's data plane, joins
//! the ring's state ([`crate::train::join`]: a new member receives weights
//! and optimizer state from the most advanced one) and trains
//! ([`crate::train::train`]), reporting metrics (rank 0), logs and the
//! outcome through [`crate::report`]. Rank 0 writes the final weights as
//! safetensors to the object store; every rank logs the SHA-256 of its
//! weights, which are bit-identical.
//!
//! Elasticity: the replica outlives its generation. When the ring breaks (a
//! peer died) the rank keeps its replica at the last completed step and
//! retries; when the scheduler sends the next generation, the old role's
//! thread stops and hands its replica to the new role on the same device,
//! which rebuilds the ring with the new membership and resumes.
//!
//! Parameter-server jobs: a PS role serves its shard ([`crate::ps`]) and a
//! worker pulls and pushes through the shards; both hand their state (the
//! shard's values and optimizer state, the worker's model and newest pulled
//! weights) to the next generation's role on this executor the same way.
//! A shard's standby ([`crate::ps::serve_standby`]) is a PS role whose
//! state is kept under its shard's number too, so when the scheduler
//! promotes it (the standby's role ends, the shard's starts on this
//! executor at the next generation) the shard takes the standby's copy.

use crate::checkpoint::{self, Checkpointing, Policy, Storage, Uploader};
use crate::report::{self, Item, Sink};
use crate::train::{self, Replica, TrainError};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use trainyard_common::cluster::{
    ps_index_shard, Assignment, Inspection, InspectionReport, InspectionResult, LogLevel, RoleKey,
    RoleKind, RoleOutcome, WorkerPeer,
};
use trainyard_common::model::ParamInfo;
use trainyard_common::spec::{Device, Strategy};
use trainyard_dataplane::{DataPlane, Ring, RingConfig};
use uuid::Uuid;

struct Running {
    key: RoleKey,
    stop: Arc<AtomicBool>,
}

/// How long a rank waits for its neighbours to connect before it retries.
pub const RING_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one collective waits for a silent peer (a dead peer's closed
/// connection is noticed at once; this bounds a hung one).
pub const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(60);

/// What a worker's thread leaves for the next generation on its device.
#[derive(Default)]
struct Parked {
    replica: Option<Replica>,
    broke_at: Option<Instant>,
    shard: Option<crate::ps::Shard>,
    /// A PS worker's last sync step (its gradient per shard), for shards
    /// a lost primary left a version behind.
    ps_step: Option<crate::ps::LastStep>,
}

/// Whose state a hand-over carries: a worker's (by device) or a PS shard's
/// (by shard: its standby's state is the shard's too).
type Slot = (Uuid, RoleKind, u32);

type Handover = JoinHandle<Parked>;

/// The set of running roles.
#[derive(Default)]
pub struct Roles {
    running: BTreeMap<(Uuid, RoleKind, u32), Running>,
    sink: Option<Sink>,
    inspecting: std::collections::BTreeSet<Uuid>,
    plane: Option<Arc<DataPlane>>,
    /// The last worker thread of each (job, device): its replica goes to
    /// the next generation's worker there.
    handovers: Arc<Mutex<HashMap<Slot, Handover>>>,
    storage: Option<StorageSetup>,
    /// Threads of roles let go, still finishing (a drain checkpoint).
    finishing: Vec<Handover>,
    /// The store opened for the URL the API gave.
    opened: Mutex<Option<(String, Arc<Storage>)>>,
}

/// How roles reach the object store.
#[derive(Clone)]
pub struct StorageSetup {
    /// Object-store options (`aws_endpoint=…`, …).
    pub options: Vec<(String, String)>,
    /// The local cache tier.
    pub cache: Arc<trainyard_store::cache::Cache>,
    /// The runtime the store's I/O runs on.
    pub rt: tokio::runtime::Handle,
}

impl Roles {
    /// Roles that report to `sink`, talk to peers through `plane` and
    /// keep checkpoints and weights in the store `storage` reaches.
    pub fn new(sink: Sink, plane: Arc<DataPlane>, storage: StorageSetup) -> Roles {
        // Datasets and TorchScript files at object-store URLs go through
        // the same stores and cache.
        let _ = checkpoint::FETCH.set(storage.clone());
        Roles {
            running: BTreeMap::new(),
            sink: Some(sink),
            inspecting: Default::default(),
            plane: Some(plane),
            handovers: Default::default(),
            storage: Some(storage),
            finishing: Vec::new(),
            opened: Mutex::new(None),
        }
    }

    /// The store at `url`, opened once.
    fn storage(&self, url: &str) -> Result<Arc<Storage>, String> {
        let setup = self.storage.as_ref().ok_or("no object store configured")?;
        let mut opened = self.opened.lock().map_err(|_| "poisoned")?;
        if let Some((u, s)) = opened.as_ref() {
            if u == url {
                return Ok(s.clone());
            }
        }
        let s = Arc::new(Storage::open(
            url,
            &setup.options,
            setup.cache.clone(),
            setup.rt.clone(),
        )?);
        *opened = Some((url.to_owned(), s.clone()));
        Ok(s)
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
                // Until the API takes it (or refuses it for good, a 4xx):
                // giving up would leave the job `inspecting` for ever, and
                // the API may be down for a while (restarts, Postgres).
                for attempt in 0u32.. {
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
                            if attempt % 20 == 19 {
                                tracing::warn!(job = %job_id, attempts = attempt + 1, "the API has not taken the inspection yet; still trying");
                            }
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

    /// Waits up to `timeout` for the threads of roles let go to end (a
    /// draining rank writes its checkpoint on the way out).
    pub fn wait_stopped(&mut self, timeout: Duration) {
        let until = Instant::now() + timeout;
        while Instant::now() < until && self.finishing.iter().any(|t| !t.is_finished()) {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.finishing.retain(|t| !t.is_finished());
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
        // Replicas of jobs no longer assigned here are let go.
        if let Ok(mut h) = self.handovers.lock() {
            // A worker's state follows the job on this executor's devices; a
            // shard's only its own shard (as the shard or its standby).
            let gone: Vec<Slot> = h
                .keys()
                .filter(|(job, kind, index)| {
                    !wanted.keys().any(|(j, k, i)| {
                        j == job
                            && k == kind
                            && (*kind == RoleKind::Worker || ps_index_shard(*i).0 == *index)
                    })
                })
                .copied()
                .collect();
            for slot in gone {
                if let Some(t) = h.remove(&slot) {
                    self.finishing.push(t);
                }
            }
        }
        self.finishing.retain(|t| !t.is_finished());
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
        let object_store = self
            .sink
            .as_ref()
            .and_then(|s| s.object_store.read().ok().map(|o| o.clone()))
            .unwrap_or_default();
        let storage = self.storage(&object_store);
        let slot = match a.key.role {
            RoleKind::Worker => (a.key.job_id, RoleKind::Worker, a.device.unwrap_or(0)),
            other => (a.key.job_id, other, ps_index_shard(a.key.index).0),
        };
        let Ok(mut handovers) = self.handovers.lock() else {
            return;
        };
        let previous = handovers.remove(&slot);
        let plane = self.plane.clone();
        let handle = std::thread::Builder::new()
            .name(format!("worker-{}", a.key.index))
            .spawn(move || {
                let parked = previous.and_then(|h| h.join().ok()).unwrap_or_default();
                if a.key.role == RoleKind::Worker {
                    return worker(a, stop, tx, storage, plane, parked);
                }
                let Some(plane) = plane else {
                    return Parked::default();
                };
                let shard = match ps_index_shard(a.key.index) {
                    (shard, true) => {
                        crate::ps::serve_standby(&a, shard, &stop, &tx, &plane, parked.shard)
                    }
                    _ => crate::ps::serve_shard(&a, &stop, &tx, &plane, parked.shard, storage),
                };
                Parked {
                    shard,
                    ..Parked::default()
                }
            });
        if let Ok(h) = handle {
            handovers.insert(slot, h);
        }
    }
}

/// Runs `f`, turning a panic (a bug, or an assertion inside libtorch) into a
/// training error that fails the job instead of killing the executor.
fn guarded<T>(f: impl FnOnce() -> Result<T, TrainError>) -> Result<T, TrainError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        Err(TrainError::Unsupported(format!(
            "training failed inside libtorch: {}",
            what.lines().next().unwrap_or("")
        )))
    })
}

/// Sleeps up to `d`, returning early (true) once `stop` is set.
fn pause(d: Duration, stop: &AtomicBool) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.load(Ordering::Relaxed)
}

/// A rank's life in one generation; returns its replica for the next.
fn worker(
    a: Assignment,
    stop: Arc<AtomicBool>,
    tx: UnboundedSender<Item>,
    storage: Result<Arc<Storage>, String>,
    plane: Option<Arc<DataPlane>>,
    parked: Parked,
) -> Parked {
    let Parked {
        mut replica,
        mut broke_at,
        ps_step,
        ..
    } = parked;
    let log = |level, msg: String| {
        tracing::info!(job = %a.key.job_id, "{msg}");
        let _ = tx.send(Item::Log(level, msg));
    };
    let fail = |reason: String| {
        log(LogLevel::Error, reason.clone());
        let _ = tx.send(Item::Outcome(RoleOutcome::Failed { reason }));
        Parked::default()
    };
    let device = match a.spec.resources.device {
        Device::Cuda if tch::Cuda::is_available() => {
            tch::Device::Cuda(a.device.unwrap_or(0) as usize)
        }
        Device::Cuda => {
            return fail(
                "the job asks for cuda but libtorch sees no CUDA device on this executor".into(),
            )
        }
        Device::Cpu => tch::Device::Cpu,
    };
    let mut peers: Vec<&WorkerPeer> = a.workers.iter().collect();
    peers.sort_by_key(|p| p.rank);
    let Some(rank) = peers.iter().position(|p| p.rank == a.key.index) else {
        return fail(format!(
            "worker {} is not among the job's workers in its own assignment",
            a.key.index
        ));
    };
    let (rank, world) = (rank as u32, peers.len() as u32);
    let config = RingConfig {
        job: a.key.job_id,
        generation: a.key.generation,
        rank,
        peers: peers.iter().map(|p| p.address.clone()).collect(),
        secret: a.secret.clone().into_bytes(),
        connect_timeout: RING_CONNECT_TIMEOUT,
        collective_timeout: COLLECTIVE_TIMEOUT,
    };
    log(
        LogLevel::Info,
        format!(
            "rank {rank} of {world} starts on {device:?} (generation {})",
            a.key.generation
        ),
    );
    if a.strategy == Strategy::ParameterServer {
        return ps_worker(&a, rank, device, replica, ps_step, &stop, &tx, &storage);
    }
    let mut ckpt = match &storage {
        Ok(s) => Some(Checkpointing {
            policy: Policy::new(a.spec.checkpoint),
            uploader: Uploader::start(s.clone(), a.key.job_id, tx.clone()),
            generation: a.key.generation,
        }),
        Err(e) => {
            log(
                LogLevel::Warn,
                format!("no checkpoints: the object store cannot be opened: {e}"),
            );
            None
        }
    };
    // Where a rank without state starts: the job's newest committed
    // checkpoint (or the one its spec resumes from).
    let resume = |r: &mut Replica| -> Result<(), String> {
        let (Some(at), Ok(s)) = (a.resume.as_ref(), storage.as_ref()) else {
            return Err("no checkpoint to resume from".into());
        };
        let states = crate::train::optim::FlatOptimizer::state_tensors(a.spec.optimizer.kind);
        let all = trainyard_common::checkpoint::flat_to_ranges(&r.layout(), 0, r.numel());
        let hits = s.cache.hits.load(Ordering::Relaxed);
        let loaded = checkpoint::load(s, at, &all, r.numel() as u64, states)?;
        r.restore(&loaded).map_err(|e| e.to_string())?;
        let warm = s.cache.hits.load(Ordering::Relaxed) - hits;
        log(
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
    };
    // A drained rank leaves a whole checkpoint (it holds the whole state).
    let drain_checkpoint = |replica: &Option<Replica>, ckpt: &mut Option<Checkpointing>| {
        let (Some(r), Some(c)) = (replica.as_ref(), ckpt.as_mut()) else {
            return;
        };
        if !checkpoint::DRAINING.load(Ordering::Relaxed)
            || c.policy.last_step() == Some(r.step)
            || r.step == 0
        {
            return;
        }
        log(
            LogLevel::Info,
            format!("draining: writing a checkpoint of step {}", r.step),
        );
        train::write_slice(r, c, 0, 1);
        c.uploader.flush(Duration::from_secs(60));
    };
    // Trained to the end (and stays around to be joined).
    let mut done = false;
    loop {
        if stop.load(Ordering::Relaxed) {
            drain_checkpoint(&replica, &mut ckpt);
            return Parked {
                replica,
                broke_at,
                shard: None,
                ps_step: None,
            };
        }
        let mut ring = if world == 1 {
            Ring::solo()
        } else {
            let Some(plane) = plane.as_deref() else {
                return fail("this executor has no data plane to build a ring with".into());
            };
            match Ring::connect(plane, &config, &stop) {
                Ok(r) => r,
                Err(e) => {
                    if !stop.load(Ordering::Relaxed) && !done {
                        log(LogLevel::Warn, format!("{e}; retrying"));
                    }
                    if pause(Duration::from_millis(500), &stop) {
                        return Parked {
                            replica,
                            broke_at,
                            shard: None,
                            ps_step: None,
                        };
                    }
                    continue;
                }
            }
        };
        let result = guarded(|| {
            let load: &dyn Fn(&mut Replica) -> Result<(), String> = &resume;
            let source = train::join(
                &mut ring,
                &mut replica,
                &a.spec,
                device,
                &stop,
                a.resume.as_ref().map(|_| load),
            )?;
            let Some(r) = replica.as_mut() else {
                return Err(TrainError::Unsupported("no replica after joining".into()));
            };
            match source.filter(|_| world > 1) {
                Some(s) if s != rank => log(
                    LogLevel::Info,
                    format!(
                        "received weights and optimizer state of step {} from rank {s}",
                        r.step
                    ),
                ),
                Some(_) => log(
                    LogLevel::Info,
                    format!(
                        "sent weights and optimizer state of step {} to the ring",
                        r.step
                    ),
                ),
                None => {}
            }
            let mut last_log = Instant::now();
            let slow = crate::ps::slow_ms(rank).map(Duration::from_millis);
            let mut on_step = |s: &train::StepStats| {
                if let Some(d) = slow {
                    std::thread::sleep(d);
                }
                if let Some(t) = broke_at.take() {
                    log(
                        LogLevel::Info,
                        format!(
                            "ring of {world} rebuilt (generation {}): first step {} ran {:.2} s after the previous ring broke",
                            a.key.generation,
                            s.step,
                            t.elapsed().as_secs_f64()
                        ),
                    );
                }
                if rank != 0 {
                    return;
                }
                let _ = tx.send(Item::Metric(*s));
                if s.eval_loss.is_some() || last_log.elapsed().as_secs() >= 10 {
                    last_log = Instant::now();
                    let acc = s.eval_accuracy.map_or(String::new(), |a| {
                        format!(", held-out accuracy {:.1}%", a * 100.0)
                    });
                    let _ = tx.send(Item::Log(
                        LogLevel::Info,
                        format!(
                            "step {}: loss {:.4}, {:.0} samples/s, all-reduce {:.1} ms ({:.2} GB/s bus){}",
                            s.step,
                            s.loss,
                            s.samples_per_sec,
                            s.comm_seconds * 1e3,
                            s.comm_bytes as f64 / s.comm_seconds.max(1e-9) / 1e9,
                            acc
                        ),
                    ));
                }
            };
            train::train_with(r, &mut ring, &stop, &mut on_step, ckpt.as_mut())
        });
        match result {
            Ok(out) => {
                if !done {
                    let bw = ring.stats().bytes_sent.load(Ordering::Relaxed);
                    log(
                        LogLevel::Info,
                        format!(
                            "rank {rank} of {world} done at step {}: weights sha256 {} ({} MiB sent on the ring)",
                            out.steps,
                            out.weights_sha256,
                            bw >> 20
                        ),
                    );
                    if rank == 0 {
                        // The final checkpoint is in before the job ends.
                        if let Some(c) = ckpt.as_ref() {
                            c.uploader.flush(Duration::from_secs(120));
                        }
                        finish(&a, &out, &storage, &tx);
                    }
                }
                done = true;
                // The finished replica is kept: a generation that arrives
                // before the outcome was applied resumes from it (zero steps
                // to go) instead of from scratch.
                if rank == 0 {
                    return Parked {
                        replica,
                        broke_at,
                        shard: None,
                        ps_step: None,
                    };
                }
                // The other ranks stay joinable until the job ends: if rank
                // 0's last collective failed where theirs succeeded, it
                // rebuilds the ring with them and receives the final state.
                drop(ring);
                if pause(Duration::from_millis(500), &stop) {
                    return Parked {
                        replica,
                        broke_at,
                        shard: None,
                        ps_step: None,
                    };
                }
            }
            Err(TrainError::Stopped) => {
                drain_checkpoint(&replica, &mut ckpt);
                return Parked {
                    replica,
                    broke_at,
                    shard: None,
                    ps_step: None,
                };
            }
            Err(TrainError::Ring(e)) => {
                if stop.load(Ordering::Relaxed) {
                    drain_checkpoint(&replica, &mut ckpt);
                    return Parked {
                        replica,
                        broke_at,
                        shard: None,
                        ps_step: None,
                    };
                }
                broke_at.get_or_insert_with(Instant::now);
                log(
                    LogLevel::Warn,
                    format!(
                        "{e} at step {}: keeping the replica and waiting for the ring to form again",
                        replica.as_ref().map_or(0, |r| r.step)
                    ),
                );
                drop(ring);
                if pause(Duration::from_millis(500), &stop) {
                    return Parked {
                        replica,
                        broke_at,
                        shard: None,
                        ps_step: None,
                    };
                }
            }
            Err(e) => return fail(e.to_string()),
        }
    }
}

/// A PS worker's life in one generation: trains until done, retrying when a
/// shard is unreachable (until the scheduler's next generation).
#[allow(clippy::too_many_arguments)]
fn ps_worker(
    a: &Assignment,
    rank: u32,
    device: tch::Device,
    mut replica: Option<Replica>,
    mut ps_step: Option<crate::ps::LastStep>,
    stop: &AtomicBool,
    tx: &UnboundedSender<Item>,
    storage: &Result<Arc<Storage>, String>,
) -> Parked {
    let log = |level, msg: String| {
        tracing::info!(job = %a.key.job_id, "{msg}");
        let _ = tx.send(Item::Log(level, msg));
    };
    loop {
        if stop.load(Ordering::Relaxed) {
            return Parked {
                replica,
                ps_step,
                ..Parked::default()
            };
        }
        let result =
            guarded(|| crate::ps::work(a, rank, device, &mut replica, &mut ps_step, stop, tx));
        match result {
            // The finished model is kept for a generation that may still come.
            Ok(Some(out)) => {
                finish(a, &out, storage, tx);
                return Parked {
                    replica,
                    ps_step,
                    ..Parked::default()
                };
            }
            Ok(None) => {
                return Parked {
                    replica,
                    ps_step,
                    ..Parked::default()
                }
            }
            Err(TrainError::Stopped) => {
                return Parked {
                    replica,
                    ps_step,
                    ..Parked::default()
                }
            }
            Err(TrainError::Ring(e)) => {
                if !stop.load(Ordering::Relaxed) {
                    log(
                        LogLevel::Warn,
                        format!("{e}: keeping the model and retrying until the next generation"),
                    );
                }
                if pause(Duration::from_millis(500), stop) {
                    return Parked {
                        replica,
                        ps_step,
                        ..Parked::default()
                    };
                }
            }
            Err(e) => {
                let reason = e.to_string();
                log(LogLevel::Error, reason.clone());
                let _ = tx.send(Item::Outcome(RoleOutcome::Failed { reason }));
                return Parked::default();
            }
        }
    }
}

/// Rank 0's end: the weights to the object store and the job's outcome.
fn finish(
    a: &Assignment,
    out: &train::Outcome,
    storage: &Result<Arc<Storage>, String>,
    tx: &UnboundedSender<Item>,
) {
    let written = storage
        .as_ref()
        .map_err(|e| format!("cannot open the object store: {e}"))
        .and_then(|s| write_weights(s, a.key.job_id, &out.weights));
    let outcome = match written {
        Ok(url) => {
            let _ = tx.send(Item::Log(
                LogLevel::Info,
                format!("done after {} steps; weights written to {url}", out.steps),
            ));
            RoleOutcome::Succeeded {
                steps: out.steps,
                // JSON has no NaN: a report carrying one would be refused
                // (and retried) forever.
                final_loss: if out.final_loss.is_finite() {
                    out.final_loss
                } else {
                    f64::MAX
                },
                eval_loss: out.eval_loss,
                eval_accuracy: out.eval_accuracy,
                weights_url: url,
            }
        }
        Err(reason) => {
            let _ = tx.send(Item::Log(LogLevel::Error, reason.clone()));
            RoleOutcome::Failed { reason }
        }
    };
    let _ = tx.send(Item::Outcome(outcome));
}

/// Writes the final weights to `{store}/{job}/final/model.safetensors`
/// (through a local file: libtorch writes safetensors to paths).
fn write_weights(
    storage: &Storage,
    job: Uuid,
    weights: &[(String, tch::Tensor)],
) -> Result<String, String> {
    let tmp = storage.cache.dir().join(format!(
        "final-{job}-{}.safetensors.tmp",
        std::process::id()
    ));
    tch::Tensor::write_safetensors(weights, &tmp)
        .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    let bytes = std::fs::read(&tmp).map_err(|e| format!("cannot read {}: {e}", tmp.display()));
    let _ = std::fs::remove_file(&tmp);
    let key = trainyard_common::checkpoint::model_key(job);
    storage.put(&key, bytes?.into())?;
    Ok(storage.store.url_of(&key))
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
