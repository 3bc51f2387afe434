//! Sweeps in Postgres: making one ([`create`]), reading it as the API's
//! resource ([`load`]), cancelling it, and the controller loop ([`run`])
//! that drives every running sweep.
//!
//! Each tick of the controller, per running sweep and under a
//! transaction-scoped advisory lock (so one API replica acts on a sweep at
//! a time and a cancel waits for the tick):
//! 1. trials follow their jobs' states (a job cancelled by its owner is a
//!    cancelled trial; the sweep goes on);
//! 2. each running trial's metric is read at the rungs (the first rank-0
//!    point at or after each rung's step) and ASHA
//!    ([`trainyard_common::sweep::asha_stops`]) stops the ones below their
//!    rung's keep line: their jobs are cancelled with the rung, the rank
//!    and the values as the reason, and the executors they held are
//!    remembered;
//! 3. a running trial whose workers grew onto executors a stopped trial
//!    freed is recorded as a growth (the scheduler's growth rule gives
//!    freed executors to placed elastic jobs whenever no waiting job needs
//!    them, and caps a trial that has not passed every rung at what it
//!    holds: once a sweep's budget is spent, the survivors of every rung
//!    take what ASHA frees);
//! 4. pending trials are submitted while fewer than `concurrency` run, as
//!    jobs of the sweep's owner, with the data policy the owner has now
//!    (its quotas, fair share and priority apply as to any job), logged
//!    to MLflow as any job of theirs is ([`crate::tracking`]);
//! 5. a sweep whose trials all ended is `succeeded` (one completed) or
//!    `failed`.

use crate::data_policy;
use crate::error::{ApiError, ApiResult};
use crate::routes::job_rows::{insert_job_sql, job_from_row, record_submitted};
use crate::AppState;
use serde_json::{Map, Value};
use sqlx::{PgConnection, PgPool, Row};
use std::collections::BTreeMap;
use std::time::Duration;
use trainyard_common::api::{Sweep, SweepBest, SweepGrowth, SweepState, SweepTrial, TrialState};
use trainyard_common::sweep::{self, rungs, Goal, SweepSpec};
use trainyard_common::{JobSpec, JobState};
use trainyard_scheduler::lifecycle::{self, TransitionError};
use trainyard_shutdown::Shutdown;
use uuid::Uuid;

mod tick;
pub use tick::drive;

/// How often the controller looks at running sweeps.
pub const TICK: Duration = Duration::from_millis(500);

/// How long after its job ended a trial's rungs and metric are still read.
pub const LATE_METRICS: Duration = Duration::from_secs(30);

fn trial_state(s: &str) -> TrialState {
    match s {
        "pending" => TrialState::Pending,
        "running" => TrialState::Running,
        "stopped" => TrialState::Stopped,
        "completed" => TrialState::Completed,
        "failed" => TrialState::Failed,
        _ => TrialState::Cancelled,
    }
}

fn sweep_state(s: &str) -> SweepState {
    match s {
        "running" => SweepState::Running,
        "succeeded" => SweepState::Succeeded,
        "failed" => SweepState::Failed,
        _ => SweepState::Cancelled,
    }
}

fn lock_sql(wait: bool) -> &'static str {
    if wait {
        "SELECT pg_advisory_xact_lock(hashtextextended('trainyard-sweep:' || $1::text, 0))::text"
    } else {
        "SELECT pg_try_advisory_xact_lock(hashtextextended('trainyard-sweep:' || $1::text, 0))::text"
    }
}

/// The spec's rungs (empty without early stopping).
fn spec_rungs(spec: &SweepSpec) -> Vec<u64> {
    match (&spec.early_stopping, spec.trial_steps()) {
        (Some(es), Some(total)) => rungs(&es.asha, total),
        _ => Vec::new(),
    }
}

