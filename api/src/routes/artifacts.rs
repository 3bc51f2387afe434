//! Users' files: `PUT /v1/artifacts/{name}` streams a model or dataset into
//! the object store under the caller's namespace (`artifacts/<owner>/…`),
//! never holding the whole body; a spec then names it `artifact:{name}`.
//! Each upload is a version: re-uploading a name swaps the name to the new
//! version in one statement, and a job keeps reading the version it was
//! submitted with (the old bytes stay until no unfinished job reads them,
//! `crate::data_policy::sweep_superseded`). Sizes are bounded per artifact
//! and per user (`--max-artifact-bytes`, `--max-artifact-bytes-per-user`).
//!
//! These routes are mounted outside the request timeout (an upload of
//! gigabytes takes longer than any request should); an upload that moves no
//! byte for `--artifact-idle-timeout-secs` is cut instead.

use crate::auth::Principal;
use crate::data_policy::{artifact_key, sweep_superseded};
use crate::error::{ApiError, ApiResult, Problem};
use crate::extract::QueryParams;
use crate::AppState;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sqlx::Row;
use std::collections::BTreeMap;
use std::time::Duration;
use trainyard_common::artifact::{artifact_name_problem, Artifact, ArtifactPage, ARTIFACT_SCHEME};
use utoipa::IntoParams;
use uuid::Uuid;

/// Query of the artifact routes: whose artifact (admins; a user's own
/// otherwise).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OwnerQuery {
    /// The owner (admins may name any user; a user only itself).
    pub owner: Option<String>,
}

/// The average rate an upload must keep once its first idle period is
/// over.
const MIN_UPLOAD_BYTES_PER_SEC: f64 = 64.0 * 1024.0;

/// Uploads one user may stream at once through one API process (each holds
/// a connection and up to one multipart part in memory, and stages bytes
/// in the store before the quota's final check).
const MAX_UPLOADS_PER_USER: usize = 2;

/// One of a user's upload slots, given back when dropped.
struct UploadSlot(String);

static UPLOADS: std::sync::Mutex<BTreeMap<String, usize>> = std::sync::Mutex::new(BTreeMap::new());

impl UploadSlot {
    fn take(key: &str, owner: &str) -> ApiResult<UploadSlot> {
        let mut m = UPLOADS.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(key.to_owned()).or_default();
        if *n >= MAX_UPLOADS_PER_USER {
            return Err(ApiError::TooManyRequests {
                detail: format!(
                    "user {owner:?} already streams {MAX_UPLOADS_PER_USER} uploads; retry when one has finished"
                ),
                retry_after: 5,
            });
        }
        *n += 1;
        Ok(UploadSlot(key.to_owned()))
    }
}

impl Drop for UploadSlot {
    fn drop(&mut self) {
        let mut m = UPLOADS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.0);
            }
        }
    }
}

/// Query of `GET /v1/artifacts/{name}`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GetQuery {
    /// The owner (admins may name any user; a user only itself).
    pub owner: Option<String>,
    /// Present: answer with the bytes instead of the metadata (as
    /// `GET /v1/artifacts/{name}/content`).
    pub download: Option<String>,
}

/// The name in the path, checked (a 400 naming `name`).
fn checked_name(name: &str) -> ApiResult<()> {
    match artifact_name_problem(name) {
        Some(why) => Err(ApiError::bad_field("name", why)),
        None => Ok(()),
    }
}

/// The owner a request is about: the caller's own name, or for an admin
/// the `owner` it names. A user naming another owner sees nothing of it.
fn owner_for(who: &Principal, owner: Option<String>) -> ApiResult<Option<String>> {
    match owner {
        None => Ok(Some(who.user.clone())),
        Some(o) if !crate::auth::valid_user_name(&o) => Err(ApiError::bad_field(
            "owner",
            "a user name is 1–64 of a-z 0-9 . _ -, starting with a letter or digit",
        )),
        Some(o) if who.sees(&o) => Ok(Some(o)),
        Some(_) => Ok(None),
    }
}

