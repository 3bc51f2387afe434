//! Scripts as people write them: the same unmodified DDP script
//! (`tests/python/scripts/ddp_digits.py`) with what people add to it every
//! day — DataLoader worker processes (fork, spawn with persistent workers,
//! forkserver), `torch.compile`, and packages of their own (an inline
//! requirement that overrides the runtime's tqdm, a requirements file with
//! scikit-learn's compiled wheels, and the dependencies of the code's own
//! `pyproject.toml`) — each as a 2-rank script job, within 1.5 points of
//! torchrun's run of the same script in the same test, judged by PyTorch in
//! eval mode on digits no job saw. Packages come from the real index
//! through each install's confined proxy; a second job with the same
//! requirements uses the executor's cached environment; each rank's
//! install phases are job events naming one environment; the executors
//! list their caches; a project's `uv.lock` pin wins over a fresh
//! resolution.
//!
//! The attacks: a package whose build step reads host files, connects to
//! the platform's database and API and writes outside its environment
//! (served by an index of the test's own, which the executors are told to
//! use) gets nothing, and its job fails at once naming it; a project that
//! names its own sources (a git repository in `[tool.uv.sources]`, a
//! `uv.lock` pinning a wheel at the database's address) fails at once
//! naming them; a rank cannot
//! write into its cached environment; its `/dev/shm` is its own. A script
//! that fails the same way twice before reporting anything fails its job
//! without spending its remaining restarts.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;
use trainyard_common::cluster::PackagesStage;
use trainyard_common::{EventData, EventKind, JobState};
use trainyard_e2e::script_jobs::{
    ddp_accuracy as accuracy, download, python, scripts_dir as scripts, split_digits as digits,
    torchrun_model,
};
use trainyard_e2e::{eventually, repo_root, run_ok, ApiClient, Platform, Proc};

const ADMIN: &str = "e2e-scripts-written-admin";

/// `torchrun --nproc-per-node 2 ddp_digits.py ARGS` on `train`, with
/// `python_path` (packages installed for the reference) on its path.
fn torchrun(
    p: &Platform,
    label: &str,
    train: &Path,
    args: &[String],
    python_path: Option<&Path>,
) -> Child {
    let reference = p.file(label);
    let inputs = reference.join("inputs");
    std::fs::create_dir_all(&inputs).unwrap();
    std::fs::copy(train, inputs.join("digits-train.npz")).unwrap();
    let mut cmd = Command::new(python());
    cmd.args([
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
    ])
    .arg(scripts().join("ddp_digits.py"))
    .args(args)
    .env("TRAINYARD_INPUT_DIR", &inputs)
    .env("TRAINYARD_OUTPUT_DIR", reference.join("outputs"))
    .env("TRAINYARD_CHECKPOINT_DIR", reference.join("checkpoints"))
    .env("TORCHINDUCTOR_CACHE_DIR", reference.join("inductor"))
    .env("OMP_NUM_THREADS", "1");
    if let Some(p) = python_path {
        cmd.env("PYTHONPATH", p);
    }
    cmd.spawn().unwrap()
}

/// The venv's uv (`scripts/test` installs it beside the venv's Python).
fn uv() -> PathBuf {
    Path::new(&python()).parent().unwrap().join("uv")
}

/// One row of the matrix: what the script is given and what it needs.
struct Row {
    name: &'static str,
    args: Vec<&'static str>,
    /// The spec's `script.requirements` (`None`: none, or the code's own).
    requirements: Option<Value>,
    /// The code: `train.py`, or an archive with a `pyproject.toml`.
    code: &'static str,
    /// What the log must show (the package the script imported, say).
    shows: &'static str,
}

fn job(row: &Row, epochs: u32) -> Value {
    let mut args = vec!["--epochs".to_owned(), epochs.to_string()];
    args.extend(row.args.iter().map(|a| a.to_string()));
    let mut script =
        json!({"code": format!("artifact:{}", row.code), "args": args, "max_restarts": 1});
    if row.code.ends_with(".tar.gz") {
        script["entrypoint"] = json!("ddp_digits.py");
    }
    if let Some(r) = &row.requirements {
        script["requirements"] = r.clone();
    }
    json!({
        "name": row.name,
        "script": script,
        "inputs": ["artifact:digits-train.npz"],
        "workers": {"min": 2, "max": 2},
        "resources": {"memory_mb": 1536},
    })
}

