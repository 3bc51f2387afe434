//! Capacity on demand: what a [`Provisioner`] is (something that starts
//! and stops executors), and how many executors to start, which idle ones
//! to release, and which jobs no amount of allowed capacity can serve — a
//! pure function over what one scheduling round sees.
//!
//! The scheduler asks this module each round, when it runs with a
//! provisioner ([`crate::fleet`] carries the decision out). The rule is
//! the planner's own, so the two never disagree about what "fits":
//!
//! * **Unmet demand** is the set of jobs that [`plan`] leaves waiting on
//!   the live executors plus the executors already started but not yet
//!   registered (pending capacity).
//! * **Blocked**: a waiting job that could not be placed even on every
//!   hand-started executor plus `min(max_per_job, max_executors)` new ones
//!   of the provisioner's [`Template`] is told why and never provisioned
//!   for; it stays queued with the reason in its `state_reason`.
//! * **Start**: the smallest `k ≤ max_executors − managed` such that
//!   planning with `k` more template executors admits as many of the other
//!   waiting jobs as the whole remaining budget would. Gang admission makes
//!   this all-or-nothing per job, so the count is exactly what the queue's
//!   minimum sets need — growth towards `workers.max` never provisions.
//! * **Release**: a provisioned executor with no role for `idle_timeout`
//!   is released, but only while no job it could help waits, so capacity
//!   that is about to be used is not churned. A job that waits on the live
//!   executors but fits once the pending ones register counts too: the
//!   idle executors are part of that fit (a requeued Slurm job's executor
//!   comes back to a job that still holds its other member). Only executors the
//!   provisioner started are ever candidates: the caller passes them, and
//!   nothing else can appear in [`Decision::release`].
//! * A TorchScript job waiting to be inspected with no live or pending
//!   executor at all asks for one executor.

use crate::plan::{plan, DeviceSlot, ExecutorView, JobView};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use trainyard_common::spec::Device;
use uuid::Uuid;

/// Something that starts and stops executors.
pub trait Provisioner: Send + Sync {
    /// Its kind, as recorded in events (`local`).
    fn kind(&self) -> &'static str;
    /// What each executor it starts offers.
    fn template(&self) -> Template;
    /// Starts an executor that registers under `name`; its process id
    /// where there is one.
    fn start(&mut self, name: &str) -> std::io::Result<Option<u32>>;
    /// Asks `name` to drain and leave.
    fn stop(&mut self, name: &str) -> std::io::Result<()>;
    /// Ends `name` at once.
    fn kill(&mut self, name: &str) -> std::io::Result<()>;
    /// The executors that ended since the last call, with how.
    fn exited(&mut self) -> Vec<(String, String)>;
    /// Takes `name` (process `pid`) back under management after a restart;
    /// false when it is not running any more (or is not ours).
    fn adopt(&mut self, name: &str, pid: Option<u32>) -> bool;
    /// Where `name`'s output goes, for messages.
    fn log_of(&self, name: &str) -> String;
    /// How the cluster manager knows `name` (`Slurm job 4711`), for events.
    fn handle(&self, _name: &str) -> Option<String> {
        None
    }
    /// Whether `name` waits for the cluster manager to run it at all (a
    /// pending batch job): its start timeout counts from when it runs.
    fn waiting(&self, _name: &str) -> bool {
        false
    }
}

/// Ids of the planner's stand-ins for executors not yet started; far from
/// any v4/v7 id a real executor gets.
const VIRTUAL_BASE: u128 = 0xffff_ffff_ffff_ffff_ffff_ffff_0000_0000;

/// What one executor the provisioner starts offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// Its `host` label.
    pub host: Option<String>,
    /// RAM it offers.
    pub ram_bytes: u64,
    /// Devices it offers.
    pub devices: Vec<DeviceSlot>,
}

impl Template {
    fn executor(&self, n: u128) -> ExecutorView {
        ExecutorView {
            id: Uuid::from_u128(VIRTUAL_BASE + n),
            host: self.host.clone(),
            ram_bytes: self.ram_bytes,
            devices: self.devices.clone(),
            held: Vec::new(),
        }
    }

    /// A sentence describing one such executor.
    pub fn describe(&self) -> String {
        let devices: Vec<String> = self
            .devices
            .iter()
            .map(|d| match d.kind {
                Device::Cpu => "cpu".to_string(),
                Device::Cuda => format!("cuda:{}", d.index),
            })
            .collect();
        format!(
            "{} MiB RAM, devices [{}]",
            self.ram_bytes >> 20,
            devices.join(", ")
        )
    }
}

