//! Asynchronous and bounded-staleness parameter servers train a
//! stranger's model as well as sync does: the subset of the matrix of
//! [`trainyard_e2e::async_matrix`] that `./scripts/test` runs (the whole
//! of it is `async-bench`'s). A residual CNN with BatchNorm, GroupNorm and
//! dropout under SGD with momentum 0.9, weight decay, warm-up cosine and
//! a clip in sync, async and bounded τ=2 with 2 workers, the same at a
//! constant rate with the clip in sync and async, and BatchNorm's CNN
//! under Adam in sync and async with 4 workers; and strangers' models with
//! the recipes their users picked — a residual CNN with a GroupNorm stem
//! and BatchNorm in its branch under the SGD recipe (4–5 points below
//! sync out of sync under the rules before `stale_updates.lr: share`) and
//! a LayerNorm MLP under Adam — in sync, async and bounded τ=2 with 2
//! workers. Every cell runs with three seeds (held-out rows, data order,
//! dropout). Each downloaded `model.pt` is evaluated by PyTorch in eval
//! mode on 500 digits no job saw, and each out-of-sync cell's mean over
//! its seeds is within 2 points of its sync cell's mean over the same
//! seeds; PyTorch's own training of each model and recipe with those
//! seeds, made in the same run, is printed beside them.

use serde_json::Value;
use std::time::{Duration, Instant};
use trainyard_common::JobState;
use trainyard_e2e::async_matrix::{self, judge, subset, Mode};
use trainyard_e2e::{eventually, kill9, repo_root, Consistency, MlpSpec, Platform, Proc};

#[test]
fn async_and_bounded_jobs_score_within_two_points_of_sync() {
    let started = Instant::now();
    let p = Platform::builder("async-ps").start();
    let dir = async_matrix::write_models(&p);
    // A shard and up to four workers per job, two jobs at once.
    let _execs: Vec<Proc> = (0..6).map(|i| p.executor(&format!("async-{i}"))).collect();
    let cells = subset();
    let outcomes = async_matrix::run(&p, &dir, &cells, 2);
    let (table, failures) = judge(&outcomes);
    println!(
        "async PS subset ({} jobs, {:.0} s; accuracy of model.pt in PyTorch eval mode on 500 test rows):\n{table}",
        cells.len(),
        async_matrix::seconds(started)
    );
    assert!(failures.is_empty(), "{}\n{table}", failures.join("\n"));
}

/// A straggler (worker rank 1 sleeps 40 ms after each step, on every
/// executor) under each `until`: the residual CNN under the SGD recipe,
/// 2 workers, in sync, async and bounded τ=2 (`until: all`, the default)
/// and async `until: first`, each with three seeds. Every out-of-sync
/// cell's mean is within 2 points of sync's, judged by PyTorch on held-out
/// rows; an `all` job ends once both workers walked their share, a
/// `first` job once worker 0 had, with the straggler's share unfinished.
#[test]
fn a_straggler_keeps_async_within_two_points_of_sync_under_either_until() {
    let started = Instant::now();
    let p = Platform::builder("async-straggler").start();
    let dir = async_matrix::write_models(&p);
    let env = [("TRAINYARD_SLOW_WORKER", "1:40")];
    let _execs: Vec<Proc> = (0..6)
        .map(|i| p.executor_with(&format!("straggler-{i}"), 4096, &env))
        .collect();
    let cells = async_matrix::straggler_cells();
    let outcomes = async_matrix::run(&p, &dir, &cells, 2);
    let (table, mut failures) = judge(&outcomes);
    println!(
        "async PS with a straggler ({} jobs, {:.0} s):\n{table}",
        cells.len(),
        async_matrix::seconds(started)
    );
    for o in outcomes.iter().filter(|o| o.cell.mode != Mode::Sync) {
        let walked = if o.cell.until == Some("first") { 1 } else { 2 };
        let want = format!("{walked} of 2 workers walked their share of the data");
        let logs = p.log_messages(&o.id);
        if !logs.iter().any(|l| l.contains(&want)) {
            failures.push(format!(
                "{}: no {want:?} in its log (ends: {:?}; {:.1} s)",
                o.cell.name(),
                logs.iter()
                    .filter(|l| l.contains("the job ends"))
                    .collect::<Vec<_>>(),
                o.seconds.unwrap_or(f64::NAN)
            ));
        }
    }
    assert!(failures.is_empty(), "{}\n{table}", failures.join("\n"));
}

