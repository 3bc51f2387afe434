//! Tests of quotas, fair share and preemption: unit cases, and property
//! tests that quotas always hold, that nothing is ever taken from a job of
//! equal or higher priority, that no gang is ever partial, and that in a
//! simulated cluster no job that fits waits more than a bounded number of
//! rounds.

use super::*;
use crate::plan::tests::{arb_executors, arb_jobs, check, cpu_exec, demand, job, GIB};
use crate::plan::{plan, plan_shared, Placement, Quota};
use proptest::prelude::{prop, prop_assert, prop_assert_eq, proptest};
use proptest::strategy::Strategy as _;
use std::collections::BTreeSet;
use trainyard_common::spec::{Device, Strategy};

fn owned(mut j: JobView, owner: &str) -> JobView {
    j.owner = owner.into();
    j
}

fn placed(mut j: JobView, p: &Plan) -> JobView {
    j.current = p.placements.get(&j.id).cloned();
    j
}

#[test]
fn decayed_usage_follows_the_formula() {
    // Without decay to speak of, device-seconds are workers × seconds.
    assert!((decayed(2.0, 10.0, 0.0, 1e12) - 20.0).abs() < 1e-6);
    // Usage one half-life ago counts half as much as usage just now.
    let h = 100.0;
    let now = decayed(1.0, 1.0, 0.0, h);
    let then = decayed(1.0, h + 1.0, h, h);
    assert!((then / now - 0.5).abs() < 1e-3, "{then} vs {now}");
    // The whole past of one device sums to H / ln 2.
    let all = decayed(1.0, 1e9, 0.0, h);
    assert!((all - h / std::f64::consts::LN_2).abs() < 1e-6);
    // Bad ages are clamped, never negative.
    assert_eq!(decayed(1.0, -5.0, -1.0, h), 0.0);
}

#[test]
fn the_owner_with_less_recent_usage_goes_first() {
    let execs = [cpu_exec(1, 2 * GIB, None)];
    let a = owned(
        job(1, 0, demand(Strategy::Allreduce, 1, 1, 0, GIB)),
        "alice",
    );
    let b = owned(job(2, 0, demand(Strategy::Allreduce, 1, 1, 0, GIB)), "bob");
    let jobs = [a.clone(), b.clone()];
    // Without usage, submission order: alice's.
    assert!(plan(&jobs, &execs).placements.contains_key(&a.id));
    let mut s = Sharing::default();
    s.usage.insert("alice".into(), 500.0);
    s.usage.insert("bob".into(), 20.0);
    let p = plan_shared(&jobs, &execs, &s);
    assert!(p.placements.contains_key(&b.id), "{p:?}");
    // Priority still comes before fair share.
    let urgent = owned(
        job(1, 5, demand(Strategy::Allreduce, 1, 1, 0, GIB)),
        "alice",
    );
    let p = plan_shared(&[urgent.clone(), b], &execs, &s);
    assert!(p.placements.contains_key(&urgent.id));
}

#[test]
fn a_job_over_its_owners_quota_waits_with_the_reason() {
    let execs: Vec<_> = (1..=4).map(|n| cpu_exec(n, 2 * GIB, None)).collect();
    let first = owned(
        job(1, 0, demand(Strategy::Allreduce, 2, 2, 0, GIB)),
        "alice",
    );
    let second = owned(
        job(2, 0, demand(Strategy::Allreduce, 1, 1, 0, GIB)),
        "alice",
    );
    let other = owned(job(3, 0, demand(Strategy::Allreduce, 1, 1, 0, GIB)), "bob");
    let mut s = Sharing::default();
    s.quotas.insert(
        "alice".into(),
        Quota {
            cpu_workers: Some(2),
            ..Quota::default()
        },
    );
    let jobs = [first.clone(), second.clone(), other.clone()];
    let p = plan_shared(&jobs, &execs, &s);
    check(&jobs, &execs, &p);
    assert!(p.placements.contains_key(&first.id));
    assert!(p.placements.contains_key(&other.id));
    let why = &p.waiting[&second.id];
    assert!(why.contains("quota") && why.contains("alice"), "{why}");
    assert!(p.over_quota.contains(&second.id));
    assert!(!p.capacity_waiting.contains(&second.id));
    // An elastic job grows only up to the quota.
    let elastic = owned(
        job(4, 0, demand(Strategy::Allreduce, 1, 4, 0, GIB)),
        "alice",
    );
    let p = plan_shared(std::slice::from_ref(&elastic), &execs, &s);
    assert_eq!(p.placements[&elastic.id].workers.len(), 2);
}

