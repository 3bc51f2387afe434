//! What one round sees: the unfinished jobs with their current placements
//! (as the planner's [`JobView`]s), the live executors (as
//! [`ExecutorView`]s), the executors each job must not use, and the names
//! and states of every executor a job still refers to, read from Postgres
//! in four queries.

use crate::plan::{Demand, DeviceSlot, ExecutorView, JobView, Placement, PsRole, WorkerRole};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use trainyard_common::cluster::{ExecutorResources, ExecutorState, HeldDevice, Range, RoleKind};
use trainyard_common::model::{parameters, MemoryEstimate, ParamInfo};
use trainyard_common::spec::{JobSpec, ModelSpec, Strategy};
use uuid::Uuid;

/// What the round remembers of a job besides its [`JobView`].
pub(super) struct JobMeta {
    pub(super) generation: i64,
    pub(super) state_reason: String,
    pub(super) created_at: chrono::DateTime<chrono::Utc>,
    /// Seconds since it last became `queued` (or was submitted).
    pub(super) waited_secs: f64,
}

/// What one round sees.
pub(super) struct World {
    pub(super) jobs: Vec<JobView>,
    pub(super) live: Vec<ExecutorView>,
    pub(super) meta: HashMap<Uuid, JobMeta>,
    pub(super) executors: HashMap<Uuid, (String, ExecutorState)>,
}

