//! Script jobs: a user's own PyTorch DDP script (`tests/python/scripts/
//! ddp_digits.py`, plain PyTorch: gloo, a BatchNorm CNN, its own
//! DistributedSampler and checkpoints) runs unmodified on two executors
//! under torchrun's environment contract, and its downloaded output,
//! evaluated by PyTorch in eval mode on digits no job saw, is within 1.5
//! points of the same script run by `torchrun --nproc-per-node 2` in the
//! same test. A hostile script's attempts (host files, the executor's
//! environment, another job's folders, a shell, a fork bomb, the API
//! without a token) are each contained while the DDP job trains beside it;
//! a memory bomb fails its job naming the limit; a cancelled script's
//! processes are gone within seconds. An elastic job (2 to 3 ranks)
//! restarts (restart count 1) when one of its executors is SIGKILLed and a
//! replacement registers, grows to world 3 when a third executor joins,
//! each time every rank restarting from the last committed checkpoint, and
//! ends within 1.5 points of torchrun's uninterrupted run; its
//! checkpoints and outputs go through the test S3 server. A script that
//! never ends is killed at its `script.max_seconds` and fails its job,
//! naming the limit, without a restart; hostile code archives a user
//! uploads (`tests/python/hostile_archives.py`: absolute and climbing
//! paths, links, special files, too many entries, bombs) each fail their
//! job naming what was refused, and nothing lands outside the job's folder.

use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use trainyard_common::JobState;
use trainyard_e2e::script_jobs::{
    ddp_accuracy as accuracy, download, scripts_dir as scripts, split_digits as digits, torchrun,
    torchrun_model,
};
use trainyard_e2e::{eventually, repo_root, ApiClient, Platform};

const ADMIN: &str = "e2e-scripts-admin";

fn user(p: &Platform, name: &str) -> ApiClient {
    p.with_token(ADMIN).new_user(name)
}

fn upload(c: &ApiClient, name: &str, file: &Path) -> String {
    c.upload(name, file)
}

fn ddp_job(name: &str, epochs: u32) -> Value {
    json!({
        "name": name,
        "script": {"code": "artifact:train.py", "args": ["--epochs", epochs.to_string()]},
        "inputs": ["artifact:digits-train.npz"],
        "workers": {"min": 2, "max": 2},
        "resources": {"memory_mb": 1024},
    })
}

/// The log of job `id`, one line each.
fn log_text(c: &ApiClient, id: &str) -> String {
    c.log_messages(id).join("\n")
}