/// An MLP on digits under AdamW with warm-up, 1 PS shard, 2 to 3 workers.
fn faults_spec(name: &str, consistency: Consistency) -> Value {
    MlpSpec::digits(name)
        .hidden(&[256, 256])
        .adamw_warmup(0.005)
        .batch_size(32)
        .epochs(120)
        .workers(2, 3)
        .ps(1)
        .consistency(consistency)
        .seed(3)
        .build()
}

/// The workers of job `id`'s current assignment, and the executor of PS
/// shard 0.
fn placement(p: &Platform, id: &str) -> (Vec<String>, String) {
    let a = p.get(&format!("/v1/jobs/{id}/assignments"));
    let name = |v: &Value| v["executor"]["name"].as_str().unwrap_or("").to_owned();
    let workers = a["workers"]
        .as_array()
        .map_or_else(Vec::new, |w| w.iter().map(name).collect());
    (workers, name(&a["parameter_servers"][0]))
}

/// The places workers of generation `generation` resumed at, from their
/// log lines: (rank, epoch, sample).
fn resumed(p: &Platform, id: &str, generation: i64) -> Vec<(u32, u64, u64)> {
    let number = |s: &str, after: &str| -> Option<u64> {
        let rest = &s[s.find(after)? + after.len()..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    p.logs(id)
        .iter()
        .filter(|l| l.generation == generation)
        .filter_map(|l| {
            let m = &l.message;
            m.contains("resumes its share of the data").then(|| {
                Some((
                    number(m, "worker ")? as u32,
                    number(m, "at epoch ")?,
                    number(m, ", sample ")?,
                ))
            })?
        })
        .collect()
}

/// Async and bounded τ=2 jobs (under the default `until: all`) through a
/// join and a killed worker: when a third worker joins, the data is dealt
/// in threes and every rank starts at the slowest rank's place; when a
/// worker's executor is killed and a spare replaces it, the replacement
/// goes on from its rank's place as shard 0 kept it, not from the start
/// of the data. Each job ends with every worker's share walked, and its
/// downloaded model, judged by PyTorch on held-out digits, is within 2
/// points of an undisturbed sync run of the same spec made in this test.
#[test]
fn async_and_bounded_workers_resume_their_ranks_share_through_a_join_and_a_kill() {
    let p = Platform::builder("async-faults")
        .heartbeat_misses(10)
        .start();
    let (digits, dir) = (repo_root().join("data/digits.npz"), p.file("eval"));
    let mut execs: Vec<(String, Proc)> = Vec::new();
    let start = |execs: &mut Vec<(String, Proc)>, name: String| {
        let proc_ = p.executor(&name);
        execs.push((name, proc_));
    };
    let mut failures = Vec::new();
    let mut results = Vec::new();
    for (mode, c) in [
        ("async", Consistency::Async),
        ("bounded", Consistency::Bounded(2)),
    ] {
        // Two executors of their own each time: the job starts with 2 workers.
        for (_, e) in execs.drain(..) {
            let _ = e.terminate();
        }
        for i in 0..2 {
            start(&mut execs, format!("af-{mode}-{i}"));
        }
        let spec = faults_spec(&format!("faults-{mode}"), c);
        let id = p.submit(&spec);
        p.wait_steps(&id, 100, Duration::from_secs(120));
        // A third executor joins: the job grows to 3 workers.
        start(&mut execs, format!("af-{mode}-2"));
        let g_join = eventually(Duration::from_secs(60), || {
            (placement(&p, &id).0.len() == 3).then(|| p.job(&id).generation)
        })
        .unwrap_or_else(|| {
            panic!(
                "{mode}: the job grows to 3 workers: {:?}",
                p.log_messages(&id)
            )
        });
        let steps = p.steps_recorded(&id);
        p.wait_steps(&id, steps + 200, Duration::from_secs(120));
        // A spare, then a worker-only executor dies: the spare replaces it.
        let spare = format!("af-{mode}-3");
        start(&mut execs, spare.clone());
        // Live before the kill, so that one round replaces the lost worker
        // in a world of 3 (no generation of 2 between).
        eventually(Duration::from_secs(30), || {
            let live = p.get("/v1/executors?state=live");
            live["executors"]
                .as_array()?
                .iter()
                .any(|e| e["name"] == spare.as_str())
                .then_some(())
        })
        .unwrap_or_else(|| panic!("{mode}: the spare {spare} is live"));
        let (workers, shard) = placement(&p, &id);
        let victim = execs
            .iter()
            .position(|(n, _)| workers.contains(n) && *n != shard)
            .expect("an executor with a worker and no shard");
        let (name, proc_) = execs.remove(victim);
        kill9(proc_.pid());
        let g_kill = eventually(Duration::from_secs(60), || {
            let g = p.job(&id).generation;
            let (w, _) = placement(&p, &id);
            (g > g_join && w.len() == 3 && !w.contains(&name)).then_some(g)
        })
        .unwrap_or_else(|| panic!("{mode}: {name} is replaced: {:?}", p.log_messages(&id)));
        let job = p.wait_end(&id, Duration::from_secs(600));
        let lines = p.log_messages(&id);
        if job.state != JobState::Succeeded {
            failures.push(format!("{mode}: {job:?} {lines:?}"));
            continue;
        }
        // After the join every rank started at one place (the slowest),
        // not at the start of the data.
        let joined = resumed(&p, &id, g_join);
        let places: std::collections::BTreeSet<(u64, u64)> =
            joined.iter().map(|&(_, e, s)| (e, s)).collect();
        if places.len() != 1 || places.contains(&(0, 0)) || !joined.iter().any(|r| r.0 == 2) {
            failures.push(format!(
                "{mode}: after the join (generation {g_join}) the ranks resumed at {joined:?}"
            ));
        }
        // After the kill the replacement (the last rank) went on from its
        // rank's place.
        let replaced = resumed(&p, &id, g_kill);
        if !replaced.iter().any(|&(r, e, s)| r == 2 && (e, s) != (0, 0)) {
            failures.push(format!(
                "{mode}: after the kill (generation {g_kill}) the ranks resumed at {replaced:?}"
            ));
        }
        let end = lines
            .iter()
            .find(|l| l.contains("3 of 3 workers walked their share of the data"));
        let updates = end.and_then(|l| {
            let rest = &l[l.find("shard 0 applied ")? + "shard 0 applied ".len()..];
            rest.split(' ').next()?.parse::<u64>().ok()
        });
        let Some(updates) = updates else {
            failures.push(format!("{mode}: not every share was walked: {lines:?}"));
            continue;
        };
        println!(
            "{mode}: after the join (generation {g_join}) ranks resumed at {joined:?} (rank, epoch, sample); after the kill (generation {g_kill}) at {replaced:?}"
        );
        results.push((mode, id, spec, updates));
    }
    // The reference: the same spec in sync, undisturbed, on 3 workers.
    let sync_spec = faults_spec("faults-sync", Consistency::Sync);
    let sync_id = p.submit(&sync_spec);
    let job = p.wait_end(&sync_id, Duration::from_secs(600));
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let sync = p.pytorch_evaluation(&sync_id, &sync_spec, &digits, &dir);
    // Every share walked once is one push per worker per step of the sync
    // job on 3 workers (measured: 1.002–1.009× with each rank resuming its
    // place). A joining worker that started at the data's start, and a
    // replacement that walked its rank's share again, add the steps the
    // job had taken by then (1.07–1.09× with the join and kill earlier).
    let sync_steps = p.result(&sync_id)["steps"]
        .as_u64()
        .expect("the sync job's steps");
    let mut table = format!(
        "sync, undisturbed: {:.2}%, {sync_steps} steps of 3 workers\n",
        sync.accuracy * 100.0
    );
    for (mode, id, spec, updates) in &results {
        let got = p.pytorch_evaluation(id, spec, &digits, &dir);
        let ratio = *updates as f64 / (3 * sync_steps) as f64;
        table += &format!(
            "{mode}, through a join and a kill: {:.2}%, {updates} updates applied ({ratio:.3}× the sync job's pushes)\n",
            got.accuracy * 100.0
        );
        if ratio > 1.04 {
            failures.push(format!(
                "{mode}: {updates} updates applied, {ratio:.3}× the sync job's 3 × {sync_steps} pushes: shares were walked again"
            ));
        }
        if (got.accuracy - sync.accuracy).abs() > 0.02 {
            failures.push(format!(
                "{mode}: {:.2}% against sync's {:.2}%",
                got.accuracy * 100.0,
                sync.accuracy * 100.0
            ));
        }
    }
    println!("async PS through a join and a kill (model.safetensors in PyTorch on held-out digits):\n{table}");
    assert!(failures.is_empty(), "{}\n{table}", failures.join("\n"));
}
