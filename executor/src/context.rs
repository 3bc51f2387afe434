//! What the roles of one executor share, passed to them explicitly.
//!
//! An executor process has a little state that every role must see: whether
//! the executor is draining (roles then write a checkpoint before they go),
//! how many checkpoint shards are still on their way to the API (a leaving
//! executor waits for them), how roles reach object storage for datasets,
//! models and checkpoints ([`crate::storage::Fetcher`]), and the test hooks
//! read from the environment once at start. [`Context`] holds them; the
//! agent ([`crate::control::agent`]) makes one and hands it to
//! [`crate::roles::Roles`], which gives each role's thread a clone. Tests
//! make their own (`Context::for_tests`) and can set "draining" without
//! touching any other test. Roles whose data-plane connection broke ask
//! through it for their peers to be checked ([`Suspicions`]).

use crate::sandbox::Sandbox;
pub use crate::signals::{CheckpointRequest, Drain, PendingUploads, StepProgress, Suspicions};
use crate::storage::checkpoint::UploadDelay;
use crate::storage::Fetcher;
use std::sync::Arc;
use std::time::Duration;

/// How long an inspection may take before the job is refused, unless the
/// executor's `--inspection-timeout-secs` says otherwise. It lives with the
/// context that carries it (rather than in `roles::inspect`, which
/// re-exports it as `LIMIT`) so that the context depends on no role.
pub const INSPECTION_LIMIT: Duration = Duration::from_secs(300);

/// Test hooks, from the environment: each slows one thing down so that a
/// test can land a fault inside it. None is set in production.
#[derive(Debug, Clone, Default)]
pub struct TestHooks {
    /// `TRAINYARD_SLOW_WORKER=rank:ms` (`*` for every rank): a worker sleeps
    /// after each step (to exercise bounded staleness, or to keep jobs
    /// running, lightly, through scheduling tests).
    pub slow_worker: Option<(Option<u32>, Duration)>,
    /// `TRAINYARD_UPLOAD_DELAY_MS=ms` (or `ms@step`: the shards of that
    /// step and later only): each checkpoint shard is held between its
    /// local write and its upload (to kill executors in the middle).
    pub upload_delay: Option<UploadDelay>,
    /// `TRAINYARD_SLOW_STANDBY=shard:ms`: a replicated PS shard pauses
    /// before it sends each update to its standby.
    pub slow_standby: Option<(u32, Duration)>,
}

impl TestHooks {
    /// The hooks set in this process's environment.
    pub fn from_env() -> TestHooks {
        let var = |k: &str| std::env::var(k).ok();
        let ms = |s: &str| s.parse::<u64>().ok().map(Duration::from_millis);
        TestHooks {
            slow_worker: var("TRAINYARD_SLOW_WORKER").and_then(|v| {
                let (r, t) = v.split_once(':')?;
                let rank = if r == "*" {
                    None
                } else {
                    Some(r.parse().ok()?)
                };
                Some((rank, ms(t)?))
            }),
            upload_delay: var("TRAINYARD_UPLOAD_DELAY_MS").and_then(|v| UploadDelay::parse(&v)),
            slow_standby: var("TRAINYARD_SLOW_STANDBY").and_then(|v| {
                let (s, t) = v.split_once(':')?;
                Some((s.parse().ok()?, ms(t)?))
            }),
        }
    }

    /// How long worker `rank` sleeps after each step.
    pub fn slow_worker(&self, rank: u32) -> Option<Duration> {
        self.slow_worker
            .and_then(|(r, d)| r.is_none_or(|r| r == rank).then_some(d))
    }

    /// How long shard `shard` pauses before replicating each update.
    pub fn slow_standby(&self, shard: u32) -> Option<Duration> {
        self.slow_standby
            .and_then(|(s, d)| (s == shard).then_some(d))
    }
}

/// The state an executor's roles share.
#[derive(Clone)]
pub struct Context {
    /// Set when the executor drains.
    pub drain: Drain,
    /// Set while the scheduler asks the role's job for a checkpoint (each
    /// role gets one of its own).
    pub checkpoint_wanted: CheckpointRequest,
    /// Checkpoint shards not yet acknowledged by the API.
    pub uploads: PendingUploads,
    /// How roles reach object storage.
    pub fetcher: Fetcher,
    /// Test hooks.
    pub hooks: TestHooks,
    /// Where a role whose data-plane connection broke asks for its peers
    /// to be checked (and, if dead, reported).
    pub suspects: Suspicions,
    /// The role's step progress, read by the heartbeat (each training
    /// role gets one of its own).
    pub progress: StepProgress,
    /// Where users' code runs: a confined child process.
    pub sandbox: Arc<Sandbox>,
    /// How long an inspection may take.
    pub inspection_timeout: Duration,
}

impl Context {
    /// A context over `fetcher` with the hooks of this process's
    /// environment, running users' code in `sandbox`.
    pub fn new(fetcher: Fetcher, sandbox: Arc<Sandbox>) -> Context {
        Context {
            drain: Drain::default(),
            checkpoint_wanted: CheckpointRequest::default(),
            uploads: PendingUploads::default(),
            fetcher,
            hooks: TestHooks::from_env(),
            suspects: Suspicions::default(),
            progress: StepProgress::default(),
            sandbox,
            inspection_timeout: INSPECTION_LIMIT,
        }
    }

    /// A context for unit tests and benchmarks: local files only, no hooks.
    pub fn for_tests() -> Context {
        Context {
            drain: Drain::default(),
            checkpoint_wanted: CheckpointRequest::default(),
            uploads: PendingUploads::default(),
            fetcher: Fetcher::local_only(),
            hooks: TestHooks::default(),
            suspects: Suspicions::default(),
            progress: StepProgress::default(),
            sandbox: Arc::new(Sandbox::for_tests()),
            inspection_timeout: INSPECTION_LIMIT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_parse_and_select_their_rank_or_shard() {
        let h = TestHooks {
            slow_worker: Some((Some(1), Duration::from_millis(5))),
            upload_delay: None,
            slow_standby: Some((2, Duration::from_millis(7))),
        };
        assert_eq!(h.slow_worker(1), Some(Duration::from_millis(5)));
        assert_eq!(h.slow_worker(0), None);
        assert_eq!(h.slow_standby(2), Some(Duration::from_millis(7)));
        assert_eq!(h.slow_standby(0), None);
        let all = TestHooks {
            slow_worker: Some((None, Duration::from_millis(3))),
            ..TestHooks::default()
        };
        assert_eq!(all.slow_worker(9), Some(Duration::from_millis(3)));
    }

    #[test]
    fn draining_is_per_context() {
        let (a, b) = (Context::for_tests(), Context::for_tests());
        a.drain.start();
        assert!(a.drain.is_draining());
        assert!(!b.drain.is_draining());
        a.uploads.add();
        a.uploads.done(5);
        assert_eq!(a.uploads.count(), 0);
    }
}