#[test]
fn an_unmodified_ddp_script_trains_like_torchrun_and_a_hostile_one_is_contained() {
    let p = Platform::builder("scripts")
        .admin_token(ADMIN)
        .no_provisioner()
        .executor_env("TRAINYARD_TORCH_THREADS", "1")
        .start();
    let mut execs = [p.executor("a"), p.executor("b")];
    let alice = user(&p, "alice");
    let mallory = user(&p, "mallory");

    // The data: digits split into the training rows and 500 no job sees.
    let (train, test) = digits(&p);
    upload(&alice, "train.py", &scripts().join("ddp_digits.py"));
    upload(&alice, "digits-train.npz", &train);

    // The script job, and torchrun's run of the same script beside it.
    let id = alice.submit(&ddp_job("ddp", 4));
    let reference = torchrun(&p, "torchrun", &train, 2, &["--epochs", "4"]);

    // Mallory's hostile script runs on the same executors meanwhile.
    upload(&mallory, "hostile.py", &scripts().join("hostile.py"));
    let token_file = p.file("join-token");
    std::fs::write(&token_file, p.join_token()).unwrap();
    let targets = json!({
        "read": [
            "/etc/passwd",
            token_file,
            train,
            format!("/proc/{}/environ", execs[0].pid()),
            "/root/.bash_history",
        ],
        "api": p.base.clone(),
    });
    let hostile = mallory.submit(&json!({
        "name": "hostile",
        "script": {"code": "artifact:hostile.py", "args": [targets.to_string()], "max_restarts": 0},
        "workers": {"min": 1, "max": 1},
        "resources": {"memory_mb": 512},
    }));
    let job = mallory.wait_end(&hostile, Duration::from_secs(180));
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{job:?}\n{}",
        log_text(&mallory, &hostile)
    );
    let report_file = p.file("report.json");
    download(
        &mallory,
        &format!("/v1/jobs/{hostile}/outputs/report.json"),
        &report_file,
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&report_file).unwrap()).unwrap();
    for (path, result) in report["read"].as_object().unwrap() {
        assert!(
            result.as_str().unwrap().starts_with("denied"),
            "the hostile script read {path}: {result}"
        );
    }
    assert!(
        report["list_parent"]
            .as_str()
            .unwrap()
            .starts_with("denied"),
        "{report}"
    );
    assert_ne!(report["system"], 0, "a shell ran: {report}");
    let forked = report["forked"].as_u64().unwrap();
    assert!(
        forked < 300,
        "the fork bomb made {forked} processes: {report}"
    );
    // The API is not even reachable: the rank's namespace has no way out
    // but to its own job's ranks.
    assert!(
        report["api"].as_str().unwrap().starts_with("unreachable"),
        "{report}"
    );
    assert!(
        report["abstract_socket"]
            .as_str()
            .unwrap()
            .starts_with("denied"),
        "{report}"
    );
    let env: Vec<&str> = report["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for secret in [
        "TRAINYARD_JOIN_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "TRAINYARD_API",
    ] {
        assert!(
            !env.contains(&secret),
            "{secret} reached the script: {env:?}"
        );
    }
    for k in [
        "RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT",
    ] {
        assert!(env.contains(&k), "{k} is missing: {env:?}");
    }

    // The DDP job: two ranks, each logged; its output against torchrun's.
    let job = alice.wait_end(&id, Duration::from_secs(600));
    let log = log_text(&alice, &id);
    assert_eq!(job.state, JobState::Succeeded, "{job:?}\n{log}");
    for rank in 0..2 {
        assert!(
            log.contains(&format!("[rank {rank}] rank {rank} epoch 3 loss")),
            "{log}"
        );
    }
    // What rank 0 reported with trainyard.report(): one point per epoch.
    let points = alice.metrics(&id, None).points;
    let steps: Vec<i64> = points.iter().map(|p| p.step).collect();
    assert_eq!(steps, [1, 2, 3, 4], "{points:?}");
    assert!(points[3].loss < points[0].loss, "{points:?}");
    assert!(
        log.contains("reported metric \"batches\" is not stored"),
        "{log}"
    );
    let listed = alice.get(&format!("/v1/jobs/{id}/outputs"));
    assert_eq!(listed["outputs"][0]["path"], "model.pt", "{listed}");
    let ours = p.file("ours.pt");
    download(&alice, &format!("/v1/jobs/{id}/outputs/model.pt"), &ours);
    let (a, b) = (
        accuracy(&ours, &test),
        accuracy(&torchrun_model(&p, "torchrun", reference), &test),
    );
    eprintln!(
        "script job {a:.4}, torchrun {b:.4}, on {} held-out rows",
        500
    );
    assert!(
        a > 0.9 && (a - b).abs() <= 0.015,
        "script job {a:.4}, torchrun {b:.4}"
    );
    let r = alice.get_response(&format!("/v1/jobs/{id}/outputs/..%2Fx"));
    assert_eq!(r.status(), 400);
    let r = mallory.get_response(&format!("/v1/jobs/{id}/outputs/model.pt"));
    assert_eq!(r.status(), 404, "another user's outputs");

    // A memory bomb fails its job, naming the limit, on its one try.
    let bomb = p.file("bomb.py");
    std::fs::write(
        &bomb,
        "import torch\nx = torch.ones(1 << 30)\nprint(x.sum())\n",
    )
    .unwrap();
    upload(&mallory, "bomb.py", &bomb);
    let id = mallory.submit(&json!({
        "name": "bomb",
        "script": {"code": "artifact:bomb.py", "max_restarts": 0},
        "workers": {"min": 1, "max": 1},
        "resources": {"memory_mb": 256},
    }));
    mallory.wait_failed_with(
        "bomb",
        &id,
        Duration::from_secs(120),
        &["exceeded its", "MiB memory", "1 tries"],
    );
    let _ = std::fs::remove_file(&bomb);

    // A cancelled script job's processes are gone within 5 s.
    let id = alice.submit(&ddp_job("cancelled", 1000));
    let pids: Vec<u32> = execs.iter().map(|e| e.pid()).collect();
    let running = eventually(Duration::from_secs(120), || {
        let found = script_ranks(&pids);
        (found.len() == 2).then_some(found)
    });
    let running = running.unwrap_or_else(|| panic!("two ranks run:\n{}", log_text(&alice, &id)));
    let (status, body) = alice.post(&format!("/v1/jobs/{id}/cancel"), &json!({}));
    assert!(status < 300, "{status} {body}");
    let cancelled = Instant::now();
    let gone = eventually(Duration::from_secs(5), || {
        (!running
            .iter()
            .any(|pid| Path::new(&format!("/proc/{pid}")).exists()))
        .then_some(())
    });
    assert!(gone.is_some(), "a cancelled script's ranks outlived 5 s");
    eprintln!("cancelled ranks gone in {:?}", cancelled.elapsed());
    for e in &mut execs {
        assert!(e.running(), "an executor died: {}", e.output());
    }
}

