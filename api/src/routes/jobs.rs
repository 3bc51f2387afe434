//! `/v1/jobs`: submit, list, read, cancel, and the event log.
//!
//! The SQL for jobs sits here beside the handlers that use it. Listing is
//! newest first with keyset pagination on `(created_at, id)`: the cursor is
//! the position of the last job returned, so pages stay stable while new
//! jobs arrive. Submits are idempotent under an `Idempotency-Key` header.

use super::job_rows::record_submitted;
use super::job_rows::{fetch_job, job_from_row, job_not_found, log_page};
pub use super::job_rows::{insert_job_sql, INSERT_SUBMITTED_EVENT, JOB_COLUMNS};
use super::params::{parse_limit, AfterQuery};
use crate::auth::Principal;
use crate::checkpointing;
use crate::data_policy;
use crate::error::{ApiError, ApiResult, Problem};
use crate::extract::{JobId, JsonBytes, QueryParams};
use crate::AppState;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, Row};
pub use trainyard_common::api::{EventPage, Job, JobEvent, JobPage};
use trainyard_common::spec::UncheckedJobSpec;
use trainyard_common::{JobSpec, JobState};
use trainyard_scheduler::lifecycle::{self, TransitionError};
use utoipa::IntoParams;
use uuid::Uuid;

/// Default page size of the job list.
pub const DEFAULT_PAGE: i64 = 50;
/// Largest page size of the job list.
pub const MAX_PAGE: i64 = 500;
/// Default page size of the event log.
pub const DEFAULT_EVENTS_PAGE: i64 = 500;
/// Largest page size of the event log.
pub const MAX_EVENTS_PAGE: i64 = 1000;
/// Longest `Idempotency-Key`.
pub const MAX_IDEMPOTENCY_KEY: usize = 255;
/// `Retry-After` of a submit refused by the cap on waiting jobs: when jobs
/// start is not known, so a polite poll interval.
pub const WAITING_CAP_RETRY_SECS: u64 = 30;
/// Header set on a submit that returned an existing job.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// Query of `GET /v1/jobs`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only jobs in these states (comma-separated, e.g. `queued,running`).
    pub state: Option<String>,
    /// Page size (1–500, default 50).
    pub limit: Option<String>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Only this user's jobs (admins; a user always sees only its own).
    pub owner: Option<String>,
}

fn created(job: &Job, replayed: bool) -> Response {
    let mut resp = (StatusCode::CREATED, Json(job)).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/jobs/{}", job.id)) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    if replayed {
        resp.headers_mut()
            .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    }
    resp
}

fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let Some(raw) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let field = "Idempotency-Key";
    let key = raw
        .to_str()
        .map_err(|_| ApiError::bad_field(field, "must be visible ASCII"))?;
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY {
        return Err(ApiError::bad_field(
            field,
            format!(
                "must be 1 to {MAX_IDEMPOTENCY_KEY} characters, got {}",
                key.len()
            ),
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(ApiError::bad_field(field, "must be visible ASCII"));
    }
    Ok(Some(key.to_owned()))
}

/// Submit a job.
///
/// The spec is validated in full: a 422 lists every violation with its
/// field. With an `Idempotency-Key` header, a retried submit returns the job
/// the first one created (with `Idempotent-Replayed: true`); reusing the key
/// for a different spec is a 422.
#[utoipa::path(
    post, path = "/v1/jobs", operation_id = "submit_job", tag = "jobs",
    request_body(content = UncheckedJobSpec, content_type = "application/json"),
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes retries of this submit return the same job (1–255 visible ASCII characters)")),
    responses(
        (status = 201, description = "Job created (or replayed)", body = Job,
         headers(("Location" = String, description = "URL of the job"))),
        (status = 400, description = "Malformed JSON or bad header", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong token", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid spec: every violation", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Over the submit rate or the cap on waiting jobs of this user", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u64, description = "Seconds after which a retry can succeed"))),
    )
)]
pub async fn submit(
    State(st): State<AppState>,
    who: Principal,
    headers: HeaderMap,
    JsonBytes(body): JsonBytes,
) -> ApiResult<Response> {
    if !who.is_admin() {
        submit_rate(&st, &who)?;
    }
    let key = idempotency_key(&headers)?;
    let spec = JobSpec::from_json(&body)?;
    if let Some(from) = spec.resume_from {
        check_resume_from(&st, &who, &spec, from).await?;
    }
    let tracking = crate::tracking::target_at_submit(&st.config, who.is_admin(), &spec)?;
    let (policy, versions) =
        data_policy::policy_at_submit(&st, &who.user, who.is_admin(), &spec).await?;
    let policy_json = serde_json::to_value(&policy).map_err(|e| ApiError::Internal(e.into()))?;
    let spec_json = serde_json::to_value(&spec).map_err(|e| ApiError::Internal(e.into()))?;
    // Hash of the canonical (validated, re-serialized) spec: a retry with
    // different whitespace or key order is still the same request.
    let hash = key
        .as_ref()
        .map(|_| Sha256::digest(spec_json.to_string().as_bytes()).to_vec());

    let mut tx = st.db.begin().await?;
    if !versions.is_empty() {
        versions_current(&mut tx, &who.user, &versions).await?;
    }
    if !who.is_admin() {
        waiting_cap(&st, &mut tx, &who.user, key.as_deref()).await?;
    }
    let inserted = sqlx::query(&insert_job_sql())
        .bind(Uuid::now_v7())
        .bind(&spec.name)
        .bind(&who.user)
        .bind(&spec_json)
        .bind(&key)
        .bind(&hash)
        .bind(spec.priority)
        .bind(&policy_json)
        .fetch_optional(&mut *tx)
        .await?;

    if let Some(row) = inserted {
        let job = job_from_row(&row)?;
        if let Some(t) = &tracking {
            crate::tracking::record(&mut tx, job.id, t).await?;
        }
        record_submitted(&mut tx, &job, &versions, key.clone()).await?;
        lifecycle::notify(&mut tx, job.id).await?;
        tx.commit().await?;
        st.metrics.jobs_submitted.inc();
        tracing::info!(job = %job.id, name = %job.name, owner = %job.owner, "job submitted");
        return Ok(created(&job, false));
    }

    // The key exists: this is a retry (same spec) or a misuse (another spec).
    let row = sqlx::query(&format!(
        "SELECT {JOB_COLUMNS}, request_hash FROM jobs WHERE owner = $1 AND idempotency_key = $2"
    ))
    .bind(&who.user)
    .bind(&key)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    let stored: Option<Vec<u8>> = row.try_get("request_hash")?;
    if stored != hash {
        return Err(ApiError::invalid_field(
            "Idempotency-Key",
            "this key was already used for a different job spec",
        ));
    }
    Ok(created(&job_from_row(&row)?, true))
}

/// A plain user's submit within their rate (a 429 with the wait
/// otherwise).
fn submit_rate(st: &AppState, who: &Principal) -> ApiResult<()> {
    if let Err(wait) = st.submits.take(&who.user) {
        return Err(ApiError::TooManyRequests {
            detail: format!(
                "user {:?} submits faster than {} a second (bursts of {}); retry in {:.1} s",
                who.user,
                st.config.submit_rate_per_user,
                st.config.submit_burst_per_user,
                wait.as_secs_f64()
            ),
            retry_after: wait.as_secs_f64().ceil() as u64,
        });
    }
    Ok(())
}

