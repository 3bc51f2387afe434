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
//!    marked `lost` (peer reports confirmed by [`suspect`] mark them
//!    sooner; when none of two or more executors has been heard for half
//!    that timeout, this server is probably the one cut off, and silence
//!    is judged against [`PARTITION_GRACE`] until a timeout after it hears
//!    one again, except for executors whose data-plane address refuses a
//!    connection: dead, not cut off, they are lost at the timeout);
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
//!
//! The parts, each depending only on the ones listed before it:
//!
//! * `error` — [`SchedulerError`];
//! * `metrics` — [`SchedulerMetrics`];
//! * `world` — what one round reads (jobs, placements, executors);
//! * `describe` — the sentence saying what a membership change moved and why;
//! * `membership` — writing one job's change, and `→ running` once every
//!   role runs;
//! * `inspection` — handing TorchScript jobs to an executor to inspect;
//! * `sharing` — quotas, fair-share usage and preemption decisions for the
//!   round (over [`crate::share`]);
//! * [`suspect`] — confirming (or not) a peer's report that an executor
//!   died, which marks it lost at once instead of after the heartbeat
//!   timeout;
//! * [`watchdog`] — roles that live but make no progress (stuck) or lag
//!   the others of a sync job (stragglers), from what heartbeats say of
//!   each role's steps: a stuck role's job leaves its executor;
//! * this file — the lease, the loop, and the round that ties them together.

mod describe;
mod error;
mod inspection;
mod membership;
mod metrics;
mod sharing;
pub mod suspect;
pub mod watchdog;
mod world;

pub use error::SchedulerError;
pub use membership::new_secret;
pub use metrics::SchedulerMetrics;
pub use sharing::{quotas, usage, SharingConfig};

use crate::fleet::{Fleet, RoundView};
use crate::lifecycle;
use crate::plan::Plan;
use sqlx::postgres::PgListener;
use sqlx::{PgConnection, PgPool};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};
use trainyard_shutdown::Shutdown;
use uuid::Uuid;
use world::World;

/// Advisory-lock key of the scheduler's leader lease ("trainyar").
pub const LEADER_LOCK_KEY: i64 = 0x7472_6169_6e79_6172;
/// Channel on which executor changes are announced.
pub const EXECUTOR_CHANNEL: &str = "trainyard_executors";

/// Longest a scheduler that hears from none of its executors (two or
/// more) waits before it declares them lost: a partition around the API
/// must not end every job, a fleet whose hosts went silent is re-placed
/// after it. (A fleet whose processes died while their hosts answer, so
/// that their data-plane ports refuse connections, is lost at the
/// timeout.)
pub const PARTITION_GRACE: Duration = Duration::from_secs(60);

/// Settings of the loop.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// How often executors heartbeat.
    pub heartbeat_interval: Duration,
    /// Missed heartbeats before an executor is lost.
    pub heartbeat_misses: u32,
    /// Fair share and preemption.
    pub sharing: SharingConfig,
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

/// The loop's state.
pub struct Scheduler {
    db: PgPool,
    config: SchedulerConfig,
    metrics: SchedulerMetrics,
    fleet: Option<tokio::sync::Mutex<Fleet>>,
    /// Until when no executor is declared lost by the timeout alone (see
    /// [`PARTITION_GRACE`]).
    deaf_until: std::sync::Mutex<Option<Instant>>,
}

/// Longest a shutdown waits for provisioned executors to drain and exit.
const RELEASE_ON_SHUTDOWN: Duration = Duration::from_secs(90);

impl Scheduler {
    /// A scheduler over `db`.
    pub fn new(db: PgPool, config: SchedulerConfig, metrics: SchedulerMetrics) -> Scheduler {
        Scheduler {
            db,
            config,
            metrics,
            fleet: None,
            deaf_until: std::sync::Mutex::new(None),
        }
    }

