//! `/v1/executors`: registration, heartbeats, drain and leave (executor
//! credentials), and the listing users see.
//!
//! Registration needs the cluster join token; it returns the executor's own
//! credential, stored only as a SHA-256 hash. Heartbeats carry that
//! credential, refresh the executor's liveness, record the roles it reports
//! running, and answer with every role assigned to it. An executor the
//! scheduler declared lost, or that left, gets 410 Gone and must register
//! again.

mod assignments;
mod tensors;

use super::access::{executor_row, ExecutorOrAdmin, OwnExecutor, EXECUTOR_COLUMNS};
use super::job_rows::{fetch_job, stored_spec};
use super::params::{parse_body, text};
use crate::auth::{bearer, constant_time_eq, hash_token as hash};
use crate::data_policy;
use crate::error::{ApiError, ApiResult, Problem};
use crate::extract::{ExecutorId, JsonBytes, QueryParams};
use crate::AppState;
use assignments::{asked_to_checkpoint, assigned_keys, assignments_for};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use sqlx::postgres::PgRow;
use sqlx::Row;
use std::collections::HashMap;
use tensors::check_tensors;
pub use tensors::{DTYPES, MAX_TENSORS};
use trainyard_common::api::Job;
pub use trainyard_common::api::{ExecutorInfo, ExecutorList, RoleInfo};
use trainyard_common::cluster::{
    ExecutorState, HeartbeatRequest, HeartbeatResponse, Inspection, InspectionReport,
    InspectionResult, RegisterRequest, RegisterResponse, RoleKind, MAX_HEARTBEAT_WAIT_MS,
    MAX_REPORTED_ROLES,
};
use trainyard_common::model::{ParamInfo, TensorKind};
use trainyard_common::JobSpec;
use trainyard_common::JobState;
use trainyard_scheduler::service::{new_secret, EXECUTOR_CHANNEL};
use utoipa::IntoParams;
use uuid::Uuid;

/// Query of `GET /v1/executors`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ExecutorQuery {
    /// Only executors in this state (`live`, `draining`, `lost`, `left`).
    pub state: Option<String>,
}

async fn notify(db: &sqlx::PgPool, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(EXECUTOR_CHANNEL)
        .bind(id.to_string())
        .execute(db)
        .await?;
    Ok(())
}

fn info_from_row(r: &PgRow, roles: Vec<RoleInfo>) -> ApiResult<ExecutorInfo> {
    let internal = |e: serde_json::Error| ApiError::Internal(e.into());
    Ok(ExecutorInfo {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        address: r.try_get("address")?,
        state: r.try_get("state")?,
        resources: serde_json::from_value(r.try_get("resources")?).map_err(internal)?,
        labels: serde_json::from_value(r.try_get("labels")?).map_err(internal)?,
        sandbox: r
            .try_get::<Option<serde_json::Value>, _>("sandbox")?
            .map(serde_json::from_value)
            .transpose()
            .map_err(internal)?,
        environments: r
            .try_get::<Option<serde_json::Value>, _>("environments")?
            .map(serde_json::from_value)
            .transpose()
            .map_err(internal)?,
        roles,
        registered_at: r.try_get("registered_at")?,
        last_heartbeat_at: r.try_get("last_heartbeat_at")?,
        seconds_since_heartbeat: r.try_get("since")?,
    })
}

async fn roles_of(db: &sqlx::PgPool, ids: &[Uuid]) -> ApiResult<HashMap<Uuid, Vec<RoleInfo>>> {
    let mut out: HashMap<Uuid, Vec<RoleInfo>> = HashMap::new();
    for r in sqlx::query("SELECT executor_id, job_id, generation, role, index, device FROM assignments WHERE executor_id = ANY($1) ORDER BY job_id, role, index")
        .bind(ids)
        .fetch_all(db)
        .await?
    {
        let stored = RoleKind::parse(&r.try_get::<String, _>("role")?).unwrap_or(RoleKind::Worker);
        let index = r.try_get::<i32, _>("index")? as u32;
        // The listing shows a standby as a PS role of its shard, flagged.
        let standby = stored == RoleKind::Standby;
        let role = if standby { RoleKind::Ps } else { stored };
        out.entry(r.try_get("executor_id")?).or_default().push(RoleInfo {
            job_id: r.try_get("job_id")?,
            generation: r.try_get("generation")?,
            role,
            index,
            standby,
            device: r.try_get::<Option<i32>, _>("device")?.map(|d| d as u32),
        });
    }
    Ok(out)
}

