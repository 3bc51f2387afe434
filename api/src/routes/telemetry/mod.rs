//! Training telemetry: executors report step metrics, log lines and each
//! role's outcome; users read metrics (downsampled) and logs, which stay in
//! Postgres after the executors are gone.
//!
//! A report is stored only from the executor that held the role it names
//! in the generation it names ([`fencing`]): a stranger is answered 403, a
//! zombie claiming another role or generation 409, and nothing of theirs
//! is stored. Reports are idempotent (metrics keyed by job, rank and step; log lines by
//! role instance and sequence number), so an executor that retries after a
//! lost answer duplicates nothing. Rank 0's stored steps are judged for a
//! diverged loss ([`crate::divergence`]), which may fail the job. An
//! outcome is accepted only from a role
//! of the job's current generation: it ends the job (`succeeded` with its
//! result, or `failed` with the role's reason; a loss that was not finite
//! with a `diverged` event too), except a crash of the
//! role's model process, which starts the job's next try (a new generation
//! of the same placement) until its tries are used up. An outcome for a
//! job that has already ended (a retry whose answer was lost) changes
//! nothing: a job has one result.

mod outcome;

use super::access::OwnExecutor;
use super::job_rows::{ensure_job, log_page, stored_spec};
use super::params::{parse_body, parse_bounded, text, AfterQuery};
use crate::checkpointing;
use crate::divergence;
use crate::error::{ApiError, ApiResult, Problem};
use crate::extract::{JobId, JsonBytes, QueryParams};
use crate::fencing;
use crate::AppState;
use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use outcome::{apply_outcome, Verdict};
use serde::Deserialize;
use sqlx::PgConnection;
use sqlx::Row;
pub use trainyard_common::api::{
    JobLogLine, LogPage, MetricSample, MetricSeries, RankProgress, ReportAck,
};
use trainyard_common::cluster::{
    LogLevel, LogLine, MetricPoint, PackagesPhase, RoleKey, RoleKind, RoleReport,
    MAX_PACKAGES_DETAIL, MAX_PACKAGES_PHASES, MAX_REPORT_ITEMS,
};
use trainyard_common::event::PackagesEvent;
use trainyard_common::EventData;
use trainyard_scheduler::lifecycle;
use utoipa::IntoParams;
use uuid::Uuid;

/// Default number of points `GET …/metrics` returns at most.
pub const DEFAULT_MAX_POINTS: i64 = 500;
/// Largest `max_points`.
pub const MAX_POINTS: i64 = 10_000;

fn finite(x: Option<f64>) -> Option<f64> {
    x.filter(|v| v.is_finite())
}