/// Four executors full of alice's elastic ring (1..4 workers); bob's job
/// of higher priority needs two.
fn elastic_world(victim_max: u32) -> (Vec<ExecutorView>, JobView, JobView) {
    let execs: Vec<_> = (1..=4).map(|n| cpu_exec(n, 2 * GIB, None)).collect();
    let a = owned(
        job(1, 0, demand(Strategy::Allreduce, 1, victim_max, 0, GIB)),
        "alice",
    );
    let first = plan(std::slice::from_ref(&a), &execs);
    let a = placed(a, &first);
    let b = owned(job(2, 5, demand(Strategy::Allreduce, 2, 2, 0, GIB)), "bob");
    (execs, a, b)
}

#[test]
fn a_higher_priority_job_shrinks_an_elastic_one_and_it_grows_back() {
    let (execs, a, b) = elastic_world(4);
    assert_eq!(a.current.as_ref().unwrap().workers.len(), 4);
    let jobs = [a.clone(), b.clone()];
    let (s, actions, p) = preempt(&jobs, &execs, &Sharing::default());
    check(&jobs, &execs, &p);
    assert_eq!(
        actions,
        vec![Action::Shrink {
            victim: a.id,
            by: b.id,
            from: 4,
            to: 2
        }]
    );
    assert_eq!(
        p.placements[&a.id].workers.len(),
        2,
        "still running, smaller"
    );
    assert_eq!(p.placements[&b.id].workers.len(), 2);
    assert_eq!(s.caps.get(&a.id), Some(&2));
    // Next round: both keep their roles, nothing more is taken.
    let jobs2 = [placed(a.clone(), &p), placed(b.clone(), &p)];
    let (_, again, p2) = preempt(&jobs2, &execs, &Sharing::default());
    assert!(again.is_empty(), "{again:?}");
    assert_eq!(p2.placements[&a.id].workers.len(), 2);
    // Bob's job ends: alice's grows back.
    let (_, _, p3) = preempt(&jobs2[..1], &execs, &Sharing::default());
    assert_eq!(p3.placements[&a.id].workers.len(), 4);
}

#[test]
fn a_fixed_size_job_is_preempted_whole_and_equal_priority_never_is() {
    let (execs, a, b) = elastic_world(4);
    let mut fixed = a.clone();
    fixed.demand.min_workers = 4;
    let jobs = [fixed.clone(), b.clone()];
    let (s, actions, p) = preempt(&jobs, &execs, &Sharing::default());
    check(&jobs, &execs, &p);
    assert_eq!(
        actions,
        vec![Action::Preempt {
            victim: fixed.id,
            by: b.id
        }]
    );
    assert!(p.placements.contains_key(&b.id));
    assert!(p.waiting[&fixed.id].contains("preempted by job"));
    assert!(s.held_back.contains_key(&fixed.id));
    // The same job at equal priority takes nothing.
    let mut peer = b.clone();
    peer.priority = fixed.priority;
    let jobs = [fixed.clone(), peer.clone()];
    let (_, actions, p) = preempt(&jobs, &execs, &Sharing::default());
    assert!(actions.is_empty());
    assert!(p.waiting.contains_key(&peer.id));
    // Nor is anything taken when even all of it would not make room.
    let mut huge = b.clone();
    huge.demand.min_workers = 5;
    huge.demand.max_workers = 5;
    let (_, actions, _) = preempt(&[fixed, huge], &execs, &Sharing::default());
    assert!(actions.is_empty());
}

/// Jobs with owners among three users, priorities spread.
fn arb_owned_jobs() -> impl proptest::strategy::Strategy<Value = Vec<JobView>> {
    (arb_jobs(), prop::collection::vec(0u8..3, 8)).prop_map(|(jobs, owners)| {
        jobs.into_iter()
            .enumerate()
            .map(|(i, mut j)| {
                j.owner = format!("u{}", owners[i % owners.len()]);
                j
            })
            .collect()
    })
}

