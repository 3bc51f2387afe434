//! Training-step benchmark: the executor's own training step (its models,
//! gradients flattened into one buffer, its flat Adam, the weights written
//! back — `ring::step_on`, what a worker runs minus the network) against
//! the same models, batch, optimizer and thread count in Python PyTorch eager
//! on the same libtorch, run side by side in one invocation.
//!
//! `cargo run --release -p trainyard-train-bench [-- --quick]` with the
//! torch venv's `python3` first on `PATH` (`source scripts/common.sh &&
//! torch_env` does it). Prints ms per step for each and the ratio
//! (Rust ÷ Python; target ≤ 1.0).

use std::process::Command;
use std::time::Instant;
use tch::{Device, Kind, Tensor};
use trainyard_bench::figure::{record_data, Better, Figure, Target};
use trainyard_common::spec::{CnnSpec, MlpSpec, ModelSpec, UncheckedJobSpec};
use trainyard_executor::replica::process::Host;
use trainyard_executor::replica::Replica;
use trainyard_executor::ring;
use trainyard_executor::storage::Fetcher;

fn bench(
    spec: &ModelSpec,
    features: i64,
    classes: i64,
    batch: i64,
    warmup: usize,
    steps: usize,
) -> f64 {
    let job: UncheckedJobSpec = serde_json::from_value::<trainyard_common::JobSpec>(serde_json::json!({
        "name": "bench",
        "model": spec,
        "dataset": {"kind": "classification", "samples": 256, "features": features, "classes": classes},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "lr": 1e-3},
        "batch_size": batch,
        "steps": 1
    }))
    .expect("a valid spec")
    .into();
    let mut replica = Replica::new(
        &job,
        Device::Cpu,
        &Fetcher::local_only(),
        &Host::for_tests(),
    )
    .expect("a replica");
    let x = Tensor::randn([batch, features], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(classes, [batch], (Kind::Int64, Device::Cpu));
    let mut start = Instant::now();
    for i in 0..warmup + steps {
        if i == warmup {
            start = Instant::now();
        }
        ring::step_on(&mut replica, &x, &y, 1e-3).expect("a step");
    }
    start.elapsed().as_secs_f64() * 1000.0 / steps as f64
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (warmup, steps) = if quick { (5, 30) } else { (20, 200) };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as i32;
    tch::set_num_threads(threads);

    let mlp_dims = [784i64, 1024, 1024, 10];
    let mlp = ModelSpec::Mlp(MlpSpec {
        inputs: 784,
        hidden: vec![1024, 1024],
        outputs: 10,
    });
    let cnn = ModelSpec::Cnn(CnnSpec {
        channels: 1,
        height: 28,
        width: 28,
        conv_channels: vec![32, 64],
        hidden: 128,
        classes: 10,
    });
    let (mlp_batch, cnn_batch) = (128, 64);

    let rust_mlp = bench(&mlp, 784, 10, mlp_batch, warmup, steps);
    let rust_cnn = bench(&cnn, 784, 10, cnn_batch, warmup, steps);

    let cfg = serde_json::json!({
        "threads": threads, "warmup": warmup, "steps": steps,
        "mlp": {"dims": mlp_dims, "batch": mlp_batch},
        "cnn": {"channels": 1, "side": 28, "convs": [32, 64], "hidden": 128, "classes": 10, "batch": cnn_batch},
    });
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../train_step.py");
    let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .arg(&script)
        .arg(cfg.to_string())
        .output()
        .expect("running python3 (the torch venv's)");
    if !out.status.success() {
        eprintln!("python failed: {}", String::from_utf8_lossy(&out.stderr));
        std::process::exit(1);
    }
    let py: serde_json::Value = serde_json::from_slice(&out.stdout).expect("python's JSON");
    let (py_mlp, py_cnn) = (
        py["mlp_ms"].as_f64().unwrap_or(f64::NAN),
        py["cnn_ms"].as_f64().unwrap_or(f64::NAN),
    );

    println!("# training step, Rust (tch, the executor's models) vs Python PyTorch {} eager; {threads} thread(s), Adam, {steps} steps after {warmup} warm-up", py["torch"].as_str().unwrap_or("?"));
    for (name, rust, python) in [
        (
            format!("train step MLP 784-1024-1024-10 batch {mlp_batch}"),
            rust_mlp,
            py_mlp,
        ),
        (
            format!("train step CNN 1x28x28 [32, 64] 128 batch {cnn_batch}"),
            rust_cnn,
            py_cnn,
        ),
    ] {
        Figure::new(
            "train",
            name,
            rust,
            "ms",
            "Python PyTorch eager",
            python,
            Better::Lower,
        )
        .target(Target::AtMost(1.0))
        .emit();
    }
    record_data(
        "train",
        &serde_json::json!({
            "threads": threads, "steps": steps, "warmup": warmup, "torch": py["torch"],
            "mlp": {"batch": mlp_batch, "rust_ms": rust_mlp, "python_ms": py_mlp},
            "cnn": {"batch": cnn_batch, "rust_ms": rust_cnn, "python_ms": py_cnn},
        }),
    );
}