/// Report a role's metrics, logs and outcome.
#[utoipa::path(
    post, path = "/v1/executors/{id}/reports", operation_id = "report_roles", tag = "executors",
    params(("id" = Uuid, Path, description = "Executor id")),
    request_body(content = RoleReport, content_type = "application/json"),
    responses(
        (status = 200, description = "Stored", body = ReportAck),
        (status = 400, description = "The id is not a UUID, or the body is malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong executor credential", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The executor holds no role in the job: nothing is stored", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such executor or job", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The outcome is from a stale generation (its metrics and logs are stored), or the role or a checkpoint shard was never this executor's (nothing is stored)", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON (Content-Type)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid report", body = Problem, content_type = "application/problem+json"),
    ),
    security(("executor_token" = []))
)]
pub async fn report(
    State(st): State<AppState>,
    OwnExecutor { id: executor, .. }: OwnExecutor,
    JsonBytes(body): JsonBytes,
) -> ApiResult<Json<ReportAck>> {
    let r: RoleReport = parse_body(&body)?;
    check_report(&r)?;
    let key = r.key;
    ensure_job(&st.db, key.job_id).await?;
    fencing::check(&st.db, executor, &key, &r.checkpoints).await?;
    // Checkpoints first: a checkpoint written at the end is committed
    // before the outcome ends the job.
    checkpointing::record(&st, key.job_id, executor, &r.checkpoints).await?;
    let mut tx = st.db.begin().await?;
    let metrics_stored = store_metrics(&mut tx, &key, &r.metrics).await?;
    let logs_stored = store_logs(&mut tx, executor, &key, &r.logs).await?;
    store_packages(&mut tx, executor, &key, &r.packages).await?;
    // Rank 0's curve is the job's: judged before the outcome, so a loss
    // that diverged in the last steps fails the job that then reports its
    // end (the outcome is then ignored: the job has ended).
    if key.role == RoleKind::Worker && key.index == 0 {
        let steps = r.metrics.iter().map(|m| m.step);
        if let (Some(first), Some(last)) = (steps.clone().min(), steps.max()) {
            let by = divergence::Reporter {
                executor,
                key: &key,
            };
            divergence::judge(&mut tx, &by, first..=last).await?;
        }
    }
    let verdict = match &r.outcome {
        Some(outcome) => apply_outcome(&mut tx, executor, &key, outcome).await?,
        None => Verdict::Ignored,
    };
    // Metrics and logs are kept even when a stale outcome is refused.
    tx.commit().await?;
    if verdict == Verdict::Stale {
        return Err(ApiError::Conflict(format!(
            "generation {} of job {} is not current for this role: the outcome is ignored",
            key.generation, key.job_id
        )));
    }
    Ok(Json(ReportAck {
        metrics_stored,
        logs_stored,
        outcome_applied: verdict == Verdict::Applied,
    }))
}

/// The report's bounds, beyond its shape: item counts, steps from 1, and
/// its checkpoint shards.
fn check_report(r: &RoleReport) -> ApiResult<()> {
    if r.metrics.len() > MAX_REPORT_ITEMS || r.logs.len() > MAX_REPORT_ITEMS {
        return Err(ApiError::invalid_field(
            "metrics",
            format!("at most {MAX_REPORT_ITEMS} metric points and log lines per report"),
        ));
    }
    if let Some(i) = r
        .metrics
        .iter()
        .position(|m| m.step == 0 || m.step > i64::MAX as u64)
    {
        return Err(ApiError::invalid_field(
            &format!("metrics[{i}].step"),
            "must be at least 1",
        ));
    }
    if r.packages.len() > MAX_PACKAGES_PHASES {
        return Err(ApiError::invalid_field(
            "packages",
            format!("at most {MAX_PACKAGES_PHASES} phases per report"),
        ));
    }
    for (i, p) in r.packages.iter().enumerate() {
        if p.detail.chars().count() > MAX_PACKAGES_DETAIL {
            return Err(ApiError::invalid_field(
                &format!("packages[{i}].detail"),
                format!("at most {MAX_PACKAGES_DETAIL} characters"),
            ));
        }
        if p.seconds.is_some_and(|s| !s.is_finite() || s < 0.0) {
            return Err(ApiError::invalid_field(
                &format!("packages[{i}].seconds"),
                "must be a finite number of seconds, at least 0",
            ));
        }
        if p.environment.as_ref().is_some_and(|e| {
            e.is_empty() || e.len() > 64 || !e.chars().all(|c| c.is_ascii_hexdigit())
        }) {
            return Err(ApiError::invalid_field(
                &format!("packages[{i}].environment"),
                "must be 1 to 64 hexadecimal digits",
            ));
        }
    }
    checkpointing::validate(&r.key, &r.checkpoints)
}