fn artifact_of_row(row: &sqlx::postgres::PgRow) -> ApiResult<Artifact> {
    let name: String = row.try_get("name")?;
    Ok(Artifact {
        url: format!("{ARTIFACT_SCHEME}{name}"),
        name,
        owner: row.try_get("owner")?,
        size: row.try_get::<i64, _>("size")? as u64,
        sha256: row.try_get("sha256")?,
        created_at: row.try_get("created_at")?,
    })
}

const CURRENT: &str = "SELECT a.owner, a.name, v.id, v.size, v.sha256, v.key, v.created_at
     FROM artifacts a JOIN artifact_versions v ON v.id = a.version";

async fn current(
    st: &AppState,
    owner: Option<String>,
    name: &str,
) -> ApiResult<(Artifact, Uuid, String)> {
    let missing = || ApiError::NotFound(format!("no artifact named {name:?}"));
    let owner = owner.ok_or_else(missing)?;
    let row = sqlx::query(&format!("{CURRENT} WHERE a.owner = $1 AND a.name = $2"))
        .bind(&owner)
        .bind(name)
        .fetch_optional(&st.db)
        .await?
        .ok_or_else(missing)?;
    Ok((
        artifact_of_row(&row)?,
        row.try_get("id")?,
        row.try_get("key")?,
    ))
}

/// Bytes `owner` holds in artifact versions.
async fn held_bytes(db: &sqlx::PgPool, owner: &str) -> ApiResult<u64> {
    let n: Option<i64> =
        sqlx::query_scalar("SELECT sum(size)::bigint FROM artifact_versions WHERE owner = $1")
            .bind(owner)
            .fetch_one(db)
            .await?;
    Ok(n.unwrap_or(0).max(0) as u64)
}

fn too_large(limit: u64) -> ApiError {
    ApiError::TooLarge(format!(
        "an artifact may have at most {limit} bytes (--max-artifact-bytes)"
    ))
}

fn over_quota(owner: &str, held: u64, quota: u64) -> ApiError {
    ApiError::TooLarge(format!(
        "user {owner:?} holds {held} bytes of artifacts and may hold {quota} (--max-artifact-bytes-per-user); delete some first (versions that unfinished jobs read count until they end)"
    ))
}

/// Upload an artifact (the request body is the file), or replace one.
#[utoipa::path(
    put, path = "/v1/artifacts/{name}", operation_id = "upload_artifact", tag = "artifacts",
    params(("name" = String, Path, description = "The artifact's name: 1–128 of A-Z a-z 0-9 . _ -, not starting with a dot"), OwnerQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The file's bytes"),
    responses(
        (status = 200, description = "Replaced: the name now points at this upload", body = Artifact),
        (status = 201, description = "Created", body = Artifact),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A user naming another owner", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The upload stalled or crawled", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Over the per-artifact or per-user limit", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The user already streams as many uploads as allowed at once", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds after which a retry can succeed"))),
    ),
    security((), ("bearer" = []))
)]
pub async fn upload(
    State(st): State<AppState>,
    who: Principal,
    Path(name): Path<String>,
    QueryParams(q): QueryParams<OwnerQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    checked_name(&name)?;
    let owner = match owner_for(&who, q.owner)? {
        Some(o) => o,
        None => {
            return Err(ApiError::Forbidden(
                "a user uploads into its own namespace only".into(),
            ))
        }
    };
    let _slot = if who.is_admin() {
        None
    } else {
        // Keyed by the store too: test processes serve several platforms.
        Some(UploadSlot::take(
            &format!("{}\u{0}{owner}", st.store.url()),
            &owner,
        )?)
    };
    let limit = st.config.max_artifact_bytes;
    let quota = (!who.is_admin()).then_some(st.config.max_artifact_bytes_per_user);
    // Versions no unfinished job reads any more leave before the quota is
    // measured (a job's end does not sweep by itself).
    sweep_superseded(&st).await;
    let held = held_bytes(&st.db, &owner).await?;
    // What this upload may add: an early 413 on a declared length, and the
    // bound the streamed bytes are held to.
    let room = quota.map_or(u64::MAX, |q| q.saturating_sub(held));
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit {
            return Err(too_large(limit));
        }
        if len > room {
            return Err(over_quota(&owner, held, quota.unwrap_or(u64::MAX)));
        }
    }
    let version = Uuid::now_v7();
    let key = artifact_key(&owner, version, &name);
    let up = st.store.upload(&key);
    let over_room = || over_quota(&owner, held, quota.unwrap_or(u64::MAX));
    let (size, sha256) = stream_into(&st, up, body, (limit, room), &over_room).await?;

    let uploaded = Uploaded {
        owner: &owner,
        name: &name,
        version,
        size,
        sha256: &sha256,
        key: &key,
    };
    let recorded = record(&st, &uploaded, quota).await;
    let replaced = match recorded {
        Ok(r) => r,
        Err(e) => {
            // Nothing points at the object: it goes with the failure.
            let _ = st.store.delete(&key).await;
            return Err(e);
        }
    };
    sweep_superseded(&st).await;
    tracing::info!(%owner, %name, size, %sha256, replaced, "artifact uploaded");
    let (artifact, _, _) = current(&st, Some(owner), &name).await?;
    let status = if replaced {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(artifact)).into_response())
}

