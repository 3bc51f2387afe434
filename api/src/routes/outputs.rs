//! `GET /v1/jobs/{id}/outputs` lists a script job's outputs (what its rank
//! 0 wrote to `TRAINYARD_OUTPUT_DIR`, stored by the executor when the
//! script finished) and `GET /v1/jobs/{id}/outputs/{path}` streams one.
//! The path is checked like an archive entry's: relative, no `..`.

use super::job_rows::{fetch_job, stream_object};
use crate::error::{ApiError, ApiResult, Problem};
use crate::extract::JobId;
use crate::AppState;
use axum::extract::{RawPathParams, State};
use axum::response::Response;
use axum::Json;
use trainyard_common::api::{OutputFile, OutputList};
use trainyard_common::checkpoint::{output_key, outputs_prefix};
use trainyard_common::spec::script::relative_path_problem;

/// List a script job's outputs.
#[utoipa::path(
    get, path = "/v1/jobs/{id}/outputs", operation_id = "list_outputs", tag = "jobs",
    params(("id" = Uuid, Path, description = "Job id")),
    responses(
        (status = 200, description = "The files rank 0 left in `TRAINYARD_OUTPUT_DIR` (none before the job succeeds, and none for a model job)", body = OutputList),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The object store is unreachable", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn list(State(st): State<AppState>, JobId(id): JobId) -> ApiResult<Json<OutputList>> {
    fetch_job(&st.db, id).await?;
    let prefix = outputs_prefix(id);
    let listed = st
        .store
        .list(&prefix)
        .await
        .map_err(|e| ApiError::Unavailable(format!("object store: {e}")))?;
    let outputs = listed
        .into_iter()
        .filter_map(|(key, size)| {
            let path = key.strip_prefix(&prefix)?.to_owned();
            Some(OutputFile { path, size })
        })
        .collect();
    Ok(Json(OutputList {
        job_id: id,
        outputs,
    }))
}

/// Download one of a script job's outputs.
#[utoipa::path(
    get, path = "/v1/jobs/{id}/outputs/{path}", operation_id = "download_output", tag = "jobs",
    params(
        ("id" = Uuid, Path, description = "Job id"),
        ("path" = String, Path, description = "The file's path in the output folder, as the listing gives it"),
    ),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream"),
        (status = 400, description = "The id is not a UUID, or the path is not a relative path without `..`", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job, or no such output", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The object store is unreachable", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn download(State(st): State<AppState>, params: RawPathParams) -> ApiResult<Response> {
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_owned())
            .unwrap_or_default()
    };
    let raw = param("id");
    let id = uuid::Uuid::parse_str(&raw)
        .map_err(|_| ApiError::bad_field("id", format!("must be a UUID, got {raw:?}")))?;
    let path = param("path");
    let job = fetch_job(&st.db, id).await?;
    if let Some(why) = relative_path_problem(&path) {
        return Err(ApiError::bad_field("path", why));
    }
    // An output's path is a file's under a folder: bounded like one.
    if path.len() > 1024
        || path
            .split('/')
            .any(|p| p.is_empty() || p == "." || p.len() > 255)
    {
        return Err(ApiError::bad_field(
            "path",
            "must be at most 1024 bytes of non-empty segments of at most 255 bytes, none `.`",
        ));
    }
    let name = path.rsplit('/').next().unwrap_or(&path).to_owned();
    stream_object(&st, &output_key(id, &path), &name, || {
        format!(
            "job {id} has no output {path:?} (it is {}); outputs are stored when a script job succeeds",
            job.state.as_str()
        )
    })
    .await
}
