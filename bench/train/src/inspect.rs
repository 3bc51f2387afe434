//! Sandbox benchmark: what the process boundary costs a model's
//! inspection. The same TorchScript module (a 64 → 256 → 256 → 10 MLP,
//! written by the venv's PyTorch) is loaded, its tensors listed and its
//! forward's schema checked, side by side in one invocation: in this
//! process (what the executor did before inspections were sandboxed) and
//! in a sandboxed child (`trainyard-confined inspection`:
//! spawn, exec, libtorch loaded, Landlock + seccomp + cgroups entered, the
//! answer as JSON). Rounds alternate the order; medians are compared.
//!
//! Then a training role's: a replica of a TorchScript job started
//! (data loaded, module loaded, tensors listed: in this process against a
//! confined model process with its shared memory) and one forward and
//! backward on a batch of 32 (in this process against a call to the model
//! process: the batch down a pipe, the gradient in shared memory).
//!
//! `cargo run --release -p trainyard-train-bench --bin inspect-bench` after
//! `source scripts/common.sh && torch_env` (and a release build of
//! `trainyard-executor`, whose binary is the child). Prints ms per
//! inspection for each and the difference; the child's start is the
//! figure a role process would also pay once per generation.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tch::Tensor;
use trainyard_bench::figure::{record_data, Better, Figure};
use trainyard_common::cluster::InspectionResult;
use trainyard_confined::core::Core;
use trainyard_confined::inspect::confined;
use trainyard_confined::model::Script;
use trainyard_confined::protocol::{Inspect as Task, Kind};
use trainyard_confined::tensors::ModelTensors;
use trainyard_confined::torchscript::Module;
use trainyard_executor::data::Dataset;
use trainyard_executor::replica::process::{Host, STOP_GRACE};
use trainyard_executor::replica::Replica;
use trainyard_executor::sandbox::{child_program, Mode, Sandbox};
use trainyard_executor::storage::Fetcher;
use trainyard_sandbox::Limits;
use trainyard_shutdown::Shutdown;

const ROUNDS: usize = 15;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let dir = std::env::temp_dir().join(format!("trainyard-inspect-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("mlp.pt");
    let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import sys, torch\n\
        m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))\n\
        torch.jit.script(m).save(sys.argv[1])\n";
    let ok = std::process::Command::new(&python)
        .args(["-c", script])
        .arg(&model)
        .status()
        .expect("python with torch (TRAINYARD_PYTHON)");
    assert!(ok.success(), "writing the model");
    let exe = std::env::current_exe().unwrap();
    let program: PathBuf = child_program(&exe).expect("build trainyard-confined (release) first");
    let sandbox =
        Sandbox::new(Mode::On, None, dir.join("sandbox"), program, Some(1)).expect("a sandbox");
    if let Some(why) = sandbox.refusal() {
        eprintln!("the sandbox is unavailable here: {why}");
        std::process::exit(1);
    }

    let in_process = || {
        let t = Instant::now();
        let r = confined(Task {
            model: model.clone(),
            trial: None,
        });
        assert!(matches!(r, InspectionResult::Parameters(_)), "{r:?}");
        t.elapsed().as_secs_f64() * 1e3
    };
    let sandboxed = || {
        let t = Instant::now();
        let ws = sandbox.workspace("bench").unwrap();
        let task = Task {
            model: ws.input("model.pt", &model).unwrap(),
            trial: None,
        };
        let r: InspectionResult = sandbox
            .run(
                Kind::Inspection,
                &ws,
                &task,
                Limits::default(),
                Duration::from_secs(60),
                &|| false,
            )
            .expect("a sandboxed inspection");
        assert!(matches!(r, InspectionResult::Parameters(_)), "{r:?}");
        t.elapsed().as_secs_f64() * 1e3
    };
    // One of each first: page cache and libtorch's lazy initialisation.
    in_process();
    sandboxed();
    let (a, b) = alternate(ROUNDS, &mut || in_process(), &mut || sandboxed());
    Figure::new(
        "sandbox",
        "inspection of a TorchScript MLP in a sandboxed child",
        b,
        "ms",
        "in the executor's process",
        a,
        Better::Lower,
    )
    .emit();
    println!(
        "sandbox: the child's start (spawn, exec, libtorch, confinement): {:.0} ms",
        b - a
    );
    record_data(
        "sandbox",
        &serde_json::json!({"rounds": ROUNDS, "in_process_ms": a, "sandboxed_ms": b,
            "start_ms": b - a, "layers": sandbox.summary()}),
    );
    role(&model, Arc::new(sandbox));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `a` and `b` timed `rounds` times each, alternating which goes first:
/// their medians.
fn alternate(rounds: usize, a: &mut dyn FnMut() -> f64, b: &mut dyn FnMut() -> f64) -> (f64, f64) {
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 0 {
            ta.push(a());
            tb.push(b());
        } else {
            tb.push(b());
            ta.push(a());
        }
    }
    (median(ta), median(tb))
}

/// A role's start and step, in this process and in a model process.
fn role(model: &Path, sandbox: Arc<Sandbox>) {
    let digits = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/digits.npz");
    let job: trainyard_common::JobSpec = serde_json::from_value(serde_json::json!({
        "name": "bench", "loss": "cross_entropy", "batch_size": 32, "steps": 100,
        "model": {"kind": "torchscript", "url": format!("file://{}", model.display())},
        "dataset": {"kind": "file", "url": format!("file://{}", digits.canonicalize().unwrap().display())},
        "optimizer": {"kind": "sgd", "lr": 0.1}
    }))
    .expect("a spec");
    let spec: trainyard_common::spec::UncheckedJobSpec = job.into();
    let fetcher = Fetcher::local_only();
    let host = Host {
        sandbox,
        timeout: Duration::from_secs(60),
        stop: Shutdown::new(),
        grace: STOP_GRACE,
    };
    let cpu = tch::Device::Cpu;
    let start_in_process = || {
        let t = Instant::now();
        let data = Dataset::load(&spec, &fetcher).unwrap();
        let m = Module::load(model, cpu).unwrap();
        let tensors = ModelTensors::of_script(&m).unwrap();
        let net = Script::new(m).unwrap();
        (t.elapsed().as_secs_f64() * 1e3, (data, net, tensors))
    };
    let start_confined = || {
        let t = Instant::now();
        let r = Replica::new(&spec, cpu, &fetcher, &host).unwrap();
        (t.elapsed().as_secs_f64() * 1e3, r)
    };
    start_in_process();
    start_confined();
    let (start_a, start_b) = alternate(ROUNDS, &mut || start_in_process().0, &mut || {
        start_confined().0
    });
    Figure::new(
        "sandbox",
        "a TorchScript role's start (data, module, tensors) with its model process",
        start_b,
        "ms",
        "in the executor's process",
        start_a,
        Better::Lower,
    )
    .emit();

    // One batch, stepped again and again by both.
    let (_, (_, net, tensors)) = start_in_process();
    let (_, mut replica) = start_confined();
    let batch = replica.batches(0, 1, replica.cursor).recv().unwrap();
    let trainable = tensors.trainable_len();
    let weights = Tensor::cat(
        &tensors
            .trainable
            .iter()
            .map(|(_, t)| t.detach().reshape([-1]))
            .collect::<Vec<_>>(),
        0,
    );
    let mut grad = Tensor::new();
    let core = Core {
        spec: &spec,
        net: &net,
        tensors: &tensors,
        weights: &weights,
        trainable,
        numel: trainable,
        device: cpu,
    };
    let mut step_in_process = || {
        let t = Instant::now();
        core.forward_backward(&batch.x, &batch.y, batch.samples, true, &mut grad)
            .unwrap();
        t.elapsed().as_secs_f64() * 1e3
    };
    let mut step_confined = || {
        let t = Instant::now();
        replica.forward_backward(&batch).unwrap();
        t.elapsed().as_secs_f64() * 1e3
    };
    const STEPS: usize = 300;
    for _ in 0..20 {
        step_in_process();
        step_confined();
    }
    let (step_a, step_b) = alternate(STEPS, &mut step_in_process, &mut step_confined);
    Figure::new(
        "sandbox",
        "a forward and backward (batch 32) through the model process",
        step_b,
        "ms",
        "in the executor's process",
        step_a,
        Better::Lower,
    )
    .emit();
    record_data(
        "sandbox-role",
        &serde_json::json!({"rounds": ROUNDS, "steps": STEPS,
            "start_in_process_ms": start_a, "start_confined_ms": start_b,
            "step_in_process_ms": step_a, "step_confined_ms": step_b}),
    );
}