/// The provisioner's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most executors it runs at once (already clamped to its CPU and
    /// memory budget).
    pub max_executors: u32,
    /// Most new executors one job may need; larger jobs are blocked.
    pub max_per_job: u32,
    /// How long an executor it started may sit without a role before it is
    /// released.
    pub idle_timeout: Duration,
}

/// A live executor this provisioner started that holds no role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idle {
    /// Its name (the provisioner's handle on it).
    pub name: String,
    /// How long it has held no role.
    pub idle_for: Duration,
}

/// What one round sees.
#[derive(Debug, Clone, Default)]
pub struct Inputs<'a> {
    /// Every unfinished, plannable job with its current placement.
    pub jobs: &'a [JobView],
    /// The jobs the round's plan over `live` left waiting (so that the
    /// common case — nothing pending — plans nothing twice).
    pub waiting_on_live: BTreeSet<Uuid>,
    /// Live executors (hand-started and provisioned).
    pub live: &'a [ExecutorView],
    /// Which of `live` this provisioner started.
    pub managed_live: BTreeSet<Uuid>,
    /// Executors started and not (yet, or any more) registered.
    pub pending: u32,
    /// Every executor this provisioner runs (live, pending or stopping).
    pub managed_total: u32,
    /// Provisioned executors without a role.
    pub idle: Vec<Idle>,
    /// A TorchScript job waits for an inspector.
    pub needs_inspector: bool,
}

/// What to do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Executors to start now.
    pub start: u32,
    /// The waiting jobs those starts (and the pending ones) are for, with
    /// how many new executors each would need on its own.
    pub serves: BTreeMap<Uuid, u32>,
    /// Jobs no allowed capacity can serve, with why.
    pub blocked: BTreeMap<Uuid, String>,
    /// Jobs that wait for capacity the budget does not have now, with why.
    pub waiting: BTreeMap<Uuid, String>,
    /// Idle provisioned executors to release (by name).
    pub release: Vec<String>,
}

/// The waiting jobs the provisioner could serve, each with the new
/// executors it would need alone noted in `out.serves`; the others are
/// blocked (`out.blocked`, with why): not even every hand-started executor
/// plus the most this provisioner may start for one job would hold its
/// minimum set.
fn sort_blocked<'j>(
    inputs: &Inputs<'j>,
    template: &Template,
    limits: &Limits,
    waiting: Vec<&'j JobView>,
    out: &mut Decision,
) -> Vec<&'j JobView> {
    let cap = limits.max_per_job.min(limits.max_executors);
    let hand: Vec<ExecutorView> = inputs
        .live
        .iter()
        .filter(|e| !inputs.managed_live.contains(&e.id))
        .cloned()
        .collect();
    let mut candidates: Vec<&JobView> = Vec::new();
    for j in waiting {
        let alone = JobView {
            current: None,
            ..j.clone()
        };
        let need = (0..=cap).find(|&k| {
            let mut v = hand.clone();
            v.extend((0..u128::from(k)).map(|n| template.executor(n)));
            plan(std::slice::from_ref(&alone), &v)
                .placements
                .contains_key(&j.id)
        });
        match need {
            Some(k) => {
                out.serves.insert(j.id, k);
                candidates.push(j);
            }
            None => {
                let mut v = hand.clone();
                v.extend((0..u128::from(cap)).map(|n| template.executor(n)));
                let why = plan(std::slice::from_ref(&alone), &v)
                    .waiting
                    .remove(&j.id)
                    .unwrap_or_default();
                out.blocked.insert(
                    j.id,
                    format!(
                        "the provisioner cannot supply this job: with {} hand-started executor(s) and {cap} new one(s) of {} (max_per_job {}, max_executors {}), it still would not fit ({why})",
                        hand.len(),
                        template.describe(),
                        limits.max_per_job,
                        limits.max_executors
                    ),
                );
            }
        }
    }

    candidates
}

