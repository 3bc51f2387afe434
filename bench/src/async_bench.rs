//! The asynchronous-PS matrix benchmark: every cell of
//! [`trainyard_e2e::async_matrix::full`] (six users' models × SGD with
//! momentum and Adam, and three strangers' models with their own recipes,
//! × 2 and 4 workers × sync, async, bounded τ=2 and τ=4), each out-of-sync job's accuracy (PyTorch, eval mode, held-out
//! rows) against its sync job's, and the cells within 2 points against
//! the same cells under the defaults before `share` (`stale_updates: {lr:
//! plain, momentum: compensate}`).
//! Then the speed of each mode: the residual CNN under SGD with momentum,
//! 2 workers, one job at a time, on executors whose worker rank 1 is a
//! straggler (`TRAINYARD_SLOW_WORKER=1:MS`, it sleeps after each step;
//! each out-of-sync mode then under `until: all` and `until: first`) and
//! on plain ones: each mode's time from start to end, its time to
//! accuracy (seconds until its own held-out evaluations reach the sync
//! job's final accuracy in PyTorch less a point) and its accuracy, each
//! against sync's. Every figure is printed
//! `name: value (baseline, ratio)`
//! and recorded for the report.
//!
//! `async-bench --short`: the two residual CNNs and BatchNorm's CNN only.
//! `async-bench --speed-only`: only the speed figures.
//! `async-bench --cells SUBSTRING`: only the cells whose name contains it.
//! `async-bench --seeds 7,8,9`: each cell once per seed, each mode's mean
//! held to sync's.
//! `async-bench --recipes a,b`: other recipes (`sgd_constant`: SGD with
//! momentum at a constant rate, no clip; `adam_beta1`, `adamw_beta1`: Adam
//! and AdamW with β₁ 0.2, what compensating asynchrony's own momentum
//! would leave of 0.9). `async-bench --models a,b`: other models (with
//! `--recipes`: each model under each recipe). `async-bench --before
//! JSON`: another baseline's `stale_updates`; `--no-baseline`: none.

use std::time::Instant;
use trainyard_bench::figure::{Better, Figure};
use trainyard_e2e::async_matrix::{self, curve, full, judge, matrix, seeded, Cell, Mode};
use trainyard_e2e::{Platform, Proc};

/// The defaults before `share` (each push at the schedule's full rate,
/// the momentum compensated for asynchrony's own). `--before` takes
/// others: `{"lr": "plain", "momentum": "as_given", "buffers":
/// "as_pushed"}` are the rules before any staleness awareness.
const BEFORE: &str = r#"{"lr": "plain", "momentum": "compensate"}"#;

fn main() {
    // The platform's binaries are this one's neighbours (release, under
    // bench/run).
    if std::env::var_os("TRAINYARD_BIN_DIR").is_none() {
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|p| p.to_path_buf()))
        {
            std::env::set_var("TRAINYARD_BIN_DIR", dir);
        }
    }
    let args: Vec<String> = std::env::args().collect();
    let short = args.iter().any(|a| a == "--short");
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let filter = arg("--cells");
    let before = arg("--before").unwrap_or_else(|| BEFORE.to_string());
    let started = Instant::now();
    let list = |s: String| -> Vec<&'static str> {
        s.split(',')
            .map(|s| &*Box::leak(s.to_string().into_boxed_str()))
            .collect()
    };
    let cells = match (arg("--recipes"), arg("--models")) {
        (None, None) => full(),
        (recipes, models) => matrix(
            &models.map_or(async_matrix::MODELS.to_vec(), list),
            &recipes.map_or(async_matrix::RECIPES.to_vec(), list),
        ),
    };
    let mut cells: Vec<Cell> = cells
        .into_iter()
        .filter(|c| !short || matches!(c.model, "res_cnn" | "res_gn" | "bn_cnn"))
        .collect();
    // The baseline: each out-of-sync cell under the rules before.
    let baseline: Vec<Cell> = cells
        .iter()
        .filter(|c| c.mode != Mode::Sync && !args.iter().any(|a| a == "--no-baseline"))
        .map(|c| Cell {
            stale_updates: Some(before.clone()),
            ..c.clone()
        })
        .collect();
    cells.extend(baseline);
    // Each cell once per seed: `judge` holds each mode's mean to sync's.
    if let Some(seeds) = arg("--seeds") {
        let seeds: Vec<u64> = seeds
            .split(',')
            .map(|s| s.trim().parse().expect("--seeds takes numbers: 7,8,9"))
            .collect();
        cells = seeded(&cells, &seeds);
    }
    if let Some(f) = &filter {
        cells.retain(|c| c.name().contains(f.as_str()));
    }
    let speed_only = args.iter().any(|a| a == "--speed-only");
    if !speed_only {
        accuracy(cells, &before, started);
    }
    // A cell filter is for looking at cells: no speed figures then.
    if speed_only || filter.is_none() {
        for straggler_ms in [0u64, 40] {
            speed(straggler_ms);
        }
    }
}

