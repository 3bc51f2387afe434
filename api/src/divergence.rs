//! A job whose loss diverged: found where rank 0's metrics are stored, so
//! every pattern is judged alike (a ring of any size, parameter servers in
//! any consistency, a script that reports its loss).
//!
//! After a report of rank 0's metrics is stored, [`judge`] reads the job's
//! curve back (its first [`EARLY_STEPS`] points, and the points of the
//! report's steps with the `window_steps − 1` before them: every window
//! that ends at a reported step, and nothing more) and asks
//! [`trainyard_common::divergence::detect`] whether it diverged by the
//! spec's `divergence` policy, then (with the best window mean the job
//! keeps in `jobs.loss_best_window`)
//! [`trainyard_common::divergence::detect_collapse`] whether it collapsed.
//! A loss that is not finite (stored as
//! `f64::MAX`) or a role that saw one ([`not_finite`], from a
//! `diverged` outcome: training loops stop before reporting such a step)
//! fails the job whatever the action. [`record`] writes the `diverged`
//! event and, with `action: fail`, the job's result and its move to
//! `failed`, which the scheduler answers by releasing its roles as for a
//! cancel; with `warn` it writes the event once and a warning in the job's
//! log, and the job goes on.

use crate::error::{ApiError, ApiResult};
use sqlx::{PgConnection, Row};
use std::ops::RangeInclusive;
use trainyard_common::cluster::RoleKey;
use trainyard_common::divergence::{
    detect, detect_collapse, early_value, Finding, LossPoint, EARLY_STEPS,
};
use trainyard_common::event::Outcome;
use trainyard_common::spec::{Divergence, DivergenceAction};
use trainyard_common::{EventData, JobState};
use trainyard_scheduler::lifecycle::{self, TransitionError};
use uuid::Uuid;

/// How `job_metrics` stores a loss that is not finite.
const STORED_NOT_FINITE: f64 = f64::MAX;

/// The role whose report is judged: where a warning line goes.
pub struct Reporter<'a> {
    /// Its executor.
    pub executor: Uuid,
    /// Its role.
    pub key: &'a RoleKey,
}

/// Judges job `job`'s rank-0 curve after a report of its `steps`; see the
/// module's rules. Returns whether the job failed.
pub async fn judge(
    tx: &mut PgConnection,
    by: &Reporter<'_>,
    steps: RangeInclusive<u64>,
) -> ApiResult<bool> {
    let job = by.key.job_id;
    let Some(policy) = open_policy(tx, job).await? else {
        return Ok(false);
    };
    let early = early_points(tx, job).await?;
    let recent = match early.get(EARLY_STEPS - 1) {
        None => Vec::new(),
        Some(fifth) => {
            let before = i64::from(policy.window_steps.saturating_sub(1));
            points(
                sqlx::query(
                    "SELECT step, loss FROM (
                         (SELECT step, loss FROM job_metrics
                          WHERE job_id = $1 AND rank = 0 AND step > $2 AND step < $3
                          ORDER BY step DESC LIMIT $5)
                         UNION ALL
                         (SELECT step, loss FROM job_metrics
                          WHERE job_id = $1 AND rank = 0 AND step > $2 AND step BETWEEN $3 AND $4)
                     ) w ORDER BY step",
                )
                .bind(job)
                .bind(fifth.step as i64)
                .bind(*steps.start() as i64)
                .bind(*steps.end() as i64)
                .bind(before),
                tx,
            )
            .await?
        }
    };
    if let Some(finding) = detect(&policy, &early, &recent) {
        return record(tx, job, finding, &policy, early_value(&early), Some(by)).await;
    }
    let Some(e) = early_value(&early) else {
        return Ok(false);
    };
    // A collapse is judged against the best the curve came down to, kept
    // with the job as its windows go by.
    let best: Option<f64> = sqlx::query_scalar("SELECT loss_best_window FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_one(&mut *tx)
        .await?;
    let (finding, now) = detect_collapse(&policy, e, best, &recent);
    if now != best {
        sqlx::query("UPDATE jobs SET loss_best_window = $2 WHERE id = $1")
            .bind(job)
            .bind(now)
            .execute(&mut *tx)
            .await?;
    }
    match finding {
        Some(finding) => record(tx, job, finding, &policy, Some(e), Some(by)).await,
        None => Ok(false),
    }
}

/// A role of job `job` saw a loss that is not finite at `step` (its
/// `diverged` outcome): the job fails with the `diverged` event. Returns
/// whether it did (not when it had ended already).
pub async fn not_finite(tx: &mut PgConnection, job: Uuid, step: u64) -> ApiResult<bool> {
    let policy = stored_policy(tx, job).await?;
    let early = early_points(tx, job).await?;
    let finding = Finding::NotFinite { step };
    record(tx, job, finding, &policy, early_value(&early), None).await
}