impl World {
    /// Reads the round's view from the database.
    pub(super) async fn load(db: &PgPool) -> Result<World, sqlx::Error> {
        // One snapshot for every read: otherwise a job submitted after an
        // executor's heartbeat could be read together with that executor's
        // state from before it (a device it still holds seen as free).
        let mut tx = db.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        let mut executors = HashMap::new();
        let mut live = Vec::new();
        // Executors that cannot confine users' code: never a TorchScript
        // job's (its replicas' model processes would be refused there).
        let mut unconfining = BTreeSet::new();
        // Executors that cannot confine a script rank's network (no
        // namespace there): never a script job's.
        let mut no_scripts = BTreeSet::new();
        for r in sqlx::query("SELECT id, name, state, resources, labels, held, sandbox->>'state' AS sandbox, sandbox->>'scripts' AS scripts FROM executors WHERE state IN ('live', 'draining') OR id IN (SELECT executor_id FROM assignments)")
            .fetch_all(&mut *tx)
            .await?
        {
            let id: Uuid = r.get("id");
            let state: ExecutorState = r.try_get("state")?;
            executors.insert(id, (r.get::<String, _>("name"), state));
            if state != ExecutorState::Live {
                continue;
            }
            if r.get::<Option<String>, _>("sandbox").as_deref() == Some("unavailable") {
                unconfining.insert(id);
                no_scripts.insert(id);
            }
            if r.get::<Option<String>, _>("scripts").as_deref() == Some("unavailable") {
                no_scripts.insert(id);
            }
            let Ok(res) = serde_json::from_value::<ExecutorResources>(r.get("resources")) else { continue };
            let labels: BTreeMap<String, String> = serde_json::from_value(r.get("labels")).unwrap_or_default();
            live.push(ExecutorView {
                id,
                host: labels.get("host").cloned(),
                ram_bytes: res.ram_bytes,
                devices: res.devices.iter().map(|d| DeviceSlot { kind: d.kind, index: d.index, memory_bytes: d.memory_bytes }).collect(),
                // Unreadable (another release's) counts as nothing held.
                held: serde_json::from_value::<Vec<HeldDevice>>(r.get("held")).unwrap_or_default().into_iter().map(|h| (h.kind, h.index)).collect(),
            });
        }

        let mut assigned: HashMap<Uuid, (Vec<WorkerRole>, Vec<PsRole>)> = HashMap::new();
        let mut standbys: Vec<(Uuid, u32, Uuid)> = Vec::new();
        for r in sqlx::query("SELECT job_id, role, index, executor_id, device, ranges FROM assignments ORDER BY job_id, role, index")
            .fetch_all(&mut *tx)
            .await?
        {
            let entry = assigned.entry(r.get("job_id")).or_default();
            let index = r.get::<i32, _>("index") as u32;
            match RoleKind::parse(&r.get::<String, _>("role")) {
                Some(RoleKind::Worker) => {
                    entry.0.push(WorkerRole { rank: index, executor: r.get("executor_id"), device: r.get::<Option<i32>, _>("device").unwrap_or(0) as u32 });
                }
                Some(RoleKind::Standby) => standbys.push((r.get("job_id"), index, r.get("executor_id"))),
                Some(RoleKind::Ps) | None => {
                    let ranges: Vec<Range> = serde_json::from_value(r.get("ranges")).unwrap_or_default();
                    entry.1.push(PsRole { shard: index, executor: r.get("executor_id"), ranges, standby: None });
                }
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

        let mut excluded: HashMap<Uuid, BTreeSet<Uuid>> = HashMap::new();
        for (job, executor) in sqlx::query_as::<_, (Uuid, Uuid)>(
            "SELECT x.job_id, x.executor_id FROM job_exclusions x JOIN jobs j ON j.id = x.job_id
             WHERE j.state IN ('queued', 'scheduling', 'running', 'recovering')",
        )
        .fetch_all(&mut *tx)
        .await?
        {
            excluded.entry(job).or_default().insert(executor);
        }

        let mut jobs = Vec::new();
        let mut meta = HashMap::new();
        for r in sqlx::query(
            "SELECT id, spec, priority, created_at, generation, state_reason, strategy, params, owner, state,
                    CASE WHEN state = 'queued' THEN extract(epoch FROM clock_timestamp() - coalesce((SELECT max(at) FROM job_events e WHERE e.job_id = jobs.id AND e.to_state = 'queued'), created_at))::float8 END AS waited
             FROM jobs WHERE state IN ('queued', 'scheduling', 'running', 'recovering')",
        )
        .fetch_all(&mut *tx)
        .await?
        {
            let Some(mut job) = job_view(&r, &mut assigned, &unconfining, &no_scripts) else {
                continue;
            };
            job.excluded.extend(excluded.remove(&job.id).unwrap_or_default());
            meta.insert(
                job.id,
                JobMeta {
                    generation: r.get("generation"),
                    state_reason: r.get("state_reason"),
                    created_at: r.get("created_at"),
                    waited_secs: r.get::<Option<f64>, _>("waited").unwrap_or(0.0),
                },
            );
            jobs.push(job);
        }
        tx.commit().await?;
        Ok(World {
            jobs,
            live,
            meta,
            executors,
        })
    }

    /// An executor's name, with its state when it is not live (its id
    /// when it is gone from the table).
    pub(super) fn executor_label(&self, id: &Uuid) -> String {
        match self.executors.get(id) {
            Some((name, state)) if *state != ExecutorState::Live => {
                format!("{name} ({})", state.as_str())
            }
            Some((name, _)) => name.clone(),
            None => id.to_string(),
        }
    }
}

fn job_view(
    r: &PgRow,
    assigned: &mut HashMap<Uuid, (Vec<WorkerRole>, Vec<PsRole>)>,
    unconfining: &BTreeSet<Uuid>,
    no_scripts: &BTreeSet<Uuid>,
) -> Option<JobView> {
    let id: Uuid = r.get("id");
    let spec = match JobSpec::from_stored(r.get("spec")) {
        Ok(s) => s,
        Err(e) => {
            // One broken job does not stop the round for the others.
            tracing::error!(job = %id, error = %e, "leaving the job out of the plan");
            return None;
        }
    };
    let created: chrono::DateTime<chrono::Utc> = r.get("created_at");
    // TorchScript models are planned from what their inspection reported;
    // a script job by the memory it asks for (its model is its own).
    let params = match spec.model.as_ref() {
        None => Vec::new(),
        Some(model) => match parameters(model) {
            Some(p) => p,
            None => r
                .get::<Option<serde_json::Value>, _>("params")
                .and_then(|v| serde_json::from_value::<Vec<ParamInfo>>(v).ok())?,
        },
    };
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
            // A script runs as one process group (torchrun's pattern).
            strategy: if spec.is_script() {
                Strategy::Allreduce
            } else {
                spec.strategy
            },
            device: spec.resources.device,
            min_workers: spec.workers.min,
            max_workers: spec.workers.max,
            parameter_servers: spec.parameter_server_count(),
            // A CPU script rank's spare interpreter counts too.
            memory_bytes: spec.worker_memory_mb().saturating_mul(1 << 20),
            // Buffers and frozen parameters count where they live.
            estimate: spec.optimizer.as_ref().map(|o| {
                MemoryEstimate::of(&params, o.kind, sync).with_ps_replicas(spec.ps_replicas())
            }),
            params: spec.optimizer.is_some().then_some(params),
        },
        current,
        owner: r.get("owner"),
        starving: false,
        // Users' code (a TorchScript model, a script) runs only where it
        // is confined.
        excluded: match spec.model {
            Some(ModelSpec::Torchscript(_)) => unconfining.clone(),
            None => no_scripts.clone(),
            Some(_) => Default::default(),
        },
    })
}
