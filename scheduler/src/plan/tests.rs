//! Unit and property tests of the planner.

use super::capacity::kind_key;
use super::*;
use crate::shard::shard_ranges;
use proptest::prelude::{any, prop, prop_assert, prop_assert_eq, proptest};
use proptest::strategy::Strategy as _;
use trainyard_common::model::parameters;
use trainyard_common::spec::{MlpSpec, ModelSpec, MAX_PS_REPLICAS};

pub(crate) const GIB: u64 = 1 << 30;
pub(crate) const MIB: u64 = 1 << 20;

pub(crate) fn id(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

pub(crate) fn cpu_exec(n: u128, ram: u64, host: Option<&str>) -> ExecutorView {
    ExecutorView {
        id: id(n),
        host: host.map(str::to_owned),
        ram_bytes: ram,
        devices: vec![DeviceSlot {
            kind: Device::Cpu,
            index: 0,
            memory_bytes: ram,
        }],
        held: Vec::new(),
    }
}

fn mlp_params(hidden: u32) -> Vec<ParamInfo> {
    parameters(&ModelSpec::Mlp(MlpSpec {
        inputs: 64,
        hidden: vec![hidden],
        outputs: 10,
    }))
    .unwrap()
}

pub(crate) fn demand(strategy: Strategy, min: u32, max: u32, ps: u32, mem: u64) -> Demand {
    let params = mlp_params(128);
    let n: u64 = params.iter().map(ParamInfo::numel).sum();
    Demand {
        strategy,
        device: Device::Cpu,
        min_workers: min,
        max_workers: max,
        parameter_servers: ps,
        memory_bytes: mem,
        estimate: Some(MemoryEstimate::new(
            n,
            trainyard_common::spec::OptimizerKind::Adam,
            true,
        )),
        params: Some(params),
    }
}

pub(crate) fn job(n: u128, priority: i32, d: Demand) -> JobView {
    JobView {
        id: id(1000 + n),
        priority,
        seq: n as i64,
        demand: d,
        current: None,
        owner: format!("u{}", n % 3),
        starving: false,
        excluded: Default::default(),
    }
}

/// Checks every invariant of a plan; panics with a message on violation.
pub(crate) fn check(jobs: &[JobView], executors: &[ExecutorView], plan: &Plan) {
    let live: HashMap<Uuid, &ExecutorView> = executors.iter().map(|e| (e.id, e)).collect();
    let mut device_used: BTreeSet<(Uuid, u8, u32)> = BTreeSet::new();
    let mut ram_used: HashMap<Uuid, u64> = HashMap::new();
    let mut gpu_used: HashMap<(Uuid, u32), u64> = HashMap::new();
    for j in jobs {
        let placed = plan.placements.get(&j.id);
        assert!(
            placed.is_some() != plan.waiting.contains_key(&j.id),
            "job {} must be placed xor waiting",
            j.id
        );
        let Some(p) = placed else { continue };
        let d = &j.demand;
        let n = p.workers.len() as u32;
        assert!(
            n >= d.min_workers && n <= d.max_workers,
            "workers {n} outside [{}, {}]",
            d.min_workers,
            d.max_workers
        );
        assert_ne!(p.strategy, Strategy::Auto);
        if p.strategy == Strategy::Allreduce {
            assert!(p.parameter_servers.is_empty());
        } else {
            assert!(!p.parameter_servers.is_empty());
        }
        for (r, w) in p.workers.iter().enumerate() {
            assert_eq!(w.rank, r as u32);
            let e = live.get(&w.executor).expect("worker on a live executor");
            assert!(
                e.devices
                    .iter()
                    .any(|s| s.kind == d.device && s.index == w.device),
                "no such device"
            );
            assert!(
                device_used.insert((w.executor, kind_key(d.device), w.device)),
                "two workers on one device"
            );
            match d.device {
                Device::Cpu => *ram_used.entry(w.executor).or_default() += d.memory_bytes,
                Device::Cuda => {
                    *gpu_used.entry((w.executor, w.device)).or_default() += d.memory_bytes
                }
            }
        }
        for (s, ps) in p.parameter_servers.iter().enumerate() {
            assert_eq!(ps.shard, s as u32);
            assert!(live.contains_key(&ps.executor), "PS on a live executor");
            *ram_used.entry(ps.executor).or_default() +=
                ps_bytes(d, p.parameter_servers.len() as u32);
            if replicas(d) == 0 {
                assert_eq!(ps.standby, None, "a standby without replicas");
            } else if j.current.is_none() {
                assert!(
                    ps.standby.is_some(),
                    "a new replicated job without a standby"
                );
            }
            if let Some(sb) = ps.standby {
                assert_ne!(sb, ps.executor, "a standby on its shard's executor");
                assert!(live.contains_key(&sb), "standby on a live executor");
                *ram_used.entry(sb).or_default() += ps_bytes(d, p.parameter_servers.len() as u32);
            }
        }
        if p.strategy == Strategy::Allreduce {
            // Workers of one host are adjacent in rank order.
            let hosts: Vec<Option<&String>> = p
                .workers
                .iter()
                .map(|w| live[&w.executor].host.as_ref())
                .collect();
            let mut seen = BTreeSet::new();
            for (i, h) in hosts.iter().enumerate() {
                if i > 0 && hosts[i - 1] == *h {
                    continue;
                }
                assert!(seen.insert(*h), "host {h:?} not contiguous in {hosts:?}");
            }
        }
    }
    for (e, used) in ram_used {
        assert!(used <= live[&e].ram_bytes, "RAM over-committed on {e}");
    }
    for ((e, i), used) in gpu_used {
        let mem = live[&e]
            .devices
            .iter()
            .find(|d| d.kind == Device::Cuda && d.index == i)
            .unwrap()
            .memory_bytes;
        assert!(used <= mem, "GPU memory over-committed");
    }
}

#[test]
fn ps_job_is_placed_and_a_lost_role_moves_to_the_spare() {
    let execs: Vec<ExecutorView> = (1..=5).map(|n| cpu_exec(n, 4 * GIB, None)).collect();
    let j = job(1, 0, demand(Strategy::ParameterServer, 2, 2, 2, GIB));
    let p1 = plan(std::slice::from_ref(&j), &execs);
    check(std::slice::from_ref(&j), &execs, &p1);
    let placed = &p1.placements[&j.id];
    assert_eq!(placed.workers.len(), 2);
    assert_eq!(placed.parameter_servers.len(), 2);
    // Shards are spread over two executors.
    assert_ne!(
        placed.parameter_servers[0].executor,
        placed.parameter_servers[1].executor
    );

    // Lose the executor of PS shard 0.
    let lost = placed.parameter_servers[0].executor;
    let survivors: Vec<ExecutorView> = execs.iter().filter(|e| e.id != lost).cloned().collect();
    let mut j2 = j.clone();
    j2.current = Some(placed.clone());
    let p2 = plan(std::slice::from_ref(&j2), &survivors);
    check(std::slice::from_ref(&j2), &survivors, &p2);
    let after = &p2.placements[&j.id];
    assert_ne!(after.parameter_servers[0].executor, lost);
    // Everything else stayed put.
    assert_eq!(after.parameter_servers[1], placed.parameter_servers[1]);
    assert_eq!(after.workers, placed.workers);
}

pub(crate) fn replicated(d: Demand) -> Demand {
    Demand {
        estimate: d.estimate.map(|e| e.with_ps_replicas(1)),
        ..d
    }
}

#[test]
fn a_standby_never_shares_its_shards_executor_and_a_job_without_room_for_one_waits() {
    // Two executors: room for two shards, but each standby must sit
    // beside the other shard.
    let execs: Vec<ExecutorView> = (1..=2).map(|n| cpu_exec(n, 4 * GIB, None)).collect();
    let j = job(
        1,
        0,
        replicated(demand(Strategy::ParameterServer, 1, 1, 2, GIB)),
    );
    let p = plan(std::slice::from_ref(&j), &execs);
    check(std::slice::from_ref(&j), &execs, &p);
    for ps in &p.placements[&j.id].parameter_servers {
        assert_ne!(ps.standby, Some(ps.executor));
        assert!(ps.standby.is_some());
    }
    // One executor: a shard fits, its standby cannot go anywhere else.
    let one = [cpu_exec(1, 64 * GIB, None)];
    let j = job(
        2,
        0,
        replicated(demand(Strategy::ParameterServer, 1, 1, 1, GIB)),
    );
    let p = plan(std::slice::from_ref(&j), &one);
    check(std::slice::from_ref(&j), &one, &p);
    let why = &p.waiting[&j.id];
    assert!(why.contains("standby"), "{why}");
    // Without replicas the same job runs there.
    let plain = job(3, 0, demand(Strategy::ParameterServer, 1, 1, 1, GIB));
    assert!(plan(std::slice::from_ref(&plain), &one)
        .placements
        .contains_key(&plain.id));
}

#[test]
fn a_lost_primary_is_replaced_by_its_standby_and_a_new_standby_is_placed() {
    let execs: Vec<ExecutorView> = (1..=5).map(|n| cpu_exec(n, 4 * GIB, None)).collect();
    let j = job(
        1,
        0,
        replicated(demand(Strategy::ParameterServer, 2, 2, 2, GIB)),
    );
    let p1 = plan(std::slice::from_ref(&j), &execs);
    check(std::slice::from_ref(&j), &execs, &p1);
    let placed = &p1.placements[&j.id];
    let lost = placed.parameter_servers[1].executor;
    let standby = placed.parameter_servers[1].standby.unwrap();
    let survivors: Vec<ExecutorView> = execs.iter().filter(|e| e.id != lost).cloned().collect();
    let mut j2 = j.clone();
    j2.current = Some(placed.clone());
    let p2 = plan(std::slice::from_ref(&j2), &survivors);
    check(std::slice::from_ref(&j2), &survivors, &p2);
    let after = &p2.placements[&j.id];
    // The shard stays where its state is.
    assert_eq!(after.parameter_servers[1].executor, standby);
    let new_standby = after.parameter_servers[1].standby.expect("a new standby");
    assert_ne!(new_standby, standby);
    assert_ne!(new_standby, lost);
    assert_eq!(after.parameter_servers[0], placed.parameter_servers[0]);
    assert_eq!(after.workers, placed.workers);

    // No room for a new standby: the promoted shard runs without one.
    let d = replicated(demand(Strategy::ParameterServer, 1, 1, 1, GIB));
    let params = d.params.clone().unwrap();
    let (a, b, w) = (id(1), id(2), id(3));
    let mut j3 = job(3, 0, d);
    j3.current = Some(Placement {
        strategy: Strategy::ParameterServer,
        workers: vec![WorkerRole {
            rank: 0,
            executor: w,
            device: 0,
        }],
        parameter_servers: vec![PsRole {
            shard: 0,
            executor: a,
            ranges: shard_ranges(&params, 1, 0),
            standby: Some(b),
        }],
    });
    let left = [cpu_exec(2, 4 * GIB, None), cpu_exec(3, GIB, None)];
    let p3 = plan(std::slice::from_ref(&j3), &left);
    check(std::slice::from_ref(&j3), &left, &p3);
    let after = &p3.placements[&j3.id];
    assert_eq!(after.parameter_servers[0].executor, b);
    assert_eq!(after.parameter_servers[0].standby, None);
    // An executor joins: the standby is placed there at the next plan.
    j3.current = Some(after.clone());
    let more = [left[0].clone(), left[1].clone(), cpu_exec(4, 4 * GIB, None)];
    let p4 = plan(std::slice::from_ref(&j3), &more);
    check(std::slice::from_ref(&j3), &more, &p4);
    let after = &p4.placements[&j3.id];
    assert_eq!(after.parameter_servers[0].executor, b);
    assert_eq!(after.parameter_servers[0].standby, Some(id(4)));
}

#[test]
fn a_job_grows_to_its_maximum_as_executors_join() {
    let mut execs: Vec<ExecutorView> = (1..=2).map(|n| cpu_exec(n, 2 * GIB, None)).collect();
    let j = job(1, 0, demand(Strategy::Allreduce, 2, 4, 0, GIB));
    let p = plan(std::slice::from_ref(&j), &execs);
    assert_eq!(p.placements[&j.id].workers.len(), 2);
    execs.push(cpu_exec(3, 2 * GIB, None));
    execs.push(cpu_exec(4, 2 * GIB, None));
    execs.push(cpu_exec(5, 2 * GIB, None));
    let mut j2 = j.clone();
    j2.current = Some(p.placements[&j.id].clone());
    let p = plan(std::slice::from_ref(&j2), &execs);
    assert_eq!(p.placements[&j.id].workers.len(), 4);
}

#[test]
fn gang_admission_is_all_or_nothing_and_smaller_jobs_backfill() {
    let execs: Vec<ExecutorView> = (1..=2).map(|n| cpu_exec(n, 2 * GIB, None)).collect();
    let big = job(1, 10, demand(Strategy::Allreduce, 3, 3, 0, GIB));
    let small = job(2, 0, demand(Strategy::Allreduce, 1, 1, 0, GIB));
    let jobs = [big.clone(), small.clone()];
    let p = plan(&jobs, &execs);
    check(&jobs, &execs, &p);
    assert!(
        p.waiting[&big.id].contains("needs 3 cpu worker device(s)"),
        "{:?}",
        p.waiting
    );
    assert_eq!(p.placements[&small.id].workers.len(), 1);
}

#[test]
fn competing_jobs_never_each_hold_half() {
    let execs: Vec<ExecutorView> = (1..=4).map(|n| cpu_exec(n, 2 * GIB, None)).collect();
    let a = job(1, 0, demand(Strategy::Allreduce, 3, 3, 0, GIB));
    let b = job(2, 0, demand(Strategy::Allreduce, 3, 3, 0, GIB));
    let jobs = [a.clone(), b.clone()];
    let p = plan(&jobs, &execs);
    check(&jobs, &execs, &p);
    assert_eq!(p.placements.len(), 1);
    assert!(
        p.placements.contains_key(&a.id),
        "submission order breaks the tie"
    );
}

#[test]
fn priority_goes_first() {
    let execs = vec![cpu_exec(1, 2 * GIB, None)];
    let low = job(1, 0, demand(Strategy::Allreduce, 1, 1, 0, GIB));
    let high = job(2, 5, demand(Strategy::Allreduce, 1, 1, 0, GIB));
    let p = plan(&[low.clone(), high.clone()], &execs);
    assert!(p.placements.contains_key(&high.id));
    assert!(p.waiting.contains_key(&low.id));
}

#[test]
fn a_device_a_stopped_role_still_holds_is_not_placed_until_released() {
    let mut execs = vec![cpu_exec(1, 8 * GIB, None), cpu_exec(2, 8 * GIB, None)];
    execs[0].held = vec![(Device::Cpu, 0)];
    let j = job(1, 0, demand(Strategy::Allreduce, 1, 2, 0, GIB));
    let p = plan(std::slice::from_ref(&j), &execs);
    let ranks: Vec<Uuid> = p.placements[&j.id]
        .workers
        .iter()
        .map(|w| w.executor)
        .collect();
    assert_eq!(ranks, vec![id(2)], "only the free executor is used");
    // Held everywhere: the job waits.
    execs[1].held = vec![(Device::Cpu, 0)];
    assert!(plan(std::slice::from_ref(&j), &execs)
        .waiting
        .contains_key(&j.id));
    // Released: both executors are used.
    execs[0].held.clear();
    execs[1].held.clear();
    assert_eq!(
        plan(std::slice::from_ref(&j), &execs).placements[&j.id]
            .workers
            .len(),
        2
    );
    // A job placed there already keeps its device.
    let mut placed = j.clone();
    placed.current = plan(std::slice::from_ref(&j), &execs)
        .placements
        .get(&j.id)
        .cloned();
    execs[0].held = vec![(Device::Cpu, 0)];
    assert_eq!(
        plan(std::slice::from_ref(&placed), &execs).placements[&j.id]
            .workers
            .len(),
        2
    );
}

#[test]
fn ps_never_takes_a_gpu_and_workers_get_one_each() {
    let gpu = |n: u128| ExecutorView {
        id: id(n),
        host: None,
        ram_bytes: 8 * GIB,
        devices: vec![
            DeviceSlot {
                kind: Device::Cpu,
                index: 0,
                memory_bytes: 8 * GIB,
            },
            DeviceSlot {
                kind: Device::Cuda,
                index: 0,
                memory_bytes: 16 * GIB,
            },
            DeviceSlot {
                kind: Device::Cuda,
                index: 1,
                memory_bytes: 16 * GIB,
            },
        ],
        held: Vec::new(),
    };
    let execs = vec![gpu(1), gpu(2)];
    let mut d = demand(Strategy::ParameterServer, 4, 8, 2, 4 * GIB);
    d.device = Device::Cuda;
    let j = job(1, 0, d);
    let p = plan(std::slice::from_ref(&j), &execs);
    check(std::slice::from_ref(&j), &execs, &p);
    assert_eq!(p.placements[&j.id].workers.len(), 4, "one per GPU");
    assert_eq!(p.placements[&j.id].parameter_servers.len(), 2);
}

#[test]
fn auto_decides_by_memory_and_says_why() {
    let execs = vec![cpu_exec(1, 4 * GIB, None), cpu_exec(2, 4 * GIB, None)];
    let small = job(1, 0, demand(Strategy::Auto, 1, 1, 1, 512 * MIB));
    let p = plan(std::slice::from_ref(&small), &execs);
    assert_eq!(p.placements[&small.id].strategy, Strategy::Allreduce);
    assert!(p.decisions[&small.id].contains("auto chose allreduce"));

    let mut big = demand(Strategy::Auto, 1, 1, 1, 512 * MIB);
    // 400 M parameters with Adam: 6.4 GB per replica, more than 80% of 4 GiB.
    big.estimate = Some(MemoryEstimate::new(
        400_000_000,
        trainyard_common::spec::OptimizerKind::Adam,
        true,
    ));
    let big = job(2, 0, big);
    // 6.4 GB per replica does not fit 80% of 7 GiB: PS, whose workers need
    // 3.2 GB each and whose shards fit the remaining RAM.
    let roomy: Vec<ExecutorView> = (1..=4).map(|n| cpu_exec(n, 7 * GIB, None)).collect();
    let p = plan(std::slice::from_ref(&big), &roomy);
    let why = &p.decisions[&big.id];
    assert!(why.contains("auto chose parameter_server"), "{why}");
    let placed = &p.placements[&big.id];
    assert_eq!(placed.strategy, Strategy::ParameterServer);
    check(std::slice::from_ref(&big), &roomy, &p);
}

/// A model's buffers count in `auto`'s arithmetic (here they tip it from
/// allreduce to the PS pattern), and its shards hold them after their
/// parameters, marked as buffers; frozen tensors are in no shard.
#[test]
fn auto_counts_buffers_and_shards_hold_them_at_their_tail() {
    use trainyard_common::model::TensorKind;
    let adam = trainyard_common::spec::OptimizerKind::Adam;
    let execs: Vec<ExecutorView> = (1..=4).map(|n| cpu_exec(n, 4 * GIB, None)).collect();
    // 100 M parameters with Adam: 1.6 GB per replica, within 80% of 4 GiB;
    // 250 M buffer elements add 2 GB and 50 M frozen ones 0.2 GB: 3.8 GB
    // is not.
    let tensors = vec![
        ParamInfo::new("fc.weight", &[100_000, 1000]),
        ParamInfo::new("bn.running_mean", &[250_000, 1000]).with(TensorKind::Buffer, "float32"),
        ParamInfo::new("emb.weight", &[50_000, 1000]).with(TensorKind::Frozen, "float32"),
        ParamInfo::new("bn.num_batches_tracked", &[]).with(TensorKind::Buffer, "int64"),
    ];
    let mut d = demand(Strategy::Auto, 1, 1, 1, 512 * MIB);
    d.estimate = Some(MemoryEstimate::new(100_000_000, adam, true));
    let p = plan(&[job(1, 0, d.clone())], &execs);
    assert_eq!(p.placements[&id(1001)].strategy, Strategy::Allreduce);

    d.estimate = Some(MemoryEstimate::of(&tensors, adam, true));
    d.params = Some(tensors.clone());
    let j = job(2, 0, d);
    let p = plan(std::slice::from_ref(&j), &execs);
    check(std::slice::from_ref(&j), &execs, &p);
    let why = &p.decisions[&j.id];
    assert!(why.contains("auto chose parameter_server"), "{why}");
    let shards = &p.placements[&j.id].parameter_servers;
    assert!(shards.len() > 1, "{why}");
    let mut elements = 0;
    for s in shards {
        let names: Vec<(&str, bool)> = s.ranges.iter().map(|r| (&r.param[..], r.buffer)).collect();
        let head = names.iter().take_while(|(_, b)| !b).count();
        assert!(
            head > 0
                && names[head..]
                    .iter()
                    .all(|(n, b)| *b && n.starts_with("bn.")),
            "{names:?}"
        );
        assert!(
            names[..head].iter().all(|(n, _)| *n == "fc.weight"),
            "{names:?}"
        );
        elements += crate::shard::range_elements(&s.ranges);
    }
    assert_eq!(elements, 350_000_001, "parameters and buffers, once each");
}

#[test]
fn ring_keeps_hosts_adjacent() {
    let hosts = ["b", "a", "b", "a", "c", "b"];
    let execs: Vec<ExecutorView> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| cpu_exec(i as u128 + 1, 2 * GIB, Some(h)))
        .collect();
    let j = job(1, 0, demand(Strategy::Allreduce, 6, 6, 0, GIB));
    let p = plan(std::slice::from_ref(&j), &execs);
    check(std::slice::from_ref(&j), &execs, &p);
    // `check` asserts contiguity only of a placed job: this one must be.
    let placed = p
        .placements
        .get(&j.id)
        .unwrap_or_else(|| panic!("six executors fit six ranks: {:?}", p.waiting));
    let by_id: HashMap<Uuid, &ExecutorView> = execs.iter().map(|e| (e.id, e)).collect();
    let order: Vec<&str> = placed
        .workers
        .iter()
        .map(|w| by_id[&w.executor].host.as_deref().unwrap())
        .collect();
    assert_eq!(order.len(), 6);
    // Three runs, one per host, in rank order: the ring crosses hosts
    // three times, not six.
    let runs = 1 + order.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(runs, 3, "ranks by host: {order:?}");
}

