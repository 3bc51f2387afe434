//! Why a scheduling round (or one job's part of it) failed.

use crate::lifecycle::TransitionError;

/// Why a round failed.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// The database failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// A failed transition as a round error: a database error as it is; a job
/// gone or moved to a state that forbids the step (it changed under the
/// round) as a protocol error.
pub(super) fn db_err(e: TransitionError) -> SchedulerError {
    match e {
        TransitionError::Database(e) => SchedulerError::Database(e),
        other => SchedulerError::Database(sqlx::Error::Protocol(other.to_string())),
    }
}
