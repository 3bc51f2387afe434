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
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use trainyard_common::api::{Sweep, SweepBest, SweepGrowth, SweepState, SweepTrial, TrialState};
use trainyard_common::sweep::{self, asha_stops, rungs, Goal, RungView, SweepSpec};
use trainyard_common::{JobSpec, JobState};
use trainyard_scheduler::lifecycle::{self, TransitionError};
use trainyard_shutdown::Shutdown;
use uuid::Uuid;

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

/// One tick of sweep `id` (nothing when another replica drives it now or
/// it is not running): its trials followed (1–3), ASHA applied (2),
/// pending trials started (4) and its end recorded (5), in one
/// transaction.
pub async fn drive(st: &AppState, id: Uuid) -> ApiResult<()> {
    let mut tx = st.db.begin().await?;
    let got: Option<String> = sqlx::query_scalar(lock_sql(false))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    if got.as_deref() != Some("true") {
        return Ok(()); // Another replica drives it now.
    }
    let Some(row) =
        sqlx::query("SELECT owner, owner_admin, spec, state FROM sweeps WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
    else {
        return Ok(());
    };
    if row.try_get::<String, _>("state")? != "running" {
        return Ok(());
    }
    let owner: String = row.try_get("owner")?;
    let admin: bool = row.try_get("owner_admin")?;
    let spec: SweepSpec = serde_json::from_value(row.try_get("spec")?)
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("sweep {id}: stored spec: {e}")))?;
    let mut tick = Tick {
        id,
        rung_steps: spec_rungs(&spec),
        col: spec.metric.column(),
        spec,
        tx,
    };
    let mut trials = tick.trials().await?;
    // 1–2: follow the jobs; read the metric at the rungs.
    for t in trials.iter_mut() {
        tick.follow(t).await?;
    }
    tick.asha(&mut trials).await?;
    // 4: start pending trials within the concurrency.
    let mut running = trials.iter().filter(|t| t.state == "running").count();
    for t in trials.iter_mut().filter(|t| t.state == "pending") {
        if running >= tick.spec.concurrency as usize {
            break;
        }
        if tick.start(st, &owner, admin, t).await? {
            running += 1;
        }
    }
    tick.end_if_done(&trials).await?;
    tick.tx.commit().await?;
    Ok(())
}

/// One tick of a sweep, in its transaction.
struct Tick {
    id: Uuid,
    spec: SweepSpec,
    /// The steps of ASHA's rungs.
    rung_steps: Vec<u64>,
    /// The metric's column of `job_metrics`.
    col: &'static str,
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
}

impl Tick {
    /// The sweep's trials, in order.
    async fn trials(&mut self) -> ApiResult<Vec<Row_>> {
        let mut trials = Vec::new();
        for r in sqlx::query(
            "SELECT index, job_id, state, params, spec, executors, freed, rung_metrics
             FROM sweep_trials WHERE sweep_id = $1 ORDER BY index",
        )
        .bind(self.id)
        .fetch_all(&mut *self.tx)
        .await?
        {
            trials.push(Row_ {
                index: r.try_get("index")?,
                job: r.try_get("job_id")?,
                state: r.try_get("state")?,
                params: serde_json::from_value(r.try_get("params")?).unwrap_or_default(),
                spec: r.try_get("spec")?,
                executors: r.try_get("executors")?,
                freed: r.try_get("freed")?,
                rung_metrics: r.try_get("rung_metrics")?,
                unsettled: false,
            });
        }
        Ok(trials)
    }