fn log_text(c: &ApiClient, id: &str) -> String {
    c.log_messages(id).join("\n")
}

/// Waits up to `limit` for job `id` to succeed; its log.
fn succeeded(c: &ApiClient, id: &str, limit: Duration) -> String {
    let done = c.wait_end(id, limit);
    let log = log_text(c, id);
    assert_eq!(
        done.state,
        JobState::Succeeded,
        "{}\n{log}",
        done.state_reason
    );
    log
}

/// The `packages` events of job `id`: (rank, stage, environment).
fn package_phases(c: &ApiClient, id: &str) -> Vec<(u32, PackagesStage, Option<String>)> {
    c.events(id)
        .into_iter()
        .filter(|e| e.kind == EventKind::Packages)
        .map(|e| match EventData::from_json(e.kind, &e.data) {
            Ok(EventData::Packages(p)) => (p.rank, p.phase.stage, p.phase.environment),
            other => panic!("a packages event that does not decode: {other:?} {e:?}"),
        })
        .collect()
}

/// Each of `ranks` got an environment (made or cached) and all got the
/// same one: its key.
fn one_environment(phases: &[(u32, PackagesStage, Option<String>)], ranks: u32) -> String {
    let mut keys = Vec::new();
    for r in 0..ranks {
        let got: Vec<&Option<String>> = phases
            .iter()
            .filter(|(rank, stage, _)| {
                *rank == r && matches!(stage, PackagesStage::Ready | PackagesStage::Cached)
            })
            .map(|(_, _, env)| env)
            .collect();
        assert_eq!(got.len(), 1, "rank {r}'s environment: {phases:?}");
        keys.push(got[0].clone().expect("an environment's key"));
    }
    assert!(
        keys.iter().all(|k| k == &keys[0]),
        "ranks differ: {phases:?}"
    );
    keys.swap_remove(0)
}

