//! A job's row as the API shows it ([`Job`]): the columns read, the
//! decoding, and the lookups by id with their 404; [`log_page`], one
//! keyset page of a job's append-only log (its events, its log lines);
//! and [`stream_object`], a stored object (a job's model, an output)
//! streamed as an attachment.

use crate::error::{ApiError, ApiResult};
use sqlx::postgres::PgRow;
use sqlx::Row;
use trainyard_common::api::{Job, SweepRef};
use trainyard_common::event::Submitted;
use trainyard_common::spec::{Strategy, UncheckedJobSpec};
use trainyard_common::{EventData, JobSpec, JobState};
use uuid::Uuid;

/// The columns a [`Job`] is read from (the API-load benchmark runs the same
/// SQL through `pgbench` as its baseline).
pub const JOB_COLUMNS: &str = "id, name, owner, spec, state, state_reason, generation, strategy, created_at, updated_at, started_at, finished_at, data_policy -> 'artifacts' AS artifacts, sweep_id, sweep_trial";

/// One page of job `job`'s rows of `table` (an append-only log keyed by
/// `id`): `columns` of those after `q.after`, at most `q.limit` (default
/// `default`, at most `max`), each decoded by `decode`; with the id the
/// next page starts after, when there are more.
pub async fn log_page<T>(
    db: &sqlx::PgPool,
    (table, columns): (&'static str, &'static str),
    job: Uuid,
    q: &super::params::AfterQuery,
    (default, max): (i64, i64),
    decode: impl Fn(&PgRow) -> ApiResult<T>,
) -> ApiResult<(Vec<T>, Option<i64>)> {
    let limit = super::params::parse_limit(q.limit.as_deref(), default, max)?;
    let after = super::params::parse_after(q.after.as_deref())?;
    ensure_job(db, job).await?;
    let rows = sqlx::query(&format!(
        "SELECT id, {columns} FROM {table} WHERE job_id = $1 AND id > $2 ORDER BY id LIMIT $3"
    ))
    .bind(job)
    .bind(after)
    .bind(limit + 1)
    .fetch_all(db)
    .await?;
    let more = rows.len() as i64 > limit;
    let page = rows.iter().take(limit as usize);
    let last = page
        .clone()
        .last()
        .map(|r| r.try_get::<i64, _>("id"))
        .transpose()?;
    let items = page.map(decode).collect::<ApiResult<Vec<T>>>()?;
    Ok((items, last.filter(|_| more)))
}

/// Job `id`'s stored spec, read by [`JobSpec::from_stored`]. Where one
/// job is asked for, a spec that does not read is the server's fault (a
/// 500, logged with the job and what is wrong); where many are (a
/// heartbeat's answer, the scheduler's round), that job alone is left out
/// and logged, by the caller.
pub fn stored_spec(id: Uuid, stored: serde_json::Value) -> ApiResult<JobSpec> {
    JobSpec::from_stored(stored).map_err(|e| ApiError::Internal(anyhow::anyhow!("job {id}: {e}")))
}

/// Decodes a row of [`JOB_COLUMNS`].
pub fn job_from_row(row: &PgRow) -> ApiResult<Job> {
    let spec: UncheckedJobSpec = stored_spec(row.try_get("id")?, row.try_get("spec")?)?.into();
    let state: JobState = row.try_get("state")?;
    Ok(Job {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        owner: row.try_get("owner")?,
        state,
        state_reason: row.try_get("state_reason")?,
        generation: row.try_get("generation")?,
        // What the scheduler resolved once placed; before, the estimate.
        strategy: match row.try_get::<Option<String>, _>("strategy")?.as_deref() {
            Some("allreduce") => Strategy::Allreduce,
            Some(_) => Strategy::ParameterServer,
            None => spec.strategy,
        },
        estimate: spec.estimate(),
        spec,
        artifacts: match row.try_get::<Option<serde_json::Value>, _>("artifacts")? {
            Some(a) => serde_json::from_value(a).map_err(|e| {
                ApiError::Internal(anyhow::anyhow!("stored artifacts do not decode: {e}"))
            })?,
            None => Vec::new(),
        },
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        sweep: match (
            row.try_get::<Option<Uuid>, _>("sweep_id")?,
            row.try_get::<Option<i32>, _>("sweep_trial")?,
        ) {
            (Some(id), Some(trial)) => Some(SweepRef {
                id,
                trial: trial.max(0) as u32,
            }),
            _ => None,
        },
    })
}