/// A version stored in the object store, to be recorded.
#[derive(Clone, Copy)]
struct Uploaded<'a> {
    owner: &'a str,
    name: &'a str,
    version: Uuid,
    size: u64,
    sha256: &'a str,
    key: &'a str,
}

/// Streams `body` into `up`, its bytes held to `limit` (413) and to the
/// owner's `room` (`over_room`'s 413), a stalled or trickled body cut off
/// (408); the size and SHA-256 stored. A failed upload is aborted.
async fn stream_into(
    st: &AppState,
    mut up: trainyard_store::Upload,
    body: Body,
    (limit, room): (u64, u64),
    over_room: &(dyn Fn() -> ApiError + Sync),
) -> ApiResult<(u64, String)> {
    let mut hash = Sha256::new();
    let mut size: u64 = 0;
    let idle_secs = st.config.artifact_idle_timeout_secs;
    let idle = Duration::from_secs(idle_secs);
    let started = std::time::Instant::now();
    let mut stream = body.into_data_stream();
    let failed = loop {
        let chunk = match tokio::time::timeout(idle, stream.next()).await {
            Err(_) => {
                break Some(ApiError::Stalled(format!(
                    "no byte of the upload arrived for {idle_secs} s (--artifact-idle-timeout-secs)"
                )))
            }
            Ok(None) => break None,
            Ok(Some(Err(e))) => {
                break Some(ApiError::bad_field(
                    "body",
                    format!("the upload was cut off: {e}"),
                ))
            }
            Ok(Some(Ok(c))) => c,
        };
        size += chunk.len() as u64;
        // A body trickled a byte at a time never stalls, yet holds a
        // connection and a part buffer for ever: past the first idle
        // period, the upload must keep up a floor rate on average.
        let past = started.elapsed().saturating_sub(idle).as_secs_f64();
        if past > 0.0 && (size as f64) < past * MIN_UPLOAD_BYTES_PER_SEC {
            break Some(ApiError::Stalled(format!(
                "the upload is slower than {} KiB/s on average",
                MIN_UPLOAD_BYTES_PER_SEC / 1024.0
            )));
        }
        if size > limit {
            break Some(too_large(limit));
        }
        if size > room {
            break Some(over_room());
        }
        hash.update(&chunk);
        if let Err(e) = up.write(&chunk).await {
            break Some(ApiError::Unavailable(format!("object store: {e}")));
        }
    };
    if let Some(e) = failed {
        up.abort().await;
        return Err(e);
    }
    up.finish()
        .await
        .map_err(|e| ApiError::Unavailable(format!("object store: {e}")))?;
    Ok((size, hex::encode(hash.finalize())))
}

