//! `/v1/sweeps`: make a hyperparameter sweep, list and read sweeps, cancel
//! one. The store and the controller that runs trials are
//! [`controller`]; a user sees and cancels only its own sweeps (an admin
//! every one), and another user's sweep answers 404 as a missing one does.

use super::params::parse_body;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult, Problem};
use crate::extract::JsonBytes;
use crate::AppState;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
pub mod controller;

use controller as sweeps;
pub use trainyard_common::api::{Sweep, SweepList};
use trainyard_common::sweep::SweepSpec;
use uuid::Uuid;

/// Most sweeps `GET /v1/sweeps` returns.
pub const LIST_LIMIT: i64 = 100;

fn sweep_id(raw: &str) -> ApiResult<Uuid> {
    Uuid::parse_str(raw).map_err(|_| ApiError::bad_field("id", format!("not a UUID: {raw:?}")))
}

fn not_found(id: Uuid) -> ApiError {
    ApiError::NotFound(format!("no sweep with id {id}"))
}

async fn visible(st: &AppState, who: &Principal, id: Uuid) -> ApiResult<Sweep> {
    match sweeps::load(&st.db, id).await? {
        Some(s) if who.sees(&s.owner) => Ok(s),
        _ => Err(not_found(id)),
    }
}

/// Make a sweep.
///
/// Every trial's spec is the base with the trial's values set, checked as
/// a job spec and against the caller's data policy before anything is
/// stored; trials then start as jobs of the caller, `concurrency` at a
/// time.
#[utoipa::path(
    post, path = "/v1/sweeps", operation_id = "create_sweep", tag = "sweeps",
    request_body(content = SweepSpec, content_type = "application/json"),
    responses(
        (status = 201, description = "Made; its trials start at once", body = Sweep),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON (Content-Type)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid sweep (the field is named: `parameters.<path>`, `base.<field>`, …)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create(
    State(st): State<AppState>,
    who: Principal,
    JsonBytes(body): JsonBytes,
) -> ApiResult<Response> {
    let spec: SweepSpec = parse_body(&body)?;
    let id = sweeps::create(&st, &who.user, who.is_admin(), spec).await?;
    // The first trials start now rather than at the next tick; only this
    // sweep is driven, so the answer does not wait on other users' sweeps.
    if let Err(e) = sweeps::drive(&st, id).await {
        tracing::warn!(sweep = %id, error = %e, "first tick of a new sweep failed");
    }
    let sweep = sweeps::load(&st.db, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    let mut resp = (StatusCode::CREATED, Json(sweep)).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/sweeps/{id}")) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    Ok(resp)
}

/// The caller's sweeps (an admin's: everyone's), newest first, at most 100.
#[utoipa::path(
    get, path = "/v1/sweeps", operation_id = "list_sweeps", tag = "sweeps",
    responses((status = 200, description = "The sweeps", body = SweepList))
)]
pub async fn list(State(st): State<AppState>, who: Principal) -> ApiResult<Json<SweepList>> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM sweeps WHERE ($1::text IS NULL OR owner = $1)
         ORDER BY created_at DESC, id DESC LIMIT $2",
    )
    .bind(who.scope())
    .bind(LIST_LIMIT)
    .fetch_all(&st.db)
    .await?;
    let mut sweeps = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(s) = sweeps::load(&st.db, id).await? {
            sweeps.push(s);
        }
    }
    Ok(Json(SweepList { sweeps }))
}

/// Read one sweep: its trials, their rungs, the best so far and the
/// survivors' growths.
#[utoipa::path(
    get, path = "/v1/sweeps/{id}", operation_id = "get_sweep", tag = "sweeps",
    params(("id" = Uuid, Path, description = "Sweep id")),
    responses(
        (status = 200, description = "The sweep", body = Sweep),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such sweep", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get(
    State(st): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Sweep>> {
    let id = sweep_id(&id)?;
    Ok(Json(visible(&st, &who, id).await?))
}

/// Cancel a sweep: no more trials start, running trials are cancelled.
/// Idempotent: a sweep that already ended is returned unchanged.
#[utoipa::path(
    post, path = "/v1/sweeps/{id}/cancel", operation_id = "cancel_sweep", tag = "sweeps",
    params(("id" = Uuid, Path, description = "Sweep id")),
    responses(
        (status = 200, description = "The sweep", body = Sweep),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such sweep", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn cancel(
    State(st): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Sweep>> {
    let id = sweep_id(&id)?;
    visible(&st, &who, id).await?;
    sweeps::cancel(&st.db, id).await?;
    Ok(Json(visible(&st, &who, id).await?))
}
