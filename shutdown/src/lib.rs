//! One stop signal for every long-running loop in Trainyard.
//!
//! The data plane's collectives, the executor's role threads, its
//! parameter-server links and standby replication, the scheduler's
//! leadership loop and the API's server all end the same way: someone
//! triggers a [`Shutdown`] and every loop that holds a clone of it sees it at
//! its next check. The type is modelled on mini-redis's `Shutdown`, with a
//! blocking side for the threads that libtorch and the data plane need:
//!
//! * [`Shutdown::is_triggered`] is the cheap check a hot loop makes between
//!   two reads of a socket;
//! * [`Shutdown::sleep`] waits on a condition variable, so a loop that backs
//!   off before a retry wakes the moment it is told to stop (no polling);
//! * [`Shutdown::wait`] is the same for async tasks;
//! * [`Shutdown::retry_pause`] is the one pause a loop takes before it tries
//!   a broken connection again ([`RETRY_PAUSE`]), so no loop hand-rolls one;
//! * [`termination`] and [`termination_or_time_limit`] turn the process's
//!   signals into a future, for the binaries' own shutdown.
//!
//! A trigger is final: a stopped loop is not restarted with the same value.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How long a loop waits before it tries a failed connection or step again.
pub const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// A stop signal shared by a loop and whoever may end it (cheap to clone:
/// every clone is the same signal).
#[derive(Clone, Default)]
pub struct Shutdown(Arc<Inner>);

#[derive(Default)]
struct Inner {
    triggered: AtomicBool,
    // The flag is also written under this lock, so a thread cannot check
    // it, miss the trigger and then sleep through the notification.
    lock: Mutex<()>,
    woken: Condvar,
    notify: Notify,
}

impl std::fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Shutdown")
            .field(&self.is_triggered())
            .finish()
    }
}

impl Shutdown {
    /// A signal nobody has triggered yet.
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// A signal that is triggered already (a loop that must not start).
    pub fn triggered() -> Shutdown {
        let s = Shutdown::new();
        s.trigger();
        s
    }

    /// Tells every holder to stop, and wakes those that sleep or wait.
    pub fn trigger(&self) {
        let guard = self.0.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.0.triggered.store(true, Ordering::SeqCst);
        drop(guard);
        self.0.woken.notify_all();
        self.0.notify.notify_waiters();
    }

    /// Whether the signal was triggered.
    pub fn is_triggered(&self) -> bool {
        self.0.triggered.load(Ordering::Relaxed)
    }

    /// Blocks the thread for up to `d`; returns early, and `true`, once the
    /// signal is triggered (`false` when `d` ran out first).
    pub fn sleep(&self, d: Duration) -> bool {
        let until = Instant::now().checked_add(d);
        let mut guard = self.0.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.0.triggered.load(Ordering::SeqCst) {
                return true;
            }
            let left = match until {
                Some(u) => u.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return false;
            }
            guard = self
                .0
                .woken
                .wait_timeout(guard, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The pause before a retry ([`RETRY_PAUSE`]): `true` when the loop
    /// must stop instead of retrying.
    pub fn retry_pause(&self) -> bool {
        self.sleep(RETRY_PAUSE)
    }

    /// Resolves once the signal is triggered (at once if it was).
    pub async fn wait(&self) {
        loop {
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so a trigger between the check
            // and the await still wakes this task.
            notified.as_mut().enable();
            if self.is_triggered() {
                return;
            }
            notified.await;
        }
    }

    /// Triggers this signal when `cause` resolves (on a task of its own).
    pub fn trigger_on(&self, cause: impl std::future::Future<Output = ()> + Send + 'static) {
        let me = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = cause => me.trigger(),
                () = me.wait() => {}
            }
        });
    }
}

/// Resolves on SIGINT or SIGTERM: the operator, systemd, Kubernetes or
/// Slurm's `scancel` asks the process to end.
pub async fn termination() {
    signals(false).await
}

/// Like [`termination`], and also on SIGUSR1: Slurm's warning before a
/// job's time limit (`sbatch --signal=B:USR1@N`), after which an executor
/// drains with a checkpoint as it does on SIGTERM.
pub async fn termination_or_time_limit() {
    signals(true).await
}

async fn signals(time_limit: bool) {
    use tokio::signal::unix::{signal, SignalKind};
    async fn on(kind: SignalKind, name: &str) {
        match signal(kind) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for {name}");
                std::future::pending::<()>().await;
            }
        }
    }
    let usr1 = async {
        if time_limit {
            on(SignalKind::user_defined1(), "SIGUSR1").await;
            tracing::info!("SIGUSR1: the job's time limit is near");
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = on(SignalKind::interrupt(), "SIGINT") => {}
        () = on(SignalKind::terminate(), "SIGTERM") => {}
        () = usr1 => {}
    }
    tracing::info!("shutdown signal received");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleep_runs_out_when_nobody_triggers() {
        let s = Shutdown::new();
        assert!(!s.sleep(Duration::from_millis(20)));
        assert!(!s.is_triggered());
    }

    #[test]
    fn a_trigger_wakes_a_sleeping_thread_long_before_its_sleep_ends() {
        let s = Shutdown::new();
        let sleeper = {
            let s = s.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                (s.sleep(Duration::from_secs(600)), t.elapsed())
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        s.trigger();
        let (stopped, slept) = sleeper.join().unwrap();
        assert!(stopped);
        // Woken by the trigger, not by the 600 s running out.
        assert!(slept < Duration::from_secs(300), "slept {slept:?}");
    }

    #[test]
    fn every_clone_is_the_same_signal_and_a_trigger_is_final() {
        let s = Shutdown::new();
        let c = s.clone();
        c.trigger();
        assert!(s.is_triggered());
        assert!(s.sleep(Duration::from_secs(600)));
        assert!(s.retry_pause());
        assert!(Shutdown::triggered().is_triggered());
        assert!(!Shutdown::new().is_triggered());
    }

    #[tokio::test]
    async fn wait_resolves_after_a_later_trigger_and_at_once_after_an_earlier_one() {
        let s = Shutdown::new();
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        s.trigger();
        tokio::time::timeout(Duration::from_secs(600), waiter)
            .await
            .expect("woken")
            .unwrap();
        // Already triggered: returns without waiting.
        s.wait().await;
    }

    #[tokio::test]
    async fn trigger_on_follows_its_cause() {
        let s = Shutdown::new();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        s.trigger_on(async move {
            let _ = rx.await;
        });
        assert!(!s.is_triggered());
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(600), s.wait())
            .await
            .expect("triggered by its cause");
    }
}