/// Records an uploaded version and points `name` at it; whether it
/// replaced a version. The user's total is checked again under a lock of
/// theirs, so two concurrent uploads cannot both fit in the last room.
#[allow(clippy::too_many_arguments)]
async fn record(st: &AppState, u: &Uploaded<'_>, quota: Option<u64>) -> ApiResult<bool> {
    let Uploaded {
        owner,
        name,
        version,
        size,
        sha256,
        key,
    } = *u;
    let mut tx = st.db.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('trainyard-artifacts:' || $1, 0))")
        .bind(owner)
        .execute(&mut *tx)
        .await?;
    if let Some(q) = quota {
        let held: Option<i64> =
            sqlx::query_scalar("SELECT sum(size)::bigint FROM artifact_versions WHERE owner = $1")
                .bind(owner)
                .fetch_one(&mut *tx)
                .await?;
        let held = held.unwrap_or(0).max(0) as u64;
        if held + size > q {
            return Err(over_quota(owner, held, q));
        }
    }
    sqlx::query(
        "INSERT INTO artifact_versions (id, owner, name, size, sha256, key) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(version)
    .bind(owner)
    .bind(name)
    .bind(size as i64)
    .bind(sha256)
    .bind(key)
    .execute(&mut *tx)
    .await?;
    let old: Option<Uuid> = sqlx::query_scalar(
        "SELECT version FROM artifacts WHERE owner = $1 AND name = $2 FOR UPDATE",
    )
    .bind(owner)
    .bind(name)
    .fetch_optional(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO artifacts (owner, name, version) VALUES ($1, $2, $3)
         ON CONFLICT (owner, name) DO UPDATE SET version = EXCLUDED.version",
    )
    .bind(owner)
    .bind(name)
    .bind(version)
    .execute(&mut *tx)
    .await?;
    if let Some(old) = old {
        sqlx::query("UPDATE artifact_versions SET superseded_at = now() WHERE id = $1")
            .bind(old)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(old.is_some())
}

/// List artifacts: the caller's own; an admin's, everybody's (or `owner`'s).
#[utoipa::path(
    get, path = "/v1/artifacts", operation_id = "list_artifacts", tag = "artifacts",
    params(OwnerQuery),
    responses(
        (status = 200, description = "The artifacts, by owner and name", body = ArtifactPage),
        (status = 400, description = "Bad query parameter", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong token", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn list(
    State(st): State<AppState>,
    who: Principal,
    QueryParams(q): QueryParams<OwnerQuery>,
) -> ApiResult<Json<ArtifactPage>> {
    let rows = match (&q.owner, who.is_admin()) {
        (None, true) => {
            sqlx::query(&format!("{CURRENT} ORDER BY a.owner, a.name"))
                .fetch_all(&st.db)
                .await?
        }
        _ => match owner_for(&who, q.owner)? {
            None => Vec::new(),
            Some(o) => {
                sqlx::query(&format!("{CURRENT} WHERE a.owner = $1 ORDER BY a.name"))
                    .bind(o)
                    .fetch_all(&st.db)
                    .await?
            }
        },
    };
    let artifacts = rows.iter().map(artifact_of_row).collect::<ApiResult<_>>()?;
    Ok(Json(ArtifactPage { artifacts }))
}

/// One artifact's metadata (`?download` for its bytes).
#[utoipa::path(
    get, path = "/v1/artifacts/{name}", operation_id = "get_artifact", tag = "artifacts",
    params(("name" = String, Path, description = "The artifact's name"), GetQuery),
    responses(
        (status = 200, description = "The artifact's metadata; its bytes with `?download`",
         content((Artifact = "application/json"), (Vec<u8> = "application/octet-stream"))),
        (status = 400, description = "Bad name or query", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such artifact", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn get(
    State(st): State<AppState>,
    who: Principal,
    Path(name): Path<String>,
    QueryParams(q): QueryParams<GetQuery>,
) -> ApiResult<Response> {
    checked_name(&name)?;
    let owner = owner_for(&who, q.owner)?;
    match q.download.as_deref() {
        None | Some("false") | Some("0") => {}
        Some("" | "true" | "1") => return content_of(&st, owner, &name).await,
        Some(_) => {
            return Err(ApiError::bad_field(
                "download",
                "give it without a value (?download), or as true/false",
            ))
        }
    }
    Ok(Json(current(&st, owner, &name).await?.0).into_response())
}

/// One artifact's bytes.
#[utoipa::path(
    get, path = "/v1/artifacts/{name}/content", operation_id = "download_artifact", tag = "artifacts",
    params(("name" = String, Path, description = "The artifact's name"), OwnerQuery),
    responses(
        (status = 200, description = "The bytes", content_type = "application/octet-stream", body = Vec<u8>,
         headers(("ETag" = String, description = "The SHA-256 of the bytes, quoted"))),
        (status = 400, description = "Bad name or query", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such artifact", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn content(
    State(st): State<AppState>,
    who: Principal,
    Path(name): Path<String>,
    QueryParams(q): QueryParams<OwnerQuery>,
) -> ApiResult<Response> {
    checked_name(&name)?;
    content_of(&st, owner_for(&who, q.owner)?, &name).await
}

async fn content_of(st: &AppState, owner: Option<String>, name: &str) -> ApiResult<Response> {
    let (a, _, key) = current(st, owner, name).await?;
    let (size, stream) = match st.store.stream(&key).await {
        Ok(s) => s,
        Err(trainyard_store::StoreError::NotFound(_)) => {
            return Err(ApiError::NotFound(format!(
                "artifact {name:?} has lost its bytes in the object store"
            )))
        }
        Err(e) => return Err(ApiError::Unavailable(format!("object store: {e}"))),
    };
    let body = Body::from_stream(stream.map_err(std::io::Error::other));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, size.to_string()),
            (header::ETAG, format!("\"{}\"", a.sha256)),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{}\"", a.name),
            ),
        ],
        body,
    )
        .into_response())
}

