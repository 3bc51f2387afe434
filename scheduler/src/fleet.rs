//! The provisioner interface and the bookkeeping that carries out
//! [`provision::decide`](crate::provision::decide)'s decisions.
//!
//! A [`Provisioner`] is what can make executors appear and go away: the
//! [`local`](crate::local) one starts `trainyard-executor` processes on
//! this machine; a Kubernetes one (designed in `docs/operators/kubernetes.md`, not
//! shipped) would scale a Deployment. The [`Fleet`] runs inside the
//! scheduler's leader round. Each round it:
//!
//! 1. reaps the processes that exited (a start that died before it
//!    registered, or one that did not register within the start timeout,
//!    is a failure: further starts back off, doubling up to 5 minutes);
//! 2. matches the executors it started to live registrations by name
//!    (started and unregistered ones are pending capacity), and tracks how
//!    long each has held no role;
//! 3. asks [`decide`] and adds its reasons to the waiting jobs' reasons, so
//!    a job the budget cannot hold stays queued saying why;
//! 4. starts and releases executors.
//!
//! Every decision is a row in `provisioner_events` (start, release,
//! stopped, exited, failed, blocked, adopted) and, where a job caused it, a
//! `provisioning` event of that job. The executors it runs are rows of
//! `provisioned_executors`; a leader that restarts on the same host adopts
//! the ones still running from there. Only members of this fleet are ever
//! stopped: an executor started by hand is never in it.

use crate::plan::{ExecutorView, JobView, Plan};
pub use crate::provision::Provisioner;
use crate::provision::{decide, Idle, Inputs, Limits, Template};
use serde_json::json;
use sqlx::PgPool;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};
use trainyard_common::api::{ProvisionedState, ProvisionerEventKind};
use trainyard_common::event::Provisioning;
use trainyard_common::EventData;
use uuid::Uuid;

/// Settings of a [`Fleet`].
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Its limits.
    pub limits: Limits,
    /// Longest a started executor may take to register.
    pub start_timeout: Duration,
    /// Longest a released executor may take to drain before it is killed.
    pub stop_timeout: Duration,
    /// This machine's name: rows are adopted only by a fleet on the host
    /// that started them.
    pub host: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Starting { since: Instant },
    Live { id: Uuid },
    Stopping { since: Instant, killed: bool },
}

#[derive(Debug, Clone)]
struct Member {
    phase: Phase,
    idle_since: Option<Instant>,
    registered: bool,
}

impl Member {
    /// Started (or found again) and waiting to be seen registered.
    fn starting(registered: bool) -> Member {
        Member {
            phase: Phase::Starting {
                since: Instant::now(),
            },
            idle_since: None,
            registered,
        }
    }
}

/// What one scheduling round hands the fleet.
pub struct RoundView<'a> {
    /// Plannable unfinished jobs.
    pub jobs: &'a [JobView],
    /// Live executors.
    pub live: &'a [ExecutorView],
    /// Executor names by id.
    pub names: &'a HashMap<Uuid, String>,
    /// Executors holding a role (in the new plan) or inspecting.
    pub busy: &'a BTreeSet<Uuid>,
    /// A TorchScript job waits for an inspector.
    pub needs_inspector: bool,
}

/// The executors a provisioner runs, and the loop state around them.
pub struct Fleet {
    db: PgPool,
    provisioner: Box<dyn Provisioner>,
    config: FleetConfig,
    members: BTreeMap<String, Member>,
    backoff: Duration,
    retry_at: Option<Instant>,
    told: HashMap<Uuid, String>,
    adopted: bool,
    closing: bool,
}

const FIRST_BACKOFF: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

impl Fleet {
    /// A fleet of `provisioner`'s executors recorded in `db`.
    pub fn new(db: PgPool, provisioner: Box<dyn Provisioner>, config: FleetConfig) -> Fleet {
        Fleet {
            db,
            provisioner,
            config,
            members: BTreeMap::new(),
            backoff: FIRST_BACKOFF,
            retry_at: None,
            told: HashMap::new(),
            adopted: false,
            closing: false,
        }
    }

