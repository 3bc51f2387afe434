//! Liveness, readiness and Prometheus metrics.

use crate::error::{ApiError, ApiResult, Problem};
use crate::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;
use sqlx::Row;
use std::time::Duration;
use trainyard_common::JobState;
use utoipa::ToSchema;

/// How long readiness waits for Postgres.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Health answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok` or `ready`.
    #[schema(example = "ok")]
    pub status: &'static str,
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "health",
    responses((status = 200, description = "Alive", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Readiness: Postgres answers within two seconds.
#[utoipa::path(get, path = "/readyz", operation_id = "readyz", tag = "health",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Postgres unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn readyz(State(st): State<AppState>) -> ApiResult<Json<Health>> {
    match tokio::time::timeout(READY_TIMEOUT, sqlx::query("SELECT 1").execute(&st.db)).await {
        Ok(Ok(_)) => Ok(Json(Health { status: "ready" })),
        Ok(Err(e)) => Err(ApiError::Unavailable(format!("database: {e}"))),
        Err(_) => Err(ApiError::Unavailable(
            "database did not answer in time".into(),
        )),
    }
}

/// Prometheus metrics in the text exposition format.
#[utoipa::path(get, path = "/metrics", operation_id = "server_metrics", tag = "health",
    responses((status = 200, description = "Metrics", body = String, content_type = "text/plain")))]
pub async fn metrics(State(st): State<AppState>) -> ApiResult<impl IntoResponse> {
    let rows = sqlx::query("SELECT state, count(*) AS n FROM jobs GROUP BY state")
        .fetch_all(&st.db)
        .await?;
    for s in JobState::ALL {
        st.metrics.jobs.with_label_values(&[s.as_str()]).set(0);
    }
    for r in rows {
        let state: JobState = r.try_get("state")?;
        let n: i64 = r.try_get("n")?;
        st.metrics.jobs.with_label_values(&[state.as_str()]).set(n);
    }
    // Usage counters catch up with the history's totals (which only grow
    // while jobs are kept).
    let rows = sqlx::query(
        "SELECT owner,
                sum(cuda_devices * secs)::float8 AS cuda, sum(cpu_workers * secs)::float8 AS cpu,
                sum(ps_ram_bytes::float8 / 1073741824 * secs / 3600)::float8 AS ram
         FROM (SELECT i.owner, i.cuda_devices, i.cpu_workers, i.ps_ram_bytes,
                      greatest(0, extract(epoch FROM coalesce(i.ended_at, j.finished_at, clock_timestamp()) - i.started_at))::float8 AS secs
               FROM usage_intervals i JOIN jobs j ON j.id = i.job_id) u
         GROUP BY owner",
    )
    .fetch_all(&st.db)
    .await?;
    for r in rows {
        let owner: String = r.try_get("owner")?;
        for (counter, total) in [
            (
                st.metrics
                    .usage_worker_seconds
                    .with_label_values(&[&owner, "cuda"]),
                r.try_get::<f64, _>("cuda")?,
            ),
            (
                st.metrics
                    .usage_worker_seconds
                    .with_label_values(&[&owner, "cpu"]),
                r.try_get::<f64, _>("cpu")?,
            ),
            (
                st.metrics
                    .usage_ps_ram_gib_hours
                    .with_label_values(&[&owner]),
                r.try_get::<f64, _>("ram")?,
            ),
        ] {
            let gap = total - counter.get();
            if gap > 0.0 {
                counter.inc_by(gap);
            }
        }
    }
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.metrics.render(),
    ))
}
