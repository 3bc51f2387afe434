//! Why a role stopped: the executor runtime's error type.
//!
//! A role's loop ([`crate::ring`], [`crate::ps`]) ends in one of these. The
//! kind decides what the role does next: a [`RoleError::Ring`] or a
//! transient [`RoleError::Ps`] leaves the replica intact and the role waits
//! for the next ring or generation; [`RoleError::Stopped`] hands the state
//! to the next generation; everything else fails the job with the error's
//! text as the reason users read.

use crate::replica::TrainError;
use crate::storage::StorageError;
use trainyard_dataplane::RingError;

/// Why a role's loop ended.
#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    /// The replica could not train (data, model, libtorch, divergence).
    #[error(transparent)]
    Train(#[from] TrainError),
    /// The ring lost a member or timed out: the replica is intact at its
    /// last completed step and waits for a new ring.
    #[error("{0}")]
    Ring(#[from] RingError),
    /// A parameter-server exchange failed; `transient` ones (a shard
    /// unreachable or gone) are retried until the next generation.
    #[error("{reason}")]
    Ps {
        /// What failed.
        reason: String,
        /// Whether waiting for the next generation can help.
        transient: bool,
    },
    /// Object storage failed where the role cannot go on without it.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The assignment cannot be run here (no data plane, not among the
    /// job's workers, no CUDA device).
    #[error("{0}")]
    Assignment(String),
    /// The role's code panicked (a bug, or an assertion inside libtorch).
    #[error("training failed inside libtorch: {0}")]
    Panicked(String),
    /// Stopped on request (a new generation, or the role was let go).
    #[error("stopped")]
    Stopped,
}

impl RoleError {
    /// A parameter-server failure that the next generation may cure.
    pub fn ps_transient(reason: impl Into<String>) -> RoleError {
        RoleError::Ps {
            reason: reason.into(),
            transient: true,
        }
    }

    /// A parameter-server failure that fails the job.
    pub fn ps_fatal(reason: impl Into<String>) -> RoleError {
        RoleError::Ps {
            reason: reason.into(),
            transient: false,
        }
    }

    /// Whether the role keeps its state and retries (until the next
    /// generation) instead of failing the job.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RoleError::Ring(_)
                | RoleError::Ps {
                    transient: true,
                    ..
                }
        )
    }

    /// Whether the process running the user's module died (reported as a
    /// crash, which the job retries a bounded number of times).
    pub fn is_crash(&self) -> bool {
        matches!(self, RoleError::Train(TrainError::Crashed(_)))
    }

    /// The step whose loss was not finite, when that ended the role
    /// (reported as a divergence: the API records a `diverged` event and
    /// fails the job).
    pub fn diverged_at(&self) -> Option<u64> {
        match self {
            RoleError::Train(TrainError::Diverged(step)) => Some(*step),
            _ => None,
        }
    }
}

/// Runs `f`, turning a panic (a bug, or an assertion inside libtorch) into a
/// role error that fails the job instead of killing the executor.
pub fn guarded<T>(f: impl FnOnce() -> Result<T, RoleError>) -> Result<T, RoleError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        Err(RoleError::Panicked(
            what.lines().next().unwrap_or("").to_owned(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_naming_its_first_line() {
        let e = guarded::<()>(|| panic!("shape mismatch\nbacktrace")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "training failed inside libtorch: shape mismatch"
        );
        assert!(!e.is_transient());
        assert!(RoleError::ps_transient("shard 0 unreachable").is_transient());
        assert!(!RoleError::ps_fatal("bad length").is_transient());
        let d = RoleError::Train(TrainError::Diverged(7));
        assert_eq!(d.diverged_at(), Some(7));
        assert!(!d.is_transient() && !d.is_crash());
        assert!(d.to_string().contains("not finite at step 7"), "{d}");
        assert_eq!(RoleError::ps_fatal("x").diverged_at(), None);
    }
}
