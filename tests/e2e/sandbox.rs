//! Strangers' models against a real executor, through the API, as a plain
//! user would send them (`tests/python/attacks.py`): TorchScript modules
//! that read host files with `torch.from_file` (a file in `/etc`, the
//! executor's join-token file, its cached copy of another user's dataset,
//! the object store's folder, the executor's own `/proc` entry), write one
//! through a shared mapping, allocate 8 GiB (in every forward, or only
//! while training, past the inspection: killed at its limit on each of
//! its 3 tries), loop forever in `forward`, and archives cut or scrambled
//! to break the loader.
//!
//! Each attack must end in a failed job with a reason that names the
//! operator or the limit; no byte of a target may reach anything the user
//! can read (reason, events, logs, metrics, a model); and the executor
//! must survive, with another user's job training beside the attacks on
//! the same executor finishing within a point of its undisturbed run, as
//! PyTorch measures the downloaded model on held-out rows.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use trainyard_common::JobState;
use trainyard_e2e::{
    eventually, python_script, repo_root, sandboxed_children, ApiClient, MlpSpec, Platform,
};

const ADMIN: &str = "e2e-sandbox-admin";

fn user(p: &Platform, name: &str) -> ApiClient {
    p.with_token(ADMIN).new_user(name)
}

fn upload(c: &ApiClient, name: &str, file: &Path) -> String {
    c.upload(name, file)
}

/// Bob's job: a built-in MLP on his own copy of digits, slowed by the
/// executor's hook so that it trains while the attacks run.
fn bystander(name: &str) -> Value {
    let mut spec = MlpSpec::digits(name).workers(1, 1).epochs(12).build();
    spec["dataset"] = json!({"kind": "file", "url": "artifact:bob-digits.npz"});
    spec["seed"] = json!(11);
    spec
}

/// The largest file under `dir` whose path contains `part`.
fn largest_file(dir: &Path, part: &str) -> Option<PathBuf> {
    let mut best: Option<(u64, PathBuf)> = None;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.display().to_string().contains(part) {
                let len = e.metadata().map_or(0, |m| m.len());
                if best.as_ref().is_none_or(|(l, _)| len > *l) {
                    best = Some((len, p));
                }
            }
        }
    }
    best.map(|(_, p)| p)
}

/// Everything user `c` can read about job `id`, as text.
fn readable(c: &ApiClient, id: &str) -> String {
    let mut all = String::new();
    all += &c.get(&format!("/v1/jobs/{id}")).to_string();
    all += &serde_json::to_string(&c.events(id)).unwrap();
    all += &c.log_messages(id).join("\n");
    all += &c.get(&format!("/v1/jobs/{id}/metrics")).to_string();
    for format in ["safetensors", "torchscript"] {
        let r = c.get_response(&format!("/v1/jobs/{id}/model?format={format}"));
        assert!(
            !r.status().is_success(),
            "a failed attack has no model to download"
        );
        all += &r.text().unwrap_or_default();
    }
    all
}

