//! `GET /v1/jobs/{id}/checkpoints` lists a job's committed checkpoints;
//! `GET /v1/jobs/{id}/model` streams its final weights (safetensors).
//!
//! Committing checkpoints (from the shard reports that come with role
//! reports), retention and clean-up live in
//! [`shared::checkpointing`](super::shared::checkpointing), which the
//! telemetry and executor routes use too.

use super::shared::job_rows::{ensure_job, fetch_job};
use crate::error::{ApiError, ApiResult, Problem};
use crate::extract::JobId;
use crate::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::TryStreamExt;
use sqlx::Row;
pub use trainyard_common::api::{CheckpointInfo, CheckpointList};
use trainyard_common::checkpoint::{model_key, Manifest};
use trainyard_common::JobSpecInput;

/// List a job's committed checkpoints, newest first.
#[utoipa::path(
    get, path = "/v1/jobs/{id}/checkpoints", tag = "jobs",
    params(("id" = Uuid, Path, description = "Job id")),
    responses(
        (status = 200, description = "Committed checkpoints", body = CheckpointList),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn list(State(st): State<AppState>, JobId(id): JobId) -> ApiResult<Json<CheckpointList>> {
    ensure_job(&st.db, id).await?;
    let spec: serde_json::Value = sqlx::query_scalar("SELECT spec FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_one(&st.db)
        .await?;
    let keep = serde_json::from_value::<JobSpecInput>(spec)
        .map(|s| s.checkpoint.keep)
        .unwrap_or(3);
    let rows = sqlx::query(
        "SELECT step, generation, shards, bytes, manifest_key, manifest, committed_at
         FROM checkpoints WHERE job_id = $1 ORDER BY step DESC",
    )
    .bind(id)
    .fetch_all(&st.db)
    .await?;
    let mut checkpoints = Vec::with_capacity(rows.len());
    for r in rows {
        let manifest: Manifest = serde_json::from_value(r.try_get("manifest")?)
            .map_err(|e| ApiError::Internal(e.into()))?;
        checkpoints.push(CheckpointInfo {
            step: r.try_get::<i64, _>("step")? as u64,
            generation: r.try_get("generation")?,
            shards: r.try_get::<i32, _>("shards")? as u32,
            bytes: r.try_get::<i64, _>("bytes")? as u64,
            cursor: manifest.cursor,
            manifest_url: st.store.url_of(&r.try_get::<String, _>("manifest_key")?),
            committed_at: r.try_get("committed_at")?,
        });
    }
    Ok(Json(CheckpointList {
        job_id: id,
        keep,
        checkpoints,
    }))
}

/// Stream the job's final weights as safetensors.
#[utoipa::path(
    get, path = "/v1/jobs/{id}/model", tag = "jobs",
    params(("id" = Uuid, Path, description = "Job id")),
    responses(
        (status = 200, description = "The final weights (safetensors: one tensor per model parameter, by name)", content_type = "application/octet-stream"),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job, or it has no final weights yet", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The object store is unreachable", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn model(State(st): State<AppState>, JobId(id): JobId) -> ApiResult<Response> {
    let job = fetch_job(&st.db, id).await?;
    let key = model_key(id);
    let (size, stream) = match st.store.stream(&key).await {
        Ok(s) => s,
        Err(trainyard_store::StoreError::NotFound(_)) => {
            return Err(ApiError::NotFound(format!(
                "job {id} has no final weights (it is {}); they are written when it succeeds",
                job.state.as_str()
            )))
        }
        Err(e) => return Err(ApiError::Unavailable(format!("object store: {e}"))),
    };
    let body = Body::from_stream(stream.map_err(std::io::Error::other));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, size.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{id}.safetensors\""),
            ),
        ],
        body,
    )
        .into_response())
}