/// Register an executor.
///
/// Needs `Authorization: Bearer <cluster join token>`. Returns the
/// executor's id and its own credential (shown only here).
#[utoipa::path(
    post, path = "/v1/executors", operation_id = "register_executor", tag = "executors",
    request_body(content = RegisterRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Registered", body = RegisterResponse, headers(("Location" = String, description = "URL of the executor"))),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong join token", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid resources or address", body = Problem, content_type = "application/problem+json"),
    ),
    security(("join_token" = []))
)]
pub async fn register(
    State(st): State<AppState>,
    headers: HeaderMap,
    JsonBytes(body): JsonBytes,
) -> ApiResult<Response> {
    if !bearer(&headers).is_some_and(|t| constant_time_eq(t.as_bytes(), st.join_token.as_bytes())) {
        return Err(ApiError::Unauthorized);
    }
    let req: RegisterRequest = parse_body(&body)?;
    let violations = req.violations();
    if !violations.is_empty() {
        return Err(ApiError::Unprocessable(violations));
    }
    let id = Uuid::now_v7();
    let token = hex::encode(new_secret());
    sqlx::query("INSERT INTO executors (id, name, address, resources, labels, token_hash, sandbox) VALUES ($1, $2, $3, $4, $5, $6, $7)")
        .bind(id)
        .bind(&req.name)
        .bind(&req.address)
        .bind(serde_json::to_value(&req.resources).map_err(|e| ApiError::Internal(e.into()))?)
        .bind(serde_json::to_value(&req.labels).map_err(|e| ApiError::Internal(e.into()))?)
        .bind(hash(&token))
        .bind(req.sandbox.as_ref().map(serde_json::to_value).transpose().map_err(|e| ApiError::Internal(e.into()))?)
        .execute(&st.db)
        .await?;
    notify(&st.db, id).await?;
    tracing::info!(executor = %id, name = %req.name, address = %req.address, "executor registered");
    let body = RegisterResponse {
        id,
        token,
        heartbeat_interval_ms: st.config.heartbeat_interval_ms,
        heartbeat_misses: st.config.heartbeat_misses,
        object_store: st.config.object_store_url(),
    };
    let mut resp = (StatusCode::CREATED, Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/executors/{id}")) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    Ok(resp)
}

/// List executors, newest first.
#[utoipa::path(
    get, path = "/v1/executors", operation_id = "list_executors", tag = "executors", params(ExecutorQuery),
    responses(
        (status = 200, description = "Executors", body = ExecutorList),
        (status = 400, description = "Bad query", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list(
    State(st): State<AppState>,
    QueryParams(q): QueryParams<ExecutorQuery>,
) -> ApiResult<Json<ExecutorList>> {
    let state = match q.state.as_deref() {
        None => None,
        Some(s) => Some(ExecutorState::parse(s).ok_or_else(|| {
            ApiError::bad_field(
                "state",
                format!("must be live, draining, lost or left, got {s:?}"),
            )
        })?),
    };
    let rows = sqlx::query(&format!(
        "SELECT {EXECUTOR_COLUMNS} FROM executors WHERE ($1::executor_state IS NULL OR state = $1) ORDER BY registered_at DESC, id DESC LIMIT 1000"
    ))
    .bind(state)
    .fetch_all(&st.db)
    .await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.get("id")).collect();
    let mut roles = roles_of(&st.db, &ids).await?;
    let executors = rows
        .iter()
        .map(|r| info_from_row(r, roles.remove(&r.get::<Uuid, _>("id")).unwrap_or_default()))
        .collect::<ApiResult<_>>()?;
    Ok(Json(ExecutorList { executors }))
}

async fn info(st: &AppState, id: Uuid) -> ApiResult<ExecutorInfo> {
    let row = executor_row(st, id).await?;
    let roles = roles_of(&st.db, &[id])
        .await?
        .remove(&id)
        .unwrap_or_default();
    info_from_row(&row, roles)
}

/// Read one executor.
#[utoipa::path(
    get, path = "/v1/executors/{id}", operation_id = "get_executor", tag = "executors",
    params(("id" = Uuid, Path, description = "Executor id")),
    responses(
        (status = 200, description = "The executor", body = ExecutorInfo),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such executor", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get(
    State(st): State<AppState>,
    ExecutorId(id): ExecutorId,
) -> ApiResult<Json<ExecutorInfo>> {
    Ok(Json(info(&st, id).await?))
}

pub(super) fn gone_if_removed(row: &PgRow) -> ApiResult<ExecutorState> {
    let state: ExecutorState = row.try_get("state")?;
    match state {
        ExecutorState::Lost => Err(ApiError::Gone(
            "this executor was declared lost (missed heartbeats); register again".into(),
        )),
        ExecutorState::Left => Err(ApiError::Gone(
            "this executor left the cluster; register again".into(),
        )),
        s => Ok(s),
    }
}

/// The progress entries of a heartbeat as rows to store: one per worker
/// role the beat names in `roles`, every figure a finite, non-negative
/// number (a bad one is the executor's bug: an error naming it).
fn progress_rows(req: &HeartbeatRequest) -> ApiResult<Vec<serde_json::Value>> {
    if req.progress.len() > MAX_REPORTED_ROLES {
        return Err(ApiError::invalid_field(
            "progress",
            format!("at most {MAX_REPORTED_ROLES} entries"),
        ));
    }
    let mut rows = Vec::new();
    for (i, p) in req.progress.iter().enumerate() {
        if p.key.role != RoleKind::Worker || !req.roles.contains(&p.key) {
            return Err(ApiError::invalid_field(
                &format!("progress[{i}].key"),
                "must be a worker role listed in roles",
            ));
        }
        for (name, v) in [("median_step_ms", p.median_step_ms), ("busy_ms", p.busy_ms)] {
            if !v.is_finite() || !(0.0..=1e12).contains(&v) {
                return Err(ApiError::invalid_field(
                    &format!("progress[{i}].{name}"),
                    "must be a finite number of milliseconds, 0 or more",
                ));
            }
        }
        rows.push(serde_json::json!({
            "job_id": p.key.job_id, "generation": p.key.generation, "rank": p.key.index,
            "step": p.step.min(i64::MAX as u64), "phase": p.phase.as_str(),
            "phase_ms": p.phase_ms.min(i64::MAX as u64),
            "median_step_ms": p.median_step_ms, "busy_ms": p.busy_ms, "window_steps": p.window,
        }));
    }
    Ok(rows)
}

/// Stores what executor `id` said its worker roles are doing, for the
/// ranks it holds now (a role it no longer holds, or never held, is
/// dropped: the row of a rank is only ever its current holder's).
async fn record_progress(
    db: &sqlx::PgPool,
    id: Uuid,
    rows: Vec<serde_json::Value>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO role_progress (job_id, rank, generation, executor_id, step, phase, phase_ms, median_step_ms, busy_ms, window_steps, reported_at)
         SELECT p.job_id, p.rank, p.generation, $1, p.step, p.phase, p.phase_ms, p.median_step_ms, p.busy_ms, p.window_steps, clock_timestamp()
         FROM jsonb_to_recordset($2) AS p(job_id uuid, generation bigint, rank int, step bigint, phase text, phase_ms bigint, median_step_ms float8, busy_ms float8, window_steps int)
         JOIN assignments a ON a.job_id = p.job_id AND a.generation = p.generation AND a.role = 'worker'
              AND a.index = p.rank AND a.executor_id = $1
         ON CONFLICT (job_id, rank) DO UPDATE SET generation = EXCLUDED.generation, executor_id = EXCLUDED.executor_id,
              step = EXCLUDED.step, phase = EXCLUDED.phase, phase_ms = EXCLUDED.phase_ms, median_step_ms = EXCLUDED.median_step_ms,
              busy_ms = EXCLUDED.busy_ms, window_steps = EXCLUDED.window_steps, reported_at = EXCLUDED.reported_at",
    )
    .bind(id)
    .bind(serde_json::Value::Array(rows))
    .execute(db)
    .await?;
    Ok(())
}

/// Heartbeat: report running roles, receive assignments.
#[utoipa::path(
    post, path = "/v1/executors/{id}/heartbeat", operation_id = "executor_heartbeat", tag = "executors",
    params(("id" = Uuid, Path, description = "Executor id")),
    request_body(content = HeartbeatRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Its assignments", body = HeartbeatResponse),
        (status = 400, description = "The id is not a UUID, or the body is malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong executor credential", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such executor", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "Declared lost or left: register again", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON (Content-Type)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid report", body = Problem, content_type = "application/problem+json"),
    ),
    security(("executor_token" = []))
)]
pub async fn heartbeat(
    State(st): State<AppState>,
    OwnExecutor { id, row }: OwnExecutor,
    JsonBytes(body): JsonBytes,
) -> ApiResult<Json<HeartbeatResponse>> {
    let state = gone_if_removed(&row)?;
    let mut req: HeartbeatRequest = parse_body(&body)?;
    if req.roles.len() > MAX_REPORTED_ROLES {
        return Err(ApiError::invalid_field(
            "roles",
            format!("at most {MAX_REPORTED_ROLES} roles"),
        ));
    }
    if req.held.len() > MAX_REPORTED_ROLES {
        return Err(ApiError::invalid_field(
            "held",
            format!("at most {MAX_REPORTED_ROLES} devices"),
        ));
    }
    req.roles.sort();
    req.roles.dedup();
    let held = serde_json::to_value(&req.held).map_err(|e| ApiError::Internal(e.into()))?;
    let environments = req
        .environments
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| ApiError::Internal(e.into()))?;
    let progress = progress_rows(&req)?;
    // As `assignments` rows name them (the scheduler compares the two).
    let reported: serde_json::Value = req
        .roles
        .iter()
        .map(|k| serde_json::json!({"job_id": k.job_id, "generation": k.generation, "role": k.role.as_str(), "index": k.index}))
        .collect();
    // Only live or draining executors are refreshed: a lost one stays lost.
    let changed: Option<bool> = sqlx::query_scalar(
        "UPDATE executors e SET last_heartbeat_at = clock_timestamp(), reported = $2, held = $3,
                environments = coalesce($4, e.environments)
         FROM (SELECT reported AS old, held AS old_held FROM executors WHERE id = $1) o
         WHERE e.id = $1 AND e.state IN ('live', 'draining')
         RETURNING o.old IS DISTINCT FROM $2 OR o.old_held IS DISTINCT FROM $3",
    )
    .bind(id)
    .bind(&reported)
    .bind(&held)
    .bind(environments)
    .fetch_optional(&st.db)
    .await?;
    match changed {
        None => {
            return Err(ApiError::Gone(
                "this executor was declared lost (missed heartbeats); register again".into(),
            ))
        }
        Some(true) => notify(&st.db, id).await?,
        Some(false) => {}
    }
    if !progress.is_empty() {
        record_progress(&st.db, id, progress).await?;
    }
    let inspections: Vec<(Uuid, serde_json::Value, String, Option<serde_json::Value>)> =
        sqlx::query_as(
            "SELECT id, spec, owner, data_policy FROM jobs WHERE inspector = $1 AND state = 'inspecting'",
        )
        .bind(id)
        .fetch_all(&st.db)
        .await?;
    // Long-poll: held while nothing is to be inspected and its assignments
    // are what it runs, until a job changes them, one of its jobs is asked
    // for a checkpoint (a preemption), or the wait is over.
    let wait = req
        .wait_ms
        .unwrap_or(0)
        .min(st.config.heartbeat_interval_ms)
        .min(MAX_HEARTBEAT_WAIT_MS);
    if wait > 0 && inspections.is_empty() {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(wait);
        let mut wake = st.wakeup.subscribe();
        wake.borrow_and_update();
        while assigned_keys(&st, id).await? == req.roles && !asked_to_checkpoint(&st, id).await? {
            match tokio::time::timeout_at(deadline, wake.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => break,
            }
        }
    }
    Ok(Json(HeartbeatResponse {
        state,
        heartbeat_interval_ms: st.config.heartbeat_interval_ms,
        assignments: assignments_for(&st, id).await?,
        inspections: inspections
            .into_iter()
            .filter_map(|(job_id, spec, owner, policy)| {
                inspection_of(&st, job_id, spec, &owner, policy)
            })
            .collect(),
    }))
}