/// Stores a rank's package phases as `packages` events of its job: one per
/// rank, generation and stage, so a retried report adds none.
async fn store_packages(
    tx: &mut PgConnection,
    executor: Uuid,
    key: &RoleKey,
    phases: &[PackagesPhase],
) -> ApiResult<()> {
    if phases.is_empty() || key.role != RoleKind::Worker {
        return Ok(());
    }
    // A role's reports are sent one at a time (a retry after the last
    // answered): the check below sees the phases its earlier ones stored.
    for p in phases {
        let seen: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM job_events WHERE job_id = $1 AND kind = 'packages'
                AND (data->>'rank')::int = $2 AND (data->>'generation')::bigint = $3 AND data->>'stage' = $4)",
        )
        .bind(key.job_id)
        .bind(key.index as i32)
        .bind(key.generation)
        .bind(p.stage.as_str())
        .fetch_one(&mut *tx)
        .await?;
        if seen {
            continue;
        }
        let took = p
            .seconds
            .map(|s| format!(" ({s:.1} s)"))
            .unwrap_or_default();
        let why = format!(
            "rank {} packages {}: {}{took}",
            key.index,
            p.stage.as_str(),
            p.detail
        );
        let data = EventData::Packages(PackagesEvent {
            rank: key.index,
            generation: key.generation,
            executor,
            phase: p.clone(),
        });
        lifecycle::event(&mut *tx, key.job_id, &data, &why).await?;
    }
    lifecycle::notify(&mut *tx, key.job_id).await?;
    Ok(())
}

/// Stores a worker's step metrics (a PS role's are ignored); returns how
/// many were new. A step measured again by a newer generation (one that
/// resumed from a checkpoint before it) replaces the older measurement, so
/// the curve shows the steps that led to the weights; an older generation's
/// late report never replaces a newer one's.
async fn store_metrics(
    tx: &mut PgConnection,
    key: &RoleKey,
    metrics: &[MetricPoint],
) -> ApiResult<u64> {
    let rank = if key.role == RoleKind::Worker {
        key.index as i32
    } else {
        -1
    };
    if rank < 0 {
        return Ok(0);
    }
    // One statement for the whole report (a fast job's rank sends hundreds
    // of points a report): a step given twice keeps its first point, as
    // row-by-row inserts did.
    let clean = |v: f64| if v.is_finite() { v } else { f64::MAX };
    let mut seen = std::collections::HashSet::with_capacity(metrics.len());
    let points: Vec<&MetricPoint> = metrics.iter().filter(|m| seen.insert(m.step)).collect();
    if points.is_empty() {
        return Ok(0);
    }
    let col = |f: &dyn Fn(&MetricPoint) -> f64| points.iter().map(|m| f(m)).collect::<Vec<f64>>();
    let opt = |f: &dyn Fn(&MetricPoint) -> Option<f64>| {
        points
            .iter()
            .map(|m| finite(f(m)))
            .collect::<Vec<Option<f64>>>()
    };
    let int = |f: &dyn Fn(&MetricPoint) -> u64| {
        points
            .iter()
            .map(|m| i32::try_from(f(m)).unwrap_or(i32::MAX))
            .collect::<Vec<i32>>()
    };
    let big = |f: &dyn Fn(&MetricPoint) -> u64| {
        points
            .iter()
            .map(|m| i64::try_from(f(m)).unwrap_or(i64::MAX))
            .collect::<Vec<i64>>()
    };
    let stored = sqlx::query(
        "INSERT INTO job_metrics (job_id, rank, step, loss, lr, samples_per_sec, data_seconds, compute_seconds, comm_seconds, eval_loss, eval_accuracy, comm_bytes, staleness, rejected, data_bytes_read, data_cache_hits, data_cache_misses, prefetch_depth, generation)
         SELECT $1, $2, p.* , $19 FROM unnest($3::bigint[], $4::float8[], $5::float8[], $6::float8[], $7::float8[],
                $8::float8[], $9::float8[], $10::float8[], $11::float8[], $12::bigint[], $13::integer[],
                $14::integer[], $15::bigint[], $16::integer[], $17::integer[], $18::integer[]) AS p
         ON CONFLICT (job_id, rank, step) DO UPDATE SET
             loss = EXCLUDED.loss, lr = EXCLUDED.lr, samples_per_sec = EXCLUDED.samples_per_sec,
             data_seconds = EXCLUDED.data_seconds, compute_seconds = EXCLUDED.compute_seconds,
             comm_seconds = EXCLUDED.comm_seconds, eval_loss = EXCLUDED.eval_loss,
             eval_accuracy = EXCLUDED.eval_accuracy, comm_bytes = EXCLUDED.comm_bytes,
             staleness = EXCLUDED.staleness, rejected = EXCLUDED.rejected,
             data_bytes_read = EXCLUDED.data_bytes_read, data_cache_hits = EXCLUDED.data_cache_hits,
             data_cache_misses = EXCLUDED.data_cache_misses, prefetch_depth = EXCLUDED.prefetch_depth,
             generation = EXCLUDED.generation, at = clock_timestamp()
         WHERE job_metrics.generation < EXCLUDED.generation",
    )
    .bind(key.job_id)
    .bind(rank)
    .bind(points.iter().map(|m| m.step as i64).collect::<Vec<i64>>())
    .bind(col(&|m| clean(m.loss)))
    .bind(col(&|m| clean(m.lr)))
    .bind(col(&|m| clean(m.samples_per_sec)))
    .bind(col(&|m| clean(m.data_seconds)))
    .bind(col(&|m| clean(m.compute_seconds)))
    .bind(col(&|m| clean(m.comm_seconds)))
    .bind(opt(&|m| m.eval_loss))
    .bind(opt(&|m| m.eval_accuracy))
    .bind(big(&|m| m.comm_bytes))
    .bind(
        points
            .iter()
            .map(|m| m.staleness.map(|v| i32::try_from(v).unwrap_or(i32::MAX)))
            .collect::<Vec<Option<i32>>>(),
    )
    .bind(int(&|m| u64::from(m.rejected)))
    .bind(big(&|m| m.data_bytes_read))
    .bind(int(&|m| u64::from(m.data_cache_hits)))
    .bind(int(&|m| u64::from(m.data_cache_misses)))
    .bind(int(&|m| u64::from(m.prefetch_depth)))
    .bind(key.generation)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    Ok(stored)
}

