//! Sharing the cluster: `/v1/quotas` (admins set and read each user's
//! limits on what its placed jobs hold at once) and `GET /v1/usage` (what
//! each job and user used over a window, from the assignment history the
//! scheduler writes in `usage_intervals`; users see their own, admins
//! everyone's).
//!
//! The scheduler reads the quotas every round (`trainyard-scheduler`'s
//! `service::sharing`): a job beyond its owner's quota waits with the
//! reason in `state_reason`; lowering a quota trims placed elastic jobs
//! towards `workers.min` and releases jobs that no longer fit it.

use super::params::parse_body;
use crate::auth::{valid_user_name, Principal, MAX_USER_CHARS};
use crate::error::{ApiError, ApiResult, Problem};
use crate::extract::{JsonBytes, QueryParams};
use crate::AppState;
use axum::extract::{Path, State};
use axum::Json;
use chrono::{DateTime, Duration, Utc};
use serde::Deserialize;
use sqlx::Row;
pub use trainyard_common::api::{
    JobUsage, OwnerUsage, QuotaInfo, QuotaLimits, QuotaList, QuotaUse, UsageFigures, UsageReport,
};
use trainyard_common::spec::Violation;
use utoipa::IntoParams;

/// Largest device or worker count a quota may name.
pub const MAX_QUOTA_WORKERS: u32 = 1_000_000;
/// Largest PS RAM a quota may name (1 PiB).
pub const MAX_QUOTA_RAM_BYTES: u64 = 1 << 50;
/// Most jobs a usage report lists.
pub const MAX_USAGE_JOBS: i64 = 1000;
/// The window a usage report covers when `from` is absent.
pub const DEFAULT_USAGE_WINDOW_HOURS: i64 = 24;

fn checked_owner(owner: &str) -> ApiResult<()> {
    if valid_user_name(owner) {
        Ok(())
    } else {
        Err(ApiError::bad_field(
            "owner",
            format!("must be 1 to {MAX_USER_CHARS} of a-z 0-9 . _ -, starting with a letter or digit; got {owner:?}"),
        ))
    }
}

fn check(q: &QuotaLimits) -> Vec<Violation> {
    let mut v = Vec::new();
    for (field, value) in [
        ("cuda_devices", q.cuda_devices),
        ("cpu_workers", q.cpu_workers),
    ] {
        if let Some(n) = value.filter(|n| *n > MAX_QUOTA_WORKERS) {
            v.push(Violation {
                field: field.into(),
                message: format!(
                    "must be between 0 and {MAX_QUOTA_WORKERS} (or null: unlimited), got {n}"
                ),
            });
        }
    }
    if let Some(n) = q.ps_ram_bytes.filter(|n| *n > MAX_QUOTA_RAM_BYTES) {
        v.push(Violation {
            field: "ps_ram_bytes".into(),
            message: format!(
                "must be between 0 and {MAX_QUOTA_RAM_BYTES} (or null: unlimited), got {n}"
            ),
        });
    }
    v
}

