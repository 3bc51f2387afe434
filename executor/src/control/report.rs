//! Delivery of a role's metrics, logs and outcome to the API.
//!
//! A role's training thread sends [`Item`]s into a channel; a task batches
//! them (every half second; a role's first step at once) into `POST /v1/executors/{id}/reports`. What
//! could not be delivered stays buffered and is retried with backoff while
//! the API is unreachable, so nothing is lost; the API stores each metric
//! step and log line once however often a report is retried.

use super::REPORT;
pub use crate::reports::Item;
use crate::reports::Reporter;
use crate::signals::PendingUploads;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::mpsc::UnboundedReceiver as Items;
use trainyard_client::{Client, Reported};
use trainyard_common::cluster::{
    InspectionReport, LogLine, RoleKey, RoleReport, MAX_PACKAGES_PHASES,
};
use uuid::Uuid;

/// How often buffered items are sent.
pub const FLUSH_EVERY: Duration = Duration::from_millis(500);

/// Metrics per report: what piles up during an API outage goes in slices
/// that stay far below the API's body limit (a metric is ~300 bytes).
pub const METRICS_PER_REPORT: usize = 500;

/// Log lines per report (each at most 4 KiB).
pub const LOGS_PER_REPORT: usize = 100;

/// Where reports go; the id and the client's credential change when the
/// executor registers again (a role's delivery keeps those it started
/// with).
#[derive(Clone)]
pub struct Sink {
    /// The API's client, holding the executor's credential.
    pub client: Client,
    /// The executor's current id.
    pub id: Arc<RwLock<Uuid>>,
    /// Object-store URL the API gave at registration.
    pub object_store: Arc<RwLock<String>>,
    /// Checkpoint shards not yet acknowledged: a delivered report takes its
    /// shards off.
    pub uploads: PendingUploads,
    /// Deliveries still holding something to send.
    pub deliveries: Deliveries,
}

/// The deliveries that have not handed everything over yet, and what they
/// still hold.
#[derive(Clone, Default)]
pub struct Deliveries(Arc<std::sync::Mutex<std::collections::HashMap<u64, Held>>>);

/// What one delivery still holds.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Held {
    /// Metric points.
    pub metrics: usize,
    /// Log lines.
    pub logs: usize,
    /// Checkpoint shard reports.
    pub checkpoints: usize,
    /// Whether the role's outcome is among them.
    pub outcome: bool,
}

impl Deliveries {
    fn start(&self) -> DeliveryGuard {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut m) = self.0.lock() {
            m.insert(id, Held::default());
        }
        DeliveryGuard {
            id,
            all: self.clone(),
        }
    }

    /// How many deliveries are still running.
    pub fn count(&self) -> usize {
        self.0.lock().map_or(0, |m| m.len())
    }

    /// What the running deliveries still hold, summed.
    pub fn held(&self) -> Held {
        self.0.lock().map_or(Held::default(), |m| {
            m.values().fold(Held::default(), |a, h| Held {
                metrics: a.metrics + h.metrics,
                logs: a.logs + h.logs,
                checkpoints: a.checkpoints + h.checkpoints,
                outcome: a.outcome || h.outcome,
            })
        })
    }
}

/// A running delivery's entry in [`Deliveries`], removed when it ends.
struct DeliveryGuard {
    id: u64,
    all: Deliveries,
}

impl DeliveryGuard {
    fn holds(&self, r: &RoleReport) {
        if let Ok(mut m) = self.all.0.lock() {
            m.insert(
                self.id,
                Held {
                    metrics: r.metrics.len(),
                    logs: r.logs.len(),
                    checkpoints: r.checkpoints.len(),
                    outcome: r.outcome.is_some(),
                },
            );
        }
    }
}

impl Drop for DeliveryGuard {
    fn drop(&mut self) {
        if let Ok(mut m) = self.all.0.lock() {
            m.remove(&self.id);
        }
    }
}

impl Sink {
    /// The executor's current id.
    pub fn executor_id(&self) -> Uuid {
        self.id.read().map(|id| *id).unwrap_or_default()
    }
}

impl Reporter for Sink {
    fn deliver(&self, key: RoleKey, items: Items<Item>) {
        tokio::spawn(deliver(self.clone(), key, items));
    }

    fn deliver_inspection(&self, report: InspectionReport) {
        let sink = self.clone();
        tokio::spawn(super::inspection::deliver(
            self.client.clone(),
            move || sink.executor_id(),
            report,
        ));
    }

    fn object_store(&self) -> String {
        self.object_store
            .read()
            .map(|o| o.clone())
            .unwrap_or_default()
    }
}

/// What a role has said that the API has not stored yet.
struct Pending {
    report: RoleReport,
    /// The last log line's number.
    seq: u64,
    /// No step was reported yet.
    first_step: bool,
}

impl Pending {
    fn new(key: RoleKey) -> Pending {
        Pending {
            report: RoleReport::empty(key),
            seq: 0,
            first_step: true,
        }
    }

