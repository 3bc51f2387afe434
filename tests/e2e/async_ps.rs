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
use trainyard_e2e::async_matrix::{self, judge, subset};
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
