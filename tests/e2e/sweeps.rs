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

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use trainyard_e2e::{repo_root, MlpSpec, Platform, Proc};

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