/// Delete an artifact; refused while a job that has not finished reads it.
#[utoipa::path(
    delete, path = "/v1/artifacts/{name}", operation_id = "delete_artifact", tag = "artifacts",
    params(("name" = String, Path, description = "The artifact's name"), OwnerQuery),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Bad name or query", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such artifact", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "An unfinished job reads it", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
pub async fn delete(
    State(st): State<AppState>,
    who: Principal,
    Path(name): Path<String>,
    QueryParams(q): QueryParams<OwnerQuery>,
) -> ApiResult<StatusCode> {
    checked_name(&name)?;
    let owner = owner_for(&who, q.owner)?
        .ok_or_else(|| ApiError::NotFound(format!("no artifact named {name:?}")))?;
    let mut tx = st.db.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('trainyard-artifacts:' || $1, 0))")
        .bind(&owner)
        .execute(&mut *tx)
        .await?;
    let version: Uuid = sqlx::query_scalar(
        "SELECT version FROM artifacts WHERE owner = $1 AND name = $2 FOR UPDATE",
    )
    .bind(&owner)
    .bind(&name)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| ApiError::NotFound(format!("no artifact named {name:?}")))?;
    let readers: Vec<Uuid> = sqlx::query_scalar(
        "SELECT j.id FROM job_artifacts ja JOIN jobs j ON j.id = ja.job_id
         WHERE ja.version = $1 AND j.state NOT IN ('succeeded', 'failed', 'cancelled')
         ORDER BY j.id LIMIT 5",
    )
    .bind(version)
    .fetch_all(&mut *tx)
    .await?;
    if !readers.is_empty() {
        return Err(ApiError::Conflict(format!(
            "artifact {name:?} is read by unfinished jobs ({}); cancel them or wait until they end",
            readers
                .iter()
                .map(|j| j.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    sqlx::query("DELETE FROM artifacts WHERE owner = $1 AND name = $2")
        .bind(&owner)
        .bind(&name)
        .execute(&mut *tx)
        .await?;
    sqlx::query("UPDATE artifact_versions SET superseded_at = now() WHERE id = $1")
        .bind(version)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    sweep_superseded(&st).await;
    tracing::info!(%owner, %name, "artifact deleted");
    Ok(StatusCode::NO_CONTENT)
}
