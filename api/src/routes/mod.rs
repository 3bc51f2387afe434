//! The router: resources, middleware and fallbacks.
//!
//! Layers, outermost first: panic catcher (a bug becomes a 500 problem, never
//! a dropped connection), request tracing, metrics, timeout, body limit;
//! the artifact routes sit outside the timeout ([`artifacts`]).
//! User-facing `/v1` routes sit behind [`auth::authenticate`] (a caller
//! resolved to a user and role, or a 401); tokens and the executor listing
//! behind [`auth::require_admin`] too (and quotas; usage is any user's,
//! scoped to its own); a job's own routes behind
//! [`auth::job_visible`] (another user's job is a 404). Executor endpoints
//! check the join token or the executor's own credential instead. Health,
//! metrics, the OpenAPI document, the docs page and the web page are open. Unknown routes and wrong methods answer with problem details too.
//!
//! Each resource module holds its handlers and the SQL only they run. What
//! several of them need to answer a request is in three helpers that import
//! no resource module, so no resource module imports another: [`params`]
//! (query parameters and JSON bodies decoded with problem details, executor
//! text made storable), [`job_rows`] (a job's row read into
//! [`Job`](trainyard_common::api::Job), its stored spec, the 404) and
//! [`access`] (an executor's credential, or an admin's token, checked
//! against its row). The rules they apply live beside the router, not in
//! it: [`crate::checkpointing`], [`crate::data_policy`], [`crate::fencing`]
//! and [`crate::wakeup`].

pub mod access;
pub mod artifacts;
pub mod assignments;
pub mod checkpoints;
pub mod executors;
pub mod health;
pub mod job_rows;
pub mod jobs;
pub mod outputs;
pub mod params;
pub mod provisioner;
pub mod sharing;
pub mod stream;
pub mod suspects;
pub mod sweeps;
pub mod telemetry;
pub mod tensorboard;
pub mod tokens;

use crate::error::ApiError;
use crate::extract::BodyLimit;
use crate::{auth, metrics, web, AppState};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::time::Duration;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

/// Builds the whole router over `state`, with `docs` (the OpenAPI document
/// and its docs page, `crate::openapi::routes`) mounted under the same
/// layers. The caller passes `docs` in because that document is built from
/// these modules' handlers: mounting it here would make the two modules
/// import each other.
pub fn router(state: AppState, docs: Router<AppState>) -> Router {
    let limit = state.config.max_body_bytes;
    // A job's own resources: another user's job is a 404 (auth::job_visible).
    let job_scoped = Router::new()
        .route("/jobs/{id}", get(jobs::get))
        .route("/jobs/{id}/cancel", post(jobs::cancel))
        .route("/jobs/{id}/events", get(jobs::events))
        .route("/jobs/{id}/assignments", get(assignments::assignments))
        .route("/jobs/{id}/checkpoints", get(checkpoints::list))
        .route("/jobs/{id}/model", get(checkpoints::model))
        .route("/jobs/{id}/tensors", get(checkpoints::tensors))
        .route("/jobs/{id}/outputs", get(outputs::list))
        .route("/jobs/{id}/outputs/{*path}", get(outputs::download))
        .route("/jobs/{id}/metrics", get(telemetry::metrics))
        .route("/jobs/{id}/logs", get(telemetry::logs))
        .route("/jobs/{id}/tensorboard", get(tensorboard::tensorboard))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::job_visible,
        ));
    // Tokens and the executor listing: admins only (a user gets a 403).
    let admin_only = Router::new()
        .route("/tokens", post(tokens::create).get(tokens::list))
        .route("/tokens/{id}", axum::routing::delete(tokens::revoke))
        .route("/executors", get(executors::list))
        .route("/executors/{id}", get(executors::get))
        .route("/quotas", get(sharing::list_quotas))
        .route(
            "/quotas/{owner}",
            get(sharing::get_quota).put(sharing::set_quota),
        )
        .route_layer(middleware::from_fn(auth::require_admin));
    // Every user-facing route: the caller is resolved to a Principal (or
    // 401s) before anything else runs.
    let users = Router::new()
        .route("/jobs", post(jobs::submit).get(jobs::list))
        .route("/events/stream", get(stream::stream))
        .route("/provisioner", get(provisioner::status))
        .route("/whoami", get(tokens::whoami))
        .route("/usage", get(sharing::usage))
        .route("/sweeps", post(sweeps::create).get(sweeps::list))
        .route("/sweeps/{id}", get(sweeps::get))
        .route("/sweeps/{id}/cancel", post(sweeps::cancel))
        .merge(job_scoped)
        .merge(admin_only)
        .method_not_allowed_fallback(method_not_allowed)
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ));
    // Executor endpoints check their own credentials (join token, executor
    // token) instead of a user's.
    let agents = Router::new()
        .route("/executors", post(executors::register))
        .route("/executors/{id}", axum::routing::delete(executors::leave))
        .route("/executors/{id}/heartbeat", post(executors::heartbeat))
        .route("/executors/{id}/drain", post(executors::drain))
        .route("/executors/{id}/reports", post(telemetry::report))
        .route("/executors/{id}/inspections", post(executors::inspection))
        .route("/executors/{id}/suspects", post(suspects::report));
    let v1 = users.merge(agents);
    // Artifacts move files of any size: outside the request timeout (an
    // upload that stalls is cut by its own idle timeout) and the JSON body
    // limit (the handler bounds what it streams).
    let artifacts = Router::new()
        .route("/v1/artifacts", get(artifacts::list))
        .route(
            "/v1/artifacts/{name}",
            get(artifacts::get)
                .put(artifacts::upload)
                .delete(artifacts::delete),
        )
        .route("/v1/artifacts/{name}/content", get(artifacts::content))
        .method_not_allowed_fallback(method_not_allowed)
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .layer(middleware::from_fn_with_state(
            state.metrics.clone(),
            metrics::track,
        ));

    Router::new()
        .nest("/v1", v1)
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .merge(docs)
        .merge(web::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.metrics.clone(),
            metrics::track,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            timeout_as_problem,
        ))
        .layer(TimeoutLayer::with_status_code(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            Duration::from_secs(state.config.request_timeout_secs),
        ))
        .merge(artifacts)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::Extension(BodyLimit(limit)))
        .layer(TraceLayer::new_for_http())
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::Internal(anyhow::anyhow!("handler panicked")).into_response()
        }))
        .with_state(state)
}

/// The timeout layer answers with a bare 408; give it our problem body.
async fn timeout_as_problem(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    if resp.status() == axum::http::StatusCode::REQUEST_TIMEOUT
        && resp
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .is_none()
    {
        return ApiError::Timeout(st.config.request_timeout_secs).into_response();
    }
    resp
}

async fn not_found(req: Request) -> ApiError {
    ApiError::NotFound(format!(
        "no route for {} {}",
        req.method(),
        req.uri().path()
    ))
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