/// Checks `spec`, expands its trials and checks each against the owner's
/// data policy, then stores the sweep (its trials start at the next tick).
pub async fn create(st: &AppState, owner: &str, admin: bool, spec: SweepSpec) -> ApiResult<Uuid> {
    let trials = sweep::expand(&spec).map_err(ApiError::Unprocessable)?;
    for t in &trials {
        data_policy::policy_at_submit(st, owner, admin, &t.spec).await?;
        crate::tracking::target_at_submit(&st.config, admin, &t.spec)?;
    }
    let id = Uuid::now_v7();
    let spec_json = serde_json::to_value(&spec).map_err(|e| ApiError::Internal(e.into()))?;
    let mut tx = st.db.begin().await?;
    sqlx::query(
        "INSERT INTO sweeps (id, name, owner, owner_admin, spec, rungs) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id)
    .bind(spec.name.trim())
    .bind(owner)
    .bind(admin)
    .bind(&spec_json)
    .bind(spec_rungs(&spec).len() as i32)
    .execute(&mut *tx)
    .await?;
    for (i, t) in trials.iter().enumerate() {
        let params = serde_json::to_value(&t.params).map_err(|e| ApiError::Internal(e.into()))?;
        let job = serde_json::to_value(&t.spec).map_err(|e| ApiError::Internal(e.into()))?;
        sqlx::query(
            "INSERT INTO sweep_trials (sweep_id, index, params, spec) VALUES ($1, $2, $3, $4)",
        )
        .bind(id)
        .bind(i as i32)
        .bind(params)
        .bind(job)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    tracing::info!(sweep = %id, owner, trials = trials.len(), "sweep created");
    Ok(id)
}

/// Sweep `id` as the API shows it; `None` when there is none.
pub async fn load(db: &PgPool, id: Uuid) -> ApiResult<Option<Sweep>> {
    let Some(row) = sqlx::query(
        "SELECT id, name, owner, spec, state, reason, created_at, finished_at FROM sweeps WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?
    else {
        return Ok(None);
    };
    let spec: SweepSpec = serde_json::from_value(row.try_get("spec")?)
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("sweep {id}: stored spec: {e}")))?;
    let rows = sqlx::query(
        "SELECT index, job_id, params, state, rung_metrics, metric, step, workers, reason
         FROM sweep_trials WHERE sweep_id = $1 ORDER BY index",
    )
    .bind(id)
    .fetch_all(db)
    .await?;
    let mut trials = Vec::with_capacity(rows.len());
    for r in &rows {
        let params = match r.try_get::<Value, _>("params")? {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        trials.push(SweepTrial {
            index: r.try_get::<i32, _>("index")? as u32,
            job_id: r.try_get("job_id")?,
            params,
            state: trial_state(r.try_get::<String, _>("state")?.as_str()),
            rung_metrics: r.try_get("rung_metrics")?,
            metric: r.try_get("metric")?,
            step: r.try_get("step")?,
            workers: r.try_get::<i32, _>("workers")?.max(0) as u32,
            reason: r.try_get("reason")?,
        });
    }
    let growths = sqlx::query(
        "SELECT trial, from_trial, workers_before, workers_after, at FROM sweep_growths
         WHERE sweep_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(db)
    .await?
    .iter()
    .map(|g| {
        Ok(SweepGrowth {
            trial: g.try_get::<i32, _>("trial")? as u32,
            from_trial: g.try_get::<i32, _>("from_trial")? as u32,
            workers_before: g.try_get::<i32, _>("workers_before")? as u32,
            workers_after: g.try_get::<i32, _>("workers_after")? as u32,
            at: g.try_get("at")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(Some(Sweep {
        id,
        name: row.try_get("name")?,
        owner: row.try_get("owner")?,
        state: sweep_state(row.try_get::<String, _>("state")?.as_str()),
        reason: row.try_get("reason")?,
        rungs: spec_rungs(&spec),
        best: best(spec.goal, &trials),
        spec,
        created_at: row.try_get("created_at")?,
        finished_at: row.try_get("finished_at")?,
        trials,
        growths,
    }))
}

/// The best completed trial by its final metric; while none completed,
/// the best latest value of any.
pub fn best(goal: Goal, trials: &[SweepTrial]) -> Option<SweepBest> {
    let pick = |completed: bool| {
        trials
            .iter()
            .filter(|t| !completed || t.state == TrialState::Completed)
            .filter_map(|t| t.metric.filter(|m| m.is_finite()).map(|m| (t, m)))
            .fold(None::<(&SweepTrial, f64)>, |b, (t, m)| match b {
                Some((_, bm)) if !goal.better(m, bm) => b,
                _ => Some((t, m)),
            })
    };
    let (t, metric) = pick(true).or_else(|| pick(false))?;
    Some(SweepBest {
        index: t.index,
        job_id: t.job_id,
        params: t.params.clone(),
        metric,
    })
}

/// Cancels sweep `id`: pending trials will not start, running trials'
/// jobs are cancelled. Returns whether it was running.
pub async fn cancel(db: &PgPool, id: Uuid) -> ApiResult<bool> {
    let mut tx = db.begin().await?;
    sqlx::query(lock_sql(true))
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let updated = sqlx::query(
        "UPDATE sweeps SET state = 'cancelled', reason = 'cancelled by its owner', finished_at = clock_timestamp()
         WHERE id = $1 AND state = 'running'",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if updated == 0 {
        tx.commit().await?;
        return Ok(false);
    }
    let jobs: Vec<Option<Uuid>> = sqlx::query_scalar(
        "UPDATE sweep_trials SET state = 'cancelled', reason = 'cancelled with the sweep', workers = 0
         WHERE sweep_id = $1 AND state IN ('pending', 'running') RETURNING job_id",
    )
    .bind(id)
    .fetch_all(&mut *tx)
    .await?;
    for job in jobs.into_iter().flatten() {
        end_job(&mut tx, job, "cancelled with its sweep").await?;
    }
    tx.commit().await?;
    Ok(true)
}

/// Cancels `job` unless it already ended.
async fn end_job(tx: &mut PgConnection, job: Uuid, reason: &str) -> ApiResult<()> {
    match lifecycle::transition(tx, job, JobState::Cancelled, reason).await {
        Ok(_) | Err(TransitionError::NotFound) | Err(TransitionError::Illegal { .. }) => Ok(()),
        Err(TransitionError::Database(e)) => Err(e.into()),
    }
}

/// The controller: ticks until `stop`.
pub async fn run(st: AppState, stop: Shutdown) {
    loop {
        if let Err(e) = tick(&st).await {
            tracing::warn!(error = %e, "sweep controller tick failed; retrying");
        }
        tokio::select! {
            _ = stop.wait() => return,
            _ = tokio::time::sleep(TICK) => {}
        }
    }
}

/// One pass over every running sweep.
pub async fn tick(st: &AppState) -> ApiResult<()> {
    let ids: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM sweeps WHERE state = 'running' ORDER BY created_at")
            .fetch_all(&st.db)
            .await?;
    for id in ids {
        if let Err(e) = drive(st, id).await {
            tracing::warn!(sweep = %id, error = %e, "sweep not driven this tick");
        }
    }
    Ok(())
}

/// A trial as the controller reads it.
struct Row_ {
    index: i32,
    job: Option<Uuid>,
    state: String,
    params: BTreeMap<String, Value>,
    spec: Value,
    executors: Vec<Uuid>,
    freed: Vec<Uuid>,
    rung_metrics: Vec<f64>,
    /// Whether its last points may still be on their way.
    unsettled: bool,
}

/// Submits trial `t` as a job of `owner`, checked again (the spec, and the
/// data policy the owner has now).
async fn submit_trial(
    st: &AppState,
    tx: &mut PgConnection,
    sweep: Uuid,
    owner: &str,
    admin: bool,
    t: &Row_,
) -> ApiResult<Uuid> {
    let spec = JobSpec::from_stored(t.spec.clone())
        .map_err(|e| ApiError::invalid_field("spec", e.to_string()))?;
    let (policy, versions) = data_policy::policy_at_submit(st, owner, admin, &spec).await?;
    let tracking = crate::tracking::target_at_submit(&st.config, admin, &spec)?;
    let policy_json = serde_json::to_value(&policy).map_err(|e| ApiError::Internal(e.into()))?;
    let spec_json = serde_json::to_value(&spec).map_err(|e| ApiError::Internal(e.into()))?;
    let row = sqlx::query(&insert_job_sql())
        .bind(Uuid::now_v7())
        .bind(&spec.name)
        .bind(owner)
        .bind(&spec_json)
        .bind(None::<String>)
        .bind(None::<Vec<u8>>)
        .bind(spec.priority)
        .bind(&policy_json)
        .fetch_one(&mut *tx)
        .await?;
    let mut job = job_from_row(&row)?;
    sqlx::query("UPDATE jobs SET sweep_id = $2, sweep_trial = $3 WHERE id = $1")
        .bind(job.id)
        .bind(sweep)
        .bind(t.index)
        .execute(&mut *tx)
        .await?;
    job.sweep = Some(trainyard_common::api::SweepRef {
        id: sweep,
        trial: t.index as u32,
    });
    if let Some(t) = &tracking {
        crate::tracking::record(tx, job.id, t).await?;
    }
    record_submitted(tx, &job, &versions, None).await?;
    lifecycle::notify(tx, job.id).await?;
    tracing::info!(sweep = %sweep, trial = t.index, job = %job.id, "trial submitted");
    Ok(job.id)
}