/// Stores a role's log lines; returns how many were new.
async fn store_logs(
    tx: &mut PgConnection,
    executor: Uuid,
    key: &RoleKey,
    logs: &[LogLine],
) -> ApiResult<u64> {
    let mut stored = 0;
    for l in logs {
        let at = DateTime::from_timestamp_millis(l.at_ms).unwrap_or_else(Utc::now);
        let message = text(&l.message);
        let level = match l.level {
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        };
        stored += sqlx::query(
            "INSERT INTO job_logs (job_id, executor_id, generation, role, index, seq, at, level, message)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
        )
        .bind(key.job_id)
        .bind(executor)
        .bind(key.generation)
        // Log lines keep the API's names (a standby: `ps`, numbered above
        // every shard), which the logs endpoint shows as they are.
        .bind(key.role.api_name())
        .bind(key.wire_index() as i32)
        .bind(l.seq as i64)
        .bind(at)
        .bind(level)
        .bind(message)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    }
    Ok(stored)
}

/// Buckets of [`MetricSeries::staleness_histogram`].
pub const STALENESS_BUCKETS: i32 = 9;

/// Query of `GET /v1/jobs/{id}/metrics`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MetricsQuery {
    /// Most points to return (1–10000, default 500); longer runs are averaged into buckets.
    pub max_points: Option<String>,
}

