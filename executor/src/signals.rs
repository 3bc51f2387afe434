//! Signals between the executor's layers, kept below all of them so that no
//! layer has to import one above it: whether the executor drains, whether
//! the scheduler asks a role's job for a checkpoint, how many checkpoint
//! shards are on their way, where a role asks for its peers to be checked
//! after a data-plane connection broke, and how far a role is in its step.
//! Each is a cheap clone of one shared cell.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use trainyard_common::cluster::{RoleKey, RoleProgress, StepPhase};

/// Whether the executor drains, shared by everything that must know.
#[derive(Debug, Clone, Default)]
pub struct Drain(Arc<AtomicBool>);

impl Drain {
    /// Marks the executor as draining (it never stops draining).
    pub fn start(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the executor drains.
    pub fn is_draining(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Whether the scheduler asks one role's job for a checkpoint (before it
/// preempts the job), as its heartbeats say. Each request that opens
/// gets a number of its own, so a checkpoint policy answers every request
/// once, also a later one after an earlier was called off.
#[derive(Debug, Clone, Default)]
pub struct CheckpointRequest(Arc<AtomicU64>);

impl CheckpointRequest {
    /// Opens a request (`true`) or closes it (`false`); the same state
    /// again changes nothing. An odd count is an open request.
    pub fn set(&self, wanted: bool) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (wanted != (n % 2 == 1)).then_some(n + 1)
            });
    }

    /// The open request's number, if one is open.
    pub fn open(&self) -> Option<u64> {
        let n = self.0.load(Ordering::Relaxed);
        (n % 2 == 1).then_some(n)
    }
}

/// Checkpoint shards handed to an uploader whose report the API has not
/// acknowledged yet.
#[derive(Debug, Clone, Default)]
pub struct PendingUploads(Arc<AtomicUsize>);

impl PendingUploads {
    /// One more shard on its way.
    pub fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` shards arrived (or were given up).
    pub fn done(&self, n: usize) {
        // Saturating: a report the API took twice must not wrap around.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
    }

    /// Shards on their way now.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// A role's request to look at its job's peers after a data-plane
/// connection broke: the agent probes each peer's data-plane address and
/// reports those that do not answer ([`crate::control::suspects`]).
#[derive(Debug, Clone)]
pub struct PeerCheck {
    /// The job.
    pub job_id: uuid::Uuid,
    /// The generation of the role that saw the failure.
    pub generation: i64,
    /// Every peer of the job in that generation: executor id and address.
    pub peers: Vec<(uuid::Uuid, String)>,
    /// What the role saw.
    pub reason: String,
}

/// Where roles send [`PeerCheck`]s; without a channel (unit tests) a check
/// goes nowhere.
#[derive(Debug, Clone, Default)]
pub struct Suspicions(Option<tokio::sync::mpsc::UnboundedSender<PeerCheck>>);

impl Suspicions {
    /// Checks go to `tx`.
    pub fn new(tx: tokio::sync::mpsc::UnboundedSender<PeerCheck>) -> Suspicions {
        Suspicions(Some(tx))
    }

    /// Asks for a look at every peer of assignment `a` (its workers, shards
    /// and standbys) because of `reason`; returns at once.
    pub fn check(&self, a: &trainyard_common::cluster::Assignment, reason: impl Into<String>) {
        let Some(tx) = &self.0 else { return };
        let mut peers: Vec<(uuid::Uuid, String)> = a
            .workers
            .iter()
            .map(|w| (w.executor_id, w.address.clone()))
            .chain(
                a.parameter_servers
                    .iter()
                    .map(|p| (p.executor_id, p.address.clone())),
            )
            .collect();
        peers.sort();
        peers.dedup();
        let _ = tx.send(PeerCheck {
            job_id: a.key.job_id,
            generation: a.key.generation,
            peers,
            reason: reason.into(),
        });
    }
}

/// One training role's progress, written by its thread at each phase
/// change and read by the heartbeat ([`StepProgress::snapshot`]): what the
/// scheduler's stuck check and the straggler figures are made of. A
/// thread stuck in a phase cannot say so, but the heartbeat, on another
/// thread, still sees since when it has been there.
#[derive(Debug, Clone, Default)]
pub struct StepProgress(Arc<std::sync::Mutex<ProgressState>>);

#[derive(Debug)]
struct ProgressState {
    step: u64,
    phase: StepPhase,
    since: std::time::Instant,
    /// When the previous step completed.
    last_done: Option<std::time::Instant>,
    /// Recent steps: (wall seconds, seconds of its own work).
    recent: std::collections::VecDeque<(f64, f64)>,
    window: usize,
    /// Seconds of evaluation and checkpoint writing since the previous
    /// step: not part of any step's time.
    paused: f64,
}

impl Default for ProgressState {
    fn default() -> Self {
        ProgressState {
            step: 0,
            phase: StepPhase::Setup,
            since: std::time::Instant::now(),
            last_done: None,
            recent: std::collections::VecDeque::new(),
            window: 50,
            paused: 0.0,
        }
    }
}

impl StepProgress {
    /// A fresh record (in setup) whose figures are over the last `window`
    /// steps.
    pub fn new(window: u32) -> StepProgress {
        let p = StepProgress::default();
        p.with(|s| s.window = (window as usize).max(1));
        p
    }

    fn with<T>(&self, f: impl FnOnce(&mut ProgressState) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The role now does `phase`.
    pub fn enter(&self, phase: StepPhase) {
        self.with(|s| {
            if s.phase != phase {
                let now = std::time::Instant::now();
                if matches!(s.phase, StepPhase::Eval | StepPhase::Checkpoint) {
                    s.paused += now.duration_since(s.since).as_secs_f64();
                }
                s.phase = phase;
                s.since = now;
            }
        });
    }

    /// Step `step` completed, `comm_seconds` of it waiting on peers; the
    /// role goes on to wait for its next batch.
    pub fn step_done(&self, step: u64, comm_seconds: f64) {
        self.with(|s| {
            let now = std::time::Instant::now();
            if matches!(s.phase, StepPhase::Eval | StepPhase::Checkpoint) {
                s.paused += now.duration_since(s.since).as_secs_f64();
            }
            if let Some(prev) = s.last_done {
                let wall = (now.duration_since(prev).as_secs_f64() - s.paused).max(0.0);
                s.recent.push_back((wall, (wall - comm_seconds).max(0.0)));
                while s.recent.len() > s.window {
                    s.recent.pop_front();
                }
            }
            s.paused = 0.0;
            s.last_done = Some(now);
            s.step = step;
            s.phase = StepPhase::Data;
            s.since = now;
        });
    }

    /// What the heartbeat says of the role `key`.
    pub fn snapshot(&self, key: RoleKey) -> RoleProgress {
        self.with(|s| {
            let mut walls: Vec<f64> = s.recent.iter().map(|r| r.0).collect();
            walls.sort_by(f64::total_cmp);
            let median = median_of(&walls);
            let mut own: Vec<f64> = s.recent.iter().map(|r| r.1).collect();
            own.sort_by(f64::total_cmp);
            let busy = median_of(&own);
            RoleProgress {
                key,
                step: s.step,
                phase: s.phase,
                phase_ms: s.since.elapsed().as_millis() as u64,
                median_step_ms: median * 1e3,
                busy_ms: busy * 1e3,
                window: s.recent.len() as u32,
            }
        })
    }
}

/// The median of sorted `xs` (0 for none).
fn median_of(xs: &[f64]) -> f64 {
    match xs.len() {
        0 => 0.0,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}
