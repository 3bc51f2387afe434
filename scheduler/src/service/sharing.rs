//! Sharing in the round: reads quotas, each owner's decayed usage (from
//! `usage_intervals`) and the preemptions in their grace period, runs the
//! preemption pass ([`crate::share::preempt`]) and turns its decisions
//! into the round's plan.
//!
//! A shrink takes effect at once (it is a membership change like any
//! other: the ring goes on with fewer ranks). A whole preemption first
//! gets a row in `preemptions` and events on both jobs; while the row
//! exists every heartbeat of the victim's executors carries
//! `checkpoint_wanted` in its assignments, so its roles vote for a
//! checkpoint at their next step (as for a drain). The victim keeps
//! running until it has committed a checkpoint after the decision or the
//! grace period is over, and is then released to `queued` with the reason
//! (it resumes from its newest checkpoint when it is placed again). A
//! preemption whose preemptor no longer needs it (it started, ended, or
//! no longer fits by taking it) is called off.

use super::error::SchedulerError;
use super::world::World;
use crate::lifecycle::event;
use crate::plan::{plan_shared, Plan, Quota, Sharing};
use crate::share::{decayed, preempt, Action};
use sqlx::{PgPool, Row};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use trainyard_common::event::Preemption;
use trainyard_common::EventData;
use uuid::Uuid;

/// Usage older than this many half-lives is left out (it weighs < 1e-6).
const HALF_LIVES_KEPT: f64 = 20.0;

/// Settings of fair share and preemption.
#[derive(Debug, Clone)]
pub struct SharingConfig {
    /// Half-life of the usage fair share compares.
    pub half_life: Duration,
    /// How long a job to be preempted may run on to checkpoint.
    pub grace: Duration,
    /// A job queued this long goes before every other waiting job of its
    /// priority (and keeps later ones from taking what it needs).
    pub max_wait: Duration,
}

impl Default for SharingConfig {
    fn default() -> Self {
        SharingConfig {
            half_life: Duration::from_secs(3600),
            grace: Duration::from_secs(30),
            max_wait: Duration::from_secs(600),
        }
    }
}

/// A preemption in its grace period.
struct Pending {
    preemptor: Uuid,
    /// It has committed a checkpoint since the decision.
    checkpointed: bool,
    /// The grace period is over.
    overdue: bool,
}

/// What the round does, beyond the plan: the sentence each changed job's
/// placement event starts with, and what was taken from whom.
pub(super) struct Decided {
    pub(super) plan: Plan,
    pub(super) notes: BTreeMap<Uuid, String>,
    pub(super) actions: Vec<Action>,
}

/// Reads quotas and usage, marks starving jobs, and returns the round's
/// plan with its preemption decisions (writing the new pending ones).
pub(super) async fn decide(
    db: &PgPool,
    world: &mut World,
    config: &SharingConfig,
) -> Result<Decided, SchedulerError> {
    let max_wait = config.max_wait.as_secs_f64();
    for j in &mut world.jobs {
        j.starving = j.current.is_none()
            && world
                .meta
                .get(&j.id)
                .is_some_and(|m| m.waited_secs >= max_wait);
    }
    let sharing = Sharing {
        quotas: quotas(db).await?,
        usage: usage(db, config.half_life).await?,
        caps: unproven_trials(db).await?,
        ..Sharing::default()
    };
    let pending = pending(db).await?;
    let (mut decided, actions, mut plan) = preempt(&world.jobs, &world.live, &sharing);
    let by_id: HashMap<Uuid, &crate::plan::JobView> =
        world.jobs.iter().map(|j| (j.id, j)).collect();
    let mut notes = BTreeMap::new();
    let mut taken = Vec::new();
    let mut in_grace: Vec<(Uuid, Uuid)> = Vec::new();
    let mut wanted = Vec::new();
    // Whole preemptions first: a job whose victim still has its grace
    // period shrinks nobody meanwhile (it cannot start yet anyway).
    for a in &actions {
        if let Action::Preempt { victim, by } = *a {
            wanted.push(victim);
            let ready = match pending.get(&victim) {
                Some(p) => p.checkpointed || p.overdue,
                None => {
                    start_pending(db, victim, by, config.grace, &by_id).await?;
                    config.grace.is_zero()
                }
            };
            if ready {
                taken.push(a.clone());
            } else {
                decided.held_back.remove(&victim);
                in_grace.push((victim, by));
            }
        }
    }
    for a in &actions {
        if let Action::Shrink {
            victim,
            by,
            from,
            to,
        } = *a
        {
            if in_grace.iter().any(|(_, b)| *b == by) {
                decided.caps.remove(&victim);
                continue;
            }
            let b = by_id[&by];
            notes.insert(
                victim,
                format!(
                    "shrunk from {from} to {to} worker(s) for job {by} of {} (priority {} > {})",
                    b.owner, b.priority, by_id[&victim].priority
                ),
            );
            taken.push(a.clone());
        }
    }
    // Called off: pending victims no longer chosen.
    for (victim, p) in &pending {
        if !wanted.contains(victim) {
            call_off(db, *victim, p.preemptor).await?;
        }
    }
    if !in_grace.is_empty() {
        plan = plan_shared(&world.jobs, &world.live, &decided);
        for (victim, by) in &in_grace {
            if let Some(w) = plan.waiting.get_mut(by) {
                *w = format!(
                    "{w}; preempting job {victim}, which may checkpoint first (grace period {}s)",
                    config.grace.as_secs()
                );
            }
        }
    }
    // Released victims: their preemption is done (the release's reason is
    // their waiting reason, `preempted by …`).
    for a in &taken {
        if let Action::Preempt { victim, .. } = a {
            sqlx::query("DELETE FROM preemptions WHERE victim = $1")
                .bind(victim)
                .execute(db)
                .await?;
        }
    }
    remind_preempted(db, &mut plan).await?;
    Ok(Decided {
        plan,
        notes,
        actions: taken,
    })
}