/// What an inspector is asked to do for job `job_id` with the stored
/// `spec`: load `model.url` and, with the spec, try a forward pass on a
/// batch of the job's data, under the job's data policy (its `artifact:`
/// URLs resolved). A stored spec that does not read (written by another
/// release) is not inspected, and logged: the inspector could not check
/// its URL.
fn inspection_of(
    st: &AppState,
    job_id: Uuid,
    spec: serde_json::Value,
    owner: &str,
    policy: Option<serde_json::Value>,
) -> Option<Inspection> {
    let spec = JobSpec::from_stored(spec)
        .map_err(|e| tracing::error!(job = %job_id, error = %e, "not inspecting the job"))
        .ok()?;
    let (spec, data_policy) = data_policy::for_executor(st, owner, policy, spec)
        .map_err(|e| tracing::error!(job = %job_id, error = %e, "not inspecting the job: its resolved spec does not pass"))
        .ok()?;
    let url = match &spec.model {
        Some(trainyard_common::spec::ModelSpec::Torchscript(t)) => t.url.clone(),
        _ => return None,
    };
    Some(Inspection {
        job_id,
        url,
        spec: Some(Box::new(spec)),
        data_policy,
    })
}

/// Drain: the scheduler moves the executor's roles off; it takes no new ones.
#[utoipa::path(
    post, path = "/v1/executors/{id}/drain", operation_id = "drain_executor", tag = "executors",
    params(("id" = Uuid, Path, description = "Executor id")),
    responses(
        (status = 200, description = "Draining", body = ExecutorInfo),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong credential", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A user's token: managing executors needs an admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such executor", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "Lost or left", body = Problem, content_type = "application/problem+json"),
    ),
    security(("executor_token" = []), ("bearer" = []))
)]
pub async fn drain(
    State(st): State<AppState>,
    ExecutorOrAdmin { id, row }: ExecutorOrAdmin,
) -> ApiResult<Json<ExecutorInfo>> {
    gone_if_removed(&row)?;
    sqlx::query("UPDATE executors SET state = 'draining', state_changed_at = clock_timestamp() WHERE id = $1 AND state = 'live'")
        .bind(id)
        .execute(&st.db)
        .await?;
    notify(&st.db, id).await?;
    tracing::info!(executor = %id, "executor draining");
    Ok(Json(info(&st, id).await?))
}

