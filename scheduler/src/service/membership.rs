//! Writing a job's membership change (new assignments, `generation + 1`,
//! the state change and the events saying why), and moving jobs whose every
//! role reported running to `running`.
//!
//! Every write re-checks the job's generation under its row lock, so a
//! leader that lost its lease mid-round cannot overwrite a newer plan.

use super::describe::describe;
use super::error::{db_err, SchedulerError};
use super::metrics::SchedulerMetrics;
use super::world::{JobMeta, World};
use crate::lifecycle::{self, event, transition};
use crate::plan::{JobView, Placement, Plan};
use sqlx::{PgPool, Row};
use std::collections::BTreeSet;
use trainyard_common::cluster::ExecutorState;
use trainyard_common::event::{self, EventData};
use trainyard_common::spec::Strategy;
use trainyard_common::JobState;
use uuid::Uuid;

/// Writes job `job`'s new placement from `plan`, if it changed: in one
/// transaction, under the job's row lock and only if its generation is
/// still the one `world` saw, the new assignments, `generation + 1`, the
/// state change that follows and the events saying why. An unchanged job
/// only gets its waiting reason refreshed.
pub(super) async fn apply(
    db: &PgPool,
    metrics: &SchedulerMetrics,
    world: &World,
    plan: &Plan,
    job: &JobView,
    note: Option<&str>,
) -> Result<(), SchedulerError> {
    let meta = &world.meta[&job.id];
    let new = plan.placements.get(&job.id);
    if new == job.current.as_ref() {
        if let Some(why) = plan.waiting.get(&job.id) {
            refresh_waiting(db, job.id, meta, why).await?;
        }
        return Ok(());
    }

    let mut tx = db.begin().await?;
    let row = sqlx::query("SELECT generation, state FROM jobs WHERE id = $1 FOR UPDATE")
        .bind(job.id)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(row) = row else { return Ok(()) };
    let generation: i64 = row.get("generation");
    let state: JobState = row.try_get("state")?;
    if generation != meta.generation || state.is_terminal() {
        return Ok(()); // Changed under us: the next round sees the new truth.
    }
    let next = generation + 1;
    let mut reason = describe(world, job.current.as_ref(), new, plan.waiting.get(&job.id));
    if let Some(note) = note {
        reason = format!("{note}: {reason}");
    }
    write_assignments(&mut tx, job.id, next, new).await?;
    let strategy = new.map(|p| strategy_name(p.strategy));
    sqlx::query(
        "UPDATE jobs SET generation = $2, updated_at = clock_timestamp(),
                strategy = coalesce($3, strategy), secret = coalesce(secret, $4),
                worlds = worlds + CASE WHEN $5 THEN 1 ELSE 0 END
         WHERE id = $1",
    )
    .bind(job.id)
    .bind(next)
    .bind(strategy)
    .bind(new_secret())
    // A generation that starts roles (not one that only releases them).
    .bind(new.is_some_and(|p| !p.workers.is_empty()))
    .execute(&mut *tx)
    .await?;
    if let Some(why) = plan.decisions.get(&job.id) {
        event(&mut tx, job.id, &EventData::Strategy, why).await?;
    }
    let placed = placement_data(world, job.current.as_ref(), next, new);
    event(&mut tx, job.id, &EventData::Placement(placed), &reason).await?;
    record_usage(&mut tx, job, next, new).await?;
    follow_placement(&mut tx, job.id, state, new.is_some(), &reason).await?;
    tx.commit().await?;
    metrics.replans.inc();
    if job.current.is_none() && new.is_some() {
        let waited = (chrono::Utc::now() - meta.created_at)
            .num_milliseconds()
            .max(0) as f64
            / 1000.0;
        metrics.placement_latency.observe(waited);
    }
    tracing::info!(job = %job.id, generation = next, "{reason}");
    Ok(())
}

/// An unchanged job's waiting reason, refreshed where it changed.
async fn refresh_waiting(
    db: &PgPool,
    job: Uuid,
    meta: &JobMeta,
    why: &str,
) -> Result<(), SchedulerError> {
    let reason = format!("waiting: {why}");
    if meta.state_reason != reason {
        sqlx::query(
            "UPDATE jobs SET state_reason = $2, updated_at = clock_timestamp()
                 WHERE id = $1 AND state_reason <> $2 AND generation = $3
                   AND state NOT IN ('succeeded', 'failed', 'cancelled')",
        )
        .bind(job)
        .bind(&reason)
        .bind(meta.generation)
        .execute(db)
        .await?;
        let mut conn = db.acquire().await?;
        lifecycle::notify(&mut conn, job).await?;
    }
    Ok(())
}