/// Events on the jobs something was taken for, once the round's
/// membership changes are written.
pub(super) async fn record(
    db: &PgPool,
    world: &World,
    actions: &[Action],
) -> Result<(), SchedulerError> {
    let owner = |id: &Uuid| {
        world
            .jobs
            .iter()
            .find(|j| j.id == *id)
            .map_or(String::new(), |j| j.owner.clone())
    };
    for a in actions {
        let mut tx = db.begin().await?;
        let by = match *a {
            Action::Shrink { by, .. } | Action::Preempt { by, .. } => by,
        };
        match *a {
            Action::Shrink {
                victim,
                by,
                from,
                to,
            } => {
                event(
                    &mut tx,
                    by,
                    &EventData::Preemption(Preemption::Shrink { victim, from, to }),
                    &format!(
                        "shrank job {victim} of {} from {from} to {to} worker(s) to make room",
                        owner(&victim)
                    ),
                )
                .await?;
                event(
                    &mut tx,
                    victim,
                    &EventData::Preemption(Preemption::Shrunk { by, from, to }),
                    &format!(
                        "shrunk from {from} to {to} worker(s) by job {by} of {}",
                        owner(&by)
                    ),
                )
                .await?;
            }
            Action::Preempt { victim, by } => {
                event(
                    &mut tx,
                    by,
                    &EventData::Preemption(Preemption::Preempt { victim }),
                    &format!("preempted job {victim} of {} to make room", owner(&victim)),
                )
                .await?;
                event(
                    &mut tx,
                    victim,
                    &EventData::Preemption(Preemption::Preempted { by }),
                    &format!("preempted by job {by} of {}: back to queued, resumes from its newest checkpoint", owner(&by)),
                )
                .await?;
            }
        }
        crate::lifecycle::notify(&mut tx, by).await?;
        tx.commit().await?;
    }
    Ok(())
}

/// A queued job whose last preemption event released it keeps saying so
/// while it waits, after what it waits for.
async fn remind_preempted(db: &PgPool, plan: &mut Plan) -> Result<(), sqlx::Error> {
    let waiting: Vec<Uuid> = plan.waiting.keys().copied().collect();
    if waiting.is_empty() {
        return Ok(());
    }
    let rows = sqlx::query(
        "SELECT DISTINCT ON (job_id) job_id, data->>'action' AS action, data->>'by' AS by
         FROM job_events WHERE kind = 'preemption' AND job_id = ANY($1)
         ORDER BY job_id, id DESC",
    )
    .bind(&waiting)
    .fetch_all(db)
    .await?;
    for r in &rows {
        if r.get::<Option<String>, _>("action").as_deref() != Some("preempted") {
            continue;
        }
        let by: Option<String> = r.get("by");
        if let Some(w) = plan.waiting.get_mut(&r.get::<Uuid, _>("job_id")) {
            if !w.starts_with("preempted by") {
                *w = format!(
                    "{w} (preempted by job {}; resumes from its newest checkpoint)",
                    by.unwrap_or_default()
                );
            }
        }
    }
    Ok(())
}

