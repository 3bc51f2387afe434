//! Who may call an executor endpoint: the executor itself, by the
//! credential it got at registration (stored as a SHA-256 hash in its row),
//! and for drain and leave also an admin. The routes take it as an
//! extractor, [`OwnExecutor`] or [`ExecutorOrAdmin`]: the route's `{id}`
//! checked against the caller's credential, with the executor's row.
//! Used by the executor routes, the suspect reports and the role reports
//! of the telemetry routes.

use crate::auth::{bearer, constant_time_eq, hash_token as hash};
use crate::error::{ApiError, ApiResult};
use crate::extract::ExecutorId;
use crate::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use sqlx::postgres::PgRow;
use sqlx::Row;
use uuid::Uuid;

/// The columns an executor is read from.
pub const EXECUTOR_COLUMNS: &str = "id, name, address, state, resources, labels, sandbox, environments, token_hash, registered_at, last_heartbeat_at,
     extract(epoch FROM clock_timestamp() - last_heartbeat_at)::float8 AS since";

/// Executor `id`'s row of [`EXECUTOR_COLUMNS`], or a 404.
pub async fn executor_row(st: &AppState, id: Uuid) -> ApiResult<PgRow> {
    sqlx::query(&format!(
        "SELECT {EXECUTOR_COLUMNS} FROM executors WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&st.db)
    .await?
    .ok_or_else(|| ApiError::NotFound(format!("no executor with id {id}")))
}

/// Checks the executor's own credential (or, for drain and leave, an
/// admin's token) and returns its row. A user's token is a 403 there; any
/// other credential a 401.
async fn authorize(
    st: &AppState,
    headers: &HeaderMap,
    id: Uuid,
    allow_admin: bool,
) -> ApiResult<PgRow> {
    if allow_admin {
        match crate::auth::resolve(st, headers).await {
            Ok(who) if who.is_admin() => return executor_row(st, id).await,
            Ok(who) => {
                return Err(ApiError::Forbidden(format!(
                    "managing executors needs the admin role; {:?} is a user",
                    who.user
                )))
            }
            Err(ApiError::Unauthorized) => {}
            Err(e) => return Err(e),
        }
    }
    let given = bearer(headers).ok_or(ApiError::Unauthorized)?;
    let row = executor_row(st, id).await?;
    let stored: Vec<u8> = row.try_get("token_hash")?;
    if !constant_time_eq(&hash(given), &stored) {
        return Err(ApiError::Unauthorized);
    }
    Ok(row)
}

/// An executor route called by that executor, with its own credential:
/// its id and its row ([`EXECUTOR_COLUMNS`]). A bad `{id}` is a 400, an
/// unknown one a 404, any other credential a 401.
pub struct OwnExecutor {
    /// The executor's id.
    pub id: Uuid,
    /// Its row.
    pub row: PgRow,
}

/// An executor route called by that executor or by an admin (drain,
/// leave): as [`OwnExecutor`], and a user's token is a 403.
pub struct ExecutorOrAdmin {
    /// The executor's id.
    pub id: Uuid,
    /// Its row.
    pub row: PgRow,
}

impl FromRequestParts<AppState> for OwnExecutor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, ApiError> {
        let ExecutorId(id) = ExecutorId::from_request_parts(parts, st).await?;
        let row = authorize(st, &parts.headers, id, false).await?;
        Ok(OwnExecutor { id, row })
    }
}

impl FromRequestParts<AppState> for ExecutorOrAdmin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, ApiError> {
        let ExecutorId(id) = ExecutorId::from_request_parts(parts, st).await?;
        let row = authorize(st, &parts.headers, id, true).await?;
        Ok(ExecutorOrAdmin { id, row })
    }
}