#[test]
fn scripts_as_people_write_them_train_like_torchrun() {
    let p = Platform::builder("scripts-written")
        .admin_token(ADMIN)
        .no_provisioner()
        .executor_env("TRAINYARD_TORCH_THREADS", "1")
        .executor_ram_mb(6144)
        .start();
    let _execs = [p.executor("a"), p.executor("b")];
    let alice = p.with_token(ADMIN).new_user("alice");
    let (train, test) = digits(&p);
    alice.upload("train.py", &scripts().join("ddp_digits.py"));
    alice.upload("digits-train.npz", &train);
    let requirements = p.file("requirements.txt");
    std::fs::write(&requirements, "# the script's own\nscikit-learn>=1.5\n").unwrap();
    alice.upload("requirements.txt", &requirements);
    // The code as a project: the script and a pyproject.toml that declares
    // what it imports.
    let project = p.file("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::copy(
        scripts().join("ddp_digits.py"),
        project.join("ddp_digits.py"),
    )
    .unwrap();
    std::fs::write(
        project.join("pyproject.toml"),
        "[project]\nname = \"digits\"\nversion = \"0.1\"\ndependencies = [\"tabulate==0.9.0\"]\n",
    )
    .unwrap();
    let archive = p.file("project.tar.gz");
    run_ok(
        Command::new("tar")
            .arg("czf")
            .arg(&archive)
            .arg("-C")
            .arg(&project)
            .args(["ddp_digits.py", "pyproject.toml"]),
        "tar",
    );
    alice.upload("project.tar.gz", &archive);
    // torchrun's packages, installed on the host as a user would.
    let reference_packages = p.file("reference-packages");
    run_ok(
        Command::new(uv())
            .args(["pip", "install", "--quiet", "--target"])
            .arg(&reference_packages)
            .args([
                "--python",
                &python(),
                "scikit-learn>=1.5",
                "tabulate==0.9.0",
                "numpy==2.4.6",
            ])
            .env("UV_SYSTEM_CERTS", "1"),
        "uv pip install (torchrun's packages)",
    );

    let rows = [
        Row {
            name: "loader-fork",
            args: vec!["--workers", "2", "--start-method", "fork"],
            requirements: None,
            code: "train.py",
            shows: "epoch 3 loss",
        },
        Row {
            name: "loader-spawn",
            args: vec!["--workers", "2", "--start-method", "spawn", "--persistent"],
            requirements: None,
            code: "train.py",
            shows: "epoch 3 loss",
        },
        Row {
            // With forkserver workers: the third start method.
            name: "inline-tqdm",
            args: vec![
                "--progress",
                "--workers",
                "2",
                "--start-method",
                "forkserver",
            ],
            requirements: Some(json!(["tqdm==4.66.5"])),
            code: "train.py",
            shows: "tqdm 4.66.5 from",
        },
        Row {
            name: "requirements-file",
            args: vec!["--sklearn"],
            requirements: Some(json!("artifact:requirements.txt")),
            code: "train.py",
            shows: "scikit-learn 1.",
        },
        Row {
            name: "pyproject",
            args: vec!["--table"],
            requirements: None,
            code: "project.tar.gz",
            shows: "epochs",
        },
        Row {
            name: "compiled",
            args: vec!["--compile"],
            requirements: None,
            code: "train.py",
            shows: "epoch 3 loss",
        },
    ];
    let mut failures = Vec::new();
    for row in &rows {
        // 4 epochs for each: a compiled DDP model's BatchNorm running
        // statistics, under torchrun too, are not yet usable after 2.
        let epochs = 4;
        let id = alice.submit(&job(row, epochs));
        let mut args = vec!["--epochs".to_owned(), epochs.to_string()];
        args.extend(row.args.iter().map(|a| a.to_string()));
        let needs = matches!(row.name, "requirements-file" | "pyproject");
        let reference = torchrun(
            &p,
            &format!("torchrun-{}", row.name),
            &train,
            &args,
            needs.then_some(reference_packages.as_path()),
        );
        let done = alice.wait_end(&id, Duration::from_secs(600));
        let log = log_text(&alice, &id);
        let theirs = torchrun_model(&p, &format!("torchrun-{}", row.name), reference);
        if done.state != JobState::Succeeded {
            failures.push(format!(
                "{}: {:?} {}\n{log}",
                row.name, done.state, done.state_reason
            ));
            continue;
        }
        assert!(
            log.contains(row.shows),
            "{}: {:?} not in\n{log}",
            row.name,
            row.shows
        );
        let ours = p.file(&format!("{}.pt", row.name));
        download(&alice, &format!("/v1/jobs/{id}/outputs/model.pt"), &ours);
        let (a, b) = (accuracy(&ours, &test), accuracy(&theirs, &test));
        eprintln!("{}: script job {a:.4}, torchrun {b:.4}", row.name);
        if !(a > 0.9 && (a - b).abs() <= 0.015) {
            failures.push(format!("{}: script job {a:.4}, torchrun {b:.4}", row.name));
        }
        if row.requirements.is_some() || row.code.ends_with(".tar.gz") {
            assert!(
                log.contains("packages: "),
                "{}: no package phase in\n{log}",
                row.name
            );
            // As events too: each rank's phases (made, or found in the
            // executor's cache by an earlier run), one environment for both;
            // a rank that made it resolved first.
            let phases = package_phases(&alice, &id);
            let key = one_environment(&phases, 2);
            for (rank, stage, _) in &phases {
                if *stage == PackagesStage::Ready {
                    assert!(
                        phases.contains(&(*rank, PackagesStage::Resolving, None)),
                        "{}: {phases:?}",
                        row.name
                    );
                }
            }
            eprintln!("{}: environment {key}, phases {phases:?}", row.name);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));

    // The same requirements again: each executor's cached environment.
    let again = alice.submit(&job(&rows[2], 1));
    let log = succeeded(&alice, &again, Duration::from_secs(300));
    assert!(
        log.contains("packages: this executor's environment for them"),
        "{log}"
    );
    assert!(
        !log.contains("packages: resolving"),
        "resolved again:\n{log}"
    );
    let phases = package_phases(&alice, &again);
    one_environment(&phases, 2);
    assert!(
        phases.iter().all(|(_, s, _)| *s == PackagesStage::Cached),
        "{phases:?}"
    );
    // Each executor lists its cache: environments on its disk, in budget.
    let admin = p.with_token(ADMIN);
    let listed = eventually(Duration::from_secs(30), || {
        let list = admin.executors(Some("live")).executors;
        let caches: Vec<_> = list.iter().filter_map(|e| e.environments).collect();
        (caches.len() == 2 && caches.iter().all(|c| c.environments >= 2 && c.bytes > 0))
            .then_some(caches)
    })
    .unwrap_or_else(|| panic!("no environment cache listed: {:?}", admin.executors(None)));
    for c in &listed {
        assert!(c.bytes <= c.budget_bytes, "{c:?}");
    }
    eprintln!("the executors' environment caches: {listed:?}");

    // A project with a uv.lock: the lock's pins are what is installed, not
    // a fresh resolution of its pyproject.toml (which would take the
    // newest tabulate).
    let locked = p.file("locked");
    std::fs::create_dir_all(&locked).unwrap();
    std::fs::write(
        locked.join("show.py"),
        "import tabulate\nprint('tabulate', tabulate.__version__, flush=True)\n",
    )
    .unwrap();
    let pyproject = |dependency: &str| {
        format!(
            "[project]\nname = \"locked\"\nversion = \"0.1\"\nrequires-python = \">=3.10\"\ndependencies = [\"{dependency}\"]\n"
        )
    };
    std::fs::write(locked.join("pyproject.toml"), pyproject("tabulate==0.9.0")).unwrap();
    run_ok(
        Command::new(uv())
            .args(["lock", "--quiet", "--project"])
            .arg(&locked)
            .env("UV_SYSTEM_CERTS", "1"),
        "uv lock",
    );
    std::fs::write(locked.join("pyproject.toml"), pyproject("tabulate>=0.9")).unwrap();
    let archive = p.file("locked.tar.gz");
    run_ok(
        Command::new("tar")
            .arg("czf")
            .arg(&archive)
            .arg("-C")
            .arg(&locked)
            .args(["show.py", "pyproject.toml", "uv.lock"]),
        "tar",
    );
    alice.upload("locked.tar.gz", &archive);
    let id = alice.submit(&json!({
        "name": "uv-lock",
        "script": {"code": "artifact:locked.tar.gz", "entrypoint": "show.py"},
        "workers": {"min": 1, "max": 1},
        "resources": {"memory_mb": 512},
    }));
    let log = succeeded(&alice, &id, Duration::from_secs(300));
    assert!(
        log.contains("tabulate 0.9.0"),
        "the lock's pin is not what ran:\n{log}"
    );
    one_environment(&package_phases(&alice, &id), 1);

    // Another torch than the runtime's: the job fails at once with the
    // resolver's conflict, naming both.
    let mut other = job(&rows[2], 1);
    other["script"]["requirements"] = json!(["torch==2.0.0"]);
    let id = alice.submit(&other);
    let done = alice.wait_end(&id, Duration::from_secs(120));
    assert_eq!(done.state, JobState::Failed);
    assert!(
        done.state_reason.contains("torch==2.0.0") && done.state_reason.contains("torch==2.11.0"),
        "{}",
        done.state_reason
    );
    eprintln!("another torch: {}", done.state_reason);
}