async fn start_pending(
    db: &PgPool,
    victim: Uuid,
    by: Uuid,
    grace: Duration,
    jobs: &HashMap<Uuid, &crate::plan::JobView>,
) -> Result<(), SchedulerError> {
    let mut tx = db.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO preemptions (victim, preemptor, release_after)
         VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3))
         ON CONFLICT (victim) DO NOTHING",
    )
    .bind(victim)
    .bind(by)
    .bind(grace.as_secs_f64())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 1 {
        let (b, v) = (jobs[&by], jobs[&victim]);
        let secs = grace.as_secs();
        event(
            &mut tx,
            victim,
            &EventData::Preemption(Preemption::Pending { by: Some(by), victim: None, grace_secs: secs }),
            &format!(
                "to be preempted by job {by} of {} (priority {} > {}): asked for a checkpoint, released once it is committed, within {secs}s",
                b.owner, b.priority, v.priority
            ),
        )
        .await?;
        event(
            &mut tx,
            by,
            &EventData::Preemption(Preemption::Pending { by: None, victim: Some(victim), grace_secs: secs }),
            &format!(
                "preempting job {victim} of {} (priority {} < {}); it is asked for a checkpoint and has up to {secs}s to commit it",
                v.owner, v.priority, b.priority
            ),
        )
        .await?;
        crate::lifecycle::notify(&mut tx, victim).await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn call_off(db: &PgPool, victim: Uuid, by: Uuid) -> Result<(), SchedulerError> {
    let mut tx = db.begin().await?;
    let gone = sqlx::query("DELETE FROM preemptions WHERE victim = $1 AND preemptor = $2")
        .bind(victim)
        .bind(by)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if gone == 1 {
        event(
            &mut tx,
            victim,
            &EventData::Preemption(Preemption::CalledOff { by }),
            &format!("preemption called off: job {by} no longer needs this job's room"),
        )
        .await?;
        crate::lifecycle::notify(&mut tx, victim).await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn pending(db: &PgPool) -> Result<HashMap<Uuid, Pending>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT p.victim, p.preemptor, p.release_after <= clock_timestamp() AS overdue,
                EXISTS (SELECT 1 FROM checkpoints c WHERE c.job_id = p.victim AND c.committed_at > p.decided_at) AS checkpointed
         FROM preemptions p",
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get("victim"),
                Pending {
                    preemptor: r.get("preemptor"),
                    checkpointed: r.get("checkpointed"),
                    overdue: r.get("overdue"),
                },
            )
        })
        .collect())
}

/// Caps of sweep trials that early stopping may still stop: a trial of a
/// sweep with rungs keeps the workers it holds (at least `workers.min`)
/// until it has passed the last rung, so the executors a stopped trial
/// frees go to the trials that survived every rung, not to ones that may
/// be stopped next (growing those wasted devices, measured by
/// `tests/e2e/sweeps.rs`). A sweep without rungs caps nothing.
async fn unproven_trials(db: &PgPool) -> Result<BTreeMap<Uuid, u32>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT t.job_id,
                greatest(coalesce((t.spec -> 'workers' ->> 'min')::int, 1),
                         (SELECT count(*) FROM assignments a WHERE a.job_id = t.job_id AND a.role = 'worker')::int) AS cap
         FROM sweep_trials t JOIN sweeps s ON s.id = t.sweep_id
         WHERE s.state = 'running' AND t.state = 'running' AND t.job_id IS NOT NULL
           AND s.rungs > 0 AND coalesce(array_length(t.rung_metrics, 1), 0) < s.rungs",
    )
    .fetch_all(db)
    .await?;
    let mut caps = BTreeMap::new();
    for r in rows {
        let cap: i32 = r.try_get("cap")?;
        caps.insert(r.try_get("job_id")?, cap.max(1) as u32);
    }
    Ok(caps)
}

/// Every owner's quota.
pub async fn quotas(db: &PgPool) -> Result<BTreeMap<String, Quota>, sqlx::Error> {
    let rows = sqlx::query("SELECT owner, cuda_devices, cpu_workers, ps_ram_bytes FROM quotas")
        .fetch_all(db)
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get::<String, _>("owner"),
                Quota {
                    cuda_devices: r
                        .get::<Option<i32>, _>("cuda_devices")
                        .map(|v| v.max(0) as u32),
                    cpu_workers: r
                        .get::<Option<i32>, _>("cpu_workers")
                        .map(|v| v.max(0) as u32),
                    ps_ram_bytes: r
                        .get::<Option<i64>, _>("ps_ram_bytes")
                        .map(|v| v.max(0) as u64),
                },
            )
        })
        .collect())
}

/// Every owner's decayed device-seconds now (see [`crate::share`]).
pub async fn usage(db: &PgPool, half_life: Duration) -> Result<BTreeMap<String, f64>, sqlx::Error> {
    let h = half_life.as_secs_f64();
    let rows = sqlx::query(
        "SELECT owner, (cuda_devices + cpu_workers)::float8 AS workers,
                extract(epoch FROM clock_timestamp() - started_at)::float8 AS from_age,
                extract(epoch FROM clock_timestamp() - coalesce(ended_at, clock_timestamp()))::float8 AS to_age
         FROM usage_intervals
         WHERE ended_at IS NULL OR ended_at > clock_timestamp() - make_interval(secs => $1)",
    )
    .bind(h * HALF_LIVES_KEPT)
    .fetch_all(db)
    .await?;
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for r in &rows {
        *out.entry(r.get("owner")).or_default() +=
            decayed(r.get("workers"), r.get("from_age"), r.get("to_age"), h);
    }
    Ok(out)
}
