//! `slow-links-ps`: the parameter-server processes of `slow-links-bench`
//! (in `bench/src/slow_links.rs`, which starts them, one per lab host, and
//! reads their answers); not a benchmark of its own.
//!
//! * `slow-links-ps calibrate K MBPS`: builds the benchmark's model (an
//!   MLP of 16·K² MiB, see [`spec`]), times its forward and backward pass
//!   (the executor's `Replica::gradient`, libtorch on one thread) and
//!   prints the batch whose gradient takes about as long here as one pull
//!   of the model at `MBPS` MB/s.
//! * `slow-links-ps shard IP K BATCH WORLD STEPS`: the executor's real
//!   shard server (`ps::serve_shard`, async consistency, SGD) holding the
//!   whole model behind a data-plane listener on `IP`; prints
//!   `{"addr": …}` and serves until its standard input closes.
//! * `slow-links-ps worker RANK WORLD SHARD_ADDR K BATCH STEPS`: worker
//!   `RANK` of `WORLD`, the executor's real worker loop (`ps::work`: pull,
//!   gradient, push, with the next pull prefetched during the gradient
//!   unless `TRAINYARD_PS_PREFETCH=off`), training `STEPS` steps against
//!   the shard; prints one JSON line with each step's arrival time and its
//!   compute and communication seconds.

use std::io::BufRead;
use std::time::Instant;
use trainyard_common::cluster::{Assignment, PsPeer, RoleKey, RoleKind, WorkerPeer};
use trainyard_common::spec::Strategy;
use trainyard_dataplane::DataPlane;
use trainyard_executor::context::Context;
use trainyard_executor::replica::process::Host;
use trainyard_executor::replica::Replica;
use trainyard_executor::reports::Item;
use trainyard_shutdown::Shutdown;

/// Errors end the process with their message (the benchmark shows it).
type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const SECRET: &str = "slow-links-secret";
const JOB: uuid::Uuid = uuid::Uuid::from_u128(0x5109_11c5);

/// The benchmark's job: an MLP of 1024·K inputs, hidden layers of 2048·K
/// and 1024·K and 10 outputs (4.2·K² M parameters: 16·K² MiB of fp32), on
/// a generated classification set, async SGD through one shard, no
/// evaluation set and no checkpoints (neither is part of a step here).
fn spec(k: u32, batch: u32, world: u32, steps: u64) -> trainyard_common::JobSpec {
    serde_json::from_value::<trainyard_common::JobSpec>(serde_json::json!({
        "name": "slow-links-ps",
        "model": {"kind": "mlp", "inputs": 1024 * k, "hidden": [2048 * k, 1024 * k], "outputs": 10},
        "dataset": {"kind": "classification", "samples": (4 * batch).max(512), "features": 1024 * k, "classes": 10},
        "loss": "cross_entropy",
        "optimizer": {"kind": "sgd", "lr": 0.001},
        "batch_size": batch,
        "steps": steps,
        "eval_fraction": 0.0,
        "checkpoint": {"at_end": false},
        "strategy": "parameter_server",
        "parameter_servers": 1,
        "consistency": "async",
        "workers": {"min": world, "max": world}
    }))
    .expect("a valid spec")
}

/// Role `role` (index `index`) of the job with its one shard at `shard`.
fn assignment(
    spec: trainyard_common::JobSpec,
    role: RoleKind,
    index: u32,
    world: u32,
    shard: &str,
) -> Result<Assignment> {
    // The shard holds the whole flat vector, as the model's layout names it.
    let rep = Replica::new(
        &spec,
        tch::Device::Cpu,
        &Context::for_tests().fetcher,
        &Host::for_tests(),
    )?;
    let ranges = rep.ranges(0, rep.numel());
    Ok(Assignment {
        key: RoleKey {
            job_id: JOB,
            generation: 1,
            role,
            index,
        },
        device: None,
        strategy: Strategy::ParameterServer,
        secret: SECRET.into(),
        spec,
        workers: (0..world)
            .map(|rank| WorkerPeer {
                rank,
                executor_id: uuid::Uuid::from_u128(u128::from(rank) + 1),
                address: "127.0.0.1:1".into(),
                device: 0,
            })
            .collect(),
        parameter_servers: vec![PsPeer {
            shard: 0,
            standby: false,
            executor_id: uuid::Uuid::from_u128(1000),
            address: shard.into(),
            ranges,
        }],
        resume: None,
        data_policy: trainyard_common::artifact::DataPolicy::unrestricted(),
        checkpoint_wanted: false,
        restarts: None,
    })
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    let s = args
        .get(i)
        .ok_or_else(|| format!("missing argument {i} ({what})"))?;
    Ok(s.parse()
        .map_err(|e| format!("argument {i} ({what}) {s:?}: {e}"))?)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    tch::set_num_threads(1);
    match args.first().map(String::as_str) {
        Some("calibrate") => calibrate(&args[1..]),
        Some("shard") => shard(&args[1..]),
        Some("worker") => worker(&args[1..]),
        _ => Err(
            "usage: slow-links-ps calibrate K MBPS | shard IP K BATCH WORLD STEPS | worker RANK WORLD SHARD_ADDR K BATCH STEPS"
                .into(),
        ),
    }
}

