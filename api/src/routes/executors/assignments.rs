//! What an executor's heartbeat is answered with: the roles assigned to
//! it in unfinished jobs, each with its job's spec resolved under the
//! owner's data policy, its peers (workers, PS shards and standbys), the
//! job's data-plane secret and where it resumes. [`super::heartbeat`]
//! reads them here; a job whose stored spec does not pass is left out of
//! the answer (logged), not the executor's other roles.

use crate::checkpointing;
use crate::data_policy;
use crate::error::ApiResult;
use crate::AppState;
use sqlx::Row;
use std::collections::BTreeMap;
use trainyard_common::cluster::{Assignment, PsPeer, Range, RoleKey, RoleKind, WorkerPeer};
use trainyard_common::spec::Strategy;
use trainyard_common::JobSpec;
use uuid::Uuid;

/// Whether a job with a role on executor `id` is waiting to be preempted
/// (and so asked for a checkpoint).
pub(super) async fn asked_to_checkpoint(st: &AppState, id: Uuid) -> ApiResult<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM preemptions p JOIN assignments a ON a.job_id = p.victim WHERE a.executor_id = $1)",
    )
    .bind(id)
    .fetch_one(&st.db)
    .await?)
}

/// The keys of the roles assigned to executor `id` in unfinished jobs,
/// sorted (what [`assignments_for`] would list, cheaply).
pub(super) async fn assigned_keys(st: &AppState, id: Uuid) -> ApiResult<Vec<RoleKey>> {
    let rows: Vec<(Uuid, i64, String, i32)> = sqlx::query_as(
        "SELECT a.job_id, a.generation, a.role, a.index FROM assignments a JOIN jobs j ON j.id = a.job_id
         WHERE a.executor_id = $1 AND j.state NOT IN ('succeeded', 'failed', 'cancelled')",
    )
    .bind(id)
    .fetch_all(&st.db)
    .await?;
    let mut keys: Vec<RoleKey> = rows
        .into_iter()
        .map(|(job_id, generation, role, index)| RoleKey {
            job_id,
            generation,
            role: RoleKind::parse(&role).unwrap_or(RoleKind::Worker),
            index: index as u32,
        })
        .collect();
    keys.sort();
    Ok(keys)
}

/// Every role assigned to executor `id` in unfinished jobs, as its
/// heartbeat's answer names them: each with its job's resolved spec,
/// peers, secret and resume point.
pub(super) async fn assignments_for(st: &AppState, id: Uuid) -> ApiResult<Vec<Assignment>> {
    let rows = sqlx::query(
        "SELECT a.job_id, a.generation, a.role, a.index, a.executor_id, a.device, a.ranges, e.address,
                j.spec, j.strategy, j.secret, j.owner, j.data_policy, j.worlds,
                EXISTS (SELECT 1 FROM preemptions p WHERE p.victim = j.id) AS preempting
         FROM assignments a
         JOIN executors e ON e.id = a.executor_id
         JOIN jobs j ON j.id = a.job_id
         WHERE a.job_id IN (SELECT job_id FROM assignments WHERE executor_id = $1)
           AND j.state NOT IN ('succeeded', 'failed', 'cancelled')
         ORDER BY a.job_id, a.role, a.index",
    )
    .bind(id)
    .fetch_all(&st.db)
    .await?;
    let mut jobs: BTreeMap<Uuid, JobPeers> = BTreeMap::new();
    for r in &rows {
        add_row(&mut jobs, r, id)?;
    }
    let mut specs = resolved_specs(st, &jobs);
    let wanted: Vec<_> = specs
        .iter()
        .map(|(id, (s, _))| (*id, s.resume_from))
        .collect();
    let resume = checkpointing::resume_points(&st.db, &wanted).await?;
    let mut out = Vec::new();
    for (id, j) in jobs {
        let Some((spec, data_policy)) = specs.remove(&id) else {
            continue;
        };
        for (key, device) in j.mine {
            out.push(Assignment {
                key,
                device,
                strategy: j.strategy,
                secret: j.secret.clone(),
                spec: spec.clone(),
                workers: j.workers.clone(),
                parameter_servers: j.ps.clone(),
                resume: resume.get(&id).cloned(),
                data_policy: data_policy.clone(),
                checkpoint_wanted: j.preempting,
                restarts: Some(u32::try_from(j.worlds - 1).unwrap_or(0)),
            });
        }
    }
    Ok(out)
}