/// Leave: after a drain, once no role is assigned to it.
#[utoipa::path(
    delete, path = "/v1/executors/{id}", operation_id = "leave_executor", tag = "executors",
    params(("id" = Uuid, Path, description = "Executor id")),
    responses(
        (status = 200, description = "Left", body = ExecutorInfo),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong credential", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A user's token: managing executors needs an admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such executor", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Roles still assigned: drain first", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "Already lost or left", body = Problem, content_type = "application/problem+json"),
    ),
    security(("executor_token" = []), ("bearer" = []))
)]
pub async fn leave(
    State(st): State<AppState>,
    ExecutorOrAdmin { id, row }: ExecutorOrAdmin,
) -> ApiResult<Json<ExecutorInfo>> {
    gone_if_removed(&row)?;
    let mut tx = st.db.begin().await?;
    sqlx::query("SELECT 1 FROM executors WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM assignments WHERE executor_id = $1")
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
    if held > 0 {
        return Err(ApiError::Conflict(format!(
            "{held} role(s) are still assigned to this executor; drain it and wait until they move"
        )));
    }
    sqlx::query(
        "UPDATE executors SET state = 'left', state_changed_at = clock_timestamp() WHERE id = $1",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    notify(&st.db, id).await?;
    tracing::info!(executor = %id, "executor left");
    Ok(Json(info(&st, id).await?))
}

/// Report what inspecting a TorchScript file found.
///
/// Its tensors (parameters, buffers, frozen parameters, each with its
/// dtype) let the scheduler size and shard the job (`inspecting →
/// scheduling`); a file that is not a loadable module, a forward that
/// cannot train on the job's data (the executor's reason), a module with
/// nothing to train, or a model too large for the job's memory fails the
/// job with the reason. A tensor list the platform could not lay out (a
/// repeated name, an unknown dtype, an integer parameter) is a 422 naming
/// the tensor's field.
#[utoipa::path(
    post, path = "/v1/executors/{id}/inspections", operation_id = "report_inspection", tag = "executors",
    params(("id" = Uuid, Path, description = "Executor id")),
    request_body(content = InspectionReport, content_type = "application/json"),
    responses(
        (status = 200, description = "The job after the inspection", body = Job),
        (status = 400, description = "The id is not a UUID, or the body is malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong executor credential", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such executor or job", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "This executor is not the job's inspector", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON (Content-Type)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid report", body = Problem, content_type = "application/problem+json"),
    ),
    security(("executor_token" = []))
)]
pub async fn inspection(
    State(st): State<AppState>,
    OwnExecutor { id, .. }: OwnExecutor,
    JsonBytes(body): JsonBytes,
) -> ApiResult<Json<Job>> {
    let report: InspectionReport = parse_body(&body)?;
    let mut tx = st.db.begin().await?;
    let row: Option<(JobState, Option<Uuid>, serde_json::Value)> =
        sqlx::query_as("SELECT state, inspector, spec FROM jobs WHERE id = $1 FOR UPDATE")
            .bind(report.job_id)
            .fetch_optional(&mut *tx)
            .await?;
    let Some((state, inspector, spec)) = row else {
        return Err(ApiError::NotFound(format!(
            "no job with id {}",
            report.job_id
        )));
    };
    if state != JobState::Inspecting || inspector != Some(id) {
        return Err(ApiError::Conflict(format!(
            "job {} is {state} and not being inspected by this executor",
            report.job_id
        )));
    }
    let spec = stored_spec(report.job_id, spec)?;
    let (to, reason) = match report.result {
        // The executor names what is wrong (a file that is not TorchScript,
        // a forward of the wrong signature, an output that does not match
        // the data); its reason is the job's.
        InspectionResult::Error(e) => (
            JobState::Failed,
            match text(e.trim()).chars().take(1000).collect::<String>() {
                r if r.is_empty() => {
                    "inspecting model.url failed (the executor gave no reason)".to_owned()
                }
                r => r,
            },
        ),
        InspectionResult::Parameters(params) => {
            check_tensors(&params)?;
            let elements = |kind: TensorKind| {
                params
                    .iter()
                    .filter(|p| p.kind == kind)
                    .map(ParamInfo::numel)
                    .fold(0u64, u64::saturating_add)
            };
            let count = elements(TensorKind::Parameter);
            let buffers = elements(TensorKind::Buffer);
            let frozen = elements(TensorKind::Frozen);
            // Buffers and frozen parameters take a worker's memory too.
            let sync = spec.consistency_mode() == trainyard_common::spec::Consistency::Sync;
            let Some(optimizer) = spec.optimizer.as_ref() else {
                return Err(ApiError::Conflict(
                    "only a TorchScript model job is inspected".into(),
                ));
            };
            let e = trainyard_common::model::MemoryEstimate::of(&params, optimizer.kind, sync);
            let have = spec.resources.memory_mb.saturating_mul(1 << 20);
            sqlx::query("UPDATE jobs SET params = $2 WHERE id = $1")
                .bind(report.job_id)
                .bind(serde_json::to_value(&params).map_err(|e| ApiError::Internal(e.into()))?)
                .execute(&mut *tx)
                .await?;
            let state = if buffers == 0 && frozen == 0 {
                String::new()
            } else {
                format!(", {buffers} buffer elements, {frozen} frozen")
            };
            if count == 0 {
                (
                    JobState::Failed,
                    format!(
                        "the TorchScript module has no trainable parameters (its {} tensors are buffers or have requires_grad=False)",
                        params.len()
                    ),
                )
            } else if e.ps_worker_bytes > have {
                (
                    JobState::Failed,
                    format!("the model has {count} parameters{state}: a worker needs {} MiB, more than resources.memory_mb ({})", e.ps_worker_bytes.div_ceil(1 << 20), spec.resources.memory_mb),
                )
            } else {
                (
                    trainyard_common::JobState::Scheduling,
                    format!(
                        "inspected: {} tensors, {count} parameters{state} ({} KiB of fp32 weights)",
                        params.len(),
                        (count * 4).div_ceil(1024)
                    ),
                )
            }
        }
    };
    trainyard_scheduler::lifecycle::transition(&mut tx, report.job_id, to, &reason)
        .await
        .map_err(|e| ApiError::Internal(anyhow::anyhow!(e.to_string())))?;
    tx.commit().await?;
    Ok(Json(fetch_job(&st.db, report.job_id).await?))
}
