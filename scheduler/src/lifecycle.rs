//! Job state changes with their event rows.
//!
//! [`transition`] locks the job row (`SELECT … FOR UPDATE`), so two
//! concurrent moves of one job are serialised: the second sees the state the
//! first left and is judged against it. A move to the state the job is
//! already in is reported as [`Transition::Unchanged`] and writes nothing,
//! which makes idempotent operations (cancel twice) cheap and exact.

use sqlx::PgConnection;
use trainyard_common::{EventData, JobState};
use uuid::Uuid;

/// Postgres channel on which every job change is announced (payload: job id).
pub const JOB_CHANNEL: &str = "trainyard_jobs";

/// What [`transition`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The job moved from `from` to the requested state.
    Moved {
        /// The state it left.
        from: JobState,
    },
    /// The job was already in the requested state; nothing was written.
    Unchanged,
}

/// Why a job could not be moved.
#[derive(Debug, thiserror::Error)]
pub enum TransitionError {
    /// No job has this id.
    #[error("job not found")]
    NotFound,
    /// The lifecycle forbids the move.
    #[error("a {from} job cannot become {to}")]
    Illegal {
        /// The job's current state.
        from: JobState,
        /// The state asked for.
        to: JobState,
    },
    /// The database failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Moves job `id` to `to` with `reason`, inside the caller's transaction.
pub async fn transition(
    tx: &mut PgConnection,
    id: Uuid,
    to: JobState,
    reason: &str,
) -> Result<Transition, TransitionError> {
    let from: JobState = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(TransitionError::NotFound)?;
    if from == to {
        return Ok(Transition::Unchanged);
    }
    if !from.can_move_to(to) {
        return Err(TransitionError::Illegal { from, to });
    }
    sqlx::query(
        "UPDATE jobs SET state = $2, state_reason = $3, updated_at = clock_timestamp(),
                started_at = CASE WHEN $2 = 'running' THEN coalesce(started_at, clock_timestamp()) ELSE started_at END,
                finished_at = CASE WHEN $2 IN ('succeeded', 'failed', 'cancelled') THEN clock_timestamp() END
         WHERE id = $1",
    )
    .bind(id)
    .bind(to)
    .bind(reason)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO job_events (job_id, kind, from_state, to_state, reason)
         VALUES ($1, 'transition', $2, $3, $4)",
    )
    .bind(id)
    .bind(from)
    .bind(to)
    .bind(reason)
    .execute(&mut *tx)
    .await?;
    notify(tx, id).await?;
    Ok(Transition::Moved { from })
}

/// Announces a change of job `id` on [`JOB_CHANNEL`] (delivered at commit).
pub async fn notify(tx: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(JOB_CHANNEL)
        .bind(id.to_string())
        .execute(tx)
        .await?;
    Ok(())
}

/// Writes an event (not a state change: a placement, a strategy decision,
/// an inspection handed over) to job `job`'s log; its kind is its data's.
pub async fn event(
    tx: &mut PgConnection,
    job: Uuid,
    data: &EventData,
    reason: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO job_events (job_id, kind, reason, data) VALUES ($1, $2, $3, $4)")
        .bind(job)
        .bind(data.kind())
        .bind(reason)
        .bind(data.to_json())
        .execute(tx)
        .await?;
    Ok(())
}
