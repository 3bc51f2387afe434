//! Small types every layer of the executor shares, kept below all of them
//! so that no layer has to import one above it: whether the executor
//! drains, whether the scheduler asks a role's job for a checkpoint, how
//! many checkpoint shards are on their way, what a role
//! reports, and the [`Reporter`] that carries reports to the API (which
//! [`crate::control`] implements and [`crate::roles`] uses).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;
use trainyard_common::checkpoint::ShardUploaded;
use trainyard_common::cluster::{InspectionReport, LogLevel, MetricPoint, RoleKey, RoleOutcome};

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

/// Something a role reports.
pub enum Item {
    /// A step.
    Metric(MetricPoint),
    /// A log line.
    Log(LogLevel, String),
    /// The end.
    Outcome(RoleOutcome),
    /// A checkpoint shard is in the object store.
    Checkpoint(ShardUploaded),
}

/// Where the roles' reports go: the control plane, seen from below.
pub trait Reporter: Send + Sync {
    /// Starts delivering role `key`'s `items` until the channel closes.
    fn deliver(&self, key: RoleKey, items: UnboundedReceiver<Item>);
    /// Starts delivering an inspection's answer.
    fn deliver_inspection(&self, report: InspectionReport);
    /// The object store the API named for this executor's checkpoints and
    /// weights.
    fn object_store(&self) -> String;
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