/// One job's roles as an executor's heartbeat answer names them: its
/// stored spec and policy, its peers, and the roles of this executor.
struct JobPeers {
    spec: serde_json::Value,
    owner: String,
    policy: Option<serde_json::Value>,
    strategy: Strategy,
    secret: String,
    workers: Vec<WorkerPeer>,
    ps: Vec<PsPeer>,
    mine: Vec<(RoleKey, Option<u32>)>,
    // A preemption waits for this job's checkpoint.
    preempting: bool,
    // Generations that started roles, this one included.
    worlds: i32,
}

/// Row `r` of a job's assignments (as `assignments_for` reads them) added
/// to its job in `jobs`; the roles of executor `me` noted as its own.
fn add_row(
    jobs: &mut BTreeMap<Uuid, JobPeers>,
    r: &sqlx::postgres::PgRow,
    me: Uuid,
) -> ApiResult<()> {
    let job_id: Uuid = r.try_get("job_id")?;
    let entry = match jobs.entry(job_id) {
        std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::btree_map::Entry::Vacant(v) => v.insert(JobPeers {
            spec: r.try_get("spec")?,
            owner: r.try_get("owner")?,
            policy: r.try_get("data_policy")?,
            strategy: if r.try_get::<Option<String>, _>("strategy")?.as_deref() == Some("allreduce")
            {
                Strategy::Allreduce
            } else {
                Strategy::ParameterServer
            },
            secret: hex::encode(
                r.try_get::<Option<Vec<u8>>, _>("secret")?
                    .unwrap_or_default(),
            ),
            workers: Vec::new(),
            ps: Vec::new(),
            mine: Vec::new(),
            preempting: r.try_get("preempting")?,
            worlds: r.try_get("worlds")?,
        }),
    };
    let index = r.try_get::<i32, _>("index")? as u32;
    let executor_id: Uuid = r.try_get("executor_id")?;
    let address: String = r.try_get("address")?;
    let device = r.try_get::<Option<i32>, _>("device")?.map(|d| d as u32);
    let role = RoleKind::parse(&r.try_get::<String, _>("role")?).unwrap_or(RoleKind::Worker);
    match role {
        RoleKind::Worker => entry.workers.push(WorkerPeer {
            rank: index,
            executor_id,
            address,
            device: device.unwrap_or(0),
        }),
        RoleKind::Ps | RoleKind::Standby => {
            let ranges: Vec<Range> =
                serde_json::from_value(r.try_get("ranges")?).unwrap_or_default();
            entry.ps.push(PsPeer {
                shard: index,
                standby: role == RoleKind::Standby,
                executor_id,
                address,
                ranges,
            });
        }
    }
    if executor_id == me {
        let key = RoleKey {
            job_id,
            generation: r.try_get("generation")?,
            role,
            index,
        };
        entry.mine.push((key, device));
    }
    Ok(())
}

/// Each job's spec, resolved for executors under its owner's data
/// policy; a job whose stored spec or resolved spec does not pass is left
/// out (logged), so that one broken job does not cost the executor its
/// other roles.
fn resolved_specs(
    st: &AppState,
    jobs: &BTreeMap<Uuid, JobPeers>,
) -> BTreeMap<Uuid, (JobSpec, trainyard_common::artifact::DataPolicy)> {
    let mut specs = BTreeMap::new();
    for (id, j) in jobs {
        let spec = match JobSpec::from_stored(j.spec.clone()) {
            Ok(s) => s,
            Err(e) => {
                // One broken job does not cost the executor its other roles.
                tracing::error!(job = %id, error = %e, "leaving the job's roles out of a heartbeat answer");
                continue;
            }
        };
        match data_policy::for_executor(st, &j.owner, j.policy.clone(), spec) {
            Ok(resolved) => {
                specs.insert(*id, resolved);
            }
            Err(e) => {
                tracing::error!(job = %id, error = %e, "leaving the job's roles out of a heartbeat answer: its resolved spec does not pass");
            }
        }
    }
    specs
}