/// The decision for one round.
pub fn decide(inputs: &Inputs<'_>, template: &Template, limits: &Limits) -> Decision {
    let mut out = Decision::default();
    let with = |k: u32| -> Vec<ExecutorView> {
        let mut v = inputs.live.to_vec();
        v.extend((0..u128::from(inputs.pending + k)).map(|n| template.executor(n)));
        v
    };
    // Waiting even with the pending executors: replanned only when some
    // are pending (the round's own plan already covers `live`).
    let waiting: Vec<&JobView> = if inputs.waiting_on_live.is_empty() {
        Vec::new()
    } else if inputs.pending == 0 {
        inputs
            .jobs
            .iter()
            .filter(|j| inputs.waiting_on_live.contains(&j.id))
            .collect()
    } else {
        let p = plan(inputs.jobs, &with(0));
        inputs
            .jobs
            .iter()
            .filter(|j| p.waiting.contains_key(&j.id))
            .collect()
    };

    let waiting_ids: BTreeSet<Uuid> = waiting.iter().map(|j| j.id).collect();
    let candidates = sort_blocked(inputs, template, limits, waiting, &mut out);
    let room = limits.max_executors.saturating_sub(inputs.managed_total);
    if !candidates.is_empty() {
        let served = |k: u32| -> BTreeSet<Uuid> {
            let p = plan(inputs.jobs, &with(k));
            candidates
                .iter()
                .map(|j| j.id)
                .filter(|id| p.placements.contains_key(id))
                .collect()
        };
        let best = served(room);
        let k = (1..=room).find(|&k| served(k) == best).unwrap_or(0);
        if !best.is_empty() {
            out.start = k;
        }
        out.serves.retain(|id, _| best.contains(id));
        for j in &candidates {
            if !best.contains(&j.id) {
                out.waiting.insert(
                    j.id,
                    format!(
                        "waiting for capacity: the provisioner runs {} of its {} executor(s) and the rest would not hold this job with the jobs before it",
                        inputs.managed_total, limits.max_executors
                    ),
                );
            }
        }
    }

    if inputs.needs_inspector && inputs.live.is_empty() && inputs.pending == 0 && room > 0 {
        out.start = out.start.max(1);
    }

    // Jobs that wait now but fit with the pending executors: the idle ones
    // are part of that fit.
    let pending_fit = inputs.pending > 0
        && inputs
            .waiting_on_live
            .iter()
            .any(|id| !waiting_ids.contains(id));
    // Release only when nothing it could serve waits.
    if candidates.is_empty() && !pending_fit && !inputs.needs_inspector {
        out.release = inputs
            .idle
            .iter()
            .filter(|i| i.idle_for >= limits.idle_timeout)
            .map(|i| i.name.clone())
            .collect();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Demand, Placement, WorkerRole};
    use proptest::prelude::{prop_assert, proptest};
    use trainyard_common::model::{parameters, MemoryEstimate, ParamInfo};
    use trainyard_common::spec::{MlpSpec, ModelSpec, OptimizerKind, Strategy};

    const MIB: u64 = 1 << 20;

    fn template(ram_mb: u64) -> Template {
        Template {
            host: Some("local".into()),
            ram_bytes: ram_mb * MIB,
            devices: vec![DeviceSlot {
                kind: Device::Cpu,
                index: 0,
                memory_bytes: ram_mb * MIB,
            }],
        }
    }

    fn limits(max: u32, per_job: u32) -> Limits {
        Limits {
            max_executors: max,
            max_per_job: per_job,
            idle_timeout: Duration::from_secs(10),
        }
    }

    fn job(n: u128, strategy: Strategy, min: u32, max: u32, ps: u32) -> JobView {
        let params: Vec<ParamInfo> = parameters(&ModelSpec::Mlp(MlpSpec {
            inputs: 64,
            hidden: vec![64],
            outputs: 10,
        }))
        .unwrap();
        let count = params.iter().map(ParamInfo::numel).sum();
        JobView {
            id: Uuid::from_u128(1000 + n),
            priority: 0,
            seq: n as i64,
            demand: Demand {
                strategy,
                device: Device::Cpu,
                min_workers: min,
                max_workers: max,
                parameter_servers: ps,
                memory_bytes: 256 * MIB,
                estimate: Some(MemoryEstimate::new(count, OptimizerKind::Sgd, true)),
                params: Some(params),
            },
            current: None,
            owner: String::new(),
            starving: false,
            excluded: Default::default(),
        }
    }

    /// [`decide`] with `waiting_on_live` from the round's plan, as the
    /// fleet passes it.
    fn decide_for(mut inputs: Inputs<'_>, t: &Template, l: &Limits) -> Decision {
        inputs.waiting_on_live = plan(inputs.jobs, inputs.live).waiting.into_keys().collect();
        decide(&inputs, t, l)
    }

    fn hand(n: u128, ram_mb: u64) -> ExecutorView {
        ExecutorView {
            id: Uuid::from_u128(n),
            host: Some("gpu-box".into()),
            ram_bytes: ram_mb * MIB,
            devices: template(ram_mb).devices,
            held: Vec::new(),
        }
    }

    #[test]
    fn starts_what_the_queue_minimum_sets_need() {
        let jobs = [
            job(1, Strategy::Allreduce, 2, 4, 0),
            job(2, Strategy::ParameterServer, 2, 2, 1),
        ];
        let d = decide_for(
            Inputs {
                jobs: &jobs,
                ..Inputs::default()
            },
            &template(1024),
            &limits(8, 8),
        );
        // Two ring workers, two PS workers (the shard shares a worker's
        // executor): four, not the ring's maximum.
        assert_eq!(d.start, 4);
        assert_eq!(d.serves.len(), 2);
        assert!(d.blocked.is_empty() && d.release.is_empty());
    }

    #[test]
    fn pending_executors_count_as_capacity() {
        let jobs = [job(1, Strategy::Allreduce, 2, 2, 0)];
        let d = decide_for(
            Inputs {
                jobs: &jobs,
                pending: 2,
                managed_total: 2,
                ..Inputs::default()
            },
            &template(1024),
            &limits(4, 4),
        );
        assert_eq!(d.start, 0);
    }

    #[test]
    fn a_job_larger_than_the_budget_is_blocked_with_its_reason() {
        let jobs = [
            job(1, Strategy::Allreduce, 4, 4, 0),
            job(2, Strategy::Allreduce, 1, 1, 0),
        ];
        let live = [hand(1, 4096)];
        let d = decide_for(
            Inputs {
                jobs: &jobs,
                live: &live,
                ..Inputs::default()
            },
            &template(1024),
            &limits(2, 2),
        );
        // One hand-started + two new executors cannot hold four ring ranks.
        let why = &d.blocked[&Uuid::from_u128(1001)];
        assert!(why.contains("max_executors 2"), "{why}");
        // The small job fits on the hand-started executor: nothing starts.
        assert_eq!(d.start, 0);
    }

    #[test]
    fn the_budget_limits_starts_and_the_rest_wait() {
        let jobs = [
            job(1, Strategy::Allreduce, 2, 2, 0),
            job(2, Strategy::Allreduce, 2, 2, 0),
        ];
        let d = decide_for(
            Inputs {
                jobs: &jobs,
                ..Inputs::default()
            },
            &template(1024),
            &limits(3, 3),
        );
        assert_eq!(d.start, 2);
        assert_eq!(d.serves.keys().next(), Some(&Uuid::from_u128(1001)));
        assert!(d.waiting.contains_key(&Uuid::from_u128(1002)));
    }

    #[test]
    fn idle_executors_go_only_when_nothing_they_could_serve_waits() {
        let idle = vec![
            Idle {
                name: "a".into(),
                idle_for: Duration::from_secs(11),
            },
            Idle {
                name: "b".into(),
                idle_for: Duration::from_secs(3),
            },
        ];
        let live = [hand(7, 1024)];
        let no_jobs = decide_for(
            Inputs {
                live: &live,
                idle: idle.clone(),
                managed_total: 2,
                ..Inputs::default()
            },
            &template(1024),
            &limits(4, 4),
        );
        assert_eq!(no_jobs.release, vec!["a".to_string()]);

        // A ring job of 3 that would use them waits: nothing is released.
        let jobs = [job(1, Strategy::Allreduce, 3, 3, 0)];
        let waiting = decide_for(
            Inputs {
                jobs: &jobs,
                live: &live,
                idle,
                managed_total: 2,
                ..Inputs::default()
            },
            &template(1024),
            &limits(4, 4),
        );
        assert!(waiting.release.is_empty());
        assert_eq!(waiting.start, 2);
    }

    #[test]
    fn an_idle_executor_a_pending_one_will_join_in_a_job_is_kept() {
        // A ring of 2 lost one member (its executor went pending again, a
        // requeued batch job): the other, idle past its timeout, is kept
        // for the job, and nothing new is started.
        let idle = vec![Idle {
            name: "kept".into(),
            idle_for: Duration::from_secs(60),
        }];
        let managed = ExecutorView {
            id: Uuid::from_u128(90),
            ..template(1024).executor(0)
        };
        let live = [managed.clone()];
        let jobs = [job(1, Strategy::Allreduce, 2, 2, 0)];
        let d = decide_for(
            Inputs {
                jobs: &jobs,
                live: &live,
                managed_live: [managed.id].into(),
                pending: 1,
                managed_total: 2,
                idle: idle.clone(),
                ..Inputs::default()
            },
            &template(1024),
            &limits(4, 4),
        );
        assert!(d.release.is_empty(), "{:?}", d.release);
        assert_eq!(d.start, 0);
        // Nothing pending: the job is a candidate for new executors, and
        // the idle one is kept as well.
        let d = decide_for(
            Inputs {
                jobs: &jobs,
                live: &live,
                managed_live: [managed.id].into(),
                pending: 0,
                managed_total: 1,
                idle,
                ..Inputs::default()
            },
            &template(1024),
            &limits(4, 4),
        );
        assert!(d.release.is_empty(), "{:?}", d.release);
        assert_eq!(d.start, 1);
    }

    #[test]
    fn an_uninspected_model_gets_one_executor_to_inspect_it() {
        let d = decide_for(
            Inputs {
                needs_inspector: true,
                ..Inputs::default()
            },
            &template(1024),
            &limits(2, 2),
        );
        assert_eq!(d.start, 1);
    }

    #[test]
    fn placed_jobs_do_not_provision_for_growth() {
        let mut j = job(1, Strategy::Allreduce, 1, 4, 0);
        let live = [hand(1, 1024)];
        j.current = Some(Placement {
            strategy: Strategy::Allreduce,
            workers: vec![WorkerRole {
                rank: 0,
                executor: live[0].id,
                device: 0,
            }],
            parameter_servers: Vec::new(),
        });
        let jobs = [j];
        let d = decide_for(
            Inputs {
                jobs: &jobs,
                live: &live,
                ..Inputs::default()
            },
            &template(1024),
            &limits(4, 4),
        );
        assert_eq!(d, Decision::default());
    }

    proptest! {
        /// Whatever the queue: starts stay within the budget, releases are
        /// only ever idle provisioned executors past their timeout, a job is
        /// never both served and blocked, and starting what was decided
        /// leaves no served job waiting.
        #[test]
        fn decisions_respect_limits_and_serve_what_they_claim(
            sizes in proptest::collection::vec((1u32..5, 0u32..3, proptest::bool::ANY), 0..5),
            hands in 0u32..3,
            pending in 0u32..3,
            max in 0u32..6,
            per_job in 1u32..6,
            idle_secs in proptest::collection::vec(0u64..20, 0..4),
        ) {
            let jobs: Vec<JobView> = sizes.iter().enumerate().map(|(i, &(min, ps, ring))| {
                if ring { job(i as u128, Strategy::Allreduce, min, min + 1, 0) }
                else { job(i as u128, Strategy::ParameterServer, min, min, ps.max(1)) }
            }).collect();
            let live: Vec<ExecutorView> = (0..hands).map(|n| hand(u128::from(n) + 1, 2048)).collect();
            let idle: Vec<Idle> = idle_secs.iter().enumerate().map(|(i, &s)| Idle { name: format!("p{i}"), idle_for: Duration::from_secs(s) }).collect();
            let managed_total = pending + idle.len() as u32;
            let lim = limits(max, per_job);
            let t = template(1024);
            let inputs = Inputs { jobs: &jobs, live: &live, pending, managed_total, idle: idle.clone(), ..Inputs::default() };
            let d = decide_for(inputs, &t, &lim);
            prop_assert!(managed_total + d.start <= max.max(managed_total));
            for name in &d.release {
                prop_assert!(idle.iter().any(|i| &i.name == name && i.idle_for >= lim.idle_timeout));
            }
            for id in d.serves.keys() {
                prop_assert!(!d.blocked.contains_key(id));
                prop_assert!(d.serves[id] <= per_job.min(max));
            }
            if !d.release.is_empty() {
                prop_assert!(d.start == 0 && d.serves.is_empty());
            }
            // Starting `start` executors places every served job.
            let mut after = live.clone();
            after.extend((0..u128::from(pending + d.start)).map(|n| t.executor(n)));
            let p = plan(&jobs, &after);
            for id in d.serves.keys() {
                prop_assert!(p.placements.contains_key(id), "served job {id} still waits");
            }
        }
    }
}