    /// Follows trial `t`'s job: its state, its metric at the rungs and
    /// now, its workers (and a growth onto a stopped trial's executors).
    async fn follow(&mut self, t: &mut Row_) -> ApiResult<()> {
        let (id, col) = (self.id, self.col);
        let Some(job) = t.job else { return Ok(()) };
        let (job_state, recent): (Option<JobState>, bool) = match sqlx::query(
            "SELECT state, coalesce(finished_at > clock_timestamp() - make_interval(secs => $2), true) AS recent
             FROM jobs WHERE id = $1",
        )
        .bind(job)
        .bind(LATE_METRICS.as_secs_f64())
        .fetch_optional(&mut *self.tx)
        .await?
        {
            Some(r) => (Some(r.try_get("state")?), r.try_get("recent")?),
            None => (None, false),
        };
        // An ended trial's last points may still be on their way (a rank
        // delivers what it measured after another rank's outcome ended the
        // job): its rungs and metric are read a while longer, its state
        // is not touched.
        let ended = t.state != "running";
        if ended && !recent {
            return Ok(());
        }
        let values: Vec<Option<f64>> = sqlx::query_scalar(&format!(
            "SELECT (SELECT m.{col} FROM job_metrics m WHERE m.job_id = $1 AND m.rank = 0
                       AND m.step >= r AND m.{col} IS NOT NULL ORDER BY m.step LIMIT 1)
             FROM unnest($2::bigint[]) AS r ORDER BY r"
        ))
        .bind(job)
        .bind(
            self.rung_steps
                .iter()
                .map(|&r| r as i64)
                .collect::<Vec<i64>>(),
        )
        .fetch_all(&mut *self.tx)
        .await?;
        t.rung_metrics = values.into_iter().map_while(|v| v).collect();
        let latest = sqlx::query(&format!(
            "SELECT step, {col} AS v FROM job_metrics WHERE job_id = $1 AND rank = 0 AND {col} IS NOT NULL
             ORDER BY step DESC LIMIT 1"
        ))
        .bind(job)
        .fetch_optional(&mut *self.tx)
        .await?;
        let (step, metric): (Option<i64>, Option<f64>) = match &latest {
            Some(r) => (Some(r.try_get("step")?), Some(r.try_get("v")?)),
            None => (None, None),
        };
        let executors: Vec<Uuid> = sqlx::query_scalar(
            "SELECT executor_id FROM assignments WHERE job_id = $1 AND role = 'worker' ORDER BY index",
        )
        .bind(job)
        .fetch_all(&mut *self.tx)
        .await?;
        let (state, reason): (&str, Option<String>) = if ended {
            (t.state.as_str(), None)
        } else {
            match job_state {
                Some(JobState::Succeeded) => ("completed", Some("its job succeeded".into())),
                Some(JobState::Failed) => {
                    let why: Option<String> =
                        sqlx::query_scalar("SELECT state_reason FROM jobs WHERE id = $1")
                            .bind(job)
                            .fetch_optional(&mut *self.tx)
                            .await?;
                    ("failed", why)
                }
                Some(JobState::Cancelled) | None => {
                    ("cancelled", Some("its job was cancelled".into()))
                }
                Some(_) => ("running", None),
            }
        };
        let state = state.to_owned();
        let state = state.as_str();
        // 3: growth onto executors a stopped trial freed.
        if state == "running" && !t.executors.is_empty() && executors.len() > t.executors.len() {
            self.grown(t, &executors).await?;
        }
        t.state = state.to_owned();
        t.executors = executors;
        // A completed trial is settled once its last step's point is in
        // (or its job ended long enough ago).
        let total = t.spec.get("steps").and_then(Value::as_i64);
        t.unsettled = state == "completed" && recent && step.zip(total).is_none_or(|(s, n)| s < n);
        sqlx::query(
            "UPDATE sweep_trials SET state = $3, rung_metrics = $4, metric = $5, step = $6,
                    workers = $7, executors = $8, reason = coalesce($9, reason)
             WHERE sweep_id = $1 AND index = $2",
        )
        .bind(id)
        .bind(t.index)
        .bind(state)
        .bind(&t.rung_metrics)
        .bind(metric)
        .bind(step)
        .bind(if state == "running" {
            t.executors.len() as i32
        } else {
            0
        })
        .bind(&t.executors)
        .bind(reason)
        .execute(&mut *self.tx)
        .await?;
        Ok(())
    }

    /// Records that running trial `t`, now on `executors`, grew onto
    /// executors a stopped trial freed.
    async fn grown(&mut self, t: &Row_, executors: &[Uuid]) -> ApiResult<()> {
        let id = self.id;
        let before: BTreeSet<Uuid> = t.executors.iter().copied().collect();
        let new: BTreeSet<Uuid> = executors
            .iter()
            .filter(|e| !before.contains(e))
            .copied()
            .collect();
        let from = sqlx::query_scalar::<_, i32>(
            "SELECT index FROM sweep_trials WHERE sweep_id = $1 AND state = 'stopped' AND freed && $2
             ORDER BY index LIMIT 1",
        )
        .bind(id)
        .bind(new.iter().copied().collect::<Vec<Uuid>>())
        .fetch_optional(&mut *self.tx)
        .await?;
        if let Some(from) = from {
            sqlx::query(
                "INSERT INTO sweep_growths (sweep_id, trial, from_trial, workers_before, workers_after)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(id)
            .bind(t.index)
            .bind(from)
            .bind(t.executors.len() as i32)
            .bind(executors.len() as i32)
            .execute(&mut *self.tx)
            .await?;
            tracing::info!(sweep = %id, trial = t.index, from, workers = executors.len(), "a surviving trial grew onto a stopped trial's executors");
        }
        Ok(())
    }

    /// 2: ASHA stops the trials that rank below the best at a rung.
    async fn asha(&mut self, trials: &mut [Row_]) -> ApiResult<()> {
        let (id, col) = (self.id, self.col);
        let Some(es) = &self.spec.early_stopping else {
            return Ok(());
        };
        let (goal, factor) = (self.spec.goal, es.asha.reduction_factor);
        let views: Vec<RungView> = trials
            .iter()
            .map(|t| RungView {
                running: t.state == "running",
                values: t.rung_metrics.clone(),
            })
            .collect();
        for s in asha_stops(goal, factor, &views) {
            let t = &mut trials[s.trial];
            let Some(job) = t.job else { continue };
            let reason = format!(
                "stopped by ASHA at rung {} ({} steps): {} {:.4} ranks {} of {} recorded there; the best {} go on",
                s.rung,
                self.rung_steps.get(s.rung).copied().unwrap_or_default(),
                col,
                t.rung_metrics[s.rung],
                s.rank + 1,
                s.recorded,
                s.keep
            );
            let freed: Vec<Uuid> = sqlx::query_scalar(
                "SELECT DISTINCT executor_id FROM assignments WHERE job_id = $1",
            )
            .bind(job)
            .fetch_all(&mut *self.tx)
            .await?;
            end_job(&mut self.tx, job, &reason).await?;
            sqlx::query(
                "UPDATE sweep_trials SET state = 'stopped', reason = $3, freed = $4, workers = 0
                 WHERE sweep_id = $1 AND index = $2",
            )
            .bind(id)
            .bind(t.index)
            .bind(&reason)
            .bind(&freed)
            .execute(&mut *self.tx)
            .await?;
            tracing::info!(sweep = %id, trial = t.index, %reason, "trial stopped early");
            t.state = "stopped".into();
            t.freed = freed;
        }
        Ok(())
    }

    /// Starts pending trial `t` (or fails it, where its spec or the
    /// owner's data policy refuses it now); whether it runs.
    async fn start(
        &mut self,
        st: &AppState,
        owner: &str,
        admin: bool,
        t: &mut Row_,
    ) -> ApiResult<bool> {
        let id = self.id;
        match submit_trial(st, &mut self.tx, id, owner, admin, t).await {
            Ok(job) => {
                t.job = Some(job);
                t.state = "running".into();
                sqlx::query(
                    "UPDATE sweep_trials SET state = 'running', job_id = $3 WHERE sweep_id = $1 AND index = $2",
                )
                .bind(id)
                .bind(t.index)
                .bind(job)
                .execute(&mut *self.tx)
                .await?;
                Ok(true)
            }
            Err(ApiError::Unprocessable(v)) | Err(ApiError::BadRequest(v)) => {
                let why = format!(
                    "could not start ({}): {}",
                    sweep::describe(&t.params),
                    v.iter()
                        .map(|x| format!("{}: {}", x.field, x.message))
                        .collect::<Vec<_>>()
                        .join("; ")
                );
                t.state = "failed".into();
                sqlx::query(
                    "UPDATE sweep_trials SET state = 'failed', reason = $3 WHERE sweep_id = $1 AND index = $2",
                )
                .bind(id)
                .bind(t.index)
                .bind(why)
                .execute(&mut *self.tx)
                .await?;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// 5: the end, once no trial is pending, running or unsettled.
    async fn end_if_done(&mut self, trials: &[Row_]) -> ApiResult<()> {
        let id = self.id;
        if trials
            .iter()
            .all(|t| t.state != "pending" && t.state != "running" && !t.unsettled)
        {
            let count = |s: &str| trials.iter().filter(|t| t.state == s).count();
            let (completed, stopped, failed) =
                (count("completed"), count("stopped"), count("failed"));
            let state = if completed > 0 { "succeeded" } else { "failed" };
            sqlx::query(
                "UPDATE sweeps SET state = $2, reason = $3, finished_at = clock_timestamp() WHERE id = $1",
            )
            .bind(id)
            .bind(state)
            .bind(format!(
                "{} trials: {completed} completed, {stopped} stopped early, {failed} failed, {} cancelled",
                trials.len(),
                count("cancelled")
            ))
            .execute(&mut *self.tx)
            .await?;
            tracing::info!(sweep = %id, state, "sweep ended");
        }
        Ok(())
    }
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