/// `resume_from` names a job the caller sees, of the same kind, with the
/// committed checkpoint it asks for (a 422 naming the field otherwise).
async fn check_resume_from(
    st: &AppState,
    who: &Principal,
    spec: &JobSpec,
    from: trainyard_common::spec::ResumeFrom,
) -> ApiResult<()> {
    // Another user's job answers as one without checkpoints: its
    // weights are not this caller's to start from.
    let visible = crate::auth::owner_of(&st.db, from.job_id)
        .await?
        .is_some_and(|o| who.sees(&o));
    // A script job starts from a script job's committed checkpoint
    // folder (numbered n: `step`), a model job from a model job's.
    let source_is_script: Option<bool> = if visible {
        sqlx::query_scalar("SELECT spec ? 'script' FROM jobs WHERE id = $1")
            .bind(from.job_id)
            .fetch_optional(&st.db)
            .await?
    } else {
        None
    };
    if source_is_script.is_some_and(|s| s != spec.is_script()) {
        return Err(ApiError::invalid_field(
            "resume_from.job_id",
            if spec.is_script() {
                format!(
                    "job {} is a model job: a script job starts from a script job's checkpoint",
                    from.job_id
                )
            } else {
                format!(
                    "job {} is a script job: a model job starts from a model job's checkpoint",
                    from.job_id
                )
            },
        ));
    }
    let found = match (visible, spec.is_script()) {
        (false, _) => false,
        (true, true) => script_checkpoint_exists(st, from.job_id, from.step).await?,
        (true, false) => checkpointing::find(&st.db, from.job_id, from.step)
            .await?
            .is_some(),
    };
    if !found {
        let (field, what) = match from.step {
            Some(step) => (
                "resume_from.step",
                format!(
                    "job {} has no committed checkpoint of step {step}",
                    from.job_id
                ),
            ),
            None => (
                "resume_from.job_id",
                format!("job {} has no committed checkpoint", from.job_id),
            ),
        };
        return Err(ApiError::invalid_field(field, what));
    }
    Ok(())
}

/// Under the owner's artifact lock, the artifact versions resolved at
/// submit are still current: a replace or delete that came between has
/// not swept them, and none can until this job is recorded as a reader.
async fn versions_current(tx: &mut PgConnection, owner: &str, versions: &[Uuid]) -> ApiResult<()> {
    // Under the owner's artifact lock, the versions resolved above are
    // still current: a replace or delete that came between has not
    // swept them, and none can until this job is recorded as a reader.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('trainyard-artifacts:' || $1, 0))")
        .bind(owner)
        .execute(&mut *tx)
        .await?;
    let current: i64 =
        sqlx::query_scalar("SELECT count(*) FROM artifacts WHERE owner = $1 AND version = ANY($2)")
            .bind(owner)
            .bind(versions)
            .fetch_one(&mut *tx)
            .await?;
    if current as usize != versions.len() {
        return Err(ApiError::Conflict(
            "an artifact this spec names was replaced or deleted while the job was submitted; submit again".into(),
        ));
    }
    Ok(())
}

/// A plain user's jobs waiting to start stay under the cap (a replayed
/// submit adds none): a 429 otherwise.
async fn waiting_cap(
    st: &AppState,
    tx: &mut PgConnection,
    user: &str,
    key: Option<&str>,
) -> ApiResult<()> {
    // One submit of this user at a time past this point, so that the
    // count and the insert agree (the cap holds across API replicas).
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('trainyard-submit:' || $1, 0))")
        .bind(user)
        .execute(&mut *tx)
        .await?;
    let replay = match key {
        Some(k) => sqlx::query_scalar::<_, i32>(
            "SELECT 1 FROM jobs WHERE owner = $1 AND idempotency_key = $2",
        )
        .bind(user)
        .bind(k)
        .fetch_optional(&mut *tx)
        .await?
        .is_some(),
        None => false,
    };
    if !replay {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM jobs WHERE owner = $1 AND state IN ('queued', 'inspecting', 'scheduling')",
        )
        .bind(user)
        .fetch_one(&mut *tx)
        .await?;
        let cap = i64::from(st.config.max_waiting_jobs_per_user);
        if waiting >= cap {
            return Err(ApiError::TooManyRequests {
                detail: format!(
                    "user {:?} has {waiting} jobs waiting to start, the most allowed is {cap}; retry when some have started, or cancel some",
                    user
                ),
                retry_after: WAITING_CAP_RETRY_SECS,
            });
        }
    }
    Ok(())
}

