//! A role's reported outcome, judged: from the job's current generation it
//! ends the job with its result event (`succeeded`, or `failed` with the
//! role's reason; a loss that was not finite with a `diverged` event too),
//! except a crash of the role's model process or script, which starts the
//! job's next try until its tries are used up. From another generation it
//! is stale, and for a job that has ended it changes nothing.
//! [`super::report`] applies it after the report's metrics and logs.

use super::finite;
use crate::divergence;
use crate::error::{ApiError, ApiResult};
use crate::routes::job_rows::stored_spec;
use crate::routes::params::text;
use sqlx::PgConnection;
use trainyard_common::cluster::{RoleKey, RoleOutcome, MODEL_CRASH_TRIES};
use trainyard_common::event::{Crash, Outcome};
use trainyard_common::{EventData, JobState};
use trainyard_scheduler::lifecycle::{self, TransitionError};
use uuid::Uuid;
/// What became of a report's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It ended the job.
    Applied,
    /// None was reported, the job had ended already (a retry whose answer
    /// was lost, or a late one), or it was cancelled meanwhile.
    Ignored,
    /// It came from a role that is not the job's current generation: the
    /// report is answered with a 409 (after its metrics and logs commit).
    Stale,
}

/// Judges a role's outcome and, when it is the current generation's, ends
/// the job with its result event. The job's row is locked first, so that
/// two deliveries of one outcome are serialised: the second sees the job
/// ended and changes nothing.
pub(super) async fn apply_outcome(
    tx: &mut PgConnection,
    executor: Uuid,
    key: &RoleKey,
    outcome: &RoleOutcome,
) -> ApiResult<Verdict> {
    let state: JobState = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1 FOR UPDATE")
        .bind(key.job_id)
        .fetch_one(&mut *tx)
        .await?;
    if state.is_terminal() {
        // A job has one result: no second one is written.
        return Ok(Verdict::Ignored);
    }
    let current: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM assignments a JOIN jobs j ON j.id = a.job_id
         WHERE a.job_id = $1 AND a.generation = $2 AND a.role = $3 AND a.index = $4 AND a.executor_id = $5 AND j.generation = $2)",
    )
    .bind(key.job_id)
    .bind(key.generation)
    .bind(key.role.as_str())
    .bind(key.index as i32)
    .bind(executor)
    .fetch_one(&mut *tx)
    .await?;
    if !current {
        return Ok(Verdict::Stale);
    }
    if let RoleOutcome::Crashed { reason } = outcome {
        return crashed(tx, executor, key, state, &text(reason)).await;
    }
    if let RoleOutcome::Diverged { step, .. } = outcome {
        // The job's reason is the API's, with the curve's early value.
        return Ok(if divergence::not_finite(tx, key.job_id, *step).await? {
            Verdict::Applied
        } else {
            Verdict::Ignored
        });
    }
    let (to, reason, data) = result_of(outcome);
    sqlx::query("INSERT INTO job_events (job_id, kind, reason, data) VALUES ($1, $2, $3, $4)")
        .bind(key.job_id)
        .bind(data.kind())
        .bind(&reason)
        .bind(data.to_json())
        .execute(&mut *tx)
        .await?;
    // A short job can finish before its roles' heartbeats moved it to
    // `running`: it ran, so it passes through `running` first.
    if to == JobState::Succeeded && state == JobState::Scheduling {
        lifecycle::transition(
            &mut *tx,
            key.job_id,
            JobState::Running,
            "its roles ran (the outcome arrived before their heartbeats)",
        )
        .await
        .map_err(|e| match e {
            TransitionError::Database(e) => ApiError::from(e),
            other => ApiError::Conflict(other.to_string()),
        })?;
    }
    match lifecycle::transition(&mut *tx, key.job_id, to, &reason).await {
        Ok(_) => Ok(Verdict::Applied),
        Err(TransitionError::Illegal { .. }) => Ok(Verdict::Ignored), // Cancelled meanwhile: the user's word stands.
        Err(TransitionError::NotFound) => {
            Err(ApiError::NotFound(format!("no job with id {}", key.job_id)))
        }
        Err(TransitionError::Database(e)) => Err(e.into()),
    }
}