/// Records `finding` on job `job`: the `diverged` event and, when the
/// action is to fail, its result and the move to `failed` (returns true);
/// with `warn`, the event only once, and a warning line from `by`'s role.
/// The job's row is locked first, so two reports of one divergence are
/// serialised and the second sees what the first wrote.
pub async fn record(
    tx: &mut PgConnection,
    job: Uuid,
    finding: Finding,
    policy: &Divergence,
    early: Option<f64>,
    by: Option<&Reporter<'_>>,
) -> ApiResult<bool> {
    let state: Option<JobState> =
        sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1 FOR UPDATE")
            .bind(job)
            .fetch_optional(&mut *tx)
            .await?;
    match state {
        None => return Err(ApiError::NotFound(format!("no job with id {job}"))),
        Some(s) if s.is_terminal() => return Ok(false),
        Some(_) => {}
    }
    let action = finding.action(policy);
    if action == DivergenceAction::Warn {
        let warned: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM job_events WHERE job_id = $1 AND kind = 'diverged')",
        )
        .bind(job)
        .fetch_one(&mut *tx)
        .await?;
        if warned {
            return Ok(false);
        }
    }
    let reason = finding.reason(policy, early);
    let data = EventData::Diverged(finding.event(policy, early));
    lifecycle::event(&mut *tx, job, &data, &reason).await?;
    if let Some(by) = by {
        log_line(tx, by, finding.step(), action, &reason).await?;
    }
    tracing::warn!(%job, "{reason}");
    if action == DivergenceAction::Warn {
        lifecycle::notify(&mut *tx, job).await?;
        return Ok(false);
    }
    lifecycle::event(
        &mut *tx,
        job,
        &EventData::Result(Outcome::Failed {}),
        &reason,
    )
    .await?;
    match lifecycle::transition(&mut *tx, job, JobState::Failed, &reason).await {
        Ok(_) => Ok(true),
        Err(TransitionError::Illegal { .. }) => Ok(false),
        Err(TransitionError::NotFound) => Err(ApiError::NotFound(format!("no job with id {job}"))),
        Err(TransitionError::Database(e)) => Err(e.into()),
    }
}

/// The job's policy, while it has not ended.
async fn open_policy(tx: &mut PgConnection, job: Uuid) -> ApiResult<Option<Divergence>> {
    let state: Option<JobState> = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_optional(&mut *tx)
        .await?;
    if state.is_none_or(|s| s.is_terminal()) {
        return Ok(None);
    }
    stored_policy(tx, job).await.map(Some)
}

/// The stored spec's `divergence` (read by the one reader of stored
/// specs, which gives the default to a spec stored before the field
/// existed).
async fn stored_policy(tx: &mut PgConnection, job: Uuid) -> ApiResult<Divergence> {
    let stored: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT spec FROM jobs WHERE id = $1")
            .bind(job)
            .fetch_optional(&mut *tx)
            .await?;
    match stored {
        Some(stored) => Ok(trainyard_common::JobSpec::from_stored(stored)
            .map_err(|e| ApiError::Internal(anyhow::anyhow!("job {job}: {e}")))?
            .divergence),
        None => Ok(Divergence::default()),
    }
}

/// The first [`EARLY_STEPS`] points of job `job`'s rank-0 curve.
async fn early_points(tx: &mut PgConnection, job: Uuid) -> ApiResult<Vec<LossPoint>> {
    points(
        sqlx::query(
            "SELECT step, loss FROM job_metrics WHERE job_id = $1 AND rank = 0 ORDER BY step LIMIT $2",
        )
        .bind(job)
        .bind(EARLY_STEPS as i64),
        tx,
    )
    .await
}

async fn points(
    q: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    tx: &mut PgConnection,
) -> ApiResult<Vec<LossPoint>> {
    let rows = q.fetch_all(&mut *tx).await?;
    rows.iter()
        .map(|r| {
            let loss: f64 = r.try_get("loss")?;
            Ok(LossPoint {
                step: r.try_get::<i64, _>("step")? as u64,
                loss: if loss >= STORED_NOT_FINITE {
                    f64::INFINITY
                } else {
                    loss
                },
            })
        })
        .collect()
}

/// The verdict as a line of the reporting role's log, so that `trainyard
/// logs` shows it where the loss is. Its sequence number is the step's,
/// negated: executors number their lines from 0, so it takes none of
/// theirs, and a repeated report writes it once.
async fn log_line(
    tx: &mut PgConnection,
    by: &Reporter<'_>,
    step: u64,
    action: DivergenceAction,
    reason: &str,
) -> ApiResult<()> {
    let level = match action {
        DivergenceAction::Warn => "warn",
        DivergenceAction::Fail => "error",
    };
    sqlx::query(
        "INSERT INTO job_logs (job_id, executor_id, generation, role, index, seq, at, level, message)
         VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp(), $7, left($8, 4096)) ON CONFLICT DO NOTHING",
    )
    .bind(by.key.job_id)
    .bind(by.executor)
    .bind(by.key.generation)
    .bind(by.key.role.api_name())
    .bind(by.key.wire_index() as i32)
    .bind(-(step.min(i64::MAX as u64) as i64) - 1)
    .bind(level)
    .bind(reason)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