pub(crate) fn arb_executors() -> impl proptest::strategy::Strategy<Value = Vec<ExecutorView>> {
    prop::collection::vec(
        (
            1u64..16,
            prop::collection::vec(4u64..40, 0..3),
            prop::option::of(0u8..3),
            any::<bool>(),
        ),
        0..10,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (ram, gpus, host, has_cpu))| {
                let mut devices: Vec<DeviceSlot> = gpus
                    .iter()
                    .enumerate()
                    .map(|(g, m)| DeviceSlot {
                        kind: Device::Cuda,
                        index: g as u32,
                        memory_bytes: m * GIB,
                    })
                    .collect();
                if has_cpu || gpus.is_empty() {
                    devices.push(DeviceSlot {
                        kind: Device::Cpu,
                        index: 0,
                        memory_bytes: ram * 512 * MIB,
                    });
                }
                ExecutorView {
                    id: id(i as u128 + 1),
                    host: host.map(|h| format!("h{h}")),
                    ram_bytes: ram * 512 * MIB,
                    devices,
                    held: Vec::new(),
                }
            })
            .collect()
    })
}

pub(crate) fn arb_jobs() -> impl proptest::strategy::Strategy<Value = Vec<JobView>> {
    prop::collection::vec(
        (
            0u8..3,
            any::<bool>(),
            1u32..4,
            0u32..3,
            1u32..3,
            1u64..8,
            -2i32..3,
            0u32..=MAX_PS_REPLICAS,
        ),
        0..8,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (s, cuda, min, extra, ps, mem, prio, replicas))| {
                let strategy = [
                    Strategy::ParameterServer,
                    Strategy::Allreduce,
                    Strategy::Auto,
                ][s as usize];
                let mut d = demand(strategy, min, min + extra, ps, mem * 256 * MIB);
                if cuda {
                    d.device = Device::Cuda;
                }
                d.estimate = d.estimate.map(|e| e.with_ps_replicas(replicas));
                job(i as u128, prio, d)
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn plans_never_over_commit_and_are_all_or_nothing(execs in arb_executors(), jobs in arb_jobs()) {
        let p = plan(&jobs, &execs);
        check(&jobs, &execs, &p);
    }

    #[test]
    fn replans_after_losses_keep_invariants_and_survivors(execs in arb_executors(), jobs in arb_jobs(), lose in prop::collection::vec(any::<bool>(), 10)) {
        let first = plan(&jobs, &execs);
        let survivors: Vec<ExecutorView> = execs.iter().enumerate().filter(|(i, _)| !lose[*i]).map(|(_, e)| e.clone()).collect();
        let jobs2: Vec<JobView> = jobs.iter().map(|j| JobView { current: first.placements.get(&j.id).cloned(), ..j.clone() }).collect();
        let second = plan(&jobs2, &survivors);
        check(&jobs2, &survivors, &second);
        let live: BTreeSet<Uuid> = survivors.iter().map(|e| e.id).collect();
        for (jid, before) in &first.placements {
            if let Some(after) = second.placements.get(jid) {
                prop_assert_eq!(after.strategy, before.strategy);
                for w in before.workers.iter().filter(|w| live.contains(&w.executor)) {
                    prop_assert!(after.workers.iter().any(|a| a.executor == w.executor && a.device == w.device), "a surviving worker was moved");
                }
                for ps in &before.parameter_servers {
                    let now = &after.parameter_servers[ps.shard as usize];
                    prop_assert_eq!(&now.ranges, &ps.ranges);
                    let standby_lives = ps.standby.is_some_and(|e| live.contains(&e));
                    if live.contains(&ps.executor) {
                        prop_assert_eq!(now.executor, ps.executor, "a surviving shard was moved");
                        if standby_lives {
                            prop_assert_eq!(now.standby, ps.standby, "a surviving standby was moved");
                        }
                    } else if standby_lives {
                        prop_assert_eq!(Some(now.executor), ps.standby, "a surviving standby was not promoted");
                    }
                }
            }
        }
    }

    /// A job that leaves some executors (its watchdog's exclusions) gets
    /// no role there, kept or new; other jobs may still use them, and the
    /// plan keeps every invariant.
    #[test]
    fn a_job_gets_no_role_on_an_executor_it_left(execs in arb_executors(), jobs in arb_jobs(), leave in prop::collection::vec(any::<bool>(), 10), which in any::<usize>()) {
        let first = plan(&jobs, &execs);
        if jobs.is_empty() || execs.is_empty() {
            return Ok(());
        }
        let chosen = jobs[which % jobs.len()].id;
        let left: BTreeSet<Uuid> = execs.iter().enumerate().filter(|(i, _)| leave[*i % leave.len()]).map(|(_, e)| e.id).collect();
        let jobs2: Vec<JobView> = jobs.iter().map(|j| JobView {
            current: first.placements.get(&j.id).cloned(),
            excluded: if j.id == chosen { left.clone() } else { BTreeSet::new() },
            ..j.clone()
        }).collect();
        let second = plan(&jobs2, &execs);
        check(&jobs2, &execs, &second);
        if let Some(p) = second.placements.get(&chosen) {
            for w in &p.workers {
                prop_assert!(!left.contains(&w.executor), "a worker on an executor the job left");
            }
            for ps in &p.parameter_servers {
                prop_assert!(!left.contains(&ps.executor), "a shard on an executor the job left");
                prop_assert!(ps.standby.is_none_or(|e| !left.contains(&e)), "a standby on an executor the job left");
            }
        }
    }

    #[test]
    fn plans_are_deterministic_whatever_the_input_order(execs in arb_executors(), jobs in arb_jobs(), seed in any::<u64>()) {
        let a = plan(&jobs, &execs);
        prop_assert_eq!(&a, &plan(&jobs, &execs));
        let mut e2 = execs.clone();
        let mut j2 = jobs.clone();
        // A cheap deterministic shuffle.
        let n = e2.len().max(1);
        e2.rotate_left((seed as usize) % n);
        e2.reverse();
        let m = j2.len().max(1);
        j2.rotate_left((seed as usize / 7) % m);
        j2.reverse();
        prop_assert_eq!(&a, &plan(&j2, &e2));
    }

    #[test]
    fn no_deadlock_if_any_job_fits_alone_one_is_placed(execs in arb_executors(), jobs in arb_jobs()) {
        let any_fits = jobs.iter().any(|j| plan(std::slice::from_ref(j), &execs).placements.contains_key(&j.id));
        let p = plan(&jobs, &execs);
        prop_assert_eq!(any_fits, !p.placements.is_empty());
    }
}