async fn quota_info(st: &AppState, owner: &str) -> ApiResult<QuotaInfo> {
    let row = sqlx::query(
        "SELECT q.cuda_devices, q.cpu_workers, q.ps_ram_bytes, q.updated_by, q.updated_at,
                coalesce(u.cuda, 0)::int8 AS use_cuda, coalesce(u.cpu, 0)::int8 AS use_cpu, coalesce(u.ram, 0)::int8 AS use_ram
         FROM (SELECT $1::text AS owner) o
         LEFT JOIN quotas q ON q.owner = o.owner
         LEFT JOIN (SELECT i.owner, sum(i.cuda_devices) AS cuda, sum(i.cpu_workers) AS cpu, sum(i.ps_ram_bytes) AS ram
                    FROM usage_intervals i JOIN jobs j ON j.id = i.job_id
                    WHERE i.ended_at IS NULL AND j.finished_at IS NULL AND i.owner = $1 GROUP BY i.owner) u ON u.owner = o.owner",
    )
    .bind(owner)
    .fetch_one(&st.db)
    .await?;
    Ok(QuotaInfo {
        owner: owner.to_owned(),
        cuda_devices: row
            .try_get::<Option<i32>, _>("cuda_devices")?
            .map(|n| n.max(0) as u32),
        cpu_workers: row
            .try_get::<Option<i32>, _>("cpu_workers")?
            .map(|n| n.max(0) as u32),
        ps_ram_bytes: row
            .try_get::<Option<i64>, _>("ps_ram_bytes")?
            .map(|n| n.max(0) as u64),
        in_use: QuotaUse {
            cuda_devices: row.try_get::<i64, _>("use_cuda")?.max(0) as u64,
            cpu_workers: row.try_get::<i64, _>("use_cpu")?.max(0) as u64,
            ps_ram_bytes: row.try_get::<i64, _>("use_ram")?.max(0) as u64,
        },
        updated_by: row.try_get("updated_by")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// Set a user's quota (admin only); absent or `null` limits are unlimited.
///
/// Takes effect at the scheduler's next round: jobs beyond it wait with
/// the reason in `state_reason`.
#[utoipa::path(
    put, path = "/v1/quotas/{owner}", operation_id = "set_quota", tag = "sharing",
    params(("owner" = String, Path, description = "The user")),
    request_body(content = QuotaLimits, content_type = "application/json"),
    responses(
        (status = 200, description = "The quota as set, with what the user's jobs hold now", body = QuotaInfo),
        (status = 400, description = "Malformed JSON or a bad user name", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields: every violation", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []), ())
)]
pub async fn set_quota(
    State(st): State<AppState>,
    who: Principal,
    Path(owner): Path<String>,
    JsonBytes(body): JsonBytes,
) -> ApiResult<Json<QuotaInfo>> {
    checked_owner(&owner)?;
    let q: QuotaLimits = parse_body(&body)?;
    let violations = check(&q);
    if !violations.is_empty() {
        return Err(ApiError::Unprocessable(violations));
    }
    sqlx::query(
        "INSERT INTO quotas (owner, cuda_devices, cpu_workers, ps_ram_bytes, updated_by)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (owner) DO UPDATE SET cuda_devices = EXCLUDED.cuda_devices,
             cpu_workers = EXCLUDED.cpu_workers, ps_ram_bytes = EXCLUDED.ps_ram_bytes,
             updated_by = EXCLUDED.updated_by, updated_at = clock_timestamp()",
    )
    .bind(&owner)
    .bind(q.cuda_devices.map(|n| n as i32))
    .bind(q.cpu_workers.map(|n| n as i32))
    .bind(q.ps_ram_bytes.map(|n| n as i64))
    .bind(&who.user)
    .execute(&st.db)
    .await?;
    tracing::info!(%owner, by = %who.user, ?q, "quota set");
    Ok(Json(quota_info(&st, &owner).await?))
}

/// A user's quota (admin only); a user never given one is unlimited.
#[utoipa::path(
    get, path = "/v1/quotas/{owner}", operation_id = "get_quota", tag = "sharing",
    params(("owner" = String, Path, description = "The user")),
    responses(
        (status = 200, description = "The quota, with what the user's jobs hold now", body = QuotaInfo),
        (status = 400, description = "A bad user name", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []), ())
)]
pub async fn get_quota(
    State(st): State<AppState>,
    Path(owner): Path<String>,
) -> ApiResult<Json<QuotaInfo>> {
    checked_owner(&owner)?;
    Ok(Json(quota_info(&st, &owner).await?))
}

/// Every user with a quota (admin only), by name.
#[utoipa::path(
    get, path = "/v1/quotas", operation_id = "list_quotas", tag = "sharing",
    responses(
        (status = 200, description = "The quotas", body = QuotaList),
        (status = 401, description = "Missing or wrong token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []), ())
)]
pub async fn list_quotas(State(st): State<AppState>) -> ApiResult<Json<QuotaList>> {
    let owners: Vec<String> =
        sqlx::query_scalar("SELECT owner FROM quotas ORDER BY owner LIMIT 10000")
            .fetch_all(&st.db)
            .await?;
    let mut quotas = Vec::with_capacity(owners.len());
    for o in owners {
        quotas.push(quota_info(&st, &o).await?);
    }
    Ok(Json(QuotaList { quotas }))
}

/// Query of `GET /v1/usage`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// Start of the window, RFC 3339 (default: 24 hours before `to`).
    pub from: Option<String>,
    /// End of the window, RFC 3339 (default and at most: now).
    pub to: Option<String>,
    /// Only this user (admins; a user sees only its own).
    pub owner: Option<String>,
}

fn parse_time(field: &str, raw: &str) -> ApiResult<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            ApiError::bad_field(
                field,
                format!("must be an RFC 3339 time such as 2026-12-01T12:00:00Z, got {raw:?} ({e})"),
            )
        })
}

fn figures(r: &sqlx::postgres::PgRow) -> ApiResult<UsageFigures> {
    Ok(UsageFigures {
        device_seconds: r.try_get::<Option<f64>, _>("cuda")?.unwrap_or(0.0),
        cpu_worker_seconds: r.try_get::<Option<f64>, _>("cpu")?.unwrap_or(0.0),
        ps_ram_gib_hours: r.try_get::<Option<f64>, _>("ram")?.unwrap_or(0.0),
    })
}