/// The script ranks (`… train.py …`, the interpreter the sandboxed child
/// became) that the executors `parents` run now.
fn script_ranks(parents: &[u32]) -> Vec<u32> {
    trainyard_e2e::children_where(parents, |args| args.contains(&&b"train.py"[..]))
}

#[test]
fn a_killed_executor_restarts_every_rank_from_the_last_checkpoint_and_a_joining_one_grows_the_world(
) {
    // Its checkpoints and outputs go to the test S3 server (Garage).
    let s3 = trainyard_e2e::TestS3::from_env();
    let p = Platform::builder("scripts-elastic")
        .admin_token(ADMIN)
        .no_provisioner()
        .s3(&s3)
        .executor_env("TRAINYARD_TORCH_THREADS", "1")
        .start();
    let mut execs = vec![p.executor("a"), p.executor("b")];
    let alice = user(&p, "alice");
    let (train, test) = digits(&p);
    upload(&alice, "train.py", &scripts().join("ddp_digits.py"));
    upload(&alice, "digits-train.npz", &train);
    let epochs = 60;
    let mut spec = ddp_job("elastic", epochs);
    spec["workers"] = json!({"min": 2, "max": 3});
    let id = alice.submit(&spec);

    // torchrun's uninterrupted run of the same script, meanwhile.
    let reference = torchrun(
        &p,
        "torchrun",
        &train,
        2,
        &["--epochs", &epochs.to_string()],
    );
    // A log line with every one of `parts` (generation numbers depend on
    // how many rounds the loss took; restart counts do not).
    let logged = |parts: &[&str], limit: u64| {
        let found = eventually(Duration::from_secs(limit), || {
            log_text(&alice, &id)
                .lines()
                .any(|l| parts.iter().all(|p| l.contains(p)))
                .then_some(())
        });
        assert!(
            found.is_some(),
            "{parts:?} never came:\n{}",
            log_text(&alice, &id)
        );
    };

    // Once a few epochs are committed, rank 1's executor is SIGKILLed and
    // a replacement registers: every rank restarts (restart 1) at world 2
    // from the last commit, not from the first epoch.
    logged(&["checkpoint 3 committed"], 180);
    let holder = alice
        .assignments(&id)
        .workers
        .iter()
        .find(|w| w.rank == 1)
        .map(|w| w.executor.name.clone())
        .unwrap();
    let at = ["a", "b"].iter().position(|n| *n == holder).unwrap();
    let victim = execs.remove(at);
    trainyard_e2e::kill9(victim.pid());
    let killed = Instant::now();
    // The replacement comes once the loss is known (before, it would be a
    // join of the world the loss then shrinks).
    let lost = eventually(Duration::from_secs(60), || {
        p.with_token(ADMIN)
            .executors(Some("lost"))
            .executors
            .iter()
            .any(|e| e.name == holder)
            .then_some(())
    });
    assert!(lost.is_some(), "{holder} is not lost after its SIGKILL");
    execs.push(p.executor("c"));
    logged(
        &["rank 1 of 2 runs train.py (generation ", ", restart 1)"],
        120,
    );
    logged(&["[rank 1] rank 1: resumed after epoch"], 120);
    eprintln!("restarted {:?} after the kill", killed.elapsed());

    // Then a third executor joins the `max: 3` job: every rank restarts at
    // world 3 from the last commit and the job finishes there.
    let committed = log_text(&alice, &id).matches("committed").count();
    let more = eventually(Duration::from_secs(120), || {
        (log_text(&alice, &id).matches("committed").count() > committed).then_some(())
    });
    assert!(
        more.is_some(),
        "world 2 commits after the restart:\n{}",
        log_text(&alice, &id)
    );
    execs.push(p.executor("d"));

    let job = alice.wait_end(&id, Duration::from_secs(600));
    let log = log_text(&alice, &id);
    assert_eq!(job.state, JobState::Succeeded, "{job:?}\n{log}");
    // The loss and the join are the only restarts: no crash was counted
    // (the generation in between, while the job waited for an executor,
    // started nothing and is no restart).
    assert!(
        log.lines()
            .any(|l| l.contains("rank 2 of 3 runs train.py (generation ")
                && l.ends_with(", restart 2)")),
        "{log}"
    );
    assert!(
        !log.contains("restart 3)"),
        "more restarts than a loss and a join:\n{log}"
    );
    let events = alice.events(&id);
    assert!(
        !events
            .iter()
            .any(|e| e.kind == trainyard_common::EventKind::Crash),
        "a lost executor spent a restart: {events:?}"
    );
    let resumed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("resumed after epoch"))
        .collect();
    assert_eq!(resumed.len(), 5, "2 ranks, then 3, resumed:\n{log}");
    assert!(
        !resumed.iter().any(|l| l.ends_with("after epoch 0")),
        "resumed from a later epoch than the first: {resumed:?}"
    );
    eprintln!("{resumed:?}");
    // Its checkpoints are listed with the job's: the newest is the last
    // one its log says was committed, by the last generation's rank 0.
    let listed = alice.checkpoints(&id);
    let newest = listed.checkpoints.first().expect("a listed checkpoint");
    // `checkpoint N committed (F files, B bytes)`
    let last_commit: u64 = log
        .lines()
        .filter_map(|l| {
            let rest = l.split("checkpoint ").nth(1)?;
            rest.split(" committed (").next()?.parse().ok()
        })
        .max()
        .expect("a committed checkpoint in the log");
    assert_eq!(newest.step, last_commit, "{listed:?}");
    // As the S3 server holds them: the newest kept commit's manifest (the
    // ones that fell out of `keep` are gone) and rank 0's output.
    let keys = s3.list(&format!("{id}/"));
    let manifests: Vec<&String> = keys
        .iter()
        .filter(|k| k.contains("/script-checkpoints/") && k.ends_with("/manifest.json"))
        .collect();
    assert!(
        manifests
            .iter()
            .any(|k| k.ends_with(&format!("/{last_commit:010}/manifest.json"))),
        "{keys:?}"
    );
    assert_eq!(manifests.len(), listed.checkpoints.len(), "{keys:?}");
    assert!(
        keys.iter().any(|k| k.ends_with("/outputs/model.pt")),
        "{keys:?}"
    );
    assert_eq!(newest.generation, job.generation, "{listed:?}");
    assert!(newest.shards >= 1 && newest.bytes > 0, "{listed:?}");
    assert!(
        listed.checkpoints.len() <= listed.keep as usize,
        "{listed:?}"
    );
    let ours = p.file("ours.pt");
    download(&alice, &format!("/v1/jobs/{id}/outputs/model.pt"), &ours);
    let (a, b) = (
        accuracy(&ours, &test),
        accuracy(&torchrun_model(&p, "torchrun", reference), &test),
    );
    eprintln!("killed, resumed and grown {a:.4}, torchrun uninterrupted {b:.4}");
    assert!(
        a > 0.9 && (a - b).abs() <= 0.015,
        "elastic {a:.4}, torchrun {b:.4}"
    );

    // A new job of one rank starts from that job's last checkpoint (its
    // world was 3) and trains the two epochs more it asks for.
    let mut spec = ddp_job("resumed-at-world-1", epochs + 2);
    spec["workers"] = json!({"min": 1, "max": 1});
    spec["resume_from"] = json!({"job_id": id});
    let next = alice.submit(&spec);
    let job = alice.wait_end(&next, Duration::from_secs(300));
    let log = log_text(&alice, &next);
    assert_eq!(job.state, JobState::Succeeded, "{job:?}\n{log}");
    assert!(log.contains(&format!("of job {id}")), "{log}");
    assert!(
        log.contains(&format!("resumed after epoch {}", epochs - 1)),
        "{log}"
    );
    assert!(
        log.contains(&format!("rank 0 epoch {} loss", epochs + 1)),
        "{log}"
    );
}

