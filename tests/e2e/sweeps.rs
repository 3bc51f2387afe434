//! A sweep under ASHA finds what the full grid finds for a fraction of its
//! device time, and its survivors grow onto the executors ASHA frees.
//!
//! Sixteen configurations of a digits MLP of 256-256 (SGD with momentum:
//! four learning rates, log-spaced, × four momenta; 6000 steps of 128),
//! elastic trials of one to two ring workers, four at a time on four
//! executors. The grid sweep runs all sixteen to the end; the ASHA sweep
//! (η = 8, rungs at a tenth and at eight tenths of the steps) runs the
//! same sixteen and stops the ones below each rung's keep line; a trial
//! that passed both rungs grows onto what stopped trials freed. Judged against PyTorch itself: each
//! sweep's best trial's downloaded weights, evaluated by plain PyTorch in
//! eval mode on the rows the trial held out, must be within 0.5 points of
//! each other (ASHA's at most 0.5 below the grid's); device time is what
//! `/v1/usage` accounts to each sweep's trial jobs (worker-seconds), ASHA's
//! at most 40 % of the grid's; and at least one surviving ASHA trial grew
//! from one worker to two on an executor a stopped trial freed, which its
//! job's events show.
//!
//! A script sweep searches the DDP digits script's learning rate as its
//! own `--lr` argument (`script.args.lr`), one rank a trial, under ASHA on
//! the loss the script reports each epoch: every trial's script was given
//! and used its value (the lr it reported), the two far too small rates
//! are stopped at the first rung with their jobs cancelled, and the best
//! trial's output scores in PyTorch like torchrun's run of the same script
//! with the same arguments.
//!
//! A PS sweep (one shard, two workers a trial) searches the learning rate
//! and the consistency mode together: every trial's job runs in the PS
//! pattern with its values, the far too small rate is stopped at rung 0 in
//! both modes with its PS jobs cancelled, and PyTorch gives the best
//! trial's downloaded weights the held-out accuracy the sweep reports.

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use trainyard_e2e::script_jobs::{
    ddp_accuracy, download, scripts_dir, split_digits, torchrun, torchrun_model,
};
use trainyard_e2e::{repo_root, Consistency, MlpSpec, Platform, Proc};

/// Steps of every trial; the rungs are at a tenth and four tenths.
const STEPS: u64 = 6000;
/// Trials at once (and executors).
const CONCURRENCY: usize = 4;

fn base() -> Value {
    let mut b = MlpSpec::digits("digits")
        .hidden(&[256, 256])
        .batch_size(128)
        .steps(STEPS)
        .workers(1, 2)
        .seed(3)
        .build();
    b["optimizer"] = json!({"kind": "momentum", "lr": 0.1, "momentum": 0.9});
    b
}

fn sweep(name: &str, asha: bool) -> Value {
    let mut s = json!({
        "name": name,
        "base": base(),
        "parameters": {
            "optimizer.lr": {"log_uniform": [0.003, 0.3], "points": 4},
            "optimizer.momentum": {"values": [0.0, 0.5, 0.8, 0.9]}
        },
        "search": "grid",
        "metric": "eval_accuracy",
        "goal": "maximize",
        "concurrency": CONCURRENCY,
    });
    if asha {
        s["early_stopping"] = json!({"asha": {"reduction_factor": 8, "min_steps": STEPS / 10}});
    }
    s
}