/// Usage over `[from, to)` per user and per job, from the assignment
/// history: device-seconds (CUDA workers), CPU-worker-seconds and PS RAM
/// GiB-hours. Users see their own; admins everyone's, or `owner`'s.
#[utoipa::path(
    get, path = "/v1/usage", operation_id = "usage", tag = "sharing",
    params(UsageQuery),
    responses(
        (status = 200, description = "Usage per user and per job", body = UsageReport),
        (status = 400, description = "A bad time, window or user name, or an unknown parameter", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or wrong token", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []), ())
)]
pub async fn usage(
    State(st): State<AppState>,
    who: Principal,
    QueryParams(q): QueryParams<UsageQuery>,
) -> ApiResult<Json<UsageReport>> {
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&st.db)
        .await?;
    let to = match q.to.as_deref() {
        Some(raw) => parse_time("to", raw)?.min(now),
        None => now,
    };
    let from = match q.from.as_deref() {
        Some(raw) => parse_time("from", raw)?,
        None => to - Duration::hours(DEFAULT_USAGE_WINDOW_HOURS),
    };
    if from >= to {
        return Err(ApiError::bad_field(
            "from",
            format!("must be before to ({to}, which is at most now), got {from}"),
        ));
    }
    if let Some(o) = &q.owner {
        checked_owner(o)?;
    }
    // A user sees only its own usage, whatever it asks for.
    let owner: Option<String> = match (who.is_admin(), q.owner) {
        (true, o) => o,
        (false, Some(o)) if o != who.user => {
            return Ok(Json(UsageReport {
                from,
                to,
                owners: Vec::new(),
                jobs: Vec::new(),
            }))
        }
        (false, _) => Some(who.user.clone()),
    };
    // An interval still open of a job that has ended (the scheduler closes
    // it at its next round) ends when the job did.
    const WINDOW: &str = "WITH w AS (
            SELECT u.job_id, u.owner, u.cuda_devices, u.cpu_workers, u.ps_ram_bytes,
                   extract(epoch FROM least(coalesce(u.ended_at, j.finished_at, $2), $2) - greatest(u.started_at, $1))::float8 AS secs
            FROM usage_intervals u JOIN jobs j ON j.id = u.job_id
            WHERE u.started_at < $2 AND coalesce(u.ended_at, j.finished_at, $2) > $1 AND ($3::text IS NULL OR u.owner = $3))";
    const SUMS: &str =
        "sum(cuda_devices * secs)::float8 AS cuda, sum(cpu_workers * secs)::float8 AS cpu,
            sum(ps_ram_bytes::float8 / 1073741824 * secs / 3600)::float8 AS ram";
    let owner_rows = sqlx::query(&format!(
        "{WINDOW} SELECT owner, count(DISTINCT job_id) AS jobs, {SUMS} FROM w WHERE secs > 0
         GROUP BY owner ORDER BY sum((cuda_devices + cpu_workers) * secs) DESC, owner"
    ))
    .bind(from)
    .bind(to)
    .bind(&owner)
    .fetch_all(&st.db)
    .await?;
    let mut owners = Vec::with_capacity(owner_rows.len());
    for r in &owner_rows {
        owners.push(OwnerUsage {
            owner: r.try_get("owner")?,
            jobs: r.try_get::<i64, _>("jobs")?.max(0) as u64,
            usage: figures(r)?,
        });
    }
    let job_rows = sqlx::query(&format!(
        "{WINDOW} SELECT w.job_id, j.name, w.owner, j.state, {SUMS}
         FROM w JOIN jobs j ON j.id = w.job_id WHERE secs > 0
         GROUP BY w.job_id, j.name, w.owner, j.state
         ORDER BY sum((cuda_devices + cpu_workers) * secs) DESC, w.job_id LIMIT $4"
    ))
    .bind(from)
    .bind(to)
    .bind(&owner)
    .bind(MAX_USAGE_JOBS)
    .fetch_all(&st.db)
    .await?;
    let mut jobs = Vec::with_capacity(job_rows.len());
    for r in &job_rows {
        jobs.push(JobUsage {
            job_id: r.try_get("job_id")?,
            name: r.try_get("name")?,
            owner: r.try_get("owner")?,
            state: r.try_get("state")?,
            usage: figures(r)?,
        });
    }
    Ok(Json(UsageReport {
        from,
        to,
        owners,
        jobs,
    }))
}