    /// Whether it runs no executor.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Takes back the executors a previous leader on this host started.
    async fn adopt(&mut self) -> Result<(), sqlx::Error> {
        let rows: Vec<(String, Option<i32>)> = sqlx::query_as(
            "SELECT name, pid FROM provisioned_executors
             WHERE provisioner = $1 AND host = $2 AND state IN ('starting', 'running', 'stopping')",
        )
        .bind(self.provisioner.kind())
        .bind(&self.config.host)
        .fetch_all(&self.db)
        .await?;
        for (name, pid) in rows {
            let pid = pid.and_then(|p| u32::try_from(p).ok());
            if self.provisioner.adopt(&name, pid) {
                self.members.insert(name.clone(), Member::starting(true));
                self.event(
                    ProvisionerEventKind::Adopted,
                    Some(&name),
                    None,
                    &format!(
                        "{name} was started by an earlier leader on this host and still runs: managed again"
                    ),
                    json!({ "pid": pid }),
                )
                .await?;
                self.set_state(&name, ProvisionedState::Running, None)
                    .await?;
            } else {
                self.set_state(
                    &name,
                    ProvisionedState::Gone,
                    Some("not running when a new leader looked"),
                )
                .await?;
            }
        }
        Ok(())
    }

    /// One round: reap, match, decide, act. Adds the provisioner's reasons
    /// to `plan.waiting`.
    pub async fn round(&mut self, view: RoundView<'_>, plan: &mut Plan) -> Result<(), sqlx::Error> {
        if !self.adopted {
            self.adopt().await?;
            self.adopted = true;
        }
        let now = Instant::now();
        self.reap().await?;
        self.track_registrations(&view, now).await?;
        self.kill_overdue();
        self.tick_idle_clocks(view.busy, now);
        if self.closing {
            return Ok(());
        }
        let template = self.provisioner.template();
        let decision = self.decision(&view, plan, &template, now);
        let backing_off = self.retry_at.filter(|t| *t > now);
        self.tell_waiting(&decision, plan, backing_off).await?;
        if decision.start > 0 && backing_off.is_none() {
            self.start(decision.start, &decision.serves, &template)
                .await?;
        }
        for name in &decision.release {
            let idle_for = self
                .members
                .get(name)
                .and_then(|m| m.idle_since)
                .map_or(0, |t| now.duration_since(t).as_secs());
            let why = format!(
                "releasing {name}: no role for {idle_for}s (idle timeout {}s) and no waiting job it could serve",
                self.config.limits.idle_timeout.as_secs()
            );
            self.release(name, &why).await?;
        }
        Ok(())
    }

    /// Registrations, and executors that stopped being live: a starting
    /// member that registered is live, one that did not within the start
    /// timeout is killed; a live one lost or gone is starting again.
    async fn track_registrations(
        &mut self,
        view: &RoundView<'_>,
        now: Instant,
    ) -> Result<(), sqlx::Error> {
        let live_by_name: HashMap<&str, Uuid> = view
            .live
            .iter()
            .filter_map(|e| view.names.get(&e.id).map(|n| (n.as_str(), e.id)))
            .collect();
        let names: Vec<String> = self.members.keys().cloned().collect();
        for name in names {
            let Some(m) = self.members.get(&name).cloned() else {
                continue;
            };
            match m.phase {
                Phase::Starting { since } => {
                    if let Some(&id) = live_by_name.get(name.as_str()) {
                        self.members.insert(
                            name.clone(),
                            Member {
                                phase: Phase::Live { id },
                                idle_since: None,
                                registered: true,
                            },
                        );
                        self.backoff = FIRST_BACKOFF;
                        self.retry_at = None;
                        sqlx::query("UPDATE provisioned_executors SET state = $3, executor_id = $2 WHERE name = $1")
                            .bind(&name)
                            .bind(id)
                            .bind(ProvisionedState::Running.as_str())
                            .execute(&self.db)
                            .await?;
                    } else if self.provisioner.waiting(&name) {
                        if let Some(m) = self.members.get_mut(&name) {
                            m.phase = Phase::Starting { since: now };
                        }
                    } else if now.duration_since(since) > self.config.start_timeout {
                        self.kill_now(&name);
                        let why = format!(
                            "{name} did not register within {}s; killed (its log: {})",
                            self.config.start_timeout.as_secs(),
                            self.provisioner.log_of(&name)
                        );
                        self.failed(&name, &why).await?;
                    }
                }
                Phase::Live { id } => match live_by_name.get(name.as_str()) {
                    Some(&now_id) if now_id == id => {}
                    Some(&now_id) => {
                        if let Some(m) = self.members.get_mut(&name) {
                            m.phase = Phase::Live { id: now_id };
                        }
                    }
                    // Lost or gone while its process runs: pending again
                    // until it re-registers or the start timeout passes.
                    None => {
                        if let Some(m) = self.members.get_mut(&name) {
                            m.phase = Phase::Starting { since: now };
                            m.idle_since = None;
                        }
                    }
                },
                Phase::Stopping { .. } => {}
            }
        }
        Ok(())
    }