fn encode_cursor(at: DateTime<Utc>, id: Uuid) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}:{id}", at.timestamp_micros()))
}

fn decode_cursor(raw: &str) -> ApiResult<(DateTime<Utc>, Uuid)> {
    let bad = || ApiError::bad_field("cursor", "not a cursor returned by this API");
    let text =
        String::from_utf8(URL_SAFE_NO_PAD.decode(raw).map_err(|_| bad())?).map_err(|_| bad())?;
    let (micros, id) = text.split_once(':').ok_or_else(bad)?;
    let micros: i64 = micros.parse().map_err(|_| bad())?;
    // Years 1–9999 only: Postgres refuses far wider ranges than chrono.
    if !(-62_135_596_800_000_000..=253_402_300_799_999_999).contains(&micros) {
        return Err(bad());
    }
    let at = DateTime::from_timestamp_micros(micros).ok_or_else(bad)?;
    Ok((at, Uuid::parse_str(id).map_err(|_| bad())?))
}

fn parse_states(raw: Option<&str>) -> ApiResult<Option<Vec<JobState>>> {
    let Some(raw) = raw else { return Ok(None) };
    raw.split(',')
        .map(|s| {
            s.trim()
                .parse::<JobState>()
                .map_err(|e| ApiError::bad_field("state", e.to_string()))
        })
        .collect::<ApiResult<Vec<_>>>()
        .map(Some)
}

/// List jobs, newest first.
#[utoipa::path(
    get, path = "/v1/jobs", operation_id = "list_jobs", tag = "jobs",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of jobs", body = JobPage),
        (status = 400, description = "Bad query parameter", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list(
    State(st): State<AppState>,
    who: Principal,
    QueryParams(q): QueryParams<ListQuery>,
) -> ApiResult<Json<JobPage>> {
    let limit = parse_limit(q.limit.as_deref(), DEFAULT_PAGE, MAX_PAGE)?;
    let states = parse_states(q.state.as_deref())?;
    let cursor = q.cursor.as_deref().map(decode_cursor).transpose()?;
    if let Some(o) = q
        .owner
        .as_deref()
        .filter(|o| !crate::auth::valid_user_name(o))
    {
        return Err(ApiError::bad_field(
            "owner",
            format!("not a user name (1 to 64 of a-z 0-9 . _ -), got {o:?}"),
        ));
    }
    // A user sees its own jobs whatever `owner` says (another user's name
    // gives an empty page, as a user without jobs would).
    let owner = match who.scope() {
        Some(me) if q.owner.as_deref().is_some_and(|o| o != me) => {
            return Ok(Json(JobPage {
                jobs: Vec::new(),
                next_cursor: None,
            }))
        }
        Some(me) => Some(me.to_owned()),
        None => q.owner.clone(),
    };
    let rows = sqlx::query(&format!(
        "SELECT {JOB_COLUMNS} FROM jobs
         WHERE ($1::job_state[] IS NULL OR state = ANY($1))
           AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3))
           AND ($5::text IS NULL OR owner = $5)
         ORDER BY created_at DESC, id DESC
         LIMIT $4"
    ))
    .bind(&states)
    .bind(cursor.map(|c| c.0))
    .bind(cursor.map(|c| c.1))
    .bind(limit + 1)
    .bind(&owner)
    .fetch_all(&st.db)
    .await?;
    let more = rows.len() as i64 > limit;
    let jobs = rows
        .iter()
        .take(limit as usize)
        .map(job_from_row)
        .collect::<ApiResult<Vec<_>>>()?;
    let next_cursor = if more {
        jobs.last().map(|j| encode_cursor(j.created_at, j.id))
    } else {
        None
    };
    Ok(Json(JobPage { jobs, next_cursor }))
}

