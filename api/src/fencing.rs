//! Which executor may report for which role: the control plane's fence,
//! as the data plane's handshake is the data plane's.
//!
//! A role report names a role (job, generation, kind, index). The API
//! stores its metrics, log lines and checkpoint shards only when the
//! calling executor held exactly that role in exactly that generation, as
//! `role_history` records every assignment the scheduler ever made. An
//! executor that held no role in the job at all (a stranger with nothing
//! but the join token) is answered 403; one that held roles in the job but
//! not the named one (a zombie claiming a generation or a rank it was not
//! part of) 409 — nothing of either report is stored. A survivor's late
//! report for a generation it did hold is accepted: its steps were real.
//! A checkpoint shard is taken only for a generation in which the executor
//! held a role, and never over a shard another executor reported.

use crate::error::{ApiError, ApiResult};
use sqlx::PgPool;
use trainyard_common::checkpoint::ShardUploaded;
use trainyard_common::cluster::RoleKey;
use uuid::Uuid;

/// Refuses the report of `executor` for role `key` (with its checkpoint
/// `shards`) unless the executor held that role; see the module's rules.
pub async fn check(
    db: &PgPool,
    executor: Uuid,
    key: &RoleKey,
    shards: &[ShardUploaded],
) -> ApiResult<()> {
    let holder: Option<Uuid> = sqlx::query_scalar(
        "SELECT executor_id FROM role_history
         WHERE job_id = $1 AND generation = $2 AND role = $3 AND index = $4",
    )
    .bind(key.job_id)
    .bind(key.generation)
    .bind(key.role.as_str())
    .bind(key.index as i32)
    .fetch_optional(db)
    .await?;
    if holder != Some(executor) {
        let held_any: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM role_history WHERE job_id = $1 AND executor_id = $2)",
        )
        .bind(key.job_id)
        .bind(executor)
        .fetch_one(db)
        .await?;
        let role = format!(
            "{} {} of generation {} of job {}",
            key.role.as_str(),
            key.index,
            key.generation,
            key.job_id
        );
        return Err(if held_any {
            ApiError::Conflict(format!(
                "{role} was never this executor's role: the report is refused"
            ))
        } else {
            ApiError::Forbidden(format!(
                "executor {executor} holds no role in job {}: the report for {role} is refused",
                key.job_id
            ))
        });
    }
    for (i, s) in shards.iter().enumerate() {
        if s.generation != key.generation {
            let held: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM role_history
                 WHERE job_id = $1 AND generation = $2 AND executor_id = $3)",
            )
            .bind(key.job_id)
            .bind(s.generation)
            .bind(executor)
            .fetch_one(db)
            .await?;
            if !held {
                return Err(ApiError::Conflict(format!(
                    "checkpoints[{i}]: this executor held no role in generation {} of job {}",
                    s.generation, key.job_id
                )));
            }
        }
        let owner: Option<Option<Uuid>> = sqlx::query_scalar(
            "SELECT executor_id FROM checkpoint_shards
             WHERE job_id = $1 AND step = $2 AND generation = $3 AND shard = $4",
        )
        .bind(key.job_id)
        .bind(s.step as i64)
        .bind(s.generation)
        .bind(s.shard as i32)
        .fetch_optional(db)
        .await?;
        if let Some(Some(other)) = owner.filter(|o| *o != Some(executor)) {
            return Err(ApiError::Conflict(format!(
                "checkpoints[{i}]: shard {} of step {} (generation {}) was reported by executor {other}; \
                 it is not replaced",
                s.shard, s.step, s.generation
            )));
        }
    }
    Ok(())
}