/// Generation `next`'s assignments of `job`: `new`'s workers, PS shards
/// and their standbys (none where the job was released).
async fn write_assignments(
    tx: &mut sqlx::PgConnection,
    job: Uuid,
    next: i64,
    new: Option<&Placement>,
) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM assignments WHERE job_id = $1")
        .bind(job)
        .execute(&mut *tx)
        .await?;
    if let Some(p) = new {
        for w in &p.workers {
            sqlx::query("INSERT INTO assignments (job_id, generation, role, index, executor_id, device) VALUES ($1, $2, 'worker', $3, $4, $5)")
                .bind(job)
                .bind(next)
                .bind(w.rank as i32)
                .bind(w.executor)
                .bind(w.device as i32)
                .execute(&mut *tx)
                .await?;
        }
        for ps in &p.parameter_servers {
            sqlx::query("INSERT INTO assignments (job_id, generation, role, index, executor_id, ranges) VALUES ($1, $2, 'ps', $3, $4, $5)")
                .bind(job)
                .bind(next)
                .bind(ps.shard as i32)
                .bind(ps.executor)
                .bind(serde_json::to_value(&ps.ranges).unwrap_or_default())
                .execute(&mut *tx)
                .await?;
            // A standby is a role of its own, numbered by its shard, with
            // its shard's ranges.
            if let Some(sb) = ps.standby {
                sqlx::query("INSERT INTO assignments (job_id, generation, role, index, executor_id, ranges) VALUES ($1, $2, 'standby', $3, $4, $5)")
                    .bind(job)
                    .bind(next)
                    .bind(ps.shard as i32)
                    .bind(sb)
                    .bind(serde_json::to_value(&ps.ranges).unwrap_or_default())
                    .execute(&mut *tx)
                    .await?;
            }
        }
    }
    Ok(())
}

/// The state change a new placement makes (`placed`: it holds roles):
/// a queued job schedules, a placed one released is queued again, a
/// running one recovers; otherwise only the reason changes.
async fn follow_placement(
    tx: &mut sqlx::PgConnection,
    job: Uuid,
    state: JobState,
    placed: bool,
    reason: &str,
) -> Result<(), SchedulerError> {
    match (state, placed) {
        (JobState::Queued, true) => {
            transition(&mut *tx, job, JobState::Scheduling, reason)
                .await
                .map_err(db_err)?;
        }
        (JobState::Scheduling | JobState::Running | JobState::Recovering, false) => {
            transition(&mut *tx, job, JobState::Queued, reason)
                .await
                .map_err(db_err)?;
        }
        (JobState::Running, true) => {
            transition(&mut *tx, job, JobState::Recovering, reason)
                .await
                .map_err(db_err)?;
        }
        _ => {
            sqlx::query("UPDATE jobs SET state_reason = $2 WHERE id = $1")
                .bind(job)
                .bind(reason)
                .execute(&mut *tx)
                .await?;
            lifecycle::notify(&mut *tx, job).await?;
        }
    }
    Ok(())
}

/// Closes the job's open usage interval and opens one for generation
/// `generation` with what `new` holds, both at the time of the placement
/// event just written: usage is exactly the placement timeline (which
/// usage accounting and fair share read).
async fn record_usage(
    tx: &mut sqlx::PgConnection,
    job: &JobView,
    generation: i64,
    new: Option<&Placement>,
) -> Result<(), sqlx::Error> {
    let at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "SELECT at FROM job_events WHERE job_id = $1 AND kind = 'placement' ORDER BY id DESC LIMIT 1",
    )
    .bind(job.id)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE usage_intervals SET ended_at = greatest(started_at, $2)
         WHERE job_id = $1 AND ended_at IS NULL",
    )
    .bind(job.id)
    .bind(at)
    .execute(&mut *tx)
    .await?;
    let Some(p) = new else { return Ok(()) };
    let workers = p.workers.len() as i32;
    let (cuda, cpu) = match job.demand.device {
        trainyard_common::spec::Device::Cuda => (workers, 0),
        trainyard_common::spec::Device::Cpu => (0, workers),
    };
    let shards = p.parameter_servers.len();
    let roles = shards
        + p.parameter_servers
            .iter()
            .filter(|s| s.standby.is_some())
            .count();
    let ps_ram = if shards == 0 {
        0
    } else {
        crate::plan::ps_bytes(&job.demand, shards as u32).saturating_mul(roles as u64)
    };
    sqlx::query(
        "INSERT INTO usage_intervals (job_id, owner, generation, cuda_devices, cpu_workers, ps_ram_bytes, started_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (job_id, generation) DO NOTHING",
    )
    .bind(job.id)
    .bind(&job.owner)
    .bind(generation)
    .bind(cuda)
    .bind(cpu)
    .bind(i64::try_from(ps_ram).unwrap_or(i64::MAX))
    .bind(at)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Closes the usage intervals of jobs that ended, at their end.
