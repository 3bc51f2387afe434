//! `trainyard sweep create FILE [--follow]`, `sweep list`, `sweep show ID`
//! and `sweep cancel ID`: hyperparameter sweeps from the command line, each
//! a request or two of the typed client. `show` prints the trials as a
//! table (their parameters, state, the metric at each rung reached, the
//! latest metric, workers, why they stopped) with the best marked; `create
//! --follow` prints a line whenever a trial changes state, then that table,
//! and exits as `trainyard job` does: 0 when the sweep succeeded, 1 when it
//! failed, 3 when it was cancelled.

use crate::args::{Connection, SweepArgs, SweepCommand};
use crate::error::{CliError, OrCli, EXIT_CANCELLED, EXIT_FAILED};
use crate::follow::{FOLLOW_PATIENCE, POLL_INTERVAL};
use crate::table::{age, print_table, wire};
use std::collections::BTreeMap;
use std::time::Duration;
use trainyard_client::{Client, RetryPolicy};
use trainyard_common::api::{Sweep, SweepState, SweepTrial};
use uuid::Uuid;

/// How often `sweep create --follow` reads the sweep.
const SWEEP_POLL: Duration = Duration::from_secs(1);

/// `trainyard sweep …`.
pub async fn sweep(args: SweepArgs) -> Result<u8, CliError> {
    match args.command {
        SweepCommand::Create { file, follow, conn } => create(file, follow, conn).await,
        SweepCommand::List { conn } => list(conn).await,
        SweepCommand::Show { id, conn } => {
            let (id, _) = sweep_id(&id)?;
            let client = conn.client()?;
            let s = client.sweep(id).await.or_cli(&client)?;
            show(&s);
            Ok(0)
        }
        SweepCommand::Cancel { id, conn } => {
            let (id, shown) = sweep_id(&id)?;
            let client = conn.client()?;
            let s = client.cancel_sweep(id).await.or_cli(&client)?;
            println!("sweep {shown} {} ({})", wire(&s.state), s.reason);
            Ok(0)
        }
    }
}

/// The sweep id the user gave, checked before it goes into a path.
fn sweep_id(id: &str) -> Result<(Uuid, String), CliError> {
    let id = id.trim();
    let bad = || CliError::Other(format!("{id:?} is not a sweep id"));
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(bad());
    }
    Ok((Uuid::parse_str(id).map_err(|_| bad())?, id.to_owned()))
}

async fn create(file: std::path::PathBuf, follow: bool, conn: Connection) -> Result<u8, CliError> {
    let bytes = if file.as_os_str() == "-" {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
            .map_err(|e| CliError::Other(format!("cannot read the sweep from stdin: {e}")))?;
        b
    } else {
        std::fs::read(&file)
            .map_err(|e| CliError::Other(format!("cannot read {}: {e}", file.display())))?
    };
    let client = conn.client()?;
    let s = client.create_sweep_json(bytes).await.or_cli(&client)?;
    println!(
        "created sweep {} ({}: {} trial(s), {} search on {}, {} at a time)",
        s.id,
        s.name,
        s.trials.len(),
        wire(&s.spec.search),
        wire(&s.spec.metric),
        s.spec.concurrency
    );
    if follow {
        return follow_sweep(&client, s).await;
    }
    Ok(0)
}

async fn list(conn: Connection) -> Result<u8, CliError> {
    let client = conn.client()?;
    let list = client.sweeps().await.or_cli(&client)?;
    let mut rows =
        vec![["ID", "NAME", "STATE", "METRIC", "TRIALS", "BEST", "AGE"].map(str::to_owned)];
    for s in list.sweeps {
        let best = s.best.as_ref().map_or_else(
            || "-".to_owned(),
            |b| format!("{} (trial {})", metric_text(b.metric), b.index),
        );
        rows.push([
            s.id.to_string(),
            s.name.clone(),
            wire(&s.state),
            format!("{} ({})", wire(&s.spec.metric), wire(&s.spec.goal)),
            trial_counts(&s.trials),
            best,
            age(s.created_at),
        ]);
    }
    print_table(&rows);
    Ok(0)
}

