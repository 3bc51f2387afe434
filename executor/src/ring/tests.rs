//! Training runs on real data on the CPU, on rings of one and of several
//! in-process replicas over loopback.

use super::*;
use crate::error::RoleError;
use crate::replica::process::Host;
use crate::replica::progress::learning_rate;
use crate::replica::{Outcome, Replica, StepStats};
use crate::storage::Fetcher;
use serde_json::json;
use tch::{Kind, Tensor};
use trainyard_common::spec::UncheckedJobSpec;
use trainyard_dataplane::Ring;
use trainyard_shutdown::Shutdown;

fn spec(v: serde_json::Value) -> UncheckedJobSpec {
    let s: trainyard_common::JobSpec = serde_json::from_value(v).expect("valid spec");
    s.into()
}

fn digits_url() -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/digits.npz");
    format!("file://{}", p.canonicalize().unwrap().display())
}

fn train(s: &UncheckedJobSpec) -> Result<(Outcome, Vec<StepStats>), RoleError> {
    let mut steps = Vec::new();
    let out = run(
        s,
        tch::Device::Cpu,
        &Fetcher::local_only(),
        &Host::for_tests(),
        &Shutdown::new(),
        &mut |st| steps.push(*st),
    )?;
    Ok((out, steps))
}

#[test]
fn mlp_learns_digits_to_95_percent_on_a_held_out_fifth() {
    let s = spec(json!({
        "name": "digits", "model": {"kind": "mlp", "inputs": 64, "hidden": [128], "outputs": 10},
        "dataset": {"kind": "file", "url": digits_url()}, "loss": "cross_entropy",
        "optimizer": {"kind": "adamw", "lr": 0.003, "weight_decay": 0.0001, "schedule": {"kind": "warmup_cosine", "warmup_steps": 20}},
        "batch_size": 64, "epochs": 30, "eval_fraction": 0.2, "seed": 3
    }));
    let (out, steps) = train(&s).unwrap();
    let acc = out.eval_accuracy.unwrap();
    assert!(acc >= 0.95, "held-out accuracy {acc}");
    assert_eq!(out.steps, steps.len() as u64);
    assert!(steps.last().unwrap().loss < steps[0].loss / 5.0);
    assert!(out
        .weights
        .iter()
        .any(|(n, t)| n == "fc0.weight" && t.size() == [128, 64]));
}

#[test]
fn transformer_beats_the_unigram_entropy_of_its_text() {
    let s = spec(json!({
        "name": "lm", "model": {"kind": "transformer", "vocab": 128, "context": 32, "layers": 2, "heads": 4, "width": 64},
        "dataset": {"kind": "text", "characters": 40000}, "loss": "cross_entropy",
        "optimizer": {"kind": "adamw", "lr": 0.003, "grad_clip": 1.0},
        "batch_size": 32, "steps": 300, "seed": 1
    }));
    // Unigram entropy (nats) of the same generated text.
    let mut rng = crate::data::rng::Rng::new(s.seed, 0xDA7A);
    let bytes = crate::data::generated_text(40000, &mut rng);
    let mut counts = [0f64; 256];
    for b in &bytes {
        counts[*b as usize] += 1.0;
    }
    let n = bytes.len() as f64;
    let entropy: f64 = counts
        .iter()
        .filter(|&&c| c > 0.0)
        .map(|&c| -(c / n) * (c / n).ln())
        .sum();
    let (out, _) = train(&s).unwrap();
    let eval = out.eval_loss.unwrap();
    assert!(
        eval < entropy,
        "eval loss {eval} ≥ unigram entropy {entropy}"
    );
}

#[test]
fn regression_loss_falls_tenfold() {
    let s = spec(json!({
        "name": "reg", "model": {"kind": "mlp", "inputs": 8, "hidden": [32], "outputs": 1},
        "dataset": {"kind": "regression", "samples": 2000, "features": 8}, "loss": "mse",
        "optimizer": {"kind": "adam", "lr": 0.01}, "batch_size": 64, "epochs": 20
    }));
    let (out, steps) = train(&s).unwrap();
    assert!(
        out.final_loss.unwrap() < steps[0].loss / 10.0,
        "{:?} vs {}",
        out.final_loss,
        steps[0].loss
    );
}