#[test]
fn a_ddp_script_trains_across_hosts_in_network_namespaces() {
    let lab = trainyard_e2e::Lab::new(2)
        .expect("the multi-host lab needs root and network namespaces (ip netns)");
    let p = Platform::builder("scripts-lab")
        .admin_token(ADMIN)
        .no_provisioner()
        .listen_host(&lab.gateway().to_string())
        .start();
    let _execs: Vec<_> = (0..2)
        .map(|i| {
            lab.executor(
                i,
                &p.client.base,
                p.join_token(),
                &format!("host{i}"),
                2048,
                &[],
            )
            .unwrap()
        })
        .collect();
    let alice = user(&p, "alice");
    let ready = eventually(Duration::from_secs(60), || {
        (p.with_token(ADMIN).live_executors().len() == 2).then_some(())
    });
    assert!(ready.is_some(), "both lab executors register");
    upload(&alice, "train.py", &scripts().join("ddp_digits.py"));
    upload(
        &alice,
        "digits-train.npz",
        &repo_root().join("data/digits.npz"),
    );
    let id = alice.submit(&ddp_job("across-hosts", 2));
    let job = alice.wait_end(&id, Duration::from_secs(300));
    let log = log_text(&alice, &id);
    assert_eq!(job.state, JobState::Succeeded, "{job:?}\n{log}");
    // Each rank on its own host (an executor in its own namespace, at its
    // host's address).
    let ran_on: std::collections::BTreeSet<String> = alice
        .logs(&id)
        .iter()
        .filter(|l| l.message.contains("runs train.py"))
        .map(|l| l.executor_id.to_string())
        .collect();
    assert_eq!(ran_on.len(), 2, "{log}");
    let addrs: Vec<String> = lab.hosts().iter().map(|h| format!("{}:", h.addr)).collect();
    for e in p.with_token(ADMIN).executors(None).executors {
        if ran_on.contains(&e.id.to_string()) {
            assert!(
                addrs.iter().any(|a| e.address.starts_with(a)),
                "{} on {addrs:?}",
                e.address
            );
        }
    }
    for rank in 0..2 {
        assert!(
            log.contains(&format!("[rank {rank}] rank {rank} epoch 1 loss")),
            "{log}"
        );
    }
    assert!(
        !log.contains("Using the loopback address"),
        "gloo fell back to loopback:\n{log}"
    );
}