/// Job `id`, or a 404.
pub async fn fetch_job(db: &sqlx::PgPool, id: Uuid) -> ApiResult<Job> {
    let row = sqlx::query(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"))
        .bind(id)
        .fetch_optional(db)
        .await?
        .ok_or_else(|| job_not_found(id))?;
    job_from_row(&row)
}

/// A 404 unless job `id` exists.
pub async fn ensure_job(db: &sqlx::PgPool, id: Uuid) -> ApiResult<()> {
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM jobs WHERE id = $1)")
        .bind(id)
        .fetch_one(db)
        .await?;
    if exists {
        Ok(())
    } else {
        Err(job_not_found(id))
    }
}

/// The 404 of a job that does not exist.
pub fn job_not_found(id: Uuid) -> ApiError {
    ApiError::NotFound(format!("no job with id {id}"))
}

/// Streams the store's object `key` as an attachment named `filename`; a
/// missing object is a 404 saying `missing`, an unreachable store a 503.
pub async fn stream_object(
    st: &crate::AppState,
    key: &str,
    filename: &str,
    missing: impl FnOnce() -> String,
) -> ApiResult<axum::response::Response> {
    use axum::http::header;
    use axum::response::IntoResponse;
    use futures::TryStreamExt;
    let (size, stream) = match st.store.stream(key).await {
        Ok(s) => s,
        Err(trainyard_store::StoreError::NotFound(_)) => return Err(ApiError::NotFound(missing())),
        Err(e) => return Err(ApiError::Unavailable(format!("object store: {e}"))),
    };
    let name = filename.replace('"', "");
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, size.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        axum::body::Body::from_stream(stream.map_err(std::io::Error::other)),
    )
        .into_response())
}

/// The submit's insert: `$1` id, `$2` name, `$3` owner, `$4` spec, `$5`
/// idempotency key, `$6` request hash, `$7` priority, `$8` data policy (the API-load
/// benchmark runs this very statement through `pgbench`).
pub fn insert_job_sql() -> String {
    format!(
        "INSERT INTO jobs (id, name, owner, spec, idempotency_key, request_hash, priority, data_policy)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (owner, idempotency_key) DO NOTHING
         RETURNING {JOB_COLUMNS}"
    )
}

/// The submit's event: `$1` job, `$2` data.
pub const INSERT_SUBMITTED_EVENT: &str =
    "INSERT INTO job_events (job_id, kind, to_state, reason, data)
     VALUES ($1, 'submitted', 'queued', 'submitted', $2)";

/// What every new job row needs beside it, in the insert's transaction:
/// the artifact versions it reads and its `submitted` event (the caller
/// wakes the scheduler).
pub async fn record_submitted(
    tx: &mut sqlx::PgConnection,
    job: &Job,
    versions: &[Uuid],
    key: Option<String>,
) -> ApiResult<()> {
    for v in versions {
        sqlx::query(
            "INSERT INTO job_artifacts (job_id, version) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(job.id)
        .bind(v)
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query(INSERT_SUBMITTED_EVENT)
        .bind(job.id)
        .bind(
            EventData::Submitted(Submitted {
                strategy: job.strategy,
                idempotency_key: key,
                owner: job.owner.clone(),
            })
            .to_json(),
        )
        .execute(&mut *tx)
        .await?;
    Ok(())
}
