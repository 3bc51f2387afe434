//! `GET /v1/jobs/{id}/checkpoints` lists a job's committed checkpoints
//! (a script job's from the manifests in its store folder);
//! `GET /v1/jobs/{id}/model` streams its final model: the weights and
//! buffers as safetensors (`?format=safetensors`, the default), or, for a
//! TorchScript job, the user's module with the trained state
//! (`?format=torchscript`, `final/model.pt`); `GET /v1/jobs/{id}/tensors`
//! lists the model's tensors (name, shape, kind, dtype).
//!
//! Committing checkpoints (from the shard reports that come with role
//! reports), retention and clean-up live in
//! [`crate::checkpointing`](crate::checkpointing), which the
//! telemetry and executor routes use too.

use super::job_rows::{ensure_job, fetch_job, stored_spec, stream_object};
use crate::error::{ApiError, ApiResult, Problem};
use crate::extract::{JobId, QueryParams};
use crate::AppState;
use axum::extract::State;
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};
use sqlx::Row;
pub use trainyard_common::api::{CheckpointInfo, CheckpointList};
use trainyard_common::api::{ModelTensors, TensorSource};
use trainyard_common::checkpoint::{
    model_key, script_checkpoints_prefix, torchscript_key, Manifest, ScriptManifest,
};
use trainyard_common::model::{parameters, ParamInfo, TensorKind};
use trainyard_common::spec::ModelSpec;
use utoipa::{IntoParams, ToSchema};

/// List a job's committed checkpoints, newest first.
#[utoipa::path(
    get, path = "/v1/jobs/{id}/checkpoints", operation_id = "list_checkpoints", tag = "jobs",
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
    let spec = stored_spec(id, spec)?;
    let keep = spec.checkpoint.keep;
    if spec.is_script() {
        return Ok(Json(CheckpointList {
            job_id: id,
            keep,
            checkpoints: script_checkpoints(&st, id).await?,
        }));
    }
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

/// A script job's committed checkpoints, newest first: the manifests its
/// rank 0's executor wrote to the store (a folder without one is a commit
/// that did not finish, and is not listed).
async fn script_checkpoints(st: &AppState, id: uuid::Uuid) -> ApiResult<Vec<CheckpointInfo>> {
    let unavailable =
        |e: trainyard_store::StoreError| ApiError::Unavailable(format!("object store: {e}"));
    let listed = st
        .store
        .list(&script_checkpoints_prefix(id))
        .await
        .map_err(unavailable)?;
    let mut out = Vec::new();
    for (key, size) in listed {
        // A manifest is a few KiB; anything else there is not one.
        if !key.ends_with("/manifest.json") || size > 4 << 20 {
            continue;
        }
        let body = match st.store.get(&key).await {
            Ok(b) => b,
            // Removed by retention between the listing and the read.
            Err(trainyard_store::StoreError::NotFound(_)) => continue,
            Err(e) => return Err(unavailable(e)),
        };
        let Ok(m) = serde_json::from_slice::<ScriptManifest>(&body) else {
            continue;
        };
        out.push(CheckpointInfo {
            step: m.seq,
            generation: i64::try_from(m.generation).unwrap_or(i64::MAX),
            shards: u32::try_from(m.files.len()).unwrap_or(u32::MAX),
            bytes: m.files.iter().map(|f| f.size).sum(),
            cursor: Default::default(),
            manifest_url: st.store.url_of(&key),
            committed_at: m.committed_at.unwrap_or_default(),
        });
    }
    out.sort_by_key(|c| std::cmp::Reverse(c.step));
    Ok(out)
}

/// Query of `GET /v1/jobs/{id}/model`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ModelQuery {
    /// `safetensors` (the default): every tensor of the model's
    /// `state_dict()` by name; `torchscript` (TorchScript jobs only): the
    /// submitted module with its trained parameters and buffers, for
    /// `torch.jit.load`.
    // Decoded by hand (ModelFormat::parse): an unknown value is a 400
    // naming `format`, not serde's message about the whole query.
    #[param(inline, value_type = Option<ModelFormat>, example = "torchscript")]
    pub format: Option<String>,
}

/// What `?format=` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModelFormat {
    /// Every tensor of the model's `state_dict()`, by name.
    Safetensors,
    /// The trained TorchScript module (TorchScript jobs only).
    Torchscript,
}

impl ModelFormat {
    fn parse(raw: Option<&str>) -> ApiResult<Self> {
        match raw {
            None | Some("safetensors") => Ok(ModelFormat::Safetensors),
            Some("torchscript") => Ok(ModelFormat::Torchscript),
            Some(other) => Err(ApiError::bad_field(
                "format",
                format!(
                    "must be safetensors or torchscript, got {:?}",
                    other.chars().take(64).collect::<String>()
                ),
            )),
        }
    }
}

