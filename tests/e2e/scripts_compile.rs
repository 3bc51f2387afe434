//! `torch.compile` in a script job past its first try. Inductor's cache
//! lives in each rank's scratch on its executor and outlives the job's
//! restarts there: a 2-rank DDP script (`tests/python/scripts/
//! ddp_digits.py --compile`) that fails once after its first epoch is
//! started again, and each rank of the new try loads its compiled graphs
//! from that cache (inductor's own counters: hits, no misses) instead of
//! compiling them again; the job's model then scores within 1.5 points of
//! torchrun's run of the same script without the fault, made in the same
//! test, judged by PyTorch in eval mode on digits no job saw.
//! An executor that offers scripts no compiler (`--script-compiler off`)
//! fails a compiled script's job at once with a reason that says so, not
//! inductor's traceback, and spends none of its restarts.

use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use trainyard_common::JobState;
use trainyard_e2e::script_jobs::{
    ddp_accuracy as accuracy, download, scripts_dir as scripts, split_digits as digits, torchrun,
    torchrun_model,
};
use trainyard_e2e::{ApiClient, Platform, Proc};

const ADMIN: &str = "e2e-scripts-compile-admin";

/// Each rank's `[rank R] rank R compiled graphs: cache hits H misses M`
/// lines, in order (as the ranks printed them, not as a failure's reason
/// quotes them again).
fn compile_counters(log: &str) -> BTreeMap<u32, Vec<(u64, u64)>> {
    let mut by_rank: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for line in log.lines() {
        let Some(printed) = line.strip_prefix("[rank ") else {
            continue;
        };
        let Some(at) = printed.find(" compiled graphs: cache hits ") else {
            continue;
        };
        let rank = printed[..at]
            .rsplit(' ')
            .next()
            .and_then(|r| r.parse().ok());
        let rest = &printed[at + " compiled graphs: cache hits ".len()..];
        let mut words = rest.split_whitespace();
        let hits = words.next().and_then(|w| w.parse().ok());
        let misses = words.nth(1).and_then(|w| w.parse().ok());
        if let (Some(rank), Some(hits), Some(misses)) = (rank, hits, misses) {
            by_rank.entry(rank).or_default().push((hits, misses));
        }
    }
    by_rank
}

fn compiled_job(name: &str, fail_once_after: Option<u32>) -> serde_json::Value {
    // 4 epochs: a compiled DDP model's BatchNorm running statistics, under
    // torchrun too, are not yet usable after 3 (21 % on held-out digits).
    let mut args = vec!["--epochs", "4", "--compile"];
    let after = fail_once_after.map(|e| e.to_string());
    if let Some(a) = &after {
        args.extend(["--fail-once-after", a.as_str()]);
    }
    json!({
        "name": name,
        "script": {"code": "artifact:train.py", "args": args, "max_restarts": 2},
        "inputs": ["artifact:digits-train.npz"],
        "workers": {"min": 2, "max": 2},
        "resources": {"memory_mb": 1536},
    })
}

/// A platform named `name` with two executors (`env` added to theirs),
/// user alice with the script and the training digits uploaded: the
/// platform, its executors, alice, and the (train, held-out) digits.
fn with_script(name: &str, env: &[(&str, &str)]) -> (Platform, Vec<Proc>, ApiClient, Digits) {
    let mut b = Platform::builder(name)
        .admin_token(ADMIN)
        .no_provisioner()
        .executor_env("TRAINYARD_TORCH_THREADS", "1")
        .executor_ram_mb(6144);
    for (k, v) in env {
        b = b.executor_env(k, v);
    }
    let p = b.start();
    let execs = vec![p.executor("a"), p.executor("b")];
    let alice = p.with_token(ADMIN).new_user("alice");
    let (train, test) = digits(&p);
    alice.upload("train.py", &scripts().join("ddp_digits.py"));
    alice.upload("digits-train.npz", &train);
    (p, execs, alice, (train, test))
}

/// The training digits and the held-out ones.
type Digits = (PathBuf, PathBuf);

#[test]
fn a_restarted_compiled_script_loads_its_kernels_from_the_cache() {
    let (p, _execs, alice, (train, test)) = with_script("scripts-compile", &[]);

    let id = alice.submit(&compiled_job("compiled-restart", Some(1)));
    // The reference: torchrun, the same script without the fault (its own
    // restarts with --standalone redial the attempt before's gloo peers).
    let reference = torchrun(
        &p,
        "torchrun-compiled",
        &train,
        2,
        &["--epochs", "4", "--compile"],
    );
    let done = alice.wait_end(&id, Duration::from_secs(600));
    let log = alice.log_messages(&id).join("\n");
    assert_eq!(
        done.state,
        JobState::Succeeded,
        "{}\n{log}",
        done.state_reason
    );
    assert!(log.contains("failing once after epoch 1"), "{log}");
    assert!(log.contains("resumed after epoch 1"), "{log}");
    assert!(log.contains("restart 1)"), "{log}");
    let counters = compile_counters(&log);
    eprintln!("compiled graphs per rank (hits, misses) by try: {counters:?}");
    assert_eq!(counters.len(), 2, "{counters:?}\n{log}");
    for (rank, tries) in &counters {
        assert_eq!(tries.len(), 2, "rank {rank}: {tries:?}\n{log}");
        let (first, again) = (tries[0], tries[1]);
        assert!(
            first.1 > 0,
            "rank {rank} compiled nothing at first: {tries:?}"
        );
        assert!(
            again.0 > 0 && again.1 == 0,
            "rank {rank} compiled again after its restart: {tries:?}"
        );
    }
    let model = p.file("compiled-restart.pt");
    download(&alice, &format!("/v1/jobs/{id}/outputs/model.pt"), &model);
    let theirs = torchrun_model(&p, "torchrun-compiled", reference);
    let (a, b) = (accuracy(&model, &test), accuracy(&theirs, &test));
    eprintln!("held-out digits: the restarted compiled job {a:.4}, torchrun {b:.4}");
    assert!(
        a > 0.9 && (a - b).abs() <= 0.015,
        "job {a:.4}, torchrun {b:.4}"
    );
}

#[test]
fn an_executor_without_a_compiler_for_scripts_fails_a_compiled_job_saying_so() {
    let (_p, _execs, alice, _) = with_script(
        "scripts-no-compiler",
        &[("TRAINYARD_SCRIPT_COMPILER", "off")],
    );

    let id = alice.submit(&compiled_job("no-compiler", None));
    let done = alice.wait_end(&id, Duration::from_secs(300));
    assert_eq!(done.state, JobState::Failed, "{}", done.state_reason);
    assert!(
        done.state_reason
            .contains("torch.compile needs a C++ compiler on the executor")
            && done.state_reason.contains("--script-compiler off"),
        "{}",
        done.state_reason
    );
    // At once: the first try's failure, none of the restarts spent.
    let log = alice.log_messages(&id).join("\n");
    assert!(log.contains("restart 0)"), "{log}");
    assert!(!log.contains("restart 1)"), "a restart was spent:\n{log}");
    eprintln!("no compiler: {}", done.state_reason);
}
