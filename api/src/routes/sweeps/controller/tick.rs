//! One tick of a running sweep ([`drive`]), in one transaction under the
//! sweep's lock: its trials' jobs followed (state, the metric at ASHA's
//! rungs, growth onto a stopped trial's executors), ASHA applied, pending
//! trials started within the concurrency, and its end recorded.

use super::{end_job, lock_sql, spec_rungs, submit_trial, Row_, LATE_METRICS};
use crate::error::{ApiError, ApiResult};
use crate::AppState;
use serde_json::Value;
use sqlx::Row;
use std::collections::BTreeSet;
use trainyard_common::sweep::{self, asha_stops, RungView, SweepSpec};
use trainyard_common::JobState;
use uuid::Uuid;

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
