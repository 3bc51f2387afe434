//! What the script-job tests share: the digits split the DDP script trains
//! on, the same script run by `torchrun` beside the platform as the
//! reference, an output downloaded from the API, and PyTorch's eval-mode
//! accuracy of a saved `state_dict` on rows no job saw.

use crate::{repo_root, run_ok, ApiClient, Platform};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// The venv's Python (`TRAINYARD_PYTHON`, which `scripts/test` exports).
pub fn python() -> String {
    std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The folder of the test scripts (`tests/python/scripts`).
pub fn scripts_dir() -> PathBuf {
    repo_root().join("tests/python/scripts")
}

/// Digits split into the training rows and 500 no job sees, in the
/// platform's folder: (train, test).
pub fn split_digits(p: &Platform) -> (PathBuf, PathBuf) {
    let dir = p.file("digits");
    let mut write = Command::new(python());
    write
        .arg(repo_root().join("tests/python/user_models.py"))
        .args(["write".as_ref(), dir.as_os_str()]);
    run_ok(&mut write, "user_models.py write");
    (dir.join("train.npz"), dir.join("test.npz"))
}

/// `torchrun --standalone --nproc-per-node NPROC ddp_digits.py ARGS` on
/// `train`, its folders under the platform's folder `label` (its weights:
/// [`torchrun_model`]).
pub fn torchrun(p: &Platform, label: &str, train: &Path, nproc: u32, args: &[&str]) -> Child {
    let reference = p.file(label);
    let inputs = reference.join("inputs");
    std::fs::create_dir_all(&inputs).unwrap();
    std::fs::copy(train, inputs.join("digits-train.npz")).unwrap();
    Command::new(python())
        .args([
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
        ])
        .arg(nproc.to_string())
        .arg(scripts_dir().join("ddp_digits.py"))
        .args(args)
        .env("TRAINYARD_INPUT_DIR", &inputs)
        .env("TRAINYARD_OUTPUT_DIR", reference.join("outputs"))
        .env("TRAINYARD_CHECKPOINT_DIR", reference.join("checkpoints"))
        .env("TORCHINDUCTOR_CACHE_DIR", reference.join("inductor"))
        .env("OMP_NUM_THREADS", "1")
        .spawn()
        .unwrap()
}

/// The weights torchrun's run `label` left, once it has ended successfully.
pub fn torchrun_model(p: &Platform, label: &str, run: Child) -> PathBuf {
    let status = run.wait_with_output().unwrap().status;
    assert!(status.success(), "torchrun ({label}) failed: {status}");
    p.file(label).join("outputs/model.pt")
}

/// Downloads `path` from the API as `c` into `to`; panics unless 200.
pub fn download(c: &ApiClient, path: &str, to: &Path) {
    let r = c.get_response(path);
    let status = r.status();
    let bytes = r.bytes().unwrap();
    assert_eq!(
        status,
        200,
        "GET {path}: {}",
        String::from_utf8_lossy(&bytes)
    );
    std::fs::write(to, bytes).unwrap();
}

/// PyTorch's eval-mode accuracy of the DDP script's `model` on `test`.
pub fn ddp_accuracy(model: &Path, test: &Path) -> f64 {
    let mut evaluate = Command::new(python());
    evaluate
        .arg(scripts_dir().join("evaluate_ddp.py"))
        .args([model, test]);
    let out = run_ok(&mut evaluate, "evaluate_ddp.py");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["accuracy"].as_f64().unwrap()
}