#[test]
fn a_script_that_never_ends_is_killed_at_its_time_limit_and_fails_its_job() {
    let p = Platform::builder("scripts-time-limit")
        .admin_token(ADMIN)
        .no_provisioner()
        .start();
    let mut exec = p.executor("a");
    let alice = user(&p, "alice");
    // It never reports and never exits: only the time limit ends it.
    let sleeper = p.file("sleeper.py");
    std::fs::write(
        &sleeper,
        "import time\nprint('sleeping forever', flush=True)\nwhile True:\n    time.sleep(60)\n",
    )
    .unwrap();
    upload(&alice, "sleeper.py", &sleeper);
    let submitted = Instant::now();
    let id = alice.submit(&json!({
        "name": "sleeper",
        "script": {"code": "artifact:sleeper.py", "max_seconds": 10, "max_restarts": 2},
        "workers": {"min": 1, "max": 1},
        "resources": {"memory_mb": 256},
    }));
    // Started cold (an interpreter, no PyTorch), then 10 s: well within
    // 60. (With 3 s, a loaded 2-core machine once killed the interpreter
    // before its first line, and the reason rightly had none to quote.)
    let job = alice.wait_failed_with(
        "sleeper",
        &id,
        Duration::from_secs(60),
        &["script.max_seconds: 10 s", "killed", "sleeping forever"],
    );
    let took = submitted.elapsed();
    eprintln!("a 10 s script ended in {took:?}: {}", job.state_reason);
    assert!(took >= Duration::from_secs(10), "{took:?}");
    // A job failure, not a crash: no restart was spent on it.
    let log = log_text(&alice, &id);
    assert!(
        !alice
            .events(&id)
            .iter()
            .any(|e| e.kind == trainyard_common::EventKind::Crash),
        "the time limit was counted as a crash:\n{log}"
    );
    assert!(!log.contains("restart 1)"), "it was restarted:\n{log}");
    // Its process (and its spare interpreter) are gone.
    let pids = [exec.pid()];
    let gone = eventually(Duration::from_secs(10), || {
        trainyard_e2e::children_where(&pids, |args| {
            args.iter().any(|a| a.ends_with(b"sleeper.py"))
        })
        .is_empty()
        .then_some(())
    });
    assert!(gone.is_some(), "the killed script still runs");
    assert!(exec.running(), "the executor died: {}", exec.output());
}