/// Mean seconds of `rounds` gradients over batches of `batch` samples
/// (after one warm-up), and the model's bytes.
fn gradient_seconds(k: u32, batch: u32, rounds: u32) -> Result<(f64, usize)> {
    let spec = spec(k, batch, 1, 10);
    let mut rep = Replica::new(
        &spec,
        tch::Device::Cpu,
        &Context::for_tests().fetcher,
        &Host::for_tests(),
    )?;
    let batches = rep.batches(0, 1, Default::default());
    let next = || batches.recv().map_err(|_| "the loader stopped".to_string());
    rep.gradient(&next()?)?;
    let mut secs = 0.0;
    for _ in 0..rounds {
        let b = next()?;
        let t = Instant::now();
        rep.gradient(&b)?;
        secs += t.elapsed().as_secs_f64();
    }
    Ok((secs / f64::from(rounds), rep.numel() * 4))
}

fn calibrate(args: &[String]) -> Result<()> {
    let k: u32 = arg(args, 0, "K")?;
    let mbps: f64 = arg(args, 1, "line rate in MB/s")?;
    // Scaled to a pull's time twice (the time is nearly linear in the
    // batch; the second pass corrects for its fixed part).
    let mut batch = 256u32;
    let mut tried = Vec::new();
    let mut pull = 0.0;
    let mut model_bytes = 0;
    for _ in 0..2 {
        let (secs, bytes) = gradient_seconds(k, batch, 3)?;
        (model_bytes, pull) = (bytes, bytes as f64 / (mbps * 1e6));
        tried.push(serde_json::json!({"batch": batch, "seconds": secs}));
        batch = ((f64::from(batch) * pull / secs).round() as u32).clamp(8, 8192);
    }
    println!(
        "{}",
        serde_json::json!({"model_bytes": model_bytes, "pull_seconds": pull, "batch": batch, "tried": tried})
    );
    Ok(())
}

fn shard(args: &[String]) -> Result<()> {
    let ip: String = arg(args, 0, "IP")?;
    let k: u32 = arg(args, 1, "K")?;
    let batch: u32 = arg(args, 2, "batch")?;
    let world: u32 = arg(args, 3, "world")?;
    let steps: u64 = arg(args, 4, "steps")?;
    let plane = DataPlane::bind(format!("{ip}:0"))?;
    let addr = plane.local_addr().to_string();
    let a = assignment(spec(k, batch, world, steps), RoleKind::Ps, 0, world, &addr)?;
    let stop = Shutdown::new();
    let server = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            trainyard_executor::ps::serve_shard(
                &a,
                &stop,
                &tx,
                &plane,
                None,
                trainyard_executor::storage::no_storage(),
                &Context::for_tests(),
            );
        })
    };
    println!("{}", serde_json::json!({ "addr": addr }));
    // Serves until the benchmark closes our standard input (or dies).
    let mut line = String::new();
    while std::io::stdin().lock().read_line(&mut line)? > 0 {
        line.clear();
    }
    stop.trigger();
    let _ = server.join();
    Ok(())
}

fn worker(args: &[String]) -> Result<()> {
    let rank: u32 = arg(args, 0, "rank")?;
    let world: u32 = arg(args, 1, "world")?;
    let shard: String = arg(args, 2, "shard address")?;
    let k: u32 = arg(args, 3, "K")?;
    let batch: u32 = arg(args, 4, "batch")?;
    let steps: u64 = arg(args, 5, "steps")?;
    let a = assignment(
        spec(k, batch, world, steps),
        RoleKind::Worker,
        rank,
        world,
        &shard,
    )?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let started = Instant::now();
    let trainer = std::thread::spawn(move || {
        let stop = Shutdown::new();
        let (mut replica, mut last) = (None, None);
        let (ctx, host) = (Context::for_tests(), Host::for_tests());
        let env = trainyard_executor::ps::WorkerEnv {
            a: &a,
            rank,
            device: tch::Device::Cpu,
            stop: &stop,
            tx: &tx,
            ctx: &ctx,
            host: &host,
        };
        trainyard_executor::ps::work(&env, &mut replica, &mut last)
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    // Each step's report as it arrives (the channel closes when the
    // worker's loop ends).
    let mut rows = Vec::new();
    while let Some(item) = rx.blocking_recv() {
        match item {
            Item::Metric(m) => rows.push(serde_json::json!({
                "step": m.step,
                "t": started.elapsed().as_secs_f64(),
                "compute": m.compute_seconds,
                "comm": m.comm_seconds,
                "data": m.data_seconds,
                "staleness": m.staleness,
                "rejected": m.rejected,
            })),
            Item::Log(_, line) => eprintln!("worker {rank}: {line}"),
            _ => {}
        }
    }
    let result = trainer
        .join()
        .map_err(|_| "the worker's loop panicked".to_string())?;
    if let Err(e) = result {
        return Err(format!("worker {rank}: {e}").into());
    }
    println!(
        "{}",
        serde_json::json!({"rank": rank, "world": world, "steps": rows})
    );
    Ok(())
}