    /// Idle clocks: a live member without a role is idle since it was
    /// last seen holding one.
    fn tick_idle_clocks(&mut self, busy: &BTreeSet<Uuid>, now: Instant) {
        for m in self.members.values_mut() {
            if let Phase::Live { id } = m.phase {
                if busy.contains(&id) {
                    m.idle_since = None;
                } else if m.idle_since.is_none() {
                    m.idle_since = Some(now);
                }
            }
        }
    }

    /// What to start and release, by the provisioner's rule, from the
    /// members' state and the round's jobs.
    fn decision(
        &self,
        view: &RoundView<'_>,
        plan: &Plan,
        template: &Template,
        now: Instant,
    ) -> crate::provision::Decision {
        let mut managed_live = BTreeSet::new();
        let mut pending = 0;
        let mut idle = Vec::new();
        for (name, m) in &self.members {
            match m.phase {
                Phase::Live { id } => {
                    managed_live.insert(id);
                    if let Some(t) = m.idle_since {
                        idle.push(Idle {
                            name: name.clone(),
                            idle_for: now.duration_since(t),
                        });
                    }
                }
                Phase::Starting { .. } => pending += 1,
                Phase::Stopping { .. } => {}
            }
        }
        decide(
            &Inputs {
                jobs: view.jobs,
                waiting_on_live: plan.waiting.keys().copied().collect(),
                live: view.live,
                managed_live,
                pending,
                managed_total: self.members.len() as u32,
                idle,
                needs_inspector: view.needs_inspector,
            },
            template,
            &self.config.limits,
        )
    }

    /// The decision's reasons into the waiting jobs' reasons; a blocked
    /// job hears why once (an event of its own and the provisioner's).
    async fn tell_waiting(
        &mut self,
        decision: &crate::provision::Decision,
        plan: &mut Plan,
        backing_off: Option<Instant>,
    ) -> Result<(), sqlx::Error> {
        for (job, why) in decision.blocked.iter().chain(&decision.waiting) {
            if let Some(w) = plan.waiting.get_mut(job) {
                *w = format!("{w}; {why}");
            }
        }
        for job in decision.serves.keys() {
            if let Some(w) = plan.waiting.get_mut(job) {
                // No countdown: the reason changes (and is written) once
                // per back-off, not every round.
                *w = match backing_off {
                    Some(_) => format!(
                        "{w}; the provisioner retries starting executors after a failed start (GET /v1/provisioner says why)"
                    ),
                    None => format!("{w}; the provisioner is starting executors for it"),
                };
            }
        }
        for (job, why) in &decision.blocked {
            if self.told.get(job) != Some(why) {
                self.told.insert(*job, why.clone());
                self.event(
                    ProvisionerEventKind::Blocked,
                    None,
                    Some(*job),
                    why,
                    json!({}),
                )
                .await?;
                job_event(&self.db, *job, why, Provisioning::Blocked).await?;
            }
        }
        self.told
            .retain(|job, _| decision.blocked.contains_key(job));

        Ok(())
    }

