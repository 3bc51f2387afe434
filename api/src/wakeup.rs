//! Wakes long-polling heartbeats when a job changes.
//!
//! A heartbeat that asks to wait (`wait_ms`) is held while its executor's
//! assignments are what it already runs; a membership change must release
//! it at once, so the survivors of a failure learn their new generation in
//! milliseconds instead of at their next beat. [`Wakeup`] holds one
//! Postgres `LISTEN` session on the job channel (the scheduler notifies it
//! in the transaction that writes a new generation) and bumps a counter on
//! every notification; a held heartbeat waits for the counter to move and
//! then looks at its assignments again. The session starts with the first
//! waiter and lives as long as the pool; when it breaks, waiters are woken
//! (they re-check) and it is opened again.

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use trainyard_scheduler::lifecycle::JOB_CHANNEL;

/// The counter of job notifications (see the module docs).
#[derive(Clone)]
pub struct Wakeup {
    inner: Arc<Inner>,
}

struct Inner {
    db: PgPool,
    tx: watch::Sender<u64>,
    started: AtomicBool,
}

impl Wakeup {
    /// A wakeup over `db`; it listens from its first subscriber on.
    pub fn new(db: PgPool) -> Wakeup {
        Wakeup {
            inner: Arc::new(Inner {
                db,
                tx: watch::channel(0).0,
                started: AtomicBool::new(false),
            }),
        }
    }

    /// A receiver that sees the counter move on the next job change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        if !self.inner.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(listen(self.inner.clone()));
        }
        self.inner.tx.subscribe()
    }
}

async fn listen(inner: Arc<Inner>) {
    while !inner.db.is_closed() {
        match PgListener::connect_with(&inner.db).await {
            Ok(mut l) => {
                if l.listen(JOB_CHANNEL).await.is_ok() {
                    while let Ok(_n) = l.recv().await {
                        inner.tx.send_modify(|c| *c = c.wrapping_add(1));
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "heartbeat wakeup: cannot listen"),
        }
        // Notifications may have been missed: every waiter looks again.
        inner.tx.send_modify(|c| *c = c.wrapping_add(1));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