/// A job's training curve (rank 0), downsampled for long runs.
#[utoipa::path(
    get, path = "/v1/jobs/{id}/metrics", operation_id = "job_metrics", tag = "jobs",
    params(("id" = Uuid, Path, description = "Job id"), MetricsQuery),
    responses(
        (status = 200, description = "The curve", body = MetricSeries),
        (status = 400, description = "Bad id or query", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn metrics(
    State(st): State<AppState>,
    JobId(id): JobId,
    QueryParams(q): QueryParams<MetricsQuery>,
) -> ApiResult<Json<MetricSeries>> {
    let max = parse_bounded(
        "max_points",
        q.max_points.as_deref(),
        DEFAULT_MAX_POINTS,
        MAX_POINTS,
    )?;
    ensure_job(&st.db, id).await?;
    let count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM job_metrics WHERE job_id = $1 AND rank = 0")
            .bind(id)
            .fetch_one(&st.db)
            .await?;
    let width = (count + max - 1) / max;
    let width = width.max(1);
    let rows = sqlx::query(
        "SELECT max(step) AS step, avg(loss) AS loss, avg(lr) AS lr, avg(samples_per_sec) AS sps,
                avg(data_seconds) AS data, avg(compute_seconds) AS compute, avg(comm_seconds) AS comm,
                avg(comm_bytes)::float8 AS comm_bytes,
                CASE WHEN sum(comm_seconds) > 0 AND sum(comm_bytes) > 0 THEN sum(comm_bytes)::float8 / sum(comm_seconds) / 1e9 END AS bus_gbps,
                (array_agg(eval_loss ORDER BY step DESC) FILTER (WHERE eval_loss IS NOT NULL))[1] AS eval_loss,
                (array_agg(eval_accuracy ORDER BY step DESC) FILTER (WHERE eval_accuracy IS NOT NULL))[1] AS eval_accuracy,
                avg(data_bytes_read)::float8 AS data_bytes_read,
                CASE WHEN sum(data_cache_hits + data_cache_misses) > 0 THEN sum(data_cache_hits)::float8 / sum(data_cache_hits + data_cache_misses) END AS cache_hit_rate,
                avg(prefetch_depth)::float8 AS prefetch_depth,
                max(generation) AS generation
         FROM (SELECT *, row_number() OVER (ORDER BY step) - 1 AS i FROM job_metrics WHERE job_id = $1 AND rank = 0) m
         GROUP BY i / $2 ORDER BY 1",
    )
    .bind(id)
    .bind(width)
    .fetch_all(&st.db)
    .await?;
    let points = rows
        .iter()
        .map(|r| {
            Ok(MetricSample {
                step: r.try_get("step")?,
                loss: r.try_get("loss")?,
                lr: r.try_get("lr")?,
                samples_per_sec: r.try_get("sps")?,
                data_seconds: r.try_get("data")?,
                compute_seconds: r.try_get("compute")?,
                comm_seconds: r.try_get("comm")?,
                comm_bytes: r.try_get("comm_bytes")?,
                bus_gbps: r.try_get("bus_gbps")?,
                eval_loss: r.try_get("eval_loss")?,
                eval_accuracy: r.try_get("eval_accuracy")?,
                data_bytes_read: r.try_get("data_bytes_read")?,
                cache_hit_rate: r.try_get("cache_hit_rate")?,
                prefetch_depth: r.try_get("prefetch_depth")?,
                generation: r.try_get("generation")?,
            })
        })
        .collect::<ApiResult<Vec<_>>>()?;
    let mut staleness_histogram = vec![0i64; STALENESS_BUCKETS as usize];
    let buckets = sqlx::query(
        "SELECT least(staleness, $2 - 1) AS s, count(*) AS n FROM job_metrics
         WHERE job_id = $1 AND staleness IS NOT NULL GROUP BY 1",
    )
    .bind(id)
    .bind(STALENESS_BUCKETS)
    .fetch_all(&st.db)
    .await?;
    for b in &buckets {
        let (s, n): (i32, i64) = (b.try_get("s")?, b.try_get("n")?);
        if let Some(slot) = staleness_histogram.get_mut(s.max(0) as usize) {
            *slot = n;
        }
    }
    let rejected_pushes: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(rejected), 0)::int8 FROM job_metrics WHERE job_id = $1",
    )
    .bind(id)
    .fetch_one(&st.db)
    .await?;
    Ok(Json(MetricSeries {
        steps_recorded: count,
        downsampled: width > 1,
        points,
        staleness_histogram,
        rejected_pushes,
        ranks: rank_progress(&st.db, id).await?,
    }))
}