#[test]
fn cnn_trains_on_generated_images() {
    let s = spec(json!({
        "name": "cnn", "model": {"kind": "cnn", "channels": 1, "height": 8, "width": 8, "conv_channels": [8], "hidden": 32, "classes": 4},
        "dataset": {"kind": "classification", "samples": 800, "features": 64, "classes": 4}, "loss": "cross_entropy",
        "optimizer": {"kind": "momentum", "lr": 0.05}, "batch_size": 32, "epochs": 5
    }));
    let (out, _) = train(&s).unwrap();
    assert!(out.eval_accuracy.unwrap() > 0.9, "{:?}", out.eval_accuracy);
}

#[test]
fn bad_data_fails_with_a_reason_that_names_the_problem() {
    let base = json!({
        "name": "bad", "model": {"kind": "mlp", "inputs": 32, "outputs": 10},
        "dataset": {"kind": "file", "url": digits_url()}, "loss": "cross_entropy",
        "optimizer": {"kind": "sgd", "lr": 0.1}, "batch_size": 8, "steps": 2
    });
    let err = train(&spec(base.clone())).err().unwrap().to_string();
    assert!(
        err.contains("64 features") && err.contains("takes 32"),
        "{err}"
    );
    let mut missing = base;
    missing["model"]["inputs"] = json!(64);
    missing["dataset"]["url"] = json!("file:///nonexistent/data.npz");
    let err = train(&spec(missing)).err().unwrap().to_string();
    assert!(
        err.contains("cannot read dataset file:///nonexistent/data.npz"),
        "{err}"
    );
}

#[test]
fn warmup_cosine_schedule() {
    let s = spec(json!({
        "name": "s", "model": {"kind": "mlp", "inputs": 2, "outputs": 2},
        "dataset": {"kind": "classification", "samples": 10, "features": 2, "classes": 2}, "loss": "cross_entropy",
        "optimizer": {"kind": "sgd", "lr": 1.0, "schedule": {"kind": "warmup_cosine", "warmup_steps": 10}}, "batch_size": 2, "steps": 110
    }));
    assert!((learning_rate(&s, 5, 110) - 0.5).abs() < 1e-9);
    assert!((learning_rate(&s, 10, 110) - 1.0).abs() < 1e-9);
    assert!((learning_rate(&s, 60, 110) - 0.5).abs() < 1e-9);
    assert!(learning_rate(&s, 110, 110).abs() < 1e-9);
}