/// Read one job.
#[utoipa::path(
    get, path = "/v1/jobs/{id}", operation_id = "get_job", tag = "jobs",
    params(("id" = Uuid, Path, description = "Job id")),
    responses(
        (status = 200, description = "The job", body = Job),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get(State(st): State<AppState>, JobId(id): JobId) -> ApiResult<Json<Job>> {
    Ok(Json(fetch_job(&st.db, id).await?))
}

/// Cancel a job.
///
/// Idempotent: cancelling a cancelled job returns it unchanged (and writes
/// no second event). A job that already succeeded or failed is a 409.
#[utoipa::path(
    post, path = "/v1/jobs/{id}/cancel", operation_id = "cancel_job", tag = "jobs",
    params(("id" = Uuid, Path, description = "Job id")),
    responses(
        (status = 200, description = "The cancelled job", body = Job),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The job already ended otherwise", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn cancel(State(st): State<AppState>, JobId(id): JobId) -> ApiResult<Json<Job>> {
    let mut tx = st.db.begin().await?;
    match lifecycle::transition(&mut tx, id, JobState::Cancelled, "cancelled by user").await {
        Ok(_) => {}
        Err(TransitionError::NotFound) => return Err(job_not_found(id)),
        Err(TransitionError::Illegal { from, .. }) => {
            return Err(ApiError::Conflict(format!(
                "job {id} already {from}; it cannot be cancelled"
            )))
        }
        Err(TransitionError::Database(e)) => return Err(e.into()),
    }
    tx.commit().await?;
    Ok(Json(fetch_job(&st.db, id).await?))
}

/// A job's event log, oldest first.
#[utoipa::path(
    get, path = "/v1/jobs/{id}/events", operation_id = "list_job_events", tag = "jobs",
    params(("id" = Uuid, Path, description = "Job id"), AfterQuery),
    responses(
        (status = 200, description = "A page of events", body = EventPage),
        (status = 400, description = "Bad id or query", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn events(
    State(st): State<AppState>,
    JobId(id): JobId,
    QueryParams(q): QueryParams<AfterQuery>,
) -> ApiResult<Json<EventPage>> {
    let (events, next_after) = log_page(
        &st.db,
        ("job_events", "at, kind, from_state, to_state, reason, data"),
        id,
        &q,
        (DEFAULT_EVENTS_PAGE, MAX_EVENTS_PAGE),
        |r| {
            Ok(JobEvent {
                id: r.try_get("id")?,
                at: r.try_get("at")?,
                kind: r.try_get("kind")?,
                from_state: r.try_get("from_state")?,
                to_state: r.try_get("to_state")?,
                reason: r.try_get("reason")?,
                data: r.try_get("data")?,
            })
        },
    )
    .await?;
    Ok(Json(EventPage { events, next_after }))
}

/// Whether script job `job` has a committed checkpoint (number `n`, or
/// any): its manifest is in the store.
async fn script_checkpoint_exists(st: &AppState, job: Uuid, n: Option<u64>) -> ApiResult<bool> {
    use trainyard_common::checkpoint::{script_checkpoint_dir, script_checkpoints_prefix};
    let prefix = match n {
        Some(n) => script_checkpoint_dir(job, n),
        None => script_checkpoints_prefix(job),
    };
    let listed = st
        .store
        .list(&prefix)
        .await
        .map_err(|e| ApiError::Unavailable(format!("object store: {e}")))?;
    Ok(listed.iter().any(|(k, _)| k.ends_with("/manifest.json")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips() {
        let at = DateTime::from_timestamp_micros(1_764_000_000_123_456).unwrap();
        let id = Uuid::now_v7();
        assert_eq!(decode_cursor(&encode_cursor(at, id)).unwrap(), (at, id));
        assert!(decode_cursor("garbage!").is_err());
        assert!(decode_cursor(&URL_SAFE_NO_PAD.encode("12:notauuid")).is_err());
    }

    #[test]
    fn states_parse_as_a_list() {
        assert_eq!(
            parse_states(Some("queued,running")).unwrap(),
            Some(vec![JobState::Queued, JobState::Running])
        );
        assert!(parse_states(Some("queued,nope")).is_err());
    }
}
