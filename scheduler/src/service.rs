//! The scheduler loop: leader election, lost-executor detection, planning
//! and writing each membership change.
//!
//! Several API replicas may run the loop; only the holder of a Postgres
//! advisory lock ([`LEADER_LOCK_KEY`], held on a dedicated session) acts.
//! When the leader dies its session ends, Postgres releases the lock, and a
//! standby takes over at its next try (every tick). The leader wakes on
//! notifications (job submitted or cancelled, executor joined, left or
//! reported new roles) and on a periodic tick, then reconciles:
//!
//! 1. executors whose last heartbeat is older than `misses × interval` are
//!    marked `lost`;
//! 2. [`plan`] runs over the live (not draining) executors and every
//!    unfinished job with its current assignments;
//! 3. each job whose roles changed gets, in one transaction, its new
//!    assignments, `generation + 1`, a state change where one applies, and
//!    an event that says what moved and why;
//! 4. jobs whose every role is reported running at the current generation
//!    move from `scheduling`/`recovering` to `running`.
//!
//! Every write re-checks the job's generation under a row lock, so a
//! leader that lost its lease mid-round cannot overwrite a newer plan.

use crate::fleet::{Fleet, RoundView};
use crate::lifecycle::{self, transition};
use crate::plan::{
    plan, Demand, DeviceSlot, ExecutorView, JobView, Placement, Plan, PsRole, WorkerRole,
};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Registry};
use serde_json::json;
use sqlx::postgres::{PgListener, PgRow};
use sqlx::{PgConnection, PgPool, Row};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use trainyard_common::cluster::{ps_index_shard, ExecutorResources, Range, STANDBY_INDEX_BASE};
use trainyard_common::model::{parameters, MemoryEstimate, ParamInfo};
use trainyard_common::spec::{JobSpecInput, Strategy};
use trainyard_common::JobState;
use uuid::Uuid;

/// Advisory-lock key of the scheduler's leader lease ("trainyar").
pub const LEADER_LOCK_KEY: i64 = 0x7472_6169_6e79_6172;
/// Channel on which executor changes are announced.
pub const EXECUTOR_CHANNEL: &str = "trainyard_executors";

/// Settings of the loop.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// How often executors heartbeat.
    pub heartbeat_interval: Duration,
    /// Missed heartbeats before an executor is lost.
    pub heartbeat_misses: u32,
}

impl SchedulerConfig {
    /// Silence after which an executor is lost.
    pub fn lost_after(&self) -> Duration {
        self.heartbeat_interval * self.heartbeat_misses
    }

    fn tick(&self) -> Duration {
        (self.heartbeat_interval / 2).max(Duration::from_millis(50))
    }
}

/// The scheduler's Prometheus metrics.
#[derive(Clone)]
pub struct SchedulerMetrics {
    /// Seconds from submission to first placement.
    pub placement_latency: Histogram,
    /// Seconds one planning round takes (load, plan, write).
    pub round_seconds: Histogram,
    /// Jobs waiting for capacity.
    pub queue_length: IntGauge,
    /// Live executors.
    pub live_executors: IntGauge,
    /// Membership changes written (generation bumps).
    pub replans: IntCounter,
    /// 1 while this process holds the leader lease.
    pub leader: IntGauge,
}

impl SchedulerMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<SchedulerMetrics> {
        let buckets = vec![
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
        ];
        let m = SchedulerMetrics {
            placement_latency: Histogram::with_opts(
                HistogramOpts::new(
                    "trainyard_scheduler_placement_latency_seconds",
                    "Seconds from submission to first placement",
                )
                .buckets(buckets.clone()),
            )?,
            round_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "trainyard_scheduler_round_seconds",
                    "Seconds one scheduling round takes",
                )
                .buckets(buckets),
            )?,
            queue_length: IntGauge::new(
                "trainyard_scheduler_queue_length",
                "Jobs waiting for capacity",
            )?,
            live_executors: IntGauge::new("trainyard_scheduler_live_executors", "Live executors")?,
            replans: IntCounter::new(
                "trainyard_scheduler_replans_total",
                "Membership changes written (generation bumps)",
            )?,
            leader: IntGauge::new(
                "trainyard_scheduler_leader",
                "1 while this process leads scheduling",
            )?,
        };
        registry.register(Box::new(m.placement_latency.clone()))?;
        registry.register(Box::new(m.round_seconds.clone()))?;
        registry.register(Box::new(m.queue_length.clone()))?;
        registry.register(Box::new(m.live_executors.clone()))?;
        registry.register(Box::new(m.replans.clone()))?;
        registry.register(Box::new(m.leader.clone()))?;
        Ok(m)
    }
}