/// The name a built-in model has in a spec's `model.kind`.
fn builtin_kind(model: &ModelSpec) -> Option<&'static str> {
    match model {
        ModelSpec::Mlp(_) => Some("mlp"),
        ModelSpec::Cnn(_) => Some("cnn"),
        ModelSpec::Transformer(_) => Some("transformer"),
        ModelSpec::Torchscript(_) => None,
    }
}

/// Stream the job's final model: safetensors (default) or, for a
/// TorchScript job, the trained TorchScript module.
#[utoipa::path(
    get, path = "/v1/jobs/{id}/model", operation_id = "download_model", tag = "jobs",
    params(("id" = Uuid, Path, description = "Job id"), ModelQuery),
    responses(
        (status = 200, description = "The final model. `safetensors`: one tensor per entry of the model's `state_dict()` (parameters and buffers), by its PyTorch name, in its dtype. `torchscript`: the submitted module with the trained parameters and buffers (`torch.jit.load`, then `.eval()`).", content_type = "application/octet-stream"),
        (status = 400, description = "The id is not a UUID; `format` is neither `safetensors` nor `torchscript`; or `torchscript` was asked of a built-in model", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job, or it has no final model yet", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The object store is unreachable", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn model(
    State(st): State<AppState>,
    JobId(id): JobId,
    QueryParams(q): QueryParams<ModelQuery>,
) -> ApiResult<Response> {
    let job = fetch_job(&st.db, id).await?;
    let format = ModelFormat::parse(q.format.as_deref())?;
    let (key, filename, what) = match format {
        ModelFormat::Safetensors => (model_key(id), format!("{id}.safetensors"), "final weights"),
        ModelFormat::Torchscript => {
            if let Some(kind) = job.spec.model.as_ref().and_then(builtin_kind) {
                return Err(ApiError::bad_field(
                    "format",
                    format!(
                        "the job's model is built-in ({kind}), not TorchScript; only safetensors is available"
                    ),
                ));
            }
            (
                torchscript_key(id),
                "model.pt".to_owned(),
                "trained TorchScript module",
            )
        }
    };
    stream_object(&st, &key, &filename, || {
        format!(
            "job {id} has no {what} (it is {}); it is written when the job succeeds",
            job.state.as_str()
        )
    })
    .await
}

/// Longest tensor list the tensors endpoint returns (inspection accepts up
/// to a million tensors; a page that long is no use to anyone reading it).
pub const MAX_LISTED_TENSORS: usize = 10_000;

/// List the model's tensors: name, shape, kind and dtype.
#[utoipa::path(
    get, path = "/v1/jobs/{id}/tensors", operation_id = "get_model_tensors", tag = "jobs",
    params(("id" = Uuid, Path, description = "Job id")),
    responses(
        (status = 200, description = "The model's tensors (at most 10000 listed; the element counts cover all)", body = ModelTensors),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn tensors(
    State(st): State<AppState>,
    JobId(id): JobId,
) -> ApiResult<Json<ModelTensors>> {
    let job = fetch_job(&st.db, id).await?;
    let (source, mut tensors) = match job.spec.model.as_ref().and_then(parameters) {
        Some(t) => (TensorSource::Spec, t),
        None => {
            let stored: Option<serde_json::Value> =
                sqlx::query_scalar("SELECT params FROM jobs WHERE id = $1")
                    .bind(id)
                    .fetch_one(&st.db)
                    .await?;
            match stored {
                Some(v) => (
                    TensorSource::Inspection,
                    serde_json::from_value::<Vec<ParamInfo>>(v)
                        .map_err(|e| ApiError::Internal(e.into()))?,
                ),
                None => (TensorSource::Pending, Vec::new()),
            }
        }
    };
    let elements = |kind: TensorKind| {
        tensors
            .iter()
            .filter(|t| t.kind == kind)
            .map(ParamInfo::numel)
            .fold(0u64, u64::saturating_add)
    };
    let (parameters, buffers, frozen) = (
        elements(TensorKind::Parameter),
        elements(TensorKind::Buffer),
        elements(TensorKind::Frozen),
    );
    let count = tensors.len() as u64;
    tensors.truncate(MAX_LISTED_TENSORS);
    Ok(Json(ModelTensors {
        job_id: id,
        source,
        tensors,
        count,
        parameters,
        buffers,
        frozen,
    }))
}
