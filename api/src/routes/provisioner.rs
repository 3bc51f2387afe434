//! `GET /v1/provisioner`: who starts executors, within which limits, the
//! executors it runs and ran, and its recent decisions with their reasons.
//!
//! The rows are written by the scheduler's fleet (`trainyard-scheduler`'s
//! `fleet` module) in whichever replica leads; the limits shown are this
//! replica's configuration, which every replica shares.

use crate::error::ApiResult;
use crate::extract::QueryParams;
use crate::routes::jobs::parse_limit;
use crate::AppState;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use sqlx::Row;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

/// The provisioner's settings, as the server runs it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProvisionerSettings {
    /// `local` (executor processes on the API's machine) or `none`.
    pub kind: String,
    /// Most executors it runs at once (its own limit, clamped to the CPU
    /// and memory budget).
    pub max_executors: u32,
    /// Most new executors one job may need; larger jobs stay queued.
    pub max_per_job: u32,
    /// Seconds an executor it started may hold no role before it goes.
    pub idle_timeout_secs: u64,
    /// Seconds a started executor may take to register.
    pub start_timeout_secs: u64,
    /// CPU cores it may use for executors.
    pub cpu_budget: f64,
    /// Memory it may give executors, in MiB.
    pub memory_budget_mb: u64,
    /// CPU cores each executor gets (its libtorch threads, rounded down).
    pub executor_cpus: f64,
    /// RAM each executor offers, in MiB.
    pub executor_memory_mb: u64,
}

/// An executor the provisioner started.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProvisionedExecutor {
    /// The name it registers under.
    pub name: String,
    /// `starting`, `running`, `stopping`, `stopped`, `exited`, `failed` or `gone`.
    pub state: String,
    /// Its process id on the provisioner's host.
    pub pid: Option<i32>,
    /// The machine that started it.
    pub host: String,
    /// Its executor id once it registered.
    pub executor_id: Option<Uuid>,
    /// Why it is in its state, where known.
    pub reason: Option<String>,
    /// When it was started.
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// When it ended.
    pub stopped_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// One provisioning decision.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProvisionerEvent {
    /// Increasing id.
    pub id: i64,
    /// When.
    pub at: chrono::DateTime<chrono::Utc>,
    /// `start`, `release`, `stopped`, `exited`, `failed`, `blocked` or `adopted`.
    pub kind: String,
    /// The executor concerned.
    pub executor: Option<String>,
    /// The job concerned (a `blocked` decision).
    pub job_id: Option<Uuid>,
    /// Why, in a sentence.
    pub reason: String,
    /// Details (`start`: the executors and the jobs they are for).
    pub data: serde_json::Value,
}

/// The provisioner's state.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProvisionerStatus {
    /// Its settings (`kind: none` when executors are only started by hand).
    pub settings: ProvisionerSettings,
    /// Executors it runs, then the most recent ended ones (up to 50).
    pub executors: Vec<ProvisionedExecutor>,
    /// Its decisions, newest first.
    pub events: Vec<ProvisionerEvent>,
}

/// Query of `GET /v1/provisioner`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StatusQuery {
    /// How many recent decisions to include (1–1000, default 100).
    pub limit: Option<String>,
}

/// The provisioner: settings, executors it started, recent decisions.
#[utoipa::path(
    get, path = "/v1/provisioner", tag = "executors",
    params(StatusQuery),
    responses(
        (status = 200, description = "The provisioner's state", body = ProvisionerStatus),
        (status = 400, description = "A bad `limit` or an unknown parameter", body = crate::error::Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn status(
    State(st): State<AppState>,
    QueryParams(q): QueryParams<StatusQuery>,
) -> ApiResult<Json<ProvisionerStatus>> {
    let limit = parse_limit(q.limit.as_deref(), 100, 1000)?;
    let rows = sqlx::query(
        "(SELECT name, state, pid, host, executor_id, reason, started_at, stopped_at
            FROM provisioned_executors WHERE state IN ('starting', 'running', 'stopping')
            ORDER BY started_at)
         UNION ALL
         (SELECT name, state, pid, host, executor_id, reason, started_at, stopped_at
            FROM provisioned_executors WHERE state NOT IN ('starting', 'running', 'stopping')
            ORDER BY stopped_at DESC NULLS LAST LIMIT 50)",
    )
    .fetch_all(&st.db)
    .await?;
    let mut executors = Vec::with_capacity(rows.len());
    for r in rows {
        executors.push(ProvisionedExecutor {
            name: r.try_get("name")?,
            state: r.try_get("state")?,
            pid: r.try_get("pid")?,
            host: r.try_get("host")?,
            executor_id: r.try_get("executor_id")?,
            reason: r.try_get("reason")?,
            started_at: r.try_get("started_at")?,
            stopped_at: r.try_get("stopped_at")?,
        });
    }
    let rows = sqlx::query(
        "SELECT id, at, kind, executor_name, job_id, reason, data FROM provisioner_events
         ORDER BY id DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(&st.db)
    .await?;
    let mut events = Vec::with_capacity(rows.len());
    for r in rows {
        events.push(ProvisionerEvent {
            id: r.try_get("id")?,
            at: r.try_get("at")?,
            kind: r.try_get("kind")?,
            executor: r.try_get("executor_name")?,
            job_id: r.try_get("job_id")?,
            reason: r.try_get("reason")?,
            data: r.try_get("data")?,
        });
    }
    Ok(Json(ProvisionerStatus {
        settings: st.provisioner.as_ref().clone(),
        executors,
        events,
    }))
}