    /// Takes `item`; whether it is news to send at once.
    fn take(&mut self, item: Item) -> bool {
        let p = &mut self.report;
        match item {
            Item::Metric(m) => {
                p.metrics.push(m);
                // A role's first step goes out at once: after a recovery
                // it is what says training resumed.
                return std::mem::take(&mut self.first_step);
            }
            Item::Log(level, message) => {
                self.seq += 1;
                let at_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                p.logs.push(LogLine {
                    seq: self.seq,
                    at_ms,
                    level,
                    message,
                });
            }
            Item::Outcome(o) => p.outcome = Some(o),
            Item::Checkpoint(c) => p.checkpoints.push(c),
            Item::Packages(phase) => {
                p.packages.push(phase);
                // A phase is news: the job's events show it now.
                return true;
            }
        }
        false
    }

    fn is_empty(&self) -> bool {
        let p = &self.report;
        p.metrics.is_empty()
            && p.logs.is_empty()
            && p.outcome.is_none()
            && p.checkpoints.is_empty()
            && p.packages.is_empty()
    }

    /// The oldest slice, and whether it holds all (the outcome goes with
    /// the last one).
    fn slice(&self) -> (RoleReport, bool) {
        let p = &self.report;
        let (nm, nl) = (
            p.metrics.len().min(METRICS_PER_REPORT),
            p.logs.len().min(LOGS_PER_REPORT),
        );
        let last = nm == p.metrics.len() && nl == p.logs.len();
        let slice = RoleReport {
            key: p.key,
            metrics: p.metrics[..nm].to_vec(),
            logs: p.logs[..nl].to_vec(),
            outcome: if last { p.outcome.clone() } else { None },
            // Shard reports go first: the API commits a checkpoint before
            // the job's end (at_end) is applied.
            checkpoints: p.checkpoints.clone(),
            packages: p.packages[..p.packages.len().min(MAX_PACKAGES_PHASES)].to_vec(),
        };
        (slice, last)
    }

    /// `slice` was answered: what it carried is dropped; the checkpoints
    /// it reported.
    fn sent(&mut self, slice: &RoleReport, last: bool) -> usize {
        let p = &mut self.report;
        p.metrics.drain(..slice.metrics.len());
        p.logs.drain(..slice.logs.len());
        p.packages.drain(..slice.packages.len());
        if last {
            p.outcome = None;
        }
        std::mem::take(&mut p.checkpoints).len()
    }
}

/// Delivers `items` for role `key` until the channel closes and all is sent.
pub async fn deliver(sink: Sink, key: RoleKey, mut items: UnboundedReceiver<Item>) {
    let guard = sink.deliveries.start();
    // The role speaks for the executor session it was started under: the
    // API takes a role's reports only from the executor that held it, and
    // a registration after a 410 is another executor.
    let (executor, client) = (
        sink.executor_id(),
        sink.client.with_own_token(sink.client.token()),
    );
    let mut pending = Pending::new(key);
    let mut open = true;
    let mut backoff = FLUSH_EVERY;
    // Failed attempts in a row (the retry policy's wait grows with them).
    let mut failures = 0u32;
    loop {
        let deadline = tokio::time::Instant::now() + backoff;
        while open {
            match tokio::time::timeout_at(deadline, items.recv()).await {
                Ok(Some(item)) => {
                    if pending.take(item) {
                        break;
                    }
                }
                Ok(None) => open = false,
                Err(_) => break,
            }
        }
        guard.holds(&pending.report);
        if pending.is_empty() {
            if !open {
                return;
            }
            continue;
        }
        let (slice, last) = pending.slice();
        let answer = match client.report(executor, &slice).await {
            // The credential this role started under is no longer one the
            // API knows (the executor's row is gone): no retry can help.
            Err(e) if matches!(e.status(), Some(401 | 404)) => Ok(Reported::Refused(e.to_string())),
            other => other,
        };
        match answer {
            Ok(answer) => {
                match answer {
                    Reported::Stale => tracing::warn!(
                        job = %key.job_id,
                        "the API refused this report as from a stale generation or another executor's role"
                    ),
                    Reported::Refused(why) => {
                        tracing::warn!(job = %key.job_id, %why, "the API refused this report; it is dropped")
                    }
                    Reported::Stored(_) => {}
                }
                failures = 0;
                sink.uploads.done(pending.sent(&slice, last));
                // More piled up: send the next slice at once.
                backoff = if last { FLUSH_EVERY } else { Duration::ZERO };
            }
            Err(e) => {
                tracing::warn!(error = %e, "report failed; retrying");
                failures += 1;
                // One flush interval is already the wait between reports.
                backoff = REPORT.delay(failures + 1);
            }
        }
        if !open && !backoff.is_zero() && !pending.is_empty() {
            // The role has ended: nothing new to wait for, but a failed send
            // still waits its backoff instead of spinning.
            tokio::time::sleep(backoff).await;
        }
    }
}
