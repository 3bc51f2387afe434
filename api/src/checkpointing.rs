//! Committing checkpoints, keeping the newest K, and finding the one a job
//! starts from.
//!
//! Roles upload their shards themselves (through their executor's local
//! cache tier) and report each one with their role report. [`record`]
//! stores the reports and, once every shard of one step (and generation)
//! is in, writes `manifest.json` to the object store — the commit point —
//! and then the `checkpoints` row. After a commit it applies the job's
//! retention (rows first, then objects) and deletes the objects of
//! checkpoints that never committed and never will (older than the newest
//! committed one). A checkpoint without a manifest is never handed to a
//! role.

use crate::error::{ApiError, ApiResult};
use crate::AppState;
use sqlx::Row;
use std::collections::BTreeSet;
use trainyard_common::checkpoint::{
    manifest_key, parse_step_dir, shard_key, step_dir, CheckpointRef, Manifest, ShardUploaded,
};
use trainyard_common::cluster::RoleKey;
use trainyard_common::event::{self, EventData};
use trainyard_common::JobSpec;
use uuid::Uuid;

/// Most shards one checkpoint may have.
pub const MAX_SHARDS: u32 = 4096;

/// Checks the shard reports of a role report; names the first bad field.
pub fn validate(key: &RoleKey, shards: &[ShardUploaded]) -> ApiResult<()> {
    for (i, s) in shards.iter().enumerate() {
        let bad = |field: &str, why: String| {
            Err(ApiError::invalid_field(
                &format!("checkpoints[{i}].{field}"),
                why,
            ))
        };
        if s.shards == 0 || s.shards > MAX_SHARDS {
            return bad("shards", format!("must be 1–{MAX_SHARDS}"));
        }
        if s.shard >= s.shards {
            return bad("shard", "must be less than shards".into());
        }
        if s.step > i64::MAX as u64 || s.bytes > i64::MAX as u64 {
            return bad("step", "out of range".into());
        }
        if s.key != shard_key(key.job_id, s.step, s.shard) {
            return bad(
                "key",
                format!(
                    "must be {} for this job, step and shard",
                    shard_key(key.job_id, s.step, s.shard)
                ),
            );
        }
        if s.ranges.is_empty() || s.ranges.iter().any(|r| r.start >= r.end) {
            return bad("ranges", "must be non-empty pieces with start < end".into());
        }
        if s.sha256.len() != 64 || !s.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return bad("sha256", "must be 64 hex digits".into());
        }
    }
    Ok(())
}

/// Records shard reports and commits every checkpoint they complete.
///
/// Commits of one job are serialised by a Postgres advisory lock (held for
/// the transaction): reports of different roles arrive concurrently, and
/// under the lock every complete checkpoint newer than the newest committed
/// one is committed in ascending step order before retention and clean-up
/// run, so clean-up never removes a checkpoint that another report was
/// about to complete.
pub async fn record(
    st: &AppState,
    job: Uuid,
    executor: Uuid,
    shards: &[ShardUploaded],
) -> ApiResult<()> {
    if shards.is_empty() {
        return Ok(());
    }
    for s in shards {
        // A retry of the reporting executor may update its shard; another
        // executor's report of the same shard changes nothing (the fence
        // refused it before; this holds under a race too).
        let stored = sqlx::query(
            "INSERT INTO checkpoint_shards (job_id, step, generation, shard, shards, report, executor_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (job_id, step, generation, shard) DO UPDATE SET report = EXCLUDED.report, shards = EXCLUDED.shards
             WHERE checkpoint_shards.executor_id IS NULL OR checkpoint_shards.executor_id = EXCLUDED.executor_id",
        )
        .bind(job)
        .bind(s.step as i64)
        .bind(s.generation)
        .bind(s.shard as i32)
        .bind(s.shards as i32)
        .bind(serde_json::to_value(s).map_err(|e| ApiError::Internal(e.into()))?)
        .bind(executor)
        .execute(&st.db)
        .await?
        .rows_affected();
        if stored == 0 {
            return Err(ApiError::Conflict(format!(
                "shard {} of checkpoint step {} (generation {}) was reported by another executor",
                s.shard, s.step, s.generation
            )));
        }
    }
    let mut tx = st.db.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 7001))")
        .bind(job.to_string())
        .execute(&mut *tx)
        .await?;
    let committed = commit_complete(st, &mut tx, job).await?;
    if committed {
        if let Err(e) = tidy(st, &mut tx, job).await {
            tracing::warn!(%job, error = %e, "checkpoint retention or clean-up failed; retried at the next commit");
        }
    }
    tx.commit().await?;
    Ok(())
}