    async fn start(
        &mut self,
        count: u32,
        serves: &BTreeMap<Uuid, u32>,
        template: &Template,
    ) -> Result<(), sqlx::Error> {
        let mut started = Vec::new();
        for _ in 0..count {
            let name = format!(
                "{}-{}",
                self.provisioner.kind(),
                &Uuid::new_v4().simple().to_string()[..8]
            );
            match self.provisioner.start(&name) {
                Ok(pid) => {
                    self.members.insert(name.clone(), Member::starting(false));
                    sqlx::query(
                        "INSERT INTO provisioned_executors (name, provisioner, host, pid, state)
                         VALUES ($1, $2, $3, $4, 'starting')",
                    )
                    .bind(&name)
                    .bind(self.provisioner.kind())
                    .bind(&self.config.host)
                    .bind(pid.and_then(|p| i32::try_from(p).ok()))
                    .execute(&self.db)
                    .await?;
                    started.push(name);
                }
                Err(e) => {
                    let why = format!("starting an executor failed: {e}");
                    self.event(ProvisionerEventKind::Failed, None, None, &why, json!({}))
                        .await?;
                    self.back_off();
                    break;
                }
            }
        }
        if started.is_empty() {
            return Ok(());
        }
        let jobs: Vec<String> = serves.keys().map(Uuid::to_string).collect();
        // Each with the cluster manager's name for it, where it has one.
        let handles: BTreeMap<&str, String> = started
            .iter()
            .filter_map(|n| Some((n.as_str(), self.provisioner.handle(n)?)))
            .collect();
        let shown: Vec<String> = started
            .iter()
            .map(|n| match handles.get(n.as_str()) {
                Some(h) => format!("{n} ({h})"),
                None => n.clone(),
            })
            .collect();
        let why = format!(
            "starting {} executor(s) ({}) of {} for {} waiting job(s) whose minimum sets the live executors cannot hold; {} of at most {} executor(s) now",
            started.len(),
            shown.join(", "),
            template.describe(),
            serves.len().max(1),
            self.members.len(),
            self.config.limits.max_executors
        );
        self.event(
            ProvisionerEventKind::Start,
            None,
            None,
            &why,
            json!({ "executors": started, "handles": handles, "jobs": jobs, "managed": self.members.len(), "max_executors": self.config.limits.max_executors }),
        )
        .await?;
        for (job, need) in serves {
            let reason = format!(
                "provisioning: starting {} executor(s) ({}); this job alone needs {need} new executor(s) of {}",
                started.len(),
                shown.join(", "),
                template.describe()
            );
            let data = Provisioning::Starting {
                executors: started.clone(),
                needed: *need,
            };
            job_event(&self.db, *job, &reason, data).await?;
        }
        Ok(())
    }

    async fn release(&mut self, name: &str, why: &str) -> Result<(), sqlx::Error> {
        if let Err(e) = self.provisioner.stop(name) {
            tracing::warn!(executor = name, error = %e, "provisioner: stop failed; killing");
            let _ = self.provisioner.kill(name);
        }
        if let Some(m) = self.members.get_mut(name) {
            m.phase = Phase::Stopping {
                since: Instant::now(),
                killed: false,
            };
        }
        self.event(
            ProvisionerEventKind::Release,
            Some(name),
            None,
            why,
            json!({}),
        )
        .await?;
        self.set_state(name, ProvisionedState::Stopping, Some(why))
            .await
    }

    /// Processes that ended: recorded, and forgotten.
    async fn reap(&mut self) -> Result<(), sqlx::Error> {
        for (name, how) in self.provisioner.exited() {
            let Some(m) = self.members.remove(&name) else {
                continue;
            };
            match m.phase {
                Phase::Stopping { killed: false, .. } => {
                    let why = format!("{name} drained and exited ({how})");
                    self.event(
                        ProvisionerEventKind::Stopped,
                        Some(&name),
                        None,
                        &why,
                        json!({}),
                    )
                    .await?;
                    self.set_state(&name, ProvisionedState::Stopped, Some(&why))
                        .await?;
                }
                Phase::Stopping { killed: true, .. } => {
                    self.set_state(
                        &name,
                        ProvisionedState::Stopped,
                        Some(&format!("killed ({how})")),
                    )
                    .await?;
                }
                Phase::Starting { .. } if !m.registered => {
                    let why = format!(
                        "{name} exited before it registered ({how}); its log: {}",
                        self.provisioner.log_of(&name)
                    );
                    self.failed(&name, &why).await?;
                    self.set_state(&name, ProvisionedState::Failed, Some(&why))
                        .await?;
                }
                _ => {
                    let why = format!("{name} exited unexpectedly ({how})");
                    self.event(
                        ProvisionerEventKind::Exited,
                        Some(&name),
                        None,
                        &why,
                        json!({}),
                    )
                    .await?;
                    self.set_state(&name, ProvisionedState::Exited, Some(&why))
                        .await?;
                }
            }
        }
        Ok(())
    }