#[test]
fn safetensors_datasets_train_too() {
    let dir = std::env::temp_dir().join(format!("ty-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("blobs.safetensors");
    // Two separable blobs.
    let x = Tensor::cat(
        &[
            Tensor::randn([100, 4], (Kind::Float, tch::Device::Cpu)) + 3.0,
            Tensor::randn([100, 4], (Kind::Float, tch::Device::Cpu)) - 3.0,
        ],
        0,
    );
    let y = Tensor::cat(
        &[
            Tensor::zeros([100], (Kind::Int64, tch::Device::Cpu)),
            Tensor::ones([100], (Kind::Int64, tch::Device::Cpu)),
        ],
        0,
    );
    Tensor::write_safetensors(&[("x", &x), ("y", &y)], &path).unwrap();
    let s = spec(json!({
        "name": "st", "model": {"kind": "mlp", "inputs": 4, "outputs": 2},
        "dataset": {"kind": "file", "url": format!("file://{}", path.display())}, "loss": "cross_entropy",
        "optimizer": {"kind": "sgd", "lr": 0.1}, "batch_size": 16, "epochs": 5
    }));
    let (out, _) = train(&s).unwrap();
    assert!(out.eval_accuracy.unwrap() > 0.95, "{:?}", out.eval_accuracy);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Trains `world` in-process replicas on a real ring over loopback, each
/// created here in turn (libtorch's seed is global), and returns each one's
/// outcome.
fn train_ring(s: &UncheckedJobSpec, world: usize) -> Vec<Outcome> {
    use trainyard_dataplane::{DataPlane, Ring, RingConfig};
    let planes: Vec<DataPlane> = (0..world)
        .map(|_| DataPlane::bind("127.0.0.1:0").unwrap())
        .collect();
    let peers: Vec<String> = planes.iter().map(|p| p.local_addr().to_string()).collect();
    let replicas: Vec<Replica> = (0..world)
        .map(|_| {
            Replica::new(
                s,
                tch::Device::Cpu,
                &Fetcher::local_only(),
                &Host::for_tests(),
            )
            .unwrap()
        })
        .collect();
    let job = uuid::Uuid::new_v4();
    std::thread::scope(|scope| {
        let joins: Vec<_> = replicas
            .into_iter()
            .enumerate()
            .map(|(rank, replica)| {
                let (plane, peers) = (&planes[rank], peers.clone());
                scope.spawn(move || {
                    let stop = Shutdown::new();
                    let cfg = RingConfig {
                        job,
                        generation: 1,
                        rank: rank as u32,
                        peers,
                        secret: b"k".to_vec(),
                        connect_timeout: std::time::Duration::from_secs(10),
                        collective_timeout: std::time::Duration::from_secs(30),
                    };
                    let mut ring = Ring::connect(plane, &cfg, &stop).unwrap();
                    let mut slot = Some(replica);
                    let source = join(
                        &mut ring,
                        &mut slot,
                        super::join::Joining {
                            spec: s,
                            device: tch::Device::Cpu,
                            fetcher: &Fetcher::local_only(),
                            host: &Host::for_tests(),
                            stop: &stop,
                            resume: None,
                        },
                    )
                    .unwrap();
                    assert_eq!(source, None, "equal fresh replicas need no broadcast");
                    super::train(slot.as_mut().unwrap(), &mut ring, &stop, &mut |_| {}).unwrap()
                })
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

fn sgd_digits(batch: u32, steps: u64) -> UncheckedJobSpec {
    spec(json!({
        "name": "exact", "model": {"kind": "mlp", "inputs": 64, "hidden": [32], "outputs": 10},
        "dataset": {"kind": "file", "url": digits_url()}, "loss": "cross_entropy",
        "optimizer": {"kind": "sgd", "lr": 0.1},
        "batch_size": batch, "steps": steps, "eval_fraction": 0.2, "seed": 5
    }))
}

/// Data parallelism changes nothing but speed: 3 ranks with batches of 16
/// end with the weights of one process with batches of 48 (the
/// concatenation of theirs), and all ranks hold the same bits.
#[test]
fn three_ring_ranks_equal_one_process_on_the_concatenated_batches() {
    let ring = train_ring(&sgd_digits(16, 12), 3);
    let (solo, _) = train(&sgd_digits(48, 12)).unwrap();
    assert!(ring
        .iter()
        .all(|o| o.weights_sha256 == ring[0].weights_sha256));
    for ((name, a), (_, b)) in ring[0].weights.iter().zip(&solo.weights) {
        let rel =
            (a - b).abs().max().double_value(&[]) / b.abs().max().double_value(&[]).max(1e-12);
        assert!(rel < 1e-5, "{name}: relative difference {rel}");
    }
    assert_eq!(ring[0].steps, 12);
}

/// A replica exported at some step and imported into a fresh one continues
/// exactly as the original would have.
#[test]
fn an_exported_state_resumes_bit_for_bit() {
    let s = spec(json!({
        "name": "resume", "model": {"kind": "mlp", "inputs": 64, "hidden": [16], "outputs": 10},
        "dataset": {"kind": "file", "url": digits_url()}, "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "lr": 0.01}, "batch_size": 32, "steps": 20, "seed": 2
    }));
    let stop = Shutdown::new();
    let mut a = Replica::new(
        &s,
        tch::Device::Cpu,
        &Fetcher::local_only(),
        &Host::for_tests(),
    )
    .unwrap();
    let mut half = s.clone();
    half.steps = Some(7);
    *a.spec_mut() = half;
    super::train(&mut a, &mut Ring::solo(), &stop, &mut |_| {}).unwrap();
    *a.spec_mut() = s.clone();
    let mut b = Replica::new(
        &s,
        tch::Device::Cpu,
        &Fetcher::local_only(),
        &Host::for_tests(),
    )
    .unwrap();
    b.import(&a.export()).unwrap();
    assert_eq!((b.step, b.cursor), (7, a.cursor));
    // The last loss comes along: a replica that joins after the last step
    // still knows the job's final loss.
    assert!(a.last_loss().is_some_and(f64::is_finite));
    assert_eq!(
        b.last_loss().map(f64::to_bits),
        a.last_loss().map(f64::to_bits)
    );
    let oa = super::train(&mut a, &mut Ring::solo(), &stop, &mut |_| {}).unwrap();
    let ob = super::train(&mut b, &mut Ring::solo(), &stop, &mut |_| {}).unwrap();
    assert_eq!(oa.weights_sha256, ob.weights_sha256);
    assert!(b.import(&[0.0; 3]).is_err());
}

/// bf16 on the wire halves the gradient bytes; on the digits MLP with 4
/// ranks its held-out accuracy stays within a point of fp32, and the ranks
/// still hold the same bits.
#[test]
fn bf16_gradients_cost_at_most_a_point_of_accuracy() {
    let base = spec(json!({
        "name": "bf16", "model": {"kind": "mlp", "inputs": 64, "hidden": [128], "outputs": 10},
        "dataset": {"kind": "file", "url": digits_url()}, "loss": "cross_entropy",
        "optimizer": {"kind": "adamw", "lr": 0.005, "weight_decay": 0.0001},
        "batch_size": 32, "epochs": 30, "eval_fraction": 0.2, "seed": 3, "strategy": "allreduce",
        "workers": {"min": 4, "max": 4}
    }));
    let mut bf16 = base.clone();
    bf16.compression = trainyard_common::spec::Compression::Bf16;
    let exact = train_ring(&base, 4);
    let packed = train_ring(&bf16, 4);
    assert!(packed
        .iter()
        .all(|o| o.weights_sha256 == packed[0].weights_sha256));
    let (a, b) = (
        exact[0].eval_accuracy.unwrap(),
        packed[0].eval_accuracy.unwrap(),
    );
    println!(
        "digits MLP, 4 ranks: held-out accuracy fp32 {:.2}%, bf16 {:.2}%",
        a * 100.0,
        b * 100.0
    );
    assert!(b >= 0.95 && (a - b).abs() <= 0.01, "fp32 {a}, bf16 {b}");
}

/// A user's BatchNorm module on a ring of two: both ranks end with the
/// same bits — parameters and buffers (rank 0's, carried with each step's
/// sum) — and the integer buffers count every step.
#[test]
fn ring_ranks_of_a_batchnorm_module_end_with_rank_0s_buffers() {
    let mut s = crate::replica::tests::spec();
    s.steps = Some(8);
    let out = train_ring(&s, 2);
    assert_eq!(out[0].weights_sha256, out[1].weights_sha256);
    for ((name, a), (_, b)) in out[0].weights.iter().zip(&out[1].weights) {
        assert!(a.equal(b), "{name} differs between the ranks");
    }
    let steps = out[0]
        .weights
        .iter()
        .find(|(k, _)| k == "bn.num_batches_tracked")
        .map(|(_, t)| t.int64_value(&[]));
    assert_eq!(steps, Some(8));
}