/// The job's current worker ranks as their heartbeats described them,
/// with the straggler flag of sync jobs.
async fn rank_progress(db: &sqlx::PgPool, id: Uuid) -> ApiResult<Vec<RankProgress>> {
    let rows = sqlx::query(
        "SELECT p.rank, p.generation, p.executor_id, coalesce(e.name, '') AS name, p.step, p.phase,
                p.phase_ms, p.median_step_ms, p.busy_ms, p.window_steps, p.reported_at, j.spec
         FROM role_progress p JOIN jobs j ON j.id = p.job_id AND j.generation = p.generation
         LEFT JOIN executors e ON e.id = p.executor_id
         WHERE p.job_id = $1 ORDER BY p.rank",
    )
    .bind(id)
    .fetch_all(db)
    .await?;
    let spec = match rows.first() {
        Some(r) => Some(stored_spec(id, r.try_get("spec")?)?),
        None => None,
    };
    let sync = spec
        .as_ref()
        .is_some_and(|s| s.consistency_mode() == trainyard_common::spec::Consistency::Sync);
    let factor = spec.map_or(2.0, |s| s.watchdog.straggler_factor);
    let busy: Vec<(f64, u32, f64)> = rows
        .iter()
        .map(|r| {
            (
                r.get::<f64, _>("busy_ms"),
                r.get::<i32, _>("window_steps").max(0) as u32,
                r.get::<f64, _>("median_step_ms"),
            )
        })
        .collect();
    let slow = if sync {
        trainyard_scheduler::service::watchdog::stragglers(&busy, factor)
    } else {
        vec![false; rows.len()]
    };
    rows.iter()
        .zip(slow)
        .map(|(r, straggler)| {
            Ok(RankProgress {
                rank: r.try_get("rank")?,
                generation: r.try_get("generation")?,
                executor_id: r.try_get("executor_id")?,
                executor_name: r.try_get("name")?,
                step: r.try_get("step")?,
                phase: r.try_get("phase")?,
                phase_seconds: r.try_get::<i64, _>("phase_ms")? as f64 / 1e3,
                median_step_seconds: r.try_get::<f64, _>("median_step_ms")? / 1e3,
                busy_ms: r.try_get("busy_ms")?,
                window_steps: r.try_get("window_steps")?,
                straggler,
                reported_at: r.try_get("reported_at")?,
            })
        })
        .collect()
}

/// Every role's log lines, oldest first.
#[utoipa::path(
    get, path = "/v1/jobs/{id}/logs", operation_id = "job_logs", tag = "jobs",
    params(("id" = Uuid, Path, description = "Job id"), AfterQuery),
    responses(
        (status = 200, description = "A page of log lines", body = LogPage),
        (status = 400, description = "Bad id or query", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn logs(
    State(st): State<AppState>,
    JobId(id): JobId,
    QueryParams(q): QueryParams<AfterQuery>,
) -> ApiResult<Json<LogPage>> {
    let (lines, next_after) = log_page(
        &st.db,
        (
            "job_logs",
            "at, executor_id, role, index, generation, level, message",
        ),
        id,
        &q,
        (500, 1000),
        |r| {
            Ok(JobLogLine {
                id: r.try_get("id")?,
                at: r.try_get("at")?,
                executor_id: r.try_get("executor_id")?,
                role: r.try_get("role")?,
                index: r.try_get("index")?,
                generation: r.try_get("generation")?,
                level: r.try_get("level")?,
                message: r.try_get("message")?,
            })
        },
    )
    .await?;
    Ok(Json(LogPage { lines, next_after }))
}