    async fn failed(&mut self, name: &str, why: &str) -> Result<(), sqlx::Error> {
        self.back_off();
        tracing::warn!(executor = name, "provisioner: {why}");
        self.event(
            ProvisionerEventKind::Failed,
            Some(name),
            None,
            why,
            json!({ "retry_in_secs": self.backoff.as_secs() }),
        )
        .await
    }

    fn back_off(&mut self) {
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// Releases every executor (the server is shutting down); the rounds
    /// that follow only reap.
    pub async fn release_all(&mut self, why: &str) -> Result<(), sqlx::Error> {
        self.closing = true;
        let names: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| !matches!(m.phase, Phase::Stopping { .. }))
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            self.release(&name, &format!("releasing {name}: {why}"))
                .await?;
        }
        Ok(())
    }

    /// Reaps exits and kills what outlived the stop timeout, without a
    /// planning round (for shutdown when this process no longer leads).
    pub async fn reap_only(&mut self) -> Result<(), sqlx::Error> {
        self.reap().await?;
        self.kill_overdue();
        Ok(())
    }

    /// Kills the released executors that outlived the stop timeout.
    fn kill_overdue(&mut self) {
        let now = Instant::now();
        let overdue: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| matches!(m.phase, Phase::Stopping { since, killed: false } if now.duration_since(since) > self.config.stop_timeout))
            .map(|(n, _)| n.clone())
            .collect();
        for name in overdue {
            self.kill_now(&name);
        }
    }

    /// SIGKILL (or the provisioner's equivalent); the member waits to be
    /// reaped.
    fn kill_now(&mut self, name: &str) {
        let _ = self.provisioner.kill(name);
        if let Some(m) = self.members.get_mut(name) {
            let since = match m.phase {
                Phase::Stopping { since, .. } => since,
                _ => Instant::now(),
            };
            m.phase = Phase::Stopping {
                since,
                killed: true,
            };
        }
    }

    async fn event(
        &self,
        kind: ProvisionerEventKind,
        executor: Option<&str>,
        job: Option<Uuid>,
        reason: &str,
        data: serde_json::Value,
    ) -> Result<(), sqlx::Error> {
        tracing::info!(kind = kind.as_str(), executor, "provisioner: {reason}");
        sqlx::query(
            "INSERT INTO provisioner_events (provisioner, kind, executor_name, job_id, reason, data)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(self.provisioner.kind())
        .bind(kind.as_str())
        .bind(executor)
        .bind(job)
        .bind(reason)
        .bind(data)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    async fn set_state(
        &self,
        name: &str,
        state: ProvisionedState,
        reason: Option<&str>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE provisioned_executors SET state = $2, reason = coalesce($3, reason),
                    stopped_at = CASE WHEN $4 THEN stopped_at ELSE clock_timestamp() END
             WHERE name = $1",
        )
        .bind(name)
        .bind(state.as_str())
        .bind(reason)
        .bind(state.is_live())
        .execute(&self.db)
        .await?;
        Ok(())
    }
}

async fn job_event(
    db: &PgPool,
    job: Uuid,
    reason: &str,
    data: Provisioning,
) -> Result<(), sqlx::Error> {
    let mut tx = db.begin().await?;
    crate::lifecycle::event(&mut tx, job, &EventData::Provisioning(data), reason).await?;
    crate::lifecycle::notify(&mut tx, job).await?;
    tx.commit().await
}
