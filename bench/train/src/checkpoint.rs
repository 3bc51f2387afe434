//! Checkpoint benchmark: what asynchronous checkpointing costs a training
//! job. The same job (an MLP of 1.9 M parameters with Adam, so each
//! checkpoint holds 22 MiB of weights and optimizer state) is trained by the
//! executor's own loop (`ring::train_with`, a ring of one) twice per round,
//! side by side in one invocation: without checkpoints, and with a
//! checkpoint every `--every` steps going through the real path (snapshot,
//! background uploader, safetensors, SHA-256, the local cache tier, then a
//! `file://` object store). Rounds alternate the order; the medians of the
//! wall time per step are compared.
//!
//! `cargo run --release -p trainyard-train-bench --bin checkpoint-bench
//! [-- --quick] [--every N]` after `source scripts/common.sh && torch_env`.
//! Prints ms per step for each and the ratio (with ÷ without; target ≤ 1.10).

use std::sync::Arc;
use std::time::Instant;
use tch::Device;
use trainyard_bench::figure::{record_data, Better, Figure, Target};
use trainyard_common::spec::UncheckedJobSpec;
use trainyard_dataplane::Ring;
use trainyard_executor::context::Context;
use trainyard_executor::replica::process::Host;
use trainyard_executor::replica::Replica;
use trainyard_executor::ring;
use trainyard_executor::storage::checkpoint::{Checkpointing, Policy, Uploader};
use trainyard_executor::storage::Fetcher;
use trainyard_executor::storage::Storage;
use trainyard_shutdown::Shutdown;

fn job(steps: u64, every: Option<u64>) -> UncheckedJobSpec {
    serde_json::from_value::<trainyard_common::JobSpec>(serde_json::json!({
        "name": "checkpoint-bench",
        "model": {"kind": "mlp", "inputs": 784, "hidden": [1024, 1024], "outputs": 10},
        "dataset": {"kind": "classification", "samples": 4096, "features": 784, "classes": 10},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "lr": 1e-3},
        "batch_size": 128,
        "steps": steps,
        "eval_fraction": 0.05,
        "checkpoint": match every {
            Some(n) => serde_json::json!({"every_steps": n, "at_end": false, "keep": 2}),
            None => serde_json::json!({"at_end": false}),
        }
    }))
    .expect("a valid spec")
    .into()
}

/// Trains `steps` steps; returns ms per step and the checkpoints written.
fn run(steps: u64, every: Option<u64>, storage: &Arc<Storage>) -> (f64, u64) {
    let spec = job(steps, every);
    let mut replica = Replica::new(
        &spec,
        Device::Cpu,
        &Fetcher::local_only(),
        &Host::for_tests(),
    )
    .expect("a replica");
    let stop = Shutdown::new();
    let ctx = Context::for_tests();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut ckpt = every.map(|_| Checkpointing {
        policy: Policy::new(spec.checkpoint, ctx.drain.clone()),
        uploader: Uploader::start(
            storage.clone(),
            uuid::Uuid::new_v4(),
            tx.clone(),
            ctx.uploads.clone(),
            None,
        ),
        generation: 1,
    });
    let started = Instant::now();
    ring::train_with(
        &mut replica,
        &mut Ring::solo(),
        &stop,
        &mut |_| {},
        ckpt.as_mut(),
    )
    .expect("training");
    // The last upload belongs to the run.
    if let Some(c) = &ckpt {
        c.uploader.flush(std::time::Duration::from_secs(120));
    }
    let ms = started.elapsed().as_secs_f64() * 1000.0 / steps as f64;
    drop(ckpt);
    drop(tx);
    let mut written = 0;
    while let Ok(item) = rx.try_recv() {
        if matches!(
            item,
            trainyard_executor::control::report::Item::Checkpoint(_)
        ) {
            written += 1;
        }
    }
    (ms, written)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let every: u64 = args
        .iter()
        .position(|a| a == "--every")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(10);
    let (steps, rounds) = if quick { (60, 1) } else { (200, 3) };
    // One core is left to the uploader (on a GPU machine training leaves
    // the CPU idle; here both share two cores).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tch::set_num_threads((cores.saturating_sub(1)).max(1) as i32);

    let dir = std::env::temp_dir().join(format!("trainyard-ckpt-bench-{}", std::process::id()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let cache = Arc::new(
        trainyard_store::cache::Cache::open(&dir.join("cache"), 256 << 20).expect("a cache"),
    );
    let storage = Arc::new(
        Storage::open(
            &format!("file://{}", dir.join("store").display()),
            &[],
            cache,
            rt.handle().clone(),
        )
        .expect("a store"),
    );
    // Warm-up: data loading, allocator, page cache.
    run(20, Some(10), &storage);

    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut written = 0;
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for checkpointing in order {
            if checkpointing {
                let (ms, n) = run(steps, Some(every), &storage);
                with.push(ms);
                written += n;
            } else {
                without.push(run(steps, None, &storage).0);
            }
        }
    }
    let (a, b) = (median(without), median(with));
    println!(
        "# checkpoints: MLP 784-1024-1024-10 with Adam (22 MiB per checkpoint), batch 128, {steps} steps x {rounds} round(s), {} libtorch thread(s); {written} checkpoints written to a file:// store",
        (cores.saturating_sub(1)).max(1)
    );
    Figure::new(
        "checkpoint",
        format!("step time with a checkpoint every {every} steps"),
        b,
        "ms",
        "without checkpoints",
        a,
        Better::Lower,
    )
    .target(Target::AtMost(1.10))
    .emit();
    record_data(
        "checkpoint",
        &serde_json::json!({"steps": steps, "rounds": rounds, "every": every, "written": written,
            "without_ms": a, "with_ms": b}),
    );
    let _ = std::fs::remove_dir_all(&dir);
}