/// Makes sweep `spec` and waits for its end: the ended sweep.
fn run(p: &Platform, spec: &Value) -> Value {
    let (status, created) = p.post("/v1/sweeps", spec);
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let started = Instant::now();
    loop {
        let s = p.get(&format!("/v1/sweeps/{id}"));
        if s["state"] != "running" {
            println!(
                "sweep {} ended in {:.0} s: {} ({})",
                s["name"],
                started.elapsed().as_secs_f64(),
                s["state"],
                s["reason"]
            );
            return s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "sweep {id} still running after 15 minutes: {s}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Worker-seconds `/v1/usage` accounts to the sweep's trial jobs.
fn device_seconds(p: &Platform, sweep: &Value) -> f64 {
    let jobs: BTreeSet<String> = trials(sweep)
        .iter()
        .filter_map(|t| t["job_id"].as_str().map(str::to_owned))
        .collect();
    let usage = p.get("/v1/usage");
    let per_job = usage["jobs"].as_array().unwrap();
    let mut seen = 0;
    let total = per_job
        .iter()
        .filter(|j| jobs.contains(j["job_id"].as_str().unwrap()))
        .map(|j| {
            seen += 1;
            j["cpu_worker_seconds"].as_f64().unwrap() + j["device_seconds"].as_f64().unwrap()
        })
        .sum();
    assert_eq!(seen, jobs.len(), "every trial's job is accounted: {usage}");
    total
}

fn trials(sweep: &Value) -> &Vec<Value> {
    sweep["trials"].as_array().unwrap()
}

/// The best trial's job, and its accuracy as PyTorch measures it.
fn best(p: &Platform, sweep: &Value, dir: &std::path::Path) -> (String, f64) {
    let job = sweep["best"]["job_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no best trial: {sweep}"))
        .to_owned();
    let spec = p.get(&format!("/v1/jobs/{job}"))["spec"].clone();
    let digits = repo_root().join("data/digits.npz");
    let acc = p.pytorch_accuracy(&job, &spec, &digits, dir);
    (job, acc)
}

#[test]
fn asha_matches_the_grid_best_for_a_fraction_of_its_device_time_and_survivors_grow() {
    let p = Platform::builder("sweeps").start();
    let _execs: Vec<Proc> = (0..CONCURRENCY)
        .map(|i| p.executor(&format!("sweep-{i}")))
        .collect();
    let dir = p.file("models");
    // One after the other: at once, each would slow the other's trials.
    let grid = run(&p, &sweep("grid", false));
    let asha = run(&p, &sweep("asha", true));
    assert_eq!(grid["state"], "succeeded", "{grid}");
    assert_eq!(asha["state"], "succeeded", "{asha}");
    assert_eq!(trials(&grid).len(), 16);
    assert_eq!(trials(&asha).len(), 16);
    assert!(
        trials(&grid).iter().all(|t| t["state"] == "completed"),
        "{grid}"
    );
    let stopped = trials(&asha)
        .iter()
        .filter(|t| t["state"] == "stopped")
        .count();
    let (grid_time, asha_time) = (device_seconds(&p, &grid), device_seconds(&p, &asha));
    let ((grid_job, grid_acc), (asha_job, asha_acc)) =
        (best(&p, &grid, &dir), best(&p, &asha, &dir));
    let mut table = String::from(
        "trial  params                                   grid acc  asha: state, rungs\n",
    );
    for (g, a) in trials(&grid).iter().zip(trials(&asha)) {
        table += &format!(
            "{:>5}  {:<40} {:>8.4}  {} {}\n",
            g["index"],
            g["params"].to_string(),
            g["metric"].as_f64().unwrap_or(f64::NAN),
            a["state"],
            a["rung_metrics"]
        );
    }
    println!(
        "{table}grid: best trial {} ({grid_job}) {:.2} % in PyTorch, {grid_time:.0} worker-s\n\
         ASHA: best trial {} ({asha_job}) {:.2} % in PyTorch, {asha_time:.0} worker-s ({:.0} % of the grid's), {stopped} stopped early\n\
         growths: {}",
        grid["best"]["index"],
        grid_acc * 100.0,
        asha["best"]["index"],
        asha_acc * 100.0,
        100.0 * asha_time / grid_time,
        asha["growths"]
    );
    assert!(
        asha_acc >= grid_acc - 0.005,
        "ASHA's best {asha_acc} is more than 0.5 points below the grid's {grid_acc}\n{table}"
    );
    assert!(
        asha_time <= 0.4 * grid_time,
        "ASHA used {asha_time:.0} worker-s, more than 40 % of the grid's {grid_time:.0}\n{table}"
    );
    assert!(stopped >= 8, "ASHA stopped only {stopped} trials\n{table}");
    // A survivor grew onto a stopped trial's executor, and its job shows
    // the second worker.
    let growths = asha["growths"].as_array().unwrap();
    assert!(
        !growths.is_empty(),
        "no surviving trial grew onto a stopped trial's executors: {asha}"
    );
    let g = &growths[0];
    assert!(
        g["workers_after"].as_u64() > g["workers_before"].as_u64(),
        "{g}"
    );
    let from = &trials(&asha)[g["from_trial"].as_u64().unwrap() as usize];
    assert_eq!(from["state"], "stopped", "{from}");
    let grown = &trials(&asha)[g["trial"].as_u64().unwrap() as usize];
    let events = p.events(grown["job_id"].as_str().unwrap());
    assert!(
        events
            .iter()
            .any(|e| e.reason.contains("worker added on") && e.reason.contains("(now 2 worker(s))")),
        "the grown trial's events show no growth: {:?}",
        events.iter().map(|e| &e.reason).collect::<Vec<_>>()
    );
}

/// Epochs of the script trials (the steps their script reports).
const SCRIPT_EPOCHS: u64 = 6;

#[test]
fn a_script_sweep_passes_each_trial_its_arguments_and_asha_stops_the_worst() {
    let p = Platform::builder("script-sweeps").start();
    let _execs: Vec<Proc> = (0..2)
        .map(|i| p.executor(&format!("script-sweep-{i}")))
        .collect();
    let (train, test) = split_digits(&p);
    p.upload("train.py", &scripts_dir().join("ddp_digits.py"));
    p.upload("digits-train.npz", &train);
    // Two good learning rates run first; the two far too small ones come
    // after and fall below the keep line at the first rung.
    let lrs = [0.05, 0.02, 0.0002, 0.0001];
    let epochs = SCRIPT_EPOCHS.to_string();
    let base_args = ["--epochs", epochs.as_str(), "--batch", "8"];
    let spec = json!({
        "name": "script-lr",
        "base": {
            "name": "script",
            "script": {"code": "artifact:train.py", "args": base_args},
            "inputs": ["artifact:digits-train.npz"],
            "workers": {"min": 1, "max": 1},
            "resources": {"memory_mb": 1024},
        },
        "parameters": {"script.args.lr": {"values": lrs}},
        "search": "grid",
        "metric": "loss",
        "goal": "minimize",
        "concurrency": 2,
        "early_stopping": {"asha": {"reduction_factor": 2, "min_steps": 2, "max_steps": SCRIPT_EPOCHS}},
    });
    let sweep = run(&p, &spec);
    assert_eq!(sweep["state"], "succeeded", "{sweep}");
    assert_eq!(sweep["rungs"], json!([2, 4]), "{sweep}");
    let trials = trials(&sweep);
    assert_eq!(trials.len(), 4);
    for (t, lr) in trials.iter().zip(lrs) {
        assert_eq!(t["params"]["script.args.lr"], json!(lr), "{t}");
        let job = t["job_id"].as_str().unwrap();
        // The trial's script was given its value, and used it: the lr it
        // reported each epoch is the one the sweep chose.
        let args = p.get(&format!("/v1/jobs/{job}"))["spec"]["script"]["args"].clone();
        let mut want: Vec<String> = base_args.iter().map(|a| a.to_string()).collect();
        want.push(format!("--lr={lr}"));
        assert_eq!(args, json!(want), "{t}");
        let points = p.metrics(job, None).points;
        assert!(points.len() >= 2, "{t}: {points:?}");
        assert!(points.iter().all(|m| m.lr == lr), "{t}: {points:?}");
    }
    // ASHA stopped the two small rates at a rung, and their jobs were
    // cancelled; the best is one of the good ones, run to its end.
    for t in &trials[2..] {
        assert_eq!(t["state"], "stopped", "{sweep}");
        assert!(
            t["reason"].as_str().is_some_and(|r| r.contains("rung")),
            "{t}"
        );
        let job = p.job(t["job_id"].as_str().unwrap());
        assert_eq!(job.state, trainyard_common::JobState::Cancelled, "{t}");
    }
    let best = &sweep["best"];
    let best_lr = best["params"]["script.args.lr"].as_f64().unwrap();
    assert!(best_lr == 0.05 || best_lr == 0.02, "{sweep}");
    let best_trial = &trials[best["index"].as_u64().unwrap() as usize];
    assert_eq!(best_trial["state"], "completed", "{sweep}");
    assert_eq!(best_trial["step"], json!(SCRIPT_EPOCHS), "{best_trial}");

    // Judged against torchrun: the best trial's downloaded output and the
    // same script run by torchrun with the same arguments score alike in
    // PyTorch on 500 rows neither saw.
    let lr_arg = format!("--lr={best_lr}");
    let mut args = base_args.to_vec();
    args.push(&lr_arg);
    let reference = torchrun(&p, "torchrun-best", &train, 1, &args);
    let ours = p.file("best.pt");
    let job = best["job_id"].as_str().unwrap();
    download(&p, &format!("/v1/jobs/{job}/outputs/model.pt"), &ours);
    let (a, b) = (
        ddp_accuracy(&ours, &test),
        ddp_accuracy(&torchrun_model(&p, "torchrun-best", reference), &test),
    );
    println!("script sweep: best lr {best_lr}, trial {a:.4}, torchrun {b:.4}");
    assert!(a > 0.9, "{a}");
    assert!((a - b).abs() <= 0.015, "trial {a:.4}, torchrun {b:.4}");
}

#[test]
fn ps_trials_sweep_the_learning_rate_and_consistency_and_asha_stops_the_slow_learners() {
    // Steps are slowed so that a trial is still training when ASHA has
    // judged it at the first rung.
    let p = Platform::builder("ps-sweeps")
        .executor_env("TRAINYARD_SLOW_WORKER", "*:15")
        .start();
    let _execs: Vec<Proc> = (0..3)
        .map(|i| p.executor(&format!("ps-sweep-{i}")))
        .collect();
    let base = MlpSpec::digits("ps")
        .steps(400)
        .workers(2, 2)
        .ps(1)
        .consistency(Consistency::Sync)
        .seed(3)
        .build();
    // One trial at a time; the grid varies its last parameter (by name)
    // fastest: (sync, 0.003), (sync, 3e-5), (async, 0.003), (async, 3e-5).
    // Each far too small rate is judged at rung 0 against the trials that
    // ran before it.
    let spec = json!({
        "name": "ps-lr-consistency",
        "base": base,
        "parameters": {
            "optimizer.lr": {"values": [0.003, 0.00003]},
            "consistency": {"values": ["sync", "async"]}
        },
        "search": "grid",
        "metric": "eval_accuracy",
        "goal": "maximize",
        "concurrency": 1,
        "early_stopping": {"asha": {"reduction_factor": 2, "min_steps": 40}},
    });
    let sweep = run(&p, &spec);
    assert_eq!(sweep["state"], "succeeded", "{sweep}");
    let trials = trials(&sweep);
    assert_eq!(trials.len(), 4);
    for t in trials {
        let job = p.get(&format!("/v1/jobs/{}", t["job_id"].as_str().unwrap()));
        assert_eq!(job["strategy"], "parameter_server", "{job}");
        assert_eq!(job["spec"]["optimizer"]["lr"], t["params"]["optimizer.lr"]);
        assert_eq!(job["spec"]["consistency"], t["params"]["consistency"]);
    }
    // The first trial passed every rung alone; the two at lr 3e-5 fell
    // below the keep line at rung 0, and their PS jobs were cancelled.
    // (The async trial at 0.003 goes on while it keeps up with the sync
    // one: η = 2 keeps one of two.)
    assert_eq!(trials[0]["state"], "completed", "{sweep}");
    for t in [&trials[1], &trials[3]] {
        assert_eq!(t["state"], "stopped", "{sweep}");
        assert!(
            t["reason"].as_str().is_some_and(|r| r.contains("rung 0")),
            "{t}"
        );
        let job = p.job(t["job_id"].as_str().unwrap());
        assert_eq!(job.state, trainyard_common::JobState::Cancelled, "{t}");
    }
    // The best is a good-rate trial, and PyTorch, evaluating its
    // downloaded weights in eval mode on the rows it held out, gives about
    // the figure the sweep reports for it (the shard may apply one more
    // update after the workers' last evaluation).
    let best = &sweep["best"];
    assert_eq!(best["params"]["optimizer.lr"], json!(0.003), "{sweep}");
    let (job, acc) = self::best(&p, &sweep, &p.file("ps-models"));
    let reported = best["metric"].as_f64().unwrap();
    println!(
        "PS sweep: best trial {} ({job}) {reported:.4} reported, {acc:.4} in PyTorch",
        best["index"]
    );
    assert!(acc > 0.9, "{acc}");
    assert!(
        (acc - reported).abs() <= 0.015,
        "PyTorch says {acc}, the sweep reported {reported}"
    );
}