pub(super) async fn close_finished_usage(db: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE usage_intervals u SET ended_at = greatest(u.started_at, coalesce(j.finished_at, clock_timestamp()))
         FROM jobs j
         WHERE u.job_id = j.id AND u.ended_at IS NULL AND j.state IN ('succeeded', 'failed', 'cancelled')",
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Moves jobs whose every role runs at the current generation to `running`.
pub(super) async fn promote_acknowledged(db: &PgPool) -> Result<(), SchedulerError> {
    let ready: Vec<(Uuid, i64, i64)> = sqlx::query_as(
        "SELECT j.id, j.generation, count(*)
         FROM jobs j JOIN assignments a ON a.job_id = j.id AND a.generation = j.generation
         JOIN executors e ON e.id = a.executor_id
         WHERE j.state IN ('scheduling', 'recovering')
         GROUP BY j.id, j.generation
         HAVING bool_and(e.reported @> jsonb_build_array(jsonb_build_object(
             'job_id', a.job_id, 'generation', a.generation, 'role', a.role, 'index', a.index)))",
    )
    .fetch_all(db)
    .await?;
    for (id, generation, roles) in ready {
        let mut tx = db.begin().await?;
        let current: Option<i64> =
            sqlx::query_scalar("SELECT generation FROM jobs WHERE id = $1 FOR UPDATE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        if current != Some(generation) {
            continue;
        }
        let reason = format!("all {roles} role(s) running at generation {generation}");
        match transition(&mut tx, id, JobState::Running, &reason).await {
            Ok(_) => tx.commit().await?,
            Err(lifecycle::TransitionError::Illegal { .. }) => {}
            Err(e) => return Err(db_err(e)),
        }
    }
    Ok(())
}

fn strategy_name(s: Strategy) -> &'static str {
    match s {
        Strategy::Allreduce => "allreduce",
        _ => "parameter_server",
    }
}

/// 32 random bytes (from two v4 UUIDs, which use the OS's CSPRNG).
pub fn new_secret() -> Vec<u8> {
    let mut s = Uuid::new_v4().as_bytes().to_vec();
    s.extend_from_slice(Uuid::new_v4().as_bytes());
    s
}

/// The placement event's data: generation `generation`'s roles, and the
/// executors of the `old` placement that are no longer live.
fn placement_data(
    world: &World,
    old: Option<&Placement>,
    generation: i64,
    p: Option<&Placement>,
) -> event::Placement {
    let held: BTreeSet<Uuid> = old
        .into_iter()
        .flat_map(|o| {
            o.workers
                .iter()
                .map(|w| w.executor)
                .chain(o.parameter_servers.iter().map(|s| s.executor))
                .chain(o.parameter_servers.iter().filter_map(|s| s.standby))
        })
        .collect();
    let departed = held
        .into_iter()
        .filter_map(|e| match world.executors.get(&e) {
            Some((_, ExecutorState::Live)) => None,
            Some((name, state)) => Some(event::Departed {
                executor: e,
                name: name.clone(),
                state: *state,
            }),
            None => Some(event::Departed {
                executor: e,
                name: e.to_string(),
                state: ExecutorState::Lost,
            }),
        })
        .collect();
    event::Placement {
        generation,
        strategy: p.map(|p| strategy_name(p.strategy).to_string()),
        workers: p.map_or(Vec::new(), |p| {
            p.workers
                .iter()
                .map(|w| event::PlacedWorker {
                    rank: w.rank,
                    executor: w.executor,
                    device: w.device,
                })
                .collect()
        }),
        parameter_servers: p.map_or(Vec::new(), |p| {
            p.parameter_servers
                .iter()
                .map(|s| event::PlacedShard {
                    shard: s.shard,
                    executor: s.executor,
                    standby: s.standby,
                })
                .collect()
        }),
        departed,
    }
}
