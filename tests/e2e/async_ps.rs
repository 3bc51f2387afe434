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

use std::time::Instant;
use trainyard_e2e::async_matrix::{self, judge, subset, Mode};
use trainyard_e2e::{Platform, Proc};

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
