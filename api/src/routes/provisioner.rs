//! `GET /v1/provisioner`: who starts executors, within which limits, the
//! executors it runs and ran, and its recent decisions with their reasons.
//!
//! The rows are written by the scheduler's fleet (`trainyard-scheduler`'s
//! `fleet` module) in whichever replica leads; the limits shown are this
//! replica's configuration, which every replica shares.

use super::params::parse_limit;
use crate::error::ApiResult;
use crate::extract::QueryParams;
use crate::AppState;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use sqlx::Row;
pub use trainyard_common::api::{
    ProvisionedExecutor, ProvisionerEvent, ProvisionerSettings, ProvisionerStatus,
};
use trainyard_common::api::{ProvisionedState, ProvisionerEventKind};
use utoipa::IntoParams;

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
    get, path = "/v1/provisioner", operation_id = "provisioner_status", tag = "executors",
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
            state: stored(ProvisionedState::parse, r.try_get("state")?)?,
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
            kind: stored(ProvisionerEventKind::parse, r.try_get("kind")?)?,
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

/// A stored name read back as its enum (the table's `CHECK` allows no
/// other).
fn stored<T>(parse: fn(&str) -> Option<T>, name: String) -> ApiResult<T> {
    parse(&name).ok_or_else(|| {
        crate::error::ApiError::Internal(anyhow::anyhow!(
            "the database holds an unknown provisioner name {name:?}"
        ))
    })
}