/// The port of a `postgres://…@host:port/db` URL.
fn db_port(url: &str) -> u16 {
    let after = url.rsplit('@').next().unwrap();
    let hostport = after.split('/').next().unwrap();
    hostport.rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn a_packages_build_step_gets_nothing_and_a_rank_cannot_touch_its_environment() {
    // The platform's own index: a mirror an admin names with
    // --package-index, served by the test on loopback.
    let index_port = trainyard_e2e::free_port().unwrap();
    let base = std::env::temp_dir().join(format!("trainyard-index-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let marker = base.join("pwned");
    // The database's and the API's ports are known once the platform runs;
    // the index is written after it starts.
    let p = Platform::builder("scripts-packages")
        .admin_token(ADMIN)
        .no_provisioner()
        .executor_env(
            "TRAINYARD_PACKAGE_INDEX",
            &format!("http://127.0.0.1:{index_port}/simple"),
        )
        .start();
    run_ok(
        Command::new(python())
            .arg(repo_root().join("tests/python/packages/local_index.py"))
            .arg(base.join("index"))
            .arg(db_port(&p.db).to_string())
            .arg(p.port.to_string())
            .arg(&marker),
        "local_index.py",
    );
    let mut serve = Command::new(python());
    serve
        .args(["-m", "http.server", "--bind", "127.0.0.1"])
        .arg(index_port.to_string())
        .arg("--directory")
        .arg(base.join("index"));
    let _index = Proc::spawn(serve).unwrap();
    let _exec = p.executor("a");
    let mallory = p.with_token(ADMIN).new_user("mallory");

    // The hostile build: the job fails at once, naming the package, and
    // the build step got nothing.
    let probe = p.file("probe.py");
    std::fs::write(&probe, PROBE).unwrap();
    mallory.upload("probe.py", &probe);
    let spec = |name: &str, requirements: Value, restarts: u32| {
        json!({
            "name": name,
            "script": {"code": "artifact:probe.py", "requirements": requirements, "max_restarts": restarts},
            "workers": {"min": 1, "max": 1},
            "resources": {"memory_mb": 512},
        })
    };
    let hostile = mallory.submit(&spec("hostile", json!(["hostile-build"]), 3));
    let job = mallory.wait_end(&hostile, Duration::from_secs(300));
    let log = log_text(&mallory, &hostile);
    assert_eq!(job.state, JobState::Failed, "{log}");
    let reason = &job.state_reason;
    assert!(
        reason.contains("installing the script's packages failed") && reason.contains("hostile"),
        "{reason}"
    );
    let got = reason
        .lines()
        .chain(log.lines())
        .find_map(|l| l.split("hostile-build got ").nth(1))
        .unwrap_or_else(|| panic!("the build step's report is missing:\n{reason}\n{log}"));
    let got: Value = serde_json::from_str(got.trim()).unwrap();
    eprintln!("the hostile build step got {got}");
    assert!(got.get("database via the proxy").is_some(), "{got}");
    assert!(
        reason.contains(&format!(
            "127.0.0.1:{}, which is not the package index",
            db_port(&p.db)
        )),
        "the proxy's refusal is not named: {reason}"
    );
    for (what, result) in got.as_object().unwrap() {
        let r = result.as_str().unwrap();
        assert!(
            r.starts_with("denied") || r.starts_with("unreachable"),
            "the build step got {what}: {r}"
        );
    }
    assert!(
        !marker.exists(),
        "the build step wrote {}",
        marker.display()
    );
    assert!(!log.contains("restart 1)"), "a restart was spent:\n{log}");

    // A package the index does not have: the resolver's message, at once.
    let missing = mallory.submit(&spec("missing", json!(["no-such-package-anywhere"]), 3));
    let job = mallory.wait_end(&missing, Duration::from_secs(120));
    assert_eq!(job.state, JobState::Failed);
    assert!(
        job.state_reason.contains("no-such-package-anywhere"),
        "{}",
        job.state_reason
    );
    eprintln!("a missing package: {}", job.state_reason);

    // A project that names its own package sources: a git repository in
    // its pyproject.toml, or a uv.lock (out of step with its
    // pyproject.toml, which --frozen does not check) that pins a wheel at
    // the database's address. Each fails at once, naming what it asked.
    let db = db_port(&p.db);
    let project = |name: &str, pyproject: &str, lock: Option<String>| -> String {
        let dir = p.file(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("main.py"), "import tiny_ok\n").unwrap();
        std::fs::write(dir.join("pyproject.toml"), pyproject).unwrap();
        let mut files = vec!["main.py", "pyproject.toml"];
        if let Some(lock) = &lock {
            std::fs::write(dir.join("uv.lock"), lock).unwrap();
            files.push("uv.lock");
        }
        let archive = p.file(&format!("{name}.tar.gz"));
        run_ok(
            Command::new("tar")
                .arg("czf")
                .arg(&archive)
                .arg("-C")
                .arg(&dir)
                .args(&files),
            "tar",
        );
        let file = format!("{name}.tar.gz");
        mallory.upload(&file, &archive);
        mallory.submit(&json!({
            "name": name,
            "script": {"code": format!("artifact:{file}"), "entrypoint": "main.py", "max_restarts": 3},
            "workers": {"min": 1, "max": 1},
            "resources": {"memory_mb": 256},
        }))
    };
    let plain = "[project]\nname = \"p\"\nversion = \"0.1\"\nrequires-python = \">=3.10\"\ndependencies = [\"tiny-ok\"]\n";
    let git = project(
        "git-source",
        &format!(
            "{plain}[tool.uv.sources]\ntiny-ok = {{ git = \"https://example.org/tiny-ok\" }}\n"
        ),
        None,
    );
    let wheel = format!("http://127.0.0.1:{db}/tiny_ok-1.0-py3-none-any.whl");
    let lock = format!(
        r#"version = 1
revision = 3
requires-python = ">=3.10"

[[package]]
name = "p"
version = "0.1"
source = {{ virtual = "." }}
dependencies = [{{ name = "tiny-ok" }}]

[package.metadata]
requires-dist = [{{ name = "tiny-ok", url = "{wheel}" }}]

[[package]]
name = "tiny-ok"
version = "1.0"
source = {{ url = "{wheel}" }}
wheels = [{{ url = "{wheel}", hash = "sha256:{zeros}" }}]
"#,
        zeros = "0".repeat(64)
    );
    let url = project("url-lock", plain, Some(lock));
    for (id, want) in [
        (git, "[tool.uv] sources is not taken".to_string()),
        (url, format!("\"tiny-ok @ {wheel}\" direct references")),
    ] {
        let job = mallory.wait_end(&id, Duration::from_secs(180));
        let log = log_text(&mallory, &id);
        assert_eq!(job.state, JobState::Failed, "{log}");
        assert!(
            job.state_reason.contains(&want),
            "{want}: {}",
            job.state_reason
        );
        assert!(!log.contains("restart 1)"), "a restart was spent:\n{log}");
        eprintln!("a project's own sources: {}", job.state_reason);
    }

    // A benign package from the index: the rank imports it, cannot write
    // its environment, has a /dev/shm of its own and a working
    // multiprocessing queue.
    let ok = mallory.submit(&spec("probe", json!(["tiny-ok==1.0"]), 0));
    succeeded(&mallory, &ok, Duration::from_secs(300));
    let report = p.file("probe.json");
    download(
        &mallory,
        &format!("/v1/jobs/{ok}/outputs/probe.json"),
        &report,
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["tiny_ok"], 42, "{report}");
    for k in ["write_site_packages", "write_package", "write_runtime"] {
        let r = report[k].as_str().unwrap();
        assert!(r.starts_with("denied"), "{k}: {r} ({report})");
    }
    assert_eq!(
        report["shm"],
        json!([]),
        "another's /dev/shm is visible: {report}"
    );
    assert_eq!(report["queue"], "ok", "{report}");
    eprintln!("the rank's probe: {report}");

    // A script that fails the same way twice before its first report: the
    // job fails then, with restarts left.
    let broken = p.file("broken.py");
    std::fs::write(&broken, "import no_module_of_this_name\n").unwrap();
    mallory.upload("broken.py", &broken);
    let id = mallory.submit(&json!({
        "name": "broken",
        "script": {"code": "artifact:broken.py", "max_restarts": 5},
        "workers": {"min": 1, "max": 1},
        "resources": {"memory_mb": 256},
    }));
    let job = mallory.wait_end(&id, Duration::from_secs(180));
    let log = log_text(&mallory, &id);
    assert_eq!(job.state, JobState::Failed, "{log}");
    assert!(
        job.state_reason.contains("same way on two tries")
            && job.state_reason.contains("no_module_of_this_name"),
        "{}",
        job.state_reason
    );
    assert!(
        !log.contains("restart 2)"),
        "more restarts were spent:\n{log}"
    );
    eprintln!("failed fast: {}", job.state_reason);
    let _ = std::fs::remove_dir_all(&base);
}

/// A rank that checks what its environment and shared memory allow, and
/// writes `probe.json` to its outputs.
const PROBE: &str = r##"
import json, multiprocessing, os, sys, sysconfig
import tiny_ok
import torch

out = {"tiny_ok": tiny_ok.VALUE}

def attempt(path):
    try:
        with open(path, "a") as f:
            f.write("# changed by another job\n")
        return "wrote " + path
    except OSError as e:
        return "denied: " + e.__class__.__name__

site = sysconfig.get_paths()["purelib"]
out["write_site_packages"] = attempt(os.path.join(site, "evil.pth"))
out["write_package"] = attempt(tiny_ok.__file__)
out["write_runtime"] = attempt(torch.__file__)
out["shm"] = sorted(os.listdir("/dev/shm"))
q = multiprocessing.Queue()
q.put("ok")
out["queue"] = q.get(timeout=10)
os.makedirs(os.environ["TRAINYARD_OUTPUT_DIR"], exist_ok=True)
with open(os.path.join(os.environ["TRAINYARD_OUTPUT_DIR"], "probe.json"), "w") as f:
    json.dump(out, f)
"##;