/// Commits, oldest first, every complete checkpoint of `job` newer than its
/// newest committed one: `manifest.json` first, then the row. Returns
/// whether any was committed.
async fn commit_complete(st: &AppState, tx: &mut sqlx::PgConnection, job: Uuid) -> ApiResult<bool> {
    let newest: Option<i64> =
        sqlx::query_scalar("SELECT max(step) FROM checkpoints WHERE job_id = $1")
            .bind(job)
            .fetch_one(&mut *tx)
            .await?;
    let groups: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT step, generation FROM checkpoint_shards WHERE job_id = $1 AND step > $2
         GROUP BY step, generation HAVING count(*) = max(shards) ORDER BY step, generation",
    )
    .bind(job)
    .bind(newest.unwrap_or(-1))
    .fetch_all(&mut *tx)
    .await?;
    let mut any = false;
    let mut done = newest.unwrap_or(-1);
    for (step, generation) in groups {
        if step <= done {
            continue;
        }
        let rows: Vec<serde_json::Value> = sqlx::query_scalar(
            "SELECT report FROM checkpoint_shards WHERE job_id = $1 AND step = $2 AND generation = $3 ORDER BY shard",
        )
        .bind(job)
        .bind(step)
        .bind(generation)
        .fetch_all(&mut *tx)
        .await?;
        let reports: Vec<ShardUploaded> = rows
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect();
        let Some(manifest) = Manifest::from_reports(job, &reports) else {
            continue;
        };
        let step = step as u64;
        let key = manifest_key(job, step);
        let json =
            serde_json::to_vec_pretty(&manifest).map_err(|e| ApiError::Internal(e.into()))?;
        st.store
            .put(&key, json.into())
            .await
            .map_err(|e| ApiError::Unavailable(format!("cannot write the manifest: {e}")))?;
        sqlx::query(
            "INSERT INTO checkpoints (job_id, step, generation, shards, bytes, manifest_key, manifest)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
        )
        .bind(job)
        .bind(step as i64)
        .bind(manifest.generation)
        .bind(manifest.shards.len() as i32)
        .bind(manifest.bytes as i64)
        .bind(&key)
        .bind(serde_json::to_value(&manifest).map_err(|e| ApiError::Internal(e.into()))?)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO job_events (job_id, kind, reason, data) VALUES ($1, 'checkpoint', $2, $3)",
        )
        .bind(job)
        .bind(format!(
            "checkpoint of step {step} committed: {} shard(s), {} bytes",
            manifest.shards.len(),
            manifest.bytes
        ))
        .bind(
            EventData::Checkpoint(event::Checkpoint {
                step,
                manifest_url: st.store.url_of(&key),
            })
            .to_json(),
        )
        .execute(&mut *tx)
        .await?;
        tracing::info!(%job, step, shards = manifest.shards.len(), bytes = manifest.bytes, "checkpoint committed");
        done = step as i64;
        any = true;
    }
    Ok(any)
}