#[test]
fn hostile_code_archives_uploaded_by_a_user_are_refused_and_write_nothing_outside() {
    let p = Platform::builder("scripts-archives")
        .admin_token(ADMIN)
        .no_provisioner()
        .start();
    let mut execs = [p.executor("a"), p.executor("b")];
    let mallory = user(&p, "mallory");

    // What the archives aim at, outside any job's folder: two paths that
    // must stay missing, a folder that must stay empty and a file that
    // must keep its bytes.
    let outside = std::env::temp_dir().join(format!("ty-e2e-archives-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&outside);
    std::fs::create_dir_all(outside.join("link-dir")).unwrap();
    let targets = json!({
        "absolute": outside.join("absolute.py"),
        "dotdot": outside.join("dotdot.py"),
        "link_dir": outside.join("link-dir"),
        "hard_target": outside.join("hard-target"),
    });
    std::fs::write(outside.join("hard-target"), b"the host's own bytes").unwrap();
    let dir = p.file("archives");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("targets.json"), targets.to_string()).unwrap();
    trainyard_e2e::python_script("hostile_archives.py", &dir);

    // Each archive, its refusal.
    let cases: [(&str, &[&str]); 14] = [
        ("absolute.tar.gz", &["not an absolute one"]),
        ("absolute.zip", &["not an absolute one"]),
        ("dotdot.tar.gz", &["must not contain `..`"]),
        ("dotdot.zip", &["must not contain `..`"]),
        ("symlink.tar.gz", &["\"evil\" is a link"]),
        ("symlink.zip", &["\"evil\" is a link"]),
        ("hardlink.tar.gz", &["\"hard\" is a link"]),
        ("fifo.tar.gz", &["\"fifo\" is not a file or a folder"]),
        ("fifo.zip", &["\"fifo\" is not a file or a folder"]),
        ("device.tar.gz", &["\"null\" is not a file or a folder"]),
        ("many.tar.gz", &["too large", "more than 10000 entries"]),
        ("many.zip", &["too large", "more than 10000 entries"]),
        ("bomb.tar.gz", &["too large", "more than 512 MiB extracted"]),
        ("bomb.zip", &["too large", "more than 512 MiB extracted"]),
    ];
    let mut jobs = Vec::new();
    for (name, words) in cases {
        // The upload itself is a plain artifact (the API stores bytes; the
        // executor judges the archive when it puts the code in place).
        upload(&mallory, name, &dir.join(name));
        let id = mallory.submit(&json!({
            "name": name.replace('.', "-"),
            "script": {"code": format!("artifact:{name}"), "entrypoint": "train.py", "max_restarts": 2},
            "workers": {"min": 1, "max": 1},
            "resources": {"memory_mb": 256},
        }));
        jobs.push((name, words, id));
    }
    for (name, words, id) in &jobs {
        let mut all = vec!["the code archive"];
        all.extend_from_slice(words);
        let job = mallory.wait_failed_with(name, id, Duration::from_secs(120), &all);
        eprintln!("{name}: {}", job.state_reason);
        // Refused, not crashed: no restart is spent on a refusal.
        assert!(
            !mallory
                .events(id)
                .iter()
                .any(|e| e.kind == trainyard_common::EventKind::Crash),
            "{name}: a refusal was counted as a crash"
        );
        assert!(
            !log_text(&mallory, id).contains("never runs"),
            "{name}: its script ran"
        );
    }

    // Nothing reached the places outside.
    for missing in ["absolute.py", "dotdot.py"] {
        assert!(
            !outside.join(missing).exists(),
            "{missing} was written outside the job's folder"
        );
    }
    let in_link_dir: Vec<_> = std::fs::read_dir(outside.join("link-dir"))
        .unwrap()
        .collect();
    assert!(
        in_link_dir.is_empty(),
        "written through a link: {in_link_dir:?}"
    );
    assert_eq!(
        std::fs::read(outside.join("hard-target")).unwrap(),
        b"the host's own bytes"
    );
    for e in &mut execs {
        assert!(e.running(), "an executor died: {}", e.output());
    }
    let _ = std::fs::remove_dir_all(&outside);
}

#[test]
fn a_one_rank_ddp_script_trains_through_its_own_relay_like_torchrun() {
    // World 1: the rank's TCPStore client reaches its own store at
    // MASTER_ADDR (its own block address) through its slot's relay.
    let p = Platform::builder("scripts-world1")
        .admin_token(ADMIN)
        .no_provisioner()
        .executor_env("TRAINYARD_TORCH_THREADS", "1")
        .start();
    let _exec = p.executor("a");
    let alice = user(&p, "alice");
    let (train, test) = digits(&p);
    upload(&alice, "train.py", &scripts().join("ddp_digits.py"));
    upload(&alice, "digits-train.npz", &train);
    let mut spec = ddp_job("world-1", 2);
    spec["workers"] = json!({"min": 1, "max": 1});
    let id = alice.submit(&spec);
    let reference = torchrun(&p, "torchrun", &train, 1, &["--epochs", "2"]);
    let job = alice.wait_end(&id, Duration::from_secs(300));
    let log = log_text(&alice, &id);
    assert_eq!(job.state, JobState::Succeeded, "{job:?}\n{log}");
    assert!(log.contains("[rank 0] rank 0 epoch 1 loss"), "{log}");
    let ours = p.file("ours.pt");
    download(&alice, &format!("/v1/jobs/{id}/outputs/model.pt"), &ours);
    let (a, b) = (
        accuracy(&ours, &test),
        accuracy(&torchrun_model(&p, "torchrun", reference), &test),
    );
    eprintln!("world 1: script job {a:.4}, torchrun {b:.4}");
    assert!(
        a > 0.9 && (a - b).abs() <= 0.015,
        "script job {a:.4}, torchrun {b:.4}"
    );
}