    /// The same loop, also provisioning executors through `fleet` while it
    /// leads.
    pub fn with_fleet(mut self, fleet: Fleet) -> Scheduler {
        self.fleet = Some(tokio::sync::Mutex::new(fleet));
        self
    }

    /// Runs until `shutdown` is triggered: campaigns for the lease, and
    /// leads while it holds it.
    pub async fn run(self, shutdown: Shutdown) {
        // One session campaigns (and, once it wins, holds the lease), so a
        // standby opens no new connection per try.
        let mut session: Option<PgConnection> = None;
        while !shutdown.is_triggered() {
            match self.campaign(&mut session).await {
                Ok(true) => {
                    if let Some(mut lock) = session.take() {
                        tracing::info!("scheduler: this process is the leader");
                        self.metrics.leader.set(1);
                        if let Err(e) = self.lead(&mut lock, &shutdown).await {
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
                () = shutdown.wait() => {}
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
        shutdown: &Shutdown,
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
                () = shutdown.wait(), if closing.is_none() => {
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

    /// While this server hears no executor (see [`PARTITION_GRACE`]), the
    /// ones silent past the timeout whose data-plane address refuses a
    /// connection are dead, not cut off: their host answers and nothing
    /// listens there (the whole fleet was killed, or the machine they ran
    /// on restarted without them). They are lost at once, as a confirmed
    /// suspect is; a probe that gets no answer leaves them to the grace.
    async fn refused_while_deaf(
        &self,
        lost_after: f64,
    ) -> Result<Vec<(Uuid, String)>, SchedulerError> {
        let silent: Vec<(Uuid, String)> = sqlx::query_as(
            "SELECT id, address FROM executors
             WHERE state IN ('live', 'draining') AND last_heartbeat_at < clock_timestamp() - make_interval(secs => $1)",
        )
        .bind(lost_after)
        .fetch_all(&self.db)
        .await?;
        let mut probes = tokio::task::JoinSet::new();
        for (id, address) in silent {
            probes.spawn(async move {
                let (outcome, _) = suspect::probe(&address, suspect::PROBE_TIMEOUT).await;
                (id, address, outcome)
            });
        }
        let mut dead = Vec::new();
        while let Some(done) = probes.join_next().await {
            if let Ok((id, address, suspect::ProbeOutcome::Refused)) = done {
                tracing::warn!(executor = %id, %address, "no executor heard, but this one's data plane refuses connections: it is dead, not cut off");
                dead.push(id);
            }
        }
        if dead.is_empty() {
            return Ok(Vec::new());
        }
        Ok(sqlx::query_as(
            "UPDATE executors SET state = 'lost', state_changed_at = clock_timestamp()
             WHERE id = ANY($1) AND state IN ('live', 'draining')
               AND last_heartbeat_at < clock_timestamp() - make_interval(secs => $2)
             RETURNING id, name",
        )
        .bind(&dead)
        .bind(lost_after)
        .fetch_all(&self.db)
        .await?)
    }

    /// One reconciliation round (public for tests and benchmarks).
    /// `detect_lost` enables marking silent executors lost.
    pub async fn round(&self, detect_lost: bool) -> Result<(), SchedulerError> {
        let lost_after = self.config.lost_after().as_secs_f64();
        // A scheduler that hears from none of several executors suspects
        // its own network first (a partition around the API): while it
        // hears nobody, and for one timeout after it hears someone again
        // (the others' beats are on their way), only silence longer than
        // PARTITION_GRACE is declared lost. One executor alone, or silence
        // beside others that beat, is judged by the timeout as always.
        // "Heard" means within half the timeout, not the whole of it: a cut
        // silences every executor at once, but their last beats are up to a
        // beat period apart, so when the first crosses the timeout the
        // others are still "heard" by a full-timeout window and the first
        // would be declared lost. A healthy executor beats once per
        // interval, well inside half of `misses` (≥ 3) intervals.
        let lost: Vec<(Uuid, String)> = if detect_lost {
            let (heard, members): (i64, i64) = sqlx::query_as(
                "SELECT count(*) FILTER (WHERE last_heartbeat_at >= clock_timestamp() - make_interval(secs => $1)),
                        count(*)
                 FROM executors WHERE state IN ('live', 'draining')",
            )
            .bind(lost_after / 2.0)
            .fetch_one(&self.db)
            .await?;
            let now = Instant::now();
            let blind = {
                let mut until = self.deaf_until.lock().unwrap_or_else(|p| p.into_inner());
                if heard == 0 && members >= 2 {
                    if until.is_none_or(|u| u <= now) {
                        tracing::warn!(
                            executors = members,
                            "no executor heard for {:.1}s: this server may be cut off from them; declaring none lost for up to {:?}",
                            lost_after / 2.0,
                            PARTITION_GRACE
                        );
                    }
                    *until = Some(now + self.config.lost_after());
                }
                until.is_some_and(|u| u > now)
            };
            let silence = if blind {
                PARTITION_GRACE.as_secs_f64().max(lost_after)
            } else {
                lost_after
            };
            let mut lost: Vec<(Uuid, String)> = sqlx::query_as(
                "UPDATE executors SET state = 'lost', state_changed_at = clock_timestamp()
                 WHERE state IN ('live', 'draining') AND last_heartbeat_at < clock_timestamp() - make_interval(secs => $1)
                 RETURNING id, name",
            )
            .bind(silence)
            .fetch_all(&self.db)
            .await?;
            if blind {
                lost.extend(self.refused_while_deaf(lost_after).await?);
            }
            lost
        } else {
            Vec::new()
        };
        for (id, name) in &lost {
            tracing::warn!(executor = %id, %name, "executor lost: no heartbeat for {lost_after:.1}s");
        }

        // Roles of finished jobs are released, their usage closed.
        membership::close_finished_usage(&self.db).await?;
        sqlx::query("DELETE FROM assignments a USING jobs j WHERE a.job_id = j.id AND j.state IN ('succeeded', 'failed', 'cancelled')")
            .execute(&self.db)
            .await?;

        // Jobs leave the executors of their stuck roles before the plan,
        // which then re-places those roles.
        watchdog::check(&self.db).await?;
        inspection::assign_inspections(&self.db).await?;
        let mut world = World::load(&self.db).await?;
        self.metrics.live_executors.set(world.live.len() as i64);
        let sharing::Decided {
            mut plan,
            notes,
            actions,
        } = sharing::decide(&self.db, &mut world, &self.config.sharing).await?;
        if let Some(fleet) = &self.fleet {
            if let Err(e) = self.provision(fleet, &world, &mut plan).await {
                tracing::warn!(error = %e, "provisioner round failed");
            }
        }
        self.metrics.queue_length.set(plan.waiting.len() as i64);
        for job in &world.jobs {
            let note = notes.get(&job.id).map(String::as_str);
            if let Err(e) =
                membership::apply(&self.db, &self.metrics, &world, &plan, job, note).await
            {
                tracing::warn!(job = %job.id, error = %e, "scheduler: writing the plan of a job failed");
            }
        }
        for a in &actions {
            let kind = match a {
                crate::share::Action::Shrink { .. } => "shrink",
                crate::share::Action::Preempt { .. } => "preempt",
            };
            self.metrics.preemptions.with_label_values(&[kind]).inc();
        }
        sharing::record(&self.db, &world, &actions).await?;
        membership::promote_acknowledged(&self.db).await?;
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
                    coalesce(bool_or(state = 'queued' AND params IS NULL AND model_kind = 'torchscript'), false)
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
        // Jobs over their owner's quota get no executors started for them.
        let jobs: Vec<crate::plan::JobView> = world
            .jobs
            .iter()
            .filter(|j| !plan.over_quota.contains(&j.id))
            .cloned()
            .collect();
        fleet
            .lock()
            .await
            .round(
                RoundView {
                    jobs: &jobs,
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
}