/// The loop's state.
pub struct Scheduler {
    db: PgPool,
    config: SchedulerConfig,
    metrics: SchedulerMetrics,
    fleet: Option<tokio::sync::Mutex<Fleet>>,
}

/// Longest a shutdown waits for provisioned executors to drain and exit.
const RELEASE_ON_SHUTDOWN: Duration = Duration::from_secs(90);

/// Why a round failed.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// The database failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl Scheduler {
    /// A scheduler over `db`.
    pub fn new(db: PgPool, config: SchedulerConfig, metrics: SchedulerMetrics) -> Scheduler {
        Scheduler {
            db,
            config,
            metrics,
            fleet: None,
        }
    }

    /// The same loop, also provisioning executors through `fleet` while it
    /// leads.
    pub fn with_fleet(mut self, fleet: Fleet) -> Scheduler {
        self.fleet = Some(tokio::sync::Mutex::new(fleet));
        self
    }

    /// Runs until `shutdown` turns true: campaigns for the lease, and leads
    /// while it holds it.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        // One session campaigns (and, once it wins, holds the lease), so a
        // standby opens no new connection per try.
        let mut session: Option<PgConnection> = None;
        while !*shutdown.borrow() {
            match self.campaign(&mut session).await {
                Ok(true) => {
                    if let Some(mut lock) = session.take() {
                        tracing::info!("scheduler: this process is the leader");
                        self.metrics.leader.set(1);
                        if let Err(e) = self.lead(&mut lock, &mut shutdown).await {
                            tracing::warn!(error = %e, "scheduler: lost leadership");
                        }
                        self.metrics.leader.set(0);
                        // Closing the session releases the lock.
                        drop(lock);
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    session = None;
                    tracing::warn!(error = %e, "scheduler: cannot reach Postgres");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(self.config.tick()) => {}
                _ = shutdown.changed() => {}
            }
        }
        // Executors this process started and still runs (it led once, or
        // the leader's shutdown below ran out of time): released without
        // planning rounds.
        if let Some(fleet) = &self.fleet {
            let mut fleet = fleet.lock().await;
            if !fleet.is_empty() {
                if let Err(e) = fleet.release_all("the server is shutting down").await {
                    tracing::warn!(error = %e, "provisioner: releasing executors");
                }
                let deadline = Instant::now() + RELEASE_ON_SHUTDOWN;
                while !fleet.is_empty() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if let Err(e) = fleet.reap_only().await {
                        tracing::warn!(error = %e, "provisioner: reaping executors");
                    }
                }
            }
        }
    }

    /// Tries to take the lease on `session` (opened when absent).
    async fn campaign(&self, session: &mut Option<PgConnection>) -> Result<bool, sqlx::Error> {
        if session.is_none() {
            *session = Some(self.db.acquire().await?.detach());
        }
        let Some(conn) = session.as_mut() else {
            return Ok(false);
        };
        sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(LEADER_LOCK_KEY)
            .fetch_one(conn)
            .await
    }

    async fn lead(
        &self,
        lock: &mut PgConnection,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), SchedulerError> {
        let mut listener = PgListener::connect_with(&self.db).await?;
        listener
            .listen_all([lifecycle::JOB_CHANNEL, EXECUTOR_CHANNEL])
            .await?;
        let led_since = Instant::now();
        let mut tick = tokio::time::interval(self.config.tick());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Set when shutdown began with provisioned executors running: the
        // rounds go on (their drains need re-planning) until they exited.
        let mut closing: Option<Instant> = None;
        loop {
            // The lease is only as good as the session that holds it.
            sqlx::query("SELECT 1").execute(&mut *lock).await?;
            let start = Instant::now();
            // Silence from before this process led says nothing about the
            // executors (the API may have been down while they trained on):
            // nobody is declared lost until a full timeout has passed here.
            let judge = led_since.elapsed() >= self.config.lost_after();
            if let Err(e) = self.round(judge).await {
                tracing::warn!(error = %e, "scheduler round failed; retrying");
            }
            self.metrics
                .round_seconds
                .observe(start.elapsed().as_secs_f64());
            if let Some(since) = closing {
                let done = match &self.fleet {
                    Some(f) => f.lock().await.is_empty(),
                    None => true,
                };
                if done || since.elapsed() > RELEASE_ON_SHUTDOWN {
                    return Ok(());
                }
            }
            tokio::select! {
                n = listener.recv() => { n?; }
                _ = tick.tick() => {}
                _ = shutdown.changed(), if closing.is_none() => {
                    let Some(fleet) = &self.fleet else { return Ok(()) };
                    let mut fleet = fleet.lock().await;
                    if fleet.is_empty() {
                        return Ok(());
                    }
                    fleet.release_all("the server is shutting down").await?;
                    closing = Some(Instant::now());
                }
            }
        }
    }

    /// One reconciliation round (public for tests and benchmarks).
    /// `detect_lost` enables marking silent executors lost.
    pub async fn round(&self, detect_lost: bool) -> Result<(), SchedulerError> {
        let lost_after = self.config.lost_after().as_secs_f64();
        let lost: Vec<(Uuid, String)> = if detect_lost {
            sqlx::query_as(
                "UPDATE executors SET state = 'lost', state_changed_at = clock_timestamp()
                 WHERE state IN ('live', 'draining') AND last_heartbeat_at < clock_timestamp() - make_interval(secs => $1)
                 RETURNING id, name",
            )
            .bind(lost_after)
            .fetch_all(&self.db)
            .await?
        } else {
            Vec::new()
        };
        for (id, name) in &lost {
            tracing::warn!(executor = %id, %name, "executor lost: no heartbeat for {lost_after:.1}s");
        }

        // Roles of finished jobs are released.
        sqlx::query("DELETE FROM assignments a USING jobs j WHERE a.job_id = j.id AND j.state IN ('succeeded', 'failed', 'cancelled')")
            .execute(&self.db)
            .await?;

        self.assign_inspections().await?;
        let world = World::load(&self.db).await?;
        self.metrics.live_executors.set(world.live.len() as i64);
        let mut plan = plan(&world.jobs, &world.live);
        if let Some(fleet) = &self.fleet {
            if let Err(e) = self.provision(fleet, &world, &mut plan).await {
                tracing::warn!(error = %e, "provisioner round failed");
            }
        }
        self.metrics.queue_length.set(plan.waiting.len() as i64);
        for job in &world.jobs {
            if let Err(e) = self.apply(&world, &plan, job).await {
                tracing::warn!(job = %job.id, error = %e, "scheduler: writing the plan of a job failed");
            }
        }
        self.promote_acknowledged().await?;
        Ok(())
    }

    /// The provisioner's part of a round: what holds a role, what waits
    /// for inspection, then [`Fleet::round`].
    async fn provision(
        &self,
        fleet: &tokio::sync::Mutex<Fleet>,
        world: &World,
        plan: &mut Plan,
    ) -> Result<(), SchedulerError> {
        let mut busy: BTreeSet<Uuid> = plan
            .placements
            .values()
            .flat_map(|p| {
                p.workers
                    .iter()
                    .map(|w| w.executor)
                    .chain(p.parameter_servers.iter().map(|s| s.executor))
                    .chain(p.parameter_servers.iter().filter_map(|s| s.standby))
            })
            .collect();
        // Inspecting executors are busy; a TorchScript job still queued
        // for inspection wants one (one query for both).
        let (inspectors, needs_inspector): (Vec<Uuid>, bool) = sqlx::query_as(
            "SELECT coalesce(array_agg(inspector) FILTER (WHERE state = 'inspecting' AND inspector IS NOT NULL), '{}'),
                    coalesce(bool_or(state = 'queued' AND params IS NULL AND spec->'model'->>'kind' = 'torchscript'), false)
             FROM jobs WHERE state IN ('queued', 'inspecting')",
        )
        .fetch_one(&self.db)
        .await?;
        busy.extend(inspectors);
        let names: HashMap<Uuid, String> = world
            .executors
            .iter()
            .map(|(id, (name, _))| (*id, name.clone()))
            .collect();
        fleet
            .lock()
            .await
            .round(
                RoundView {
                    jobs: &world.jobs,
                    live: &world.live,
                    names: &names,
                    busy: &busy,
                    needs_inspector,
                },
                plan,
            )
            .await?;
        Ok(())
    }

    async fn apply(&self, world: &World, plan: &Plan, job: &JobView) -> Result<(), SchedulerError> {
        let meta = &world.meta[&job.id];
        let new = plan.placements.get(&job.id);
        if new == job.current.as_ref() {
            if let Some(why) = plan.waiting.get(&job.id) {
                let reason = format!("waiting: {why}");
                if meta.state_reason != reason {
                    sqlx::query(
                        "UPDATE jobs SET state_reason = $2, updated_at = clock_timestamp()
                     WHERE id = $1 AND state_reason <> $2 AND generation = $3
                       AND state NOT IN ('succeeded', 'failed', 'cancelled')",
                    )
                    .bind(job.id)
                    .bind(&reason)
                    .bind(meta.generation)
                    .execute(&self.db)
                    .await?;
                    let mut conn = self.db.acquire().await?;
                    lifecycle::notify(&mut conn, job.id).await?;
                }
            }
            return Ok(());
        }

        let mut tx = self.db.begin().await?;
        let row = sqlx::query(
            "SELECT generation, state::text AS state FROM jobs WHERE id = $1 FOR UPDATE",
        )
        .bind(job.id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Ok(()) };
        let generation: i64 = row.get("generation");
        let state: JobState = row
            .get::<String, _>("state")
            .parse()
            .unwrap_or(JobState::Failed);
        if generation != meta.generation || state.is_terminal() {
            return Ok(()); // Changed under us: the next round sees the new truth.
        }
        let next = generation + 1;
        let reason = describe(world, job.current.as_ref(), new, plan.waiting.get(&job.id));
        sqlx::query("DELETE FROM assignments WHERE job_id = $1")
            .bind(job.id)
            .execute(&mut *tx)
            .await?;
        if let Some(p) = new {
            for w in &p.workers {
                sqlx::query("INSERT INTO assignments (job_id, generation, role, index, executor_id, device) VALUES ($1, $2, 'worker', $3, $4, $5)")
                    .bind(job.id)
                    .bind(next)
                    .bind(w.rank as i32)
                    .bind(w.executor)
                    .bind(w.device as i32)
                    .execute(&mut *tx)
                    .await?;
            }
            for ps in &p.parameter_servers {
                sqlx::query("INSERT INTO assignments (job_id, generation, role, index, executor_id, ranges) VALUES ($1, $2, 'ps', $3, $4, $5)")
                    .bind(job.id)
                    .bind(next)
                    .bind(ps.shard as i32)
                    .bind(ps.executor)
                    .bind(serde_json::to_value(&ps.ranges).unwrap_or_default())
                    .execute(&mut *tx)
                    .await?;
                // A standby is a PS role of its own (index: see
                // `STANDBY_INDEX_BASE`) with its shard's ranges.
                if let Some(sb) = ps.standby {
                    sqlx::query("INSERT INTO assignments (job_id, generation, role, index, executor_id, ranges) VALUES ($1, $2, 'ps', $3, $4, $5)")
                        .bind(job.id)
                        .bind(next)
                        .bind((STANDBY_INDEX_BASE + ps.shard) as i32)
                        .bind(sb)
                        .bind(serde_json::to_value(&ps.ranges).unwrap_or_default())
                        .execute(&mut *tx)
                        .await?;
                }
            }
        }
        let strategy = new.map(|p| strategy_name(p.strategy));
        sqlx::query(
            "UPDATE jobs SET generation = $2, updated_at = clock_timestamp(),
                    strategy = coalesce($3, strategy), secret = coalesce(secret, $4)
             WHERE id = $1",
        )
        .bind(job.id)
        .bind(next)
        .bind(strategy)
        .bind(new_secret())
        .execute(&mut *tx)
        .await?;
        if let Some(why) = plan.decisions.get(&job.id) {
            event(&mut tx, job.id, "strategy", why, json!({})).await?;
        }
        event(
            &mut tx,
            job.id,
            "placement",
            &reason,
            placement_json(next, new),
        )
        .await?;
        match (state, new.is_some()) {
            (JobState::Queued, true) => {
                transition(&mut tx, job.id, JobState::Scheduling, &reason)
                    .await
                    .map_err(db_err)?;
            }
            (JobState::Scheduling | JobState::Running | JobState::Recovering, false) => {
                transition(&mut tx, job.id, JobState::Queued, &reason)
                    .await
                    .map_err(db_err)?;
            }
            (JobState::Running, true) => {
                transition(&mut tx, job.id, JobState::Recovering, &reason)
                    .await
                    .map_err(db_err)?;
            }
            _ => {
                sqlx::query("UPDATE jobs SET state_reason = $2 WHERE id = $1")
                    .bind(job.id)
                    .bind(&reason)
                    .execute(&mut *tx)
                    .await?;
                lifecycle::notify(&mut tx, job.id).await?;
            }
        }
        tx.commit().await?;
        self.metrics.replans.inc();
        if job.current.is_none() && new.is_some() {
            let waited = (chrono::Utc::now() - meta.created_at)
                .num_milliseconds()
                .max(0) as f64
                / 1000.0;
            self.metrics.placement_latency.observe(waited);
        }
        tracing::info!(job = %job.id, generation = next, "{reason}");
        Ok(())
    }

    /// Gives each TorchScript job that has not been inspected to a live
    /// executor (moving it to `inspecting`), and moves the inspection of a
    /// lost or departed inspector to another.
    async fn assign_inspections(&self) -> Result<(), SchedulerError> {
        let pending: Vec<(Uuid, String, Option<Uuid>)> = sqlx::query_as(
            "SELECT j.id, j.state::text, j.inspector FROM jobs j
             WHERE j.state IN ('queued', 'inspecting') AND j.params IS NULL AND j.spec->'model'->>'kind' = 'torchscript'
               AND NOT EXISTS (SELECT 1 FROM executors e WHERE e.id = j.inspector AND e.state = 'live' AND j.state = 'inspecting')
             ORDER BY j.priority DESC, j.created_at",
        )
        .fetch_all(&self.db)
        .await?;
        for (job, state, previous) in pending {
            let pick: Option<(Uuid, String)> = sqlx::query_as(
                "SELECT e.id, e.name FROM executors e WHERE e.state = 'live'
                 ORDER BY (SELECT count(*) FROM jobs j WHERE j.inspector = e.id AND j.state = 'inspecting'), e.id LIMIT 1",
            )
            .fetch_optional(&self.db)
            .await?;
            let mut tx = self.db.begin().await?;
            // Re-check under the row lock: a cancel may have come first.
            let still: Option<String> = sqlx::query_scalar(
                "SELECT state::text FROM jobs WHERE id = $1 AND params IS NULL FOR UPDATE",
            )
            .bind(job)
            .fetch_optional(&mut *tx)
            .await?;
            if still.as_deref() != Some(state.as_str()) {
                continue;
            }
            match pick {
                None => {
                    sqlx::query(
                        "UPDATE jobs SET state_reason = $2 WHERE id = $1 AND state_reason <> $2",
                    )
                    .bind(job)
                    .bind("waiting: no live executor to inspect the TorchScript file")
                    .execute(&mut *tx)
                    .await?;
                }
                Some((exec, name)) => {
                    sqlx::query("UPDATE jobs SET inspector = $2 WHERE id = $1")
                        .bind(job)
                        .bind(exec)
                        .execute(&mut *tx)
                        .await?;
                    let reason =
                        format!("loading the TorchScript file on {name} to learn its tensors");
                    if state == "queued" {
                        transition(&mut tx, job, JobState::Inspecting, &reason)
                            .await
                            .map_err(db_err)?;
                    } else {
                        let why = format!(
                            "inspector {} is gone; {reason}",
                            previous.map_or("?".into(), |p| p.to_string())
                        );
                        event(&mut tx, job, "inspection", &why, json!({})).await?;
                        lifecycle::notify(&mut tx, job).await?;
                    }
                }
            }
            tx.commit().await?;
        }
        Ok(())
    }

    /// Moves jobs whose every role runs at the current generation to `running`.
    async fn promote_acknowledged(&self) -> Result<(), SchedulerError> {
        let ready: Vec<(Uuid, i64, i64)> = sqlx::query_as(
            "SELECT j.id, j.generation, count(*)
             FROM jobs j JOIN assignments a ON a.job_id = j.id AND a.generation = j.generation
             JOIN executors e ON e.id = a.executor_id
             WHERE j.state IN ('scheduling', 'recovering')
             GROUP BY j.id, j.generation
             HAVING bool_and(e.reported @> jsonb_build_array(jsonb_build_object(
                 'job_id', a.job_id, 'generation', a.generation, 'role', a.role, 'index', a.index)))",
        )
        .fetch_all(&self.db)
        .await?;
        for (id, generation, roles) in ready {
            let mut tx = self.db.begin().await?;
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
}

fn db_err(e: lifecycle::TransitionError) -> SchedulerError {
    match e {
        lifecycle::TransitionError::Database(e) => SchedulerError::Database(e),
        other => SchedulerError::Database(sqlx::Error::Protocol(other.to_string())),
    }
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

async fn event(
    tx: &mut PgConnection,
    job: Uuid,
    kind: &str,
    reason: &str,
    data: serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO job_events (job_id, kind, reason, data) VALUES ($1, $2, $3, $4)")
        .bind(job)
        .bind(kind)
        .bind(reason)
        .bind(data)
        .execute(tx)
        .await?;
    Ok(())
}

fn placement_json(generation: i64, p: Option<&Placement>) -> serde_json::Value {
    match p {
        None => json!({ "generation": generation, "workers": [], "parameter_servers": [] }),
        Some(p) => json!({
            "generation": generation,
            "strategy": strategy_name(p.strategy),
            "workers": p.workers.iter().map(|w| json!({"rank": w.rank, "executor": w.executor, "device": w.device})).collect::<Vec<_>>(),
            "parameter_servers": p.parameter_servers.iter().map(|s| json!({"shard": s.shard, "executor": s.executor, "standby": s.standby})).collect::<Vec<_>>(),
        }),
    }
}

/// A sentence saying what changed between two placements and why.
fn describe(
    world: &World,
    old: Option<&Placement>,
    new: Option<&Placement>,
    waiting: Option<&String>,
) -> String {
    let name = |id: &Uuid| world.executor_label(id);
    match (old, new) {
        (None, Some(n)) => format!(
            "placed {} PS shard(s){} and {} worker(s) on {} executor(s)",
            n.parameter_servers.len(),
            match n
                .parameter_servers
                .iter()
                .filter(|p| p.standby.is_some())
                .count()
            {
                0 => String::new(),
                k => format!(" with {k} standby(s)"),
            },
            n.workers.len(),
            n.workers
                .iter()
                .map(|w| w.executor)
                .chain(n.parameter_servers.iter().map(|p| p.executor))
                .chain(n.parameter_servers.iter().filter_map(|p| p.standby))
                .collect::<BTreeSet<_>>()
                .len()
        ),
        (Some(o), None) => {
            let why = waiting.map_or("no longer placeable", |w| w.as_str());
            // A placed job loses its minimum set when executors holding its
            // roles are gone: name them, so the release is explained.
            let gone: BTreeSet<String> = o
                .workers
                .iter()
                .map(|w| w.executor)
                .chain(o.parameter_servers.iter().map(|p| p.executor))
                .filter(|e| world.executors.get(e).is_none_or(|(_, s)| s != "live"))
                .map(|e| name(&e))
                .collect();
            if gone.is_empty() {
                format!("released every role: {why}")
            } else {
                format!(
                    "released every role: {why} (its roles on {} are gone)",
                    gone.into_iter().collect::<Vec<_>>().join(", ")
                )
            }
        }
        (None, None) => "nothing to place".into(),
        (Some(o), Some(n)) => {
            let mut parts = Vec::new();
            for ps in &o.parameter_servers {
                let now = n.parameter_servers.get(ps.shard as usize);
                let to = now.map(|p| p.executor);
                if let Some(t) = to.filter(|t| Some(*t) == ps.standby) {
                    let (was, why) = match world.executors.get(&ps.executor) {
                        Some((n, state)) if state == "draining" => (n.clone(), "draining"),
                        Some((n, _)) => (n.clone(), "lost"),
                        None => (ps.executor.to_string(), "lost"),
                    };
                    parts.push(format!(
                        "PS shard {} primary on {was} ({why}): standby on {} promoted",
                        ps.shard,
                        name(&t)
                    ));
                } else if to != Some(ps.executor) {
                    parts.push(format!(
                        "PS shard {} moved from {} to {}",
                        ps.shard,
                        name(&ps.executor),
                        to.map_or("nowhere".into(), |t| name(&t))
                    ));
                }
                let sb = now.and_then(|p| p.standby);
                if sb != ps.standby {
                    if let Some(e) = sb {
                        parts.push(format!(
                            "standby of PS shard {} placed on {}",
                            ps.shard,
                            name(&e)
                        ));
                    } else if to != ps.standby {
                        parts.push(format!(
                            "standby of PS shard {} on {} lost; none placed yet",
                            ps.shard,
                            ps.standby.map_or("?".into(), |e| name(&e))
                        ));
                    }
                }
            }
            let old_w: BTreeSet<(Uuid, u32)> =
                o.workers.iter().map(|w| (w.executor, w.device)).collect();
            let new_w: BTreeSet<(Uuid, u32)> =
                n.workers.iter().map(|w| (w.executor, w.device)).collect();
            for (e, _) in old_w.difference(&new_w) {
                parts.push(format!("worker removed from {}", name(e)));
            }
            for (e, _) in new_w.difference(&old_w) {
                parts.push(format!("worker added on {}", name(e)));
            }
            if parts.is_empty() {
                parts.push("ranks reordered".into());
            }
            format!("{} (now {} worker(s))", parts.join("; "), n.workers.len())
        }
    }
}

struct JobMeta {
    generation: i64,
    state_reason: String,
    created_at: chrono::DateTime<chrono::Utc>,
}

/// What one round sees.
struct World {
    jobs: Vec<JobView>,
    live: Vec<ExecutorView>,
    meta: HashMap<Uuid, JobMeta>,
    executors: HashMap<Uuid, (String, String)>,
}

impl World {
    async fn load(db: &PgPool) -> Result<World, sqlx::Error> {
        let mut executors = HashMap::new();
        let mut live = Vec::new();
        for r in sqlx::query("SELECT id, name, state::text AS state, resources, labels FROM executors WHERE state IN ('live', 'draining') OR id IN (SELECT executor_id FROM assignments)")
            .fetch_all(db)
            .await?
        {
            let id: Uuid = r.get("id");
            let state: String = r.get("state");
            executors.insert(id, (r.get::<String, _>("name"), state.clone()));
            if state != "live" {
                continue;
            }
            let Ok(res) = serde_json::from_value::<ExecutorResources>(r.get("resources")) else { continue };
            let labels: BTreeMap<String, String> = serde_json::from_value(r.get("labels")).unwrap_or_default();
            live.push(ExecutorView {
                id,
                host: labels.get("host").cloned(),
                ram_bytes: res.ram_bytes,
                devices: res.devices.iter().map(|d| DeviceSlot { kind: d.kind, index: d.index, memory_bytes: d.memory_bytes }).collect(),
            });
        }

        let mut assigned: HashMap<Uuid, (Vec<WorkerRole>, Vec<PsRole>)> = HashMap::new();
        let mut standbys: Vec<(Uuid, u32, Uuid)> = Vec::new();
        for r in sqlx::query("SELECT job_id, role, index, executor_id, device, ranges FROM assignments ORDER BY job_id, role, index")
            .fetch_all(db)
            .await?
        {
            let entry = assigned.entry(r.get("job_id")).or_default();
            let index = r.get::<i32, _>("index") as u32;
            if r.get::<String, _>("role") == "worker" {
                entry.0.push(WorkerRole { rank: index, executor: r.get("executor_id"), device: r.get::<Option<i32>, _>("device").unwrap_or(0) as u32 });
            } else if let (shard, true) = ps_index_shard(index) {
                standbys.push((r.get("job_id"), shard, r.get("executor_id")));
            } else {
                let ranges: Vec<Range> = serde_json::from_value(r.get("ranges")).unwrap_or_default();
                entry.1.push(PsRole { shard: index, executor: r.get("executor_id"), ranges, standby: None });
            }
        }
        for (job, shard, executor) in standbys {
            let primary = assigned
                .get_mut(&job)
                .and_then(|e| e.1.iter_mut().find(|p| p.shard == shard));
            if let Some(p) = primary {
                p.standby = Some(executor);
            }
        }

        let mut jobs = Vec::new();
        let mut meta = HashMap::new();
        for r in sqlx::query(
            "SELECT id, spec, priority, created_at, generation, state_reason, strategy, params
             FROM jobs WHERE state IN ('queued', 'scheduling', 'running', 'recovering')",
        )
        .fetch_all(db)
        .await?
        {
            let Some(job) = job_view(&r, &mut assigned) else {
                continue;
            };
            meta.insert(
                job.id,
                JobMeta {
                    generation: r.get("generation"),
                    state_reason: r.get("state_reason"),
                    created_at: r.get("created_at"),
                },
            );
            jobs.push(job);
        }
        Ok(World {
            jobs,
            live,
            meta,
            executors,
        })
    }

    fn executor_label(&self, id: &Uuid) -> String {
        match self.executors.get(id) {
            Some((name, state)) if state != "live" => format!("{name} ({state})"),
            Some((name, _)) => name.clone(),
            None => id.to_string(),
        }
    }
}

fn job_view(
    r: &PgRow,
    assigned: &mut HashMap<Uuid, (Vec<WorkerRole>, Vec<PsRole>)>,
) -> Option<JobView> {
    let id: Uuid = r.get("id");
    let spec: JobSpecInput = match serde_json::from_value(r.get("spec")) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(job = %id, error = %e, "stored spec does not decode; skipping");
            return None;
        }
    };
    let created: chrono::DateTime<chrono::Utc> = r.get("created_at");
    // TorchScript models are planned from what their inspection reported.
    let params = match parameters(&spec.model) {
        Some(p) => p,
        None => r
            .get::<Option<serde_json::Value>, _>("params")
            .and_then(|v| serde_json::from_value::<Vec<ParamInfo>>(v).ok())?,
    };
    let count: u64 = params
        .iter()
        .map(ParamInfo::numel)
        .fold(0, u64::saturating_add);
    let sync = spec.consistency_mode() == trainyard_common::spec::Consistency::Sync;
    let current = assigned
        .remove(&id)
        .map(|(workers, parameter_servers)| Placement {
            strategy: match r.get::<Option<String>, _>("strategy").as_deref() {
                Some("allreduce") => Strategy::Allreduce,
                _ => Strategy::ParameterServer,
            },
            workers,
            parameter_servers,
        });
    Some(JobView {
        id,
        priority: r.get("priority"),
        seq: created.timestamp_micros(),
        demand: Demand {
            strategy: spec.strategy,
            device: spec.resources.device,
            min_workers: spec.workers.min,
            max_workers: spec.workers.max,
            parameter_servers: spec.parameter_server_count(),
            memory_bytes: spec.resources.memory_mb.saturating_mul(1 << 20),
            estimate: Some(
                MemoryEstimate::new(count, spec.optimizer.kind, sync)
                    .with_ps_replicas(spec.ps_replicas()),
            ),
            params: Some(params),
        },
        current,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world(executors: &[(Uuid, &str, &str)]) -> World {
        World {
            jobs: Vec::new(),
            live: Vec::new(),
            meta: HashMap::new(),
            executors: executors
                .iter()
                .map(|(id, name, state)| (*id, ((*name).to_owned(), (*state).to_owned())))
                .collect(),
        }
    }

    #[test]
    fn a_release_names_the_executors_whose_loss_caused_it() {
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let w = world(&[
            (a, "ex-a", "live"),
            (b, "ex-b", "lost"),
            (c, "ex-c", "left"),
        ]);
        let old = Placement {
            strategy: Strategy::ParameterServer,
            workers: vec![
                WorkerRole {
                    rank: 0,
                    executor: a,
                    device: 0,
                },
                WorkerRole {
                    rank: 1,
                    executor: b,
                    device: 0,
                },
            ],
            parameter_servers: vec![PsRole {
                shard: 0,
                executor: c,
                ranges: Vec::new(),
                standby: None,
            }],
        };
        let why = "needs 2 cpu worker device(s) with 384 MiB free, has 1".to_owned();
        assert_eq!(
            describe(&w, Some(&old), None, Some(&why)),
            format!("released every role: {why} (its roles on ex-b (lost), ex-c (left) are gone)")
        );
        // Nothing gone (a higher-priority job took the room): no names.
        let w = world(&[
            (a, "ex-a", "live"),
            (b, "ex-b", "live"),
            (c, "ex-c", "live"),
        ]);
        assert_eq!(
            describe(&w, Some(&old), None, Some(&why)),
            format!("released every role: {why}")
        );
    }
}