/// `3 completed, 1 stopped`: the trials by state.
fn trial_counts(trials: &[SweepTrial]) -> String {
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for t in trials {
        *by.entry(wire(&t.state)).or_default() += 1;
    }
    if by.is_empty() {
        return "none".into();
    }
    by.iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn metric_text(x: f64) -> String {
    format!("{x:.4}")
}

/// A parameter's value as the spec would write it.
fn param_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Number(n) => match n.as_f64() {
            Some(x) if n.is_f64() => format!("{}", (x * 1e6).round() / 1e6),
            _ => n.to_string(),
        },
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The rows of a sweep's trial table (the first is the header): index
/// (`*` marks the best), each parameter, state, rungs reached, the metric
/// at each rung, the latest metric and step, workers, job, reason.
pub fn trial_rows(s: &Sweep) -> Vec<Vec<String>> {
    let params: Vec<String> = {
        let mut p: Vec<String> = s
            .trials
            .iter()
            .flat_map(|t| t.params.keys().cloned())
            .collect();
        p.sort();
        p.dedup();
        p
    };
    let best = s.best.as_ref().map(|b| b.index);
    let mut header = vec!["TRIAL".to_owned()];
    header.extend(params.iter().cloned());
    header.extend(["STATE".to_owned(), "RUNGS".to_owned()]);
    header.extend(s.rungs.iter().map(|r| format!("@{r}")));
    header.extend(["METRIC", "STEP", "WORKERS", "JOB", "REASON"].map(str::to_owned));
    let mut rows = vec![header];
    for t in &s.trials {
        let mut row = vec![format!(
            "{}{}",
            t.index,
            if best == Some(t.index) { " *" } else { "" }
        )];
        row.extend(
            params
                .iter()
                .map(|p| t.params.get(p).map_or_else(|| "-".to_owned(), param_text)),
        );
        row.push(wire(&t.state));
        row.push(if s.rungs.is_empty() {
            "-".into()
        } else {
            format!("{}/{}", t.rung_metrics.len(), s.rungs.len())
        });
        row.extend((0..s.rungs.len()).map(|k| {
            t.rung_metrics
                .get(k)
                .map_or_else(String::new, |m| metric_text(*m))
        }));
        row.push(t.metric.map_or_else(|| "-".into(), metric_text));
        row.push(t.step.map_or_else(|| "-".into(), |s| s.to_string()));
        row.push(t.workers.to_string());
        row.push(t.job_id.map_or_else(|| "-".into(), |j| j.to_string()));
        row.push(t.reason.clone().unwrap_or_default());
        rows.push(row);
    }
    rows
}

/// Prints rows of any width as left-aligned columns two spaces apart.
fn print_rows(rows: &[Vec<String>]) {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; n];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
}

/// `sweep show ID`: what the sweep is, its trials, its best.
fn show(s: &Sweep) {
    println!(
        "sweep {} ({}): {} — {}",
        s.id,
        s.name,
        wire(&s.state),
        s.reason
    );
    let early = if s.rungs.is_empty() {
        "no early stopping".to_owned()
    } else {
        format!(
            "ASHA rungs at {} steps",
            s.rungs
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    println!(
        "{} search, {} ({}), {} at a time, {early}",
        wire(&s.spec.search),
        wire(&s.spec.metric),
        wire(&s.spec.goal),
        s.spec.concurrency
    );
    print_rows(&trial_rows(s));
    match &s.best {
        Some(b) => println!(
            "best: trial {} {} {} ({}) job {}",
            b.index,
            wire(&s.spec.metric),
            metric_text(b.metric),
            b.params
                .iter()
                .map(|(k, v)| format!("{k}={}", param_text(v)))
                .collect::<Vec<_>>()
                .join(" "),
            b.job_id.map_or_else(|| "-".into(), |j| j.to_string()),
        ),
        None => println!("best: none yet"),
    }
    for g in &s.growths {
        println!(
            "growth: trial {} went from {} to {} worker(s) onto the executors trial {} freed",
            g.trial, g.workers_before, g.workers_after, g.from_trial
        );
    }
}

/// `sweep create --follow`: a line per trial that changes state, then the
/// table; the exit code.
async fn follow_sweep(client: &Client, mut s: Sweep) -> Result<u8, CliError> {
    let patient = client.with_retry(RetryPolicy::patient(FOLLOW_PATIENCE, POLL_INTERVAL * 2));
    let mut seen: BTreeMap<u32, String> = BTreeMap::new();
    loop {
        for t in &s.trials {
            let state = wire(&t.state);
            if seen.get(&t.index) != Some(&state) {
                let mut line = format!("trial {} {state}", t.index);
                if let Some(m) = t.metric {
                    line.push_str(&format!("  {} {}", wire(&s.spec.metric), metric_text(m)));
                }
                if let Some(r) = &t.reason {
                    line.push_str(&format!("  ({r})"));
                }
                eprintln!("{line}");
                seen.insert(t.index, state);
            }
        }
        if s.state != SweepState::Running {
            break;
        }
        tokio::time::sleep(SWEEP_POLL).await;
        s = patient.sweep(s.id).await.or_cli(client)?;
    }
    show(&s);
    Ok(match s.state {
        SweepState::Succeeded => 0,
        SweepState::Cancelled => EXIT_CANCELLED,
        _ => EXIT_FAILED,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_are_checked_before_they_reach_a_path() {
        assert!(sweep_id("../jobs").is_err());
        assert!(sweep_id("").is_err());
        assert!(sweep_id("42").is_err());
        let id = Uuid::new_v4().to_string();
        assert_eq!(sweep_id(&format!(" {id} ")).unwrap().1, id);
    }

    #[test]
    fn parameters_print_as_written() {
        assert_eq!(param_text(&json!(0.001)), "0.001");
        assert_eq!(param_text(&json!(0.1 + 0.2)), "0.3");
        assert_eq!(param_text(&json!(64)), "64");
        assert_eq!(param_text(&json!("adamw")), "adamw");
        assert_eq!(param_text(&json!([128, 64])), "[128,64]");
    }
}