#[test]
fn hostile_models_fail_alone_and_leak_nothing_while_another_job_trains() {
    let p = Platform::builder("sandbox")
        .admin_token(ADMIN)
        .no_provisioner()
        .executor_env("TRAINYARD_INSPECTION_TIMEOUT_SECS", "20")
        .executor_env("TRAINYARD_SLOW_WORKER", "*:25")
        .start();
    let mut exec = p.executor("host");
    let (alice, bob) = (user(&p, "alice"), user(&p, "bob"));
    let digits = repo_root().join("data/digits.npz");
    upload(&bob, "bob-digits.npz", &digits);
    let alice_data = upload(&alice, "digits.npz", &digits);

    // Bob's undisturbed run: it also leaves his data in the executor's
    // cache and his weights in the object store, two of the targets.
    let quiet = bystander("quiet");
    let first = bob.submit(&quiet);
    let job = bob.wait_end(&first, Duration::from_secs(240));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let eval_dir = p.file("eval");
    let undisturbed = bob.pytorch_accuracy(&first, &quiet, &digits, &eval_dir);

    let cache = std::env::temp_dir().join(format!("ty-e2e-cache-{}-host", std::process::id()));
    let cached = largest_file(&cache, "").expect("bob's dataset in the executor's cache");
    let stored = largest_file(&p.data, &first).expect("bob's weights in the object store");
    let secrets = p.file("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    let token_file = secrets.join("join-token");
    std::fs::write(&token_file, p.join_token()).unwrap();
    let victim = std::env::temp_dir().join(format!("ty-sandbox-victim-{}", std::process::id()));
    std::fs::write(&victim, "the host's own bytes").unwrap();
    let targets = [
        PathBuf::from("/etc/passwd"),
        token_file,
        cached.clone(),
        stored.clone(),
        PathBuf::from(format!("/proc/{}/environ", exec.pid())),
    ];
    let models = p.file("attacks");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::write(
        models.join("targets.json"),
        json!({"read": targets, "write": victim}).to_string(),
    )
    .unwrap();
    python_script("attacks.py", &models);

    // Bob trains again while Alice's attacks run on the same executor.
    let busy = bystander("busy");
    let second = bob.submit(&busy);
    bob.wait_steps(&second, 20, Duration::from_secs(120));

    let mut attacks: Vec<(String, Vec<&str>)> = (0..targets.len())
        .map(|i| (format!("read-{i}.pt"), vec!["aten::from_file", "`forward`"]))
        .collect();
    attacks.extend([
        ("write.pt".to_owned(), vec!["aten::from_file", "`forward`"]),
        ("hog.pt".to_owned(), vec!["exceeded its", "MiB memory"]),
        // Killed at its limit on each try: the job tries 3 times, then fails.
        (
            "hog-train.pt".to_owned(),
            vec![
                "crashed on each of its 3 tries",
                "exceeded its",
                "MiB memory",
            ],
        ),
        ("spin.pt".to_owned(), vec!["did not finish within 20 s"]),
        ("truncated.pt".to_owned(), vec!["TorchScript"]),
        ("fuzzed.pt".to_owned(), vec!["TorchScript"]),
    ]);
    let jobs: Vec<(String, String, Vec<&str>)> = attacks
        .into_iter()
        .map(|(file, expect)| {
            let url = upload(&alice, &file, &models.join(&file));
            let spec = json!({
                "name": file.trim_end_matches(".pt"),
                "model": {"kind": "torchscript", "url": url},
                "dataset": {"kind": "file", "url": alice_data},
                "loss": "cross_entropy",
                "optimizer": {"kind": "sgd", "lr": 0.1},
                "batch_size": 32, "steps": 20,
                "resources": {"memory_mb": 512},
            });
            (file, alice.submit(&spec), expect)
        })
        .collect();
    assert_eq!(
        bob.state(&second),
        "running",
        "the attacks ran beside Bob's job"
    );

    // Distinctive text of the targets; the binary ones (Bob's data and
    // weights) could only come back in a model, and a failed job has none.
    let needles = [
        p.join_token().to_owned(),
        "root:x:0:0".to_owned(),
        format!("TRAINYARD_CACHE_DIR={}", cache.display()),
    ];
    for (file, id, expect) in &jobs {
        alice.wait_failed_with(file, id, Duration::from_secs(180), expect);
        let crashes = alice
            .events(id)
            .into_iter()
            .filter(|e| e.kind == trainyard_common::EventKind::Crash)
            .count();
        let tries = if file == "hog-train.pt" { 2 } else { 0 };
        assert_eq!(crashes, tries, "{file}: crash events");
        let seen = readable(&alice, id);
        for n in &needles {
            assert!(
                !seen.contains(n.as_str()),
                "{file}: a target's bytes reached the user"
            );
        }
    }
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "the host's own bytes",
        "the shared mapping wrote the host's file"
    );

    // The executor survived everything and Bob's job trained as if alone.
    assert!(exec.running(), "the executor died: {}", exec.output());
    let job = bob.wait_end(&second, Duration::from_secs(300));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let disturbed = bob.pytorch_accuracy(&second, &busy, &digits, &eval_dir);
    assert!(
        (disturbed - undisturbed).abs() <= 0.01,
        "bob's job: {disturbed:.4} beside the attacks, {undisturbed:.4} alone"
    );
    eprintln!("bob's job: {disturbed:.4} beside the attacks, {undisturbed:.4} alone");
    let listed = p.with_token(ADMIN).executors(None);
    let me = listed.executors.iter().find(|e| e.name == "host").unwrap();
    let sandbox = me
        .sandbox
        .as_ref()
        .expect("the executor reports its sandbox");
    assert_eq!(
        sandbox.state,
        trainyard_common::cluster::SandboxState::Confined,
        "{sandbox:?}"
    );
    let _ = std::fs::remove_file(&victim);

    // A cancelled job's inspection is killed at once, not at its timeout.
    let mut spec = json!({
        "name": "spin-cancelled",
        "model": {"kind": "torchscript", "url": "artifact:spin.pt"},
        "dataset": {"kind": "file", "url": alice_data},
        "loss": "cross_entropy", "optimizer": {"kind": "sgd", "lr": 0.1},
        "batch_size": 32, "steps": 20,
    });
    spec["resources"] = json!({"memory_mb": 512});
    let id = alice.submit(&spec);
    let child = eventually(Duration::from_secs(60), || {
        sandboxed_children(&[exec.pid()], "inspection")
            .into_iter()
            .next()
    })
    .expect("the executor starts a sandboxed inspection");
    let (status, body) = alice.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
    assert!(status < 300, "{status} {body}");
    let gone = eventually(Duration::from_secs(10), || {
        (!Path::new(&format!("/proc/{child}")).exists()).then_some(())
    });
    assert!(
        gone.is_some(),
        "the inspection of a cancelled job still runs"
    );

    // A cancelled job's model process is killed within seconds, and the
    // executor's one device is given to the next job only once that
    // process has exited: never two model processes on it at once.
    let good = upload(&alice, "good.pt", &models.join("good-for-fuzz.pt"));
    let model_job = |name: &str, steps: u64| {
        json!({
            "name": name,
            "model": {"kind": "torchscript", "url": good},
            "dataset": {"kind": "file", "url": alice_data},
            "loss": "cross_entropy", "optimizer": {"kind": "sgd", "lr": 0.1},
            "batch_size": 32, "steps": steps, "resources": {"memory_mb": 512},
        })
    };
    let long = alice.submit(&model_job("cancelled-mid-run", 1_000_000));
    alice.wait_steps(&long, 5, Duration::from_secs(120));
    let old = sandboxed_children(&[exec.pid()], "model");
    assert!(!old.is_empty(), "the running job has a model process");
    let (status, body) = alice.post(&format!("/v1/jobs/{long}/cancel"), &json!({}));
    assert!(status < 300, "{status} {body}");
    let next = alice.submit(&model_job("after-the-cancelled", 20));
    let alive = |pid: &u32| Path::new(&format!("/proc/{pid}")).exists();
    let exited = eventually(Duration::from_secs(5), || {
        let now = sandboxed_children(&[exec.pid()], "model");
        assert!(
            !(now.iter().any(|p| !old.contains(p)) && old.iter().any(alive)),
            "the next job's model process started beside the cancelled one's"
        );
        (!old.iter().any(alive)).then_some(())
    });
    assert!(
        exited.is_some(),
        "a cancelled job's model process outlived 5 s"
    );
    let job = alice.wait_end(&next, Duration::from_secs(120));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    assert!(exec.running(), "the executor died: {}", exec.output());
}
