//! `GET /v1/jobs/{id}/assignments`: who holds which role of a job now.
//!
//! The scheduler rewrites a job's rows in `assignments` as a whole, together
//! with `jobs.generation`, in one transaction per membership change; this
//! reads them back joined with their executors, so the web page can draw the
//! cluster map (PS shards with the parameter ranges they own and the workers
//! that pull from them, or the ring's ranks in order) and redraw it at each
//! generation. A job that is not placed (queued, or ended) has none. A
//! shard's hot standby (a job with `replicas`) is stored as a `standby` row
//! numbered by its shard and shown here with its shard.

use super::job_rows::fetch_job;
use crate::error::{ApiError, ApiResult, Problem};
use crate::extract::JobId;
use crate::AppState;
use axum::extract::State;
use axum::Json;
use sqlx::Row;
pub use trainyard_common::api::{JobAssignments, PsShard, RoleHost, WorkerRole};
use trainyard_common::cluster::{ExecutorState, Range, RoleKind};

/// A job's current roles and where they run.
#[utoipa::path(
    get, path = "/v1/jobs/{id}/assignments", operation_id = "get_job_assignments", tag = "jobs",
    params(("id" = Uuid, Path, description = "Job id")),
    responses(
        (status = 200, description = "The job's roles at its current generation", body = JobAssignments),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn assignments(
    State(st): State<AppState>,
    JobId(id): JobId,
) -> ApiResult<Json<JobAssignments>> {
    let job = fetch_job(&st.db, id).await?;
    let rows = sqlx::query(
        "SELECT a.role, a.index, a.device, a.ranges, e.id, e.name, e.address, e.state
         FROM assignments a JOIN executors e ON e.id = a.executor_id
         WHERE a.job_id = $1 AND a.generation = $2
         ORDER BY a.role, a.index",
    )
    .bind(id)
    .bind(job.generation)
    .fetch_all(&st.db)
    .await?;
    let mut parameter_servers: Vec<PsShard> = Vec::new();
    let mut standbys = Vec::new();
    let mut workers = Vec::new();
    for r in &rows {
        let executor = RoleHost {
            id: r.try_get("id")?,
            name: r.try_get("name")?,
            address: r.try_get("address")?,
            state: r.try_get::<ExecutorState, _>("state")?,
        };
        let index = u32::try_from(r.try_get::<i32, _>("index")?)
            .map_err(|e| ApiError::Internal(e.into()))?;
        let role = RoleKind::parse(&r.try_get::<String, _>("role")?);
        if role == Some(RoleKind::Standby) {
            standbys.push((index, executor));
        } else if role == Some(RoleKind::Ps) {
            let ranges: Vec<Range> = serde_json::from_value(r.try_get("ranges")?)
                .map_err(|e| ApiError::Internal(e.into()))?;
            parameter_servers.push(PsShard {
                shard: index,
                elements: ranges.iter().map(|r| r.end.saturating_sub(r.start)).sum(),
                executor,
                ranges,
                standby: None,
            });
        } else {
            let device = r.try_get::<Option<i32>, _>("device")?.unwrap_or(0);
            workers.push(WorkerRole {
                rank: index,
                executor,
                device: u32::try_from(device).map_err(|e| ApiError::Internal(e.into()))?,
            });
        }
    }
    for (shard, host) in standbys {
        if let Some(p) = parameter_servers.iter_mut().find(|p| p.shard == shard) {
            p.standby = Some(host);
        }
    }
    Ok(Json(JobAssignments {
        job_id: id,
        state: job.state,
        generation: job.generation,
        strategy: job.strategy,
        parameter_servers,
        workers,
    }))
}