/// A role's model process died (a signal, a limit, no answer in time).
/// Below [`MODEL_CRASH_TRIES`] crashes, the job tries again as it would
/// after losing the role's executor: the same placement in a new
/// generation, every role restarted, the crashed replica rebuilt from its
/// peers' state or the latest checkpoint, with a `crash` event naming the
/// role, the cause and the try. The crash that uses up the tries fails
/// the job with the same cause: a model that crashes every time is not
/// retried for ever.
async fn crashed(
    tx: &mut PgConnection,
    executor: Uuid,
    key: &RoleKey,
    state: JobState,
    reason: &str,
) -> ApiResult<Verdict> {
    let job = key.job_id;
    let before: i64 =
        sqlx::query_scalar("SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'crash'")
            .bind(job)
            .fetch_one(&mut *tx)
            .await?;
    let attempt = u32::try_from(before).unwrap_or(u32::MAX).saturating_add(1);
    // A script job restarts as often as its spec allows (torchrun's
    // max_restarts); a model job's model gets MODEL_CRASH_TRIES tries.
    let stored: serde_json::Value = sqlx::query_scalar("SELECT spec FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_one(&mut *tx)
        .await?;
    let spec = stored_spec(job, stored)?;
    let (tries, what) = match &spec.script {
        Some(s) => (s.max_restarts().saturating_add(1), "script"),
        None => (MODEL_CRASH_TRIES, "model"),
    };
    let name: Option<String> = sqlx::query_scalar("SELECT name FROM executors WHERE id = $1")
        .bind(executor)
        .fetch_optional(&mut *tx)
        .await?;
    let who = format!(
        "{} {} on {}",
        key.role.api_name(),
        key.wire_index(),
        name.unwrap_or_else(|| executor.to_string())
    );
    if attempt >= tries {
        let why = if what == "script" {
            format!("the script failed on each of its {tries} tries (max_restarts {}); the last time, {who}: {reason}", tries - 1)
        } else {
            format!(
                "the model crashed on each of its {tries} tries; the last time, {who}: {reason}"
            )
        };
        lifecycle::event(&mut *tx, job, &EventData::Result(Outcome::Failed {}), &why).await?;
        return match lifecycle::transition(&mut *tx, job, JobState::Failed, &why).await {
            Ok(_) => Ok(Verdict::Applied),
            Err(TransitionError::Illegal { .. }) => Ok(Verdict::Ignored),
            Err(TransitionError::NotFound) => {
                Err(ApiError::NotFound(format!("no job with id {job}")))
            }
            Err(TransitionError::Database(e)) => Err(e.into()),
        };
    }
    let next = key.generation + 1;
    sqlx::query("UPDATE assignments SET generation = $2 WHERE job_id = $1")
        .bind(job)
        .bind(next)
        .execute(&mut *tx)
        .await?;
    // The same world starts again: one restart more.
    sqlx::query("UPDATE jobs SET generation = $2, worlds = worlds + 1, updated_at = clock_timestamp() WHERE id = $1")
        .bind(job)
        .bind(next)
        .execute(&mut *tx)
        .await?;
    let why = format!(
        "{who}: {reason}; the job's roles restart at generation {next}, {} (try {} of {tries})",
        if what == "script" {
            "each rank's script from its checkpoint folder"
        } else {
            "from their peers' state or the latest checkpoint"
        },
        attempt + 1
    );
    let data = EventData::Crash(Crash {
        role: key.role.api_name().to_owned(),
        index: key.wire_index(),
        generation: key.generation,
        executor,
        retry_generation: next,
        attempt,
        tries,
    });
    lifecycle::event(&mut *tx, job, &data, &why).await?;
    if state == JobState::Running {
        lifecycle::transition(&mut *tx, job, JobState::Recovering, &why)
            .await
            .map_err(|e| match e {
                TransitionError::Database(e) => ApiError::from(e),
                other => ApiError::Conflict(other.to_string()),
            })?;
    } else {
        sqlx::query("UPDATE jobs SET state_reason = $2 WHERE id = $1")
            .bind(job)
            .bind(&why)
            .execute(&mut *tx)
            .await?;
        lifecycle::notify(&mut *tx, job).await?;
    }
    Ok(Verdict::Applied)
}

/// The state an outcome moves the job to, the reason its result event and
/// transition give, and the result's data.
fn result_of(outcome: &RoleOutcome) -> (JobState, String, EventData) {
    match outcome {
        RoleOutcome::Succeeded {
            steps,
            final_loss,
            eval_loss,
            eval_accuracy,
            weights_url,
        } => {
            // A rank that joined after the last step and received the
            // finished state has trained no step of its own: no loss.
            let known = final_loss.filter(|l| l.is_finite());
            let loss = match known {
                Some(l) => format!("final loss {l:.4}"),
                None => "final loss not known to the reporting rank".into(),
            };
            (
                JobState::Succeeded,
                match eval_accuracy {
                    Some(a) => format!(
                        "trained {steps} steps: {loss}, held-out accuracy {:.1}%",
                        a * 100.0
                    ),
                    None => match eval_loss.filter(|l| l.is_finite()) {
                        Some(l) => format!("trained {steps} steps: {loss}, held-out loss {l:.4}"),
                        None => format!("trained {steps} steps: {loss}, no held-out evaluation"),
                    },
                },
                EventData::Result(Outcome::Trained {
                    steps: *steps,
                    final_loss: known,
                    eval_loss: finite(*eval_loss),
                    eval_accuracy: finite(*eval_accuracy),
                    weights_url: weights_url.clone(),
                }),
            )
        }
        RoleOutcome::Ran { outputs, bytes } => (
            JobState::Succeeded,
            format!(
                "the script finished on every rank that ran to its end; {outputs} output file(s), {bytes} bytes"
            ),
            EventData::Result(Outcome::Ran {
                outputs: *outputs,
                bytes: *bytes,
            }),
        ),
        // A crash that uses up the job's tries (`crashed`) fails it too,
        // and a divergence (`divergence::not_finite`) always does.
        RoleOutcome::Failed { reason }
        | RoleOutcome::Crashed { reason }
        | RoleOutcome::Diverged { reason, .. } => (
            JobState::Failed,
            text(reason),
            EventData::Result(Outcome::Failed {}),
        ),
    }
}