fn arb_quotas() -> impl proptest::strategy::Strategy<Value = BTreeMap<String, Quota>> {
    prop::collection::vec(
        (
            prop::option::of(0u32..4),
            prop::option::of(0u32..4),
            prop::option::of(0u64..6),
        ),
        3,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (c, w, r))| {
                (
                    format!("u{i}"),
                    Quota {
                        cuda_devices: c,
                        cpu_workers: w,
                        ps_ram_bytes: r.map(|g| g * GIB),
                    },
                )
            })
            .collect()
    })
}

/// Per owner: cuda workers, cpu workers, PS RAM held in `p`.
fn holdings(jobs: &[JobView], p: &Plan) -> BTreeMap<String, (u32, u32, u64)> {
    let mut out: BTreeMap<String, (u32, u32, u64)> = BTreeMap::new();
    for j in jobs {
        let Some(pl) = p.placements.get(&j.id) else {
            continue;
        };
        let e = out.entry(j.owner.clone()).or_default();
        let n = pl.workers.len() as u32;
        match j.demand.device {
            Device::Cuda => e.0 += n,
            Device::Cpu => e.1 += n,
        }
        let shards = pl.parameter_servers.len() as u32;
        let roles = pl.parameter_servers.len()
            + pl.parameter_servers
                .iter()
                .filter(|s| s.standby.is_some())
                .count();
        e.2 += crate::plan::ps_bytes(&j.demand, shards) * roles as u64;
    }
    out
}