/// Each mode's time, time to accuracy and accuracy against sync's, one
/// job at a time, worker rank 1 sleeping `straggler_ms` after each step.
/// With a straggler each out-of-sync mode runs under both `until`s.
fn speed(straggler_ms: u64) {
    let p = Platform::builder("async-bench-speed").start();
    let dir = async_matrix::write_models(&p);
    let slow = format!("1:{straggler_ms}");
    let env: Vec<(&str, &str)> = if straggler_ms > 0 {
        vec![("TRAINYARD_SLOW_WORKER", slow.as_str())]
    } else {
        Vec::new()
    };
    let _execs: Vec<Proc> = (0..3)
        .map(|i| p.executor_with(&format!("speed-{i}"), 4096, &env))
        .collect();
    let mut cells = Vec::new();
    for mode in [Mode::Sync, Mode::Async, Mode::Bounded(2), Mode::Bounded(4)] {
        let cell = Cell::new("res_cnn", "sgd_momentum", 2, mode);
        if mode != Mode::Sync && straggler_ms > 0 {
            cells.push(cell.clone().until("first"));
        }
        cells.push(cell);
    }
    let outcomes = async_matrix::run(&p, &dir, &cells, 1);
    let (table, _) = judge(&outcomes);
    eprintln!("{table}");
    let Some(sync) = outcomes.iter().find(|o| o.cell.mode == Mode::Sync) else {
        return;
    };
    let label = if straggler_ms > 0 {
        format!("worker 1 sleeps {straggler_ms} ms a step")
    } else {
        "alike workers".into()
    };
    // Time to accuracy: seconds from the start until the job's own
    // held-out evaluations (rank 0's, polled) first reach the sync job's
    // final accuracy less a point. That accuracy is PyTorch's on the 500
    // test rows: the job's own held-out rows are few (a row is over a
    // point), so its last evaluation would set a coarse target.
    let target = sync.accuracy.map(|a| a - 1.0);
    let reach = |o: &async_matrix::Outcome| target.and_then(|t| curve::time_to(&o.curve, t));
    eprintln!(
        "{label}: time to {} % held-out accuracy (sync's final in PyTorch less 1 point): {}",
        target.map_or("—".into(), |t| format!("{t:.1}")),
        outcomes
            .iter()
            .map(|o| format!(
                "{} {}",
                o.cell.name(),
                reach(o).map_or("never".into(), |t| format!("{t:.2} s"))
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for o in outcomes.iter().filter(|o| o.cell.mode != Mode::Sync) {
        let mode = format!(
            "{}{}",
            o.cell.mode.name(),
            o.cell
                .until
                .map_or(String::new(), |u| format!(" until {u}"))
        );
        let against = |name: &str,
                       value: Option<f64>,
                       base: Option<f64>,
                       unit: &'static str,
                       better: Better| {
            if let (Some(v), Some(b)) = (value, base) {
                Figure::new(
                    "async",
                    format!("{label}: {mode} {name}"),
                    v,
                    unit,
                    "sync",
                    b,
                    better,
                )
                .emit();
            }
        };
        against("job time", o.seconds, sync.seconds, "s", Better::Lower);
        against(
            "time to accuracy",
            reach(o),
            reach(sync),
            "s",
            Better::Lower,
        );
        against("accuracy", o.accuracy, sync.accuracy, "%", Better::Higher);
    }
}

/// The accuracy matrix: `cells` with their baselines under `before`.
fn accuracy(cells: Vec<Cell>, before: &str, started: Instant) {
    let p = Platform::builder("async-bench").start();
    let dir = async_matrix::write_models(&p);
    let _execs: Vec<Proc> = (0..10).map(|i| p.executor(&format!("async-{i}"))).collect();
    let outcomes = async_matrix::run(&p, &dir, &cells, 2);
    let (table, failures) = judge(&outcomes);
    eprintln!("{table}");
    let accuracy_of = |c: &Cell| outcomes.iter().find(|o| o.cell == *c)?.accuracy;
    for o in outcomes
        .iter()
        .filter(|o| o.cell.mode != Mode::Sync && o.cell.stale_updates.is_none())
    {
        let Some(sync) = accuracy_of(&o.cell.sync()) else {
            continue;
        };
        let base = Cell {
            stale_updates: Some(before.to_string()),
            ..o.cell.clone()
        };
        if let Some(a) = o.accuracy {
            Figure::new(
                "async",
                format!("{} accuracy", o.cell.name()),
                a,
                "%",
                "its sync job",
                sync,
                Better::Higher,
            )
            .emit();
            eprintln!(
                "{}: {:+.1} points from sync (the rules before: {})",
                o.cell.name(),
                a - sync,
                accuracy_of(&base).map_or("— (failed)".into(), |b| format!("{:+.1}", b - sync))
            );
        }
    }
    // Cells within the bound: with the rules, and under the rules before
    // (a cell of several seeds counts once, as `judge` judges it).
    let within = |rules: bool| {
        let mut cells: Vec<Cell> = outcomes
            .iter()
            .filter(|o| o.cell.mode != Mode::Sync && o.cell.stale_updates.is_none() == rules)
            .map(|o| o.cell.group())
            .collect();
        cells.sort();
        cells.dedup();
        cells
            .iter()
            .filter(|c| {
                !failures.iter().any(|f| {
                    outcomes
                        .iter()
                        .filter(|o| o.cell.group() == **c)
                        .any(|o| f.starts_with(&format!("{}:", o.cell.name())))
                })
            })
            .count() as f64
    };
    Figure::new(
        "async",
        format!(
            "out-of-sync cells within {} points of sync",
            async_matrix::POINTS
        ),
        within(true),
        "cells",
        "the rules before",
        within(false),
        Better::Higher,
    )
    .emit();
    for f in &failures {
        eprintln!("miss: {f}");
    }
    eprintln!(
        "{} jobs in {:.0} s",
        cells.len(),
        async_matrix::seconds(started)
    );
}
