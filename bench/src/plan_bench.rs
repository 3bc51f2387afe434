//! Planner benchmark: plan 1,000 queued jobs over 1,000 executors, then
//! re-plan after one executor is lost.
//!
//! Prints placements per second and the re-plan time, each beside its
//! target (≥ 1,000 placements/s, re-plan < 50 ms) as a ratio, plus a
//! baseline measured in the same run: the same planner over an empty queue
//! (the fixed cost of reading the cluster). Run with
//! `cargo run --release -p trainyard-bench --bin plan-bench [-- --quick]`.

use std::time::{Duration, Instant};
use trainyard_bench::figure::{record_data, Better, Figure, Target};
use trainyard_common::model::{parameters, MemoryEstimate};
use trainyard_common::spec::{Device, MlpSpec, ModelSpec, OptimizerKind, Strategy};
use trainyard_scheduler::plan::{plan, Demand, DeviceSlot, ExecutorView, JobView};
use uuid::Uuid;

const GIB: u64 = 1 << 30;

fn executors(n: usize) -> Vec<ExecutorView> {
    (0..n)
        .map(|i| ExecutorView {
            id: Uuid::from_u128(i as u128 + 1),
            host: Some(format!("host-{}", i / 8)),
            ram_bytes: 64 * GIB,
            devices: std::iter::once(DeviceSlot {
                kind: Device::Cpu,
                index: 0,
                memory_bytes: 64 * GIB,
            })
            .chain((0..4).map(|g| DeviceSlot {
                kind: Device::Cuda,
                index: g,
                memory_bytes: 80 * GIB,
            }))
            .collect(),
            held: Vec::new(),
        })
        .collect()
}

fn jobs(n: usize) -> Vec<JobView> {
    let params = parameters(&ModelSpec::Mlp(MlpSpec {
        inputs: 784,
        hidden: vec![1024, 1024],
        outputs: 10,
    }))
    .unwrap_or_default();
    let count: u64 = params.iter().map(|p| p.numel()).sum();
    (0..n)
        .map(|i| {
            let ps = i % 2 == 0;
            JobView {
                id: Uuid::from_u128(1_000_000 + i as u128),
                priority: (i % 3) as i32,
                seq: i as i64,
                demand: Demand {
                    strategy: if ps {
                        Strategy::ParameterServer
                    } else {
                        Strategy::Allreduce
                    },
                    device: Device::Cuda,
                    min_workers: 2,
                    max_workers: 4,
                    parameter_servers: if ps { 2 } else { 0 },
                    memory_bytes: 8 * GIB,
                    estimate: Some(MemoryEstimate::new(count, OptimizerKind::Adam, true)),
                    params: Some(params.clone()),
                },
                current: None,
                owner: String::new(),
                starving: false,
                excluded: Default::default(),
            }
        })
        .collect()
}

fn best_of(runs: usize, mut f: impl FnMut() -> Duration) -> Duration {
    (0..runs).map(|_| f()).min().unwrap_or_default()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (n_jobs, n_execs, runs) = if quick {
        (200, 200, 3)
    } else {
        (1000, 1000, 5)
    };
    let execs = executors(n_execs);
    let queue = jobs(n_jobs);

    let empty = best_of(runs, || {
        let t = Instant::now();
        std::hint::black_box(plan(&[], &execs));
        t.elapsed()
    });
    let mut first = None;
    let full = best_of(runs, || {
        let t = Instant::now();
        let p = plan(&queue, &execs);
        let d = t.elapsed();
        first = Some(p);
        d
    });
    let first = first.unwrap_or_default();
    let placed = first.placements.len();
    let roles: usize = first
        .placements
        .values()
        .map(|p| p.workers.len() + p.parameter_servers.len())
        .sum();

    // Lose the executor that holds the most roles, then re-plan.
    let mut load = std::collections::HashMap::new();
    for p in first.placements.values() {
        for e in p
            .workers
            .iter()
            .map(|w| w.executor)
            .chain(p.parameter_servers.iter().map(|s| s.executor))
        {
            *load.entry(e).or_insert(0) += 1;
        }
    }
    let lost = load
        .iter()
        .max_by_key(|(id, n)| (**n, **id))
        .map(|(id, _)| *id)
        .unwrap_or_default();
    let survivors: Vec<ExecutorView> = execs.iter().filter(|e| e.id != lost).cloned().collect();
    let current: Vec<JobView> = queue
        .iter()
        .map(|j| JobView {
            current: first.placements.get(&j.id).cloned(),
            ..j.clone()
        })
        .collect();
    let mut moved = 0;
    let replan = best_of(runs, || {
        let t = Instant::now();
        let p = plan(&current, &survivors);
        let d = t.elapsed();
        moved = p
            .placements
            .iter()
            .filter(|(id, pl)| first.placements.get(*id) != Some(*pl))
            .count();
        d
    });

    let per_sec = placed as f64 / full.as_secs_f64();
    println!("# planner: {n_jobs} queued jobs (half PS with 2 shards, half allreduce; 2–4 workers) over {n_execs} executors (4 GPUs each); best of {runs}; {placed} jobs, {roles} roles placed; {moved} job(s) changed by the re-plan");
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    Figure::new(
        "plan",
        format!("plan placements per second ({n_jobs} jobs over {n_execs} executors)"),
        per_sec,
        "jobs/s",
        "target",
        1000.0,
        Better::Higher,
    )
    .target(Target::AtLeast(1.0))
    .emit();
    Figure::new(
        "plan",
        format!("plan the whole queue ({n_jobs} jobs)"),
        ms(full),
        "ms",
        "empty-queue plan",
        ms(empty),
        Better::Lower,
    )
    .emit();
    Figure::new(
        "plan",
        "re-plan after losing the busiest executor",
        ms(replan),
        "ms",
        "budget",
        50.0,
        Better::Lower,
    )
    .target(Target::AtMost(1.0))
    .emit();
    record_data(
        "plan",
        &serde_json::json!({
            "jobs": n_jobs, "executors": n_execs, "runs": runs, "placed": placed, "roles": roles,
            "empty_ms": ms(empty), "full_ms": ms(full), "replan_ms": ms(replan), "moved": moved,
            "placements_per_sec": per_sec,
        }),
    );
}