fn quotas_hold(quotas: &BTreeMap<String, Quota>, jobs: &[JobView], p: &Plan) -> Result<(), String> {
    for (owner, (cuda, cpu, ram)) in holdings(jobs, p) {
        let q = quotas.get(&owner).copied().unwrap_or_default();
        if q.cuda_devices.is_some_and(|m| cuda > m)
            || q.cpu_workers.is_some_and(|m| cpu > m)
            || q.ps_ram_bytes.is_some_and(|m| ram > m)
        {
            return Err(format!(
                "{owner} holds {cuda} cuda, {cpu} cpu, {ram} B PS RAM over {q:?}"
            ));
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn quotas_always_hold_and_gangs_are_whole(execs in arb_executors(), jobs in arb_owned_jobs(), quotas in arb_quotas(), lose in prop::collection::vec(proptest::prelude::any::<bool>(), 10)) {
        let s = Sharing { quotas: quotas.clone(), ..Sharing::default() };
        // Placed without quotas first, then planned under them (a lowered
        // quota), also after losing executors.
        let free = plan(&jobs, &execs);
        let jobs2: Vec<JobView> = jobs.iter().cloned().map(|j| placed(j, &free)).collect();
        let survivors: Vec<ExecutorView> = execs.iter().enumerate().filter(|(i, _)| !lose[*i]).map(|(_, e)| e.clone()).collect();
        for (js, es) in [(&jobs, &execs), (&jobs2, &execs), (&jobs2, &survivors)] {
            let p = plan_shared(js, es, &s);
            check(js, es, &p);
            prop_assert!(quotas_hold(&quotas, js, &p).is_ok(), "{:?}", quotas_hold(&quotas, js, &p));
            let (_, _, pp) = preempt(js, es, &s);
            check(js, es, &pp);
            prop_assert!(quotas_hold(&quotas, js, &pp).is_ok(), "{:?}", quotas_hold(&quotas, js, &pp));
        }
    }

    #[test]
    fn preemption_takes_only_from_lower_priority_and_only_to_place(execs in arb_executors(), running in arb_owned_jobs(), arriving in arb_owned_jobs()) {
        let first = plan(&running, &execs);
        let mut jobs: Vec<JobView> = running.iter().cloned().map(|j| placed(j, &first)).collect();
        jobs.extend(arriving.into_iter().map(|mut j| { j.id = Uuid::from_u128(j.id.as_u128() + 500); j.seq += 100; j }));
        let by_id: HashMap<Uuid, &JobView> = jobs.iter().map(|j| (j.id, j)).collect();
        let (s, actions, p) = preempt(&jobs, &execs, &Sharing::default());
        check(&jobs, &execs, &p);
        prop_assert_eq!(&p, &plan_shared(&jobs, &execs, &s));
        let mut made_room_for = BTreeSet::new();
        for a in &actions {
            let (victim, by) = match a {
                Action::Shrink { victim, by, from, to } => {
                    prop_assert!(to < from);
                    prop_assert!(*to >= by_id[victim].demand.min_workers, "shrunk below workers.min");
                    prop_assert_eq!(p.placements[victim].workers.len() as u32, *to);
                    (victim, by)
                }
                Action::Preempt { victim, by } => {
                    prop_assert!(!p.placements.contains_key(victim));
                    (victim, by)
                }
            };
            prop_assert!(by_id[victim].priority < by_id[by].priority, "took from equal or higher priority");
            prop_assert!(by_id[victim].current.is_some());
            prop_assert!(by_id[by].current.is_none());
            made_room_for.insert(*by);
        }
        // Every job something was taken for starts in this plan.
        for by in made_room_for {
            prop_assert!(p.placements.contains_key(&by), "took capacity for a job that still waits");
        }
    }

    /// A simulated cluster over rounds: jobs of three users (equal
    /// priority) arrive, run for a few rounds and end. A job waiting longer
    /// than `STARVE` rounds is marked starving, as the service does by
    /// time. Every job that fits the cluster alone starts within
    /// `STARVE + jobs × longest run` rounds of arriving.
    #[test]
    fn no_job_that_fits_waits_more_than_a_bounded_number_of_rounds(execs in arb_executors(), jobs in arb_owned_jobs(), arrivals in prop::collection::vec(0u32..6, 8), runs in prop::collection::vec(1u32..4, 8)) {
        const STARVE: u32 = 3;
        let jobs: Vec<JobView> = jobs.into_iter().map(|mut j| { j.priority = 0; j }).collect();
        let n = jobs.len() as u32;
        let longest = 3;
        let bound = STARVE + n * longest + 1;
        let fits: BTreeSet<Uuid> = jobs.iter().filter(|j| plan(std::slice::from_ref(*j), &execs).placements.contains_key(&j.id)).map(|j| j.id).collect();
        let arrive: HashMap<Uuid, u32> = jobs.iter().enumerate().map(|(i, j)| (j.id, arrivals[i % arrivals.len()])).collect();
        let run: HashMap<Uuid, u32> = jobs.iter().enumerate().map(|(i, j)| (j.id, runs[i % runs.len()])).collect();
        let mut current: HashMap<Uuid, Placement> = HashMap::new();
        let mut started: HashMap<Uuid, u32> = HashMap::new();
        let mut done: BTreeSet<Uuid> = BTreeSet::new();
        let mut usage: BTreeMap<String, f64> = BTreeMap::new();
        for round in 0..(6 + bound + 2) {
            let view: Vec<JobView> = jobs.iter().filter(|j| arrive[&j.id] <= round && !done.contains(&j.id)).map(|j| {
                let mut v = j.clone();
                v.current = current.get(&j.id).cloned();
                v.starving = v.current.is_none() && round - arrive[&j.id] >= STARVE;
                v
            }).collect();
            let s = Sharing { usage: usage.clone(), ..Sharing::default() };
            let p = plan_shared(&view, &execs, &s);
            check(&view, &execs, &p);
            for v in &view {
                match p.placements.get(&v.id) {
                    Some(pl) => {
                        started.entry(v.id).or_insert(round);
                        *usage.entry(v.owner.clone()).or_default() += pl.workers.len() as f64;
                        current.insert(v.id, pl.clone());
                    }
                    None => { current.remove(&v.id); }
                }
            }
            for (id, at) in &started {
                if round + 1 - at >= run[id] {
                    done.insert(*id);
                    current.remove(id);
                }
            }
            for j in &jobs {
                if fits.contains(&j.id) && !started.contains_key(&j.id) && arrive[&j.id] <= round {
                    prop_assert!(round - arrive[&j.id] <= bound, "job {} waited {} rounds (bound {bound})", j.id, round - arrive[&j.id]);
                }
            }
        }
    }
}