/// Keeps the job's newest K committed checkpoints and removes what is
/// older than the newest one and not committed (rows and objects).
async fn tidy(st: &AppState, tx: &mut sqlx::PgConnection, job: Uuid) -> anyhow::Result<()> {
    let spec: serde_json::Value = sqlx::query_scalar("SELECT spec FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_one(&mut *tx)
        .await?;
    let keep = JobSpec::from_stored(spec)
        .map_err(|e| anyhow::anyhow!("job {job}: {e}"))?
        .checkpoint
        .keep;
    let dropped: Vec<i64> = sqlx::query_scalar(
        "DELETE FROM checkpoints WHERE job_id = $1 AND step IN
           (SELECT step FROM checkpoints WHERE job_id = $1 ORDER BY step DESC OFFSET $2)
         RETURNING step",
    )
    .bind(job)
    .bind(i64::from(keep))
    .fetch_all(&mut *tx)
    .await?;
    for step in &dropped {
        st.store.delete_prefix(&step_dir(job, *step as u64)).await?;
    }
    let kept: Vec<i64> =
        sqlx::query_scalar("SELECT step FROM checkpoints WHERE job_id = $1 ORDER BY step")
            .bind(job)
            .fetch_all(&mut *tx)
            .await?;
    let Some(&newest) = kept.last() else {
        return Ok(());
    };
    sqlx::query("DELETE FROM checkpoint_shards WHERE job_id = $1 AND step <= $2")
        .bind(job)
        .bind(newest)
        .execute(&mut *tx)
        .await?;
    let kept: BTreeSet<u64> = kept.into_iter().map(|s| s as u64).collect();
    let mut partial = BTreeSet::new();
    for (key, _) in st.store.list(&job.to_string()).await? {
        let step = key.split('/').nth(1).and_then(parse_step_dir);
        if let Some(step) = step.filter(|s| *s < newest as u64 && !kept.contains(s)) {
            partial.insert(step);
        }
    }
    for step in partial {
        tracing::info!(%job, step, "removing a checkpoint that never committed");
        st.store.delete_prefix(&step_dir(job, step)).await?;
    }
    Ok(())
}

/// The checkpoint each job's roles start from when they hold no state: the
/// job's newest committed one, else the one its spec resumes from.
pub async fn resume_points(
    db: &sqlx::PgPool,
    jobs: &[(Uuid, Option<trainyard_common::spec::ResumeFrom>)],
) -> Result<std::collections::BTreeMap<Uuid, CheckpointRef>, sqlx::Error> {
    let ids: Vec<Uuid> = jobs.iter().map(|j| j.0).collect();
    let rows = sqlx::query(
        "SELECT DISTINCT ON (job_id) job_id, step, manifest_key FROM checkpoints
         WHERE job_id = ANY($1) ORDER BY job_id, step DESC",
    )
    .bind(&ids)
    .fetch_all(db)
    .await?;
    let mut out = std::collections::BTreeMap::new();
    for r in rows {
        let job_id: Uuid = r.try_get("job_id")?;
        out.insert(
            job_id,
            CheckpointRef {
                job_id,
                step: r.try_get::<i64, _>("step")? as u64,
                manifest: r.try_get("manifest_key")?,
            },
        );
    }
    for (job, from) in jobs {
        if out.contains_key(job) {
            continue;
        }
        if let Some(f) = from {
            if let Some(c) = find(db, f.job_id, f.step).await? {
                out.insert(*job, c);
            }
        }
    }
    Ok(out)
}

/// A committed checkpoint of `job`: at `step`, or its newest.
pub async fn find(
    db: &sqlx::PgPool,
    job: Uuid,
    step: Option<u64>,
) -> Result<Option<CheckpointRef>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT step, manifest_key FROM checkpoints WHERE job_id = $1 AND ($2::bigint IS NULL OR step = $2)
         ORDER BY step DESC LIMIT 1",
    )
    .bind(job)
    .bind(step.map(|s| s as i64))
    .fetch_optional(db)
    .await?;
    row.map(|r| {
        Ok(CheckpointRef {
            job_id: job,
            step: r.try_get::<i64, _>("step")? as u64,
            manifest: r.try_get("manifest_key")?,
        })
    })
    .transpose()
}
