//! Judging the matrix: each out-of-sync cell's mean accuracy over its
//! seeds against its sync cell's, as a table and a list of misses.

use super::{Cell, Mode, Outcome, POINTS};

/// The table of `outcomes` (each out-of-sync cell beside its sync job)
/// and every cell that misses: a job that did not succeed, a problem in
/// its files, or an accuracy more than [`POINTS`] from its sync job's.
/// A cell run with several seeds is one row: its mean over them (each
/// seed's figure beside it), held to its sync cell's mean over the same
/// seeds.
pub fn judge(outcomes: &[Outcome]) -> (String, Vec<String>) {
    // The cells in the order they ran, each with its runs (one per seed).
    let mut groups: Vec<(Cell, Vec<&Outcome>)> = Vec::new();
    for o in outcomes {
        let key = o.cell.group();
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, runs)) => runs.push(o),
            None => groups.push((key, vec![o])),
        }
    }
    let runs_of = |c: &Cell| groups.iter().find(|(k, _)| k == c).map(|(_, r)| r);
    // The mean accuracy of a cell's runs (none if any run has none), and
    // each run's, in seed order.
    let mean = |runs: &[&Outcome]| -> (Option<f64>, Vec<(u64, Option<f64>)>) {
        let mut each: Vec<(u64, Option<f64>)> =
            runs.iter().map(|o| (o.cell.seed, o.accuracy)).collect();
        each.sort_by_key(|(s, _)| *s);
        let all: Option<Vec<f64>> = each.iter().map(|(_, a)| *a).collect();
        let m = all
            .filter(|a| !a.is_empty())
            .map(|a| a.iter().sum::<f64>() / a.len() as f64);
        (m, each)
    };
    let listed = |each: &[(u64, Option<f64>)]| -> String {
        each.iter()
            .map(|(_, a)| a.map_or("—".to_string(), |v| format!("{v:.1}")))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut failures = Vec::new();
    let mut table = format!(
        "{:<12} {:<15} {:>2} {:<12} {:>8} {:<16} {:>8} {:>7} {:>9}  {:<26} {}\n",
        "model",
        "recipe",
        "w",
        "mode",
        "acc %",
        "each seed",
        "sync %",
        "gap",
        "PyTorch %",
        "staleness histogram",
        "rejected"
    );
    for (c, runs) in &groups {
        for o in runs {
            if let Err(e) = &o.ended {
                failures.push(format!("{}: the job ended {e}", o.cell.name()));
            }
            for p in &o.problems {
                failures.push(format!("{}: {p}", o.cell.name()));
            }
        }
        let (acc, each) = mean(runs);
        let (sync, sync_each) = runs_of(&c.sync()).map_or((None, Vec::new()), |r| mean(r));
        let seeds: Vec<u64> = each.iter().map(|(s, _)| *s).collect();
        let same_seeds = sync_each.iter().map(|(s, _)| *s).collect::<Vec<_>>() == seeds;
        let held = c.mode != Mode::Sync || c.stale_updates.is_some();
        let gap = match (acc, sync) {
            (Some(a), Some(s)) if held && same_seeds => Some(a - s),
            _ => None,
        };
        // A job that ended is judged above; one that succeeded and still
        // gives no figure to compare is a miss, never a silent pass.
        let ended = runs.iter().all(|o| o.ended.is_ok());
        if ended && acc.is_none() {
            failures.push(format!(
                "{}: PyTorch gave no accuracy for each of its seeds ({})",
                c.name(),
                listed(&each)
            ));
        } else if ended && held && gap.is_none() {
            failures.push(format!(
                "{}: cannot be judged: its sync cell did not run with the same seeds ({seeds:?}) or has no accuracy",
                c.name()
            ));
        }
        if let Some(g) = gap {
            if g.abs() > POINTS {
                let of = if seeds.len() > 1 {
                    format!(" (the mean of seeds {seeds:?}: {})", listed(&each))
                } else {
                    String::new()
                };
                failures.push(format!(
                    "{}: {:.1} % in PyTorch (eval mode){of}, {g:+.1} points from the same job in sync mode ({:.1} %{})",
                    c.name(),
                    acc.unwrap_or(f64::NAN),
                    sync.unwrap_or(f64::NAN),
                    if seeds.len() > 1 {
                        format!(": {}", listed(&sync_each))
                    } else {
                        String::new()
                    }
                ));
            }
        }
        let mut staleness: Vec<i64> = Vec::new();
        for o in runs {
            if staleness.len() < o.staleness.len() {
                staleness.resize(o.staleness.len(), 0);
            }
            for (t, s) in staleness.iter_mut().zip(&o.staleness) {
                *t += s;
            }
        }
        let rejected: i64 = runs.iter().map(|o| o.rejected).sum();
        let f = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
        table.push_str(&format!(
            "{:<12} {:<15} {:>2} {:<12} {:>8} {:<16} {:>8} {:>7} {:>9}  {:<26} {}\n",
            c.model,
            c.recipe,
            c.workers,
            format!(
                "{}{}",
                c.mode.name(),
                if c.stale_updates.is_some() { "*" } else { "" }
            ),
            f(acc),
            if each.len() > 1 {
                listed(&each)
            } else {
                String::new()
            },
            f(sync),
            gap.map_or("".into(), |g| format!("{g:+.1}")),
            f(runs[0].pytorch),
            format!("{staleness:?}"),
            rejected
        ));
    }
    (table, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(cell: Cell, accuracy: Option<f64>) -> Outcome {
        Outcome {
            cell,
            id: String::new(),
            curve: Vec::new(),
            ended: Ok(()),
            accuracy,
            problems: Vec::new(),
            staleness: vec![1, 2],
            rejected: 0,
            seconds: None,
            pytorch: Some(98.0),
        }
    }

    fn runs(mode: Mode, figures: &[(u64, Option<f64>)]) -> Vec<Outcome> {
        figures
            .iter()
            .map(|&(seed, a)| outcome(Cell::new("m", "r", 2, mode).with_seed(seed), a))
            .collect()
    }

    /// Each mode's mean over its seeds is held to sync's: one bad seed
    /// does not fail a cell whose mean is close, a mean 2+ points away
    /// does, and both directions count.
    #[test]
    fn a_cell_is_judged_by_its_mean_over_seeds() {
        let sync = runs(
            Mode::Sync,
            &[(7, Some(96.2)), (8, Some(98.4)), (9, Some(99.4))],
        );
        let close = runs(
            Mode::Async,
            &[(7, Some(98.6)), (8, Some(98.0)), (9, Some(98.4))],
        );
        let (table, failures) = judge(&[sync.clone(), close].concat());
        assert!(failures.is_empty(), "{failures:?}\n{table}");
        assert!(table.contains("96.2 98.4 99.4"), "{table}");
        let below = runs(
            Mode::Async,
            &[(7, Some(95.0)), (8, Some(96.0)), (9, Some(95.5))],
        );
        let (_, failures) = judge(&[sync.clone(), below].concat());
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("-2.5 points"), "{failures:?}");
        let low = runs(
            Mode::Sync,
            &[(7, Some(95.0)), (8, Some(96.0)), (9, Some(95.5))],
        );
        let above = runs(
            Mode::Bounded(2),
            &[(7, Some(98.5)), (8, Some(98.0)), (9, Some(99.0))],
        );
        let (_, failures) = judge(&[low, above].concat());
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("+3.0 points"), "{failures:?}");
    }

    /// A cell with nothing to compare is a miss: a missing figure, a sync
    /// cell of other seeds, or none at all.
    #[test]
    fn a_cell_that_cannot_be_compared_fails() {
        let sync = runs(Mode::Sync, &[(7, Some(98.0)), (8, Some(98.0))]);
        let missing = runs(Mode::Async, &[(7, Some(98.0)), (8, None)]);
        let (_, f) = judge(&[sync.clone(), missing].concat());
        assert!(f.iter().any(|f| f.contains("no accuracy")), "{f:?}");
        let other = runs(Mode::Async, &[(7, Some(98.0)), (9, Some(98.0))]);
        let (_, f) = judge(&[sync, other.clone()].concat());
        assert!(f.iter().any(|f| f.contains("cannot be judged")), "{f:?}");
        let (_, f) = judge(&other);
        assert!(f.iter().any(|f| f.contains("cannot be judged")), "{f:?}");
        let mut failed = runs(Mode::Async, &[(7, None)]);
        failed[0].ended = Err("failed: diverged".into());
        let (_, f) = judge(&failed);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("the job ended failed"), "{f:?}");
    }
}
