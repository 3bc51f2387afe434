//! Sandbox benchmark: what the process boundary costs a model's
//! inspection. The same TorchScript module (a 64 → 256 → 256 → 10 MLP,
//! written by the venv's PyTorch) is loaded, its tensors listed and its
//! forward's schema checked, side by side in one invocation: in this
//! process (what the executor did before inspections were sandboxed) and
//! in a sandboxed child (`trainyard-executor --sandboxed inspection`:
//! spawn, exec, libtorch loaded, Landlock + seccomp + cgroups entered, the
//! answer as JSON). Rounds alternate the order; medians are compared.
//!
//! `cargo run --release -p trainyard-train-bench --bin inspect-bench` after
//! `source scripts/common.sh && torch_env` (and a release build of
//! `trainyard-executor`, whose binary is the child). Prints ms per
//! inspection for each and the difference; the child's start is the
//! figure a role process would also pay once per generation.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use trainyard_bench::figure::{record_data, Better, Figure};
use trainyard_common::cluster::InspectionResult;
use trainyard_executor::roles::inspect::{confined, Task};
use trainyard_executor::sandbox::{Mode, Sandbox};
use trainyard_sandbox::Limits;

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
    let program: PathBuf = exe.with_file_name("trainyard-executor");
    assert!(
        program.is_file(),
        "build trainyard-executor (release) first"
    );
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
                "inspection",
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
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            a.push(in_process());
            b.push(sandboxed());
        } else {
            b.push(sandboxed());
            a.push(in_process());
        }
    }
    let (a, b) = (median(a), median(b));
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
    let _ = std::fs::remove_dir_all(&dir);
}
