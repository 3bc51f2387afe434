//! `trainyard job ID` (and `submit --follow`): follows a job to its end —
//! a state line at each change and a progress line (a bar when the number
//! of steps is known, the latest loss and held-out accuracy), redrawn in
//! place on a terminal, at most every two seconds otherwise — then how it
//! ended, where its weights are, and an exit code that says it.

use crate::error::CliError;
use crate::error::{OrCli, EXIT_CANCELLED, EXIT_FAILED};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};
use trainyard_client::{Client, RetryPolicy};
use trainyard_common::api::{Job, MetricSeries};
use trainyard_common::event::Outcome;
use trainyard_common::spec::{DatasetSpec, UncheckedJobSpec};
use trainyard_common::{EventData, JobState};
use uuid::Uuid;

/// How often `trainyard job` polls the API.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// How long `trainyard job` waits, after a job succeeded, for the metrics
/// of its last steps.
const SETTLE: Duration = Duration::from_secs(5);
/// How long `job ID` keeps following through an unreachable or failing API
/// (a restart, a loaded machine) before it gives up.
pub const FOLLOW_PATIENCE: Duration = Duration::from_secs(60);
/// Width of the progress bar in characters.
const BAR_WIDTH: usize = 30;
/// Without a terminal, a progress line at most this often.
const PLAIN_EVERY: Duration = Duration::from_secs(2);
/// Most events `finish` reads to find how the job ended.
const EVENTS: u32 = 1000;

/// Steps a job will run, when the spec says: `steps`, or `epochs` over a
/// generated dataset (whose size the spec gives). `None` for epochs over a
/// file or generated text, whose length only the executor knows.
pub fn expected_steps(spec: &UncheckedJobSpec) -> Option<u64> {
    if let Some(s) = spec.steps {
        return Some(s);
    }
    let epochs = u64::from(spec.epochs?);
    let samples = match spec.dataset.as_ref()? {
        DatasetSpec::Classification(d) => d.samples,
        DatasetSpec::Regression(d) => d.samples,
        DatasetSpec::Text(_) | DatasetSpec::File(_) => return None,
    };
    let batch = u64::from(spec.batch_size?).max(1);
    let workers = u64::from(spec.workers.max).max(1);
    let train = samples - (samples as f64 * spec.eval_fraction).round() as u64;
    Some(epochs * train.div_ceil(workers).div_ceil(batch).max(1))
}

/// A text progress bar: `[#####-----]  50%`.
pub fn bar(done: u64, total: u64) -> String {
    let frac = if total == 0 {
        0.0
    } else {
        (done as f64 / total as f64).clamp(0.0, 1.0)
    };
    let full = (frac * BAR_WIDTH as f64).round() as usize;
    format!(
        "[{}{}] {:>3.0}%",
        "#".repeat(full),
        "-".repeat(BAR_WIDTH - full),
        frac * 100.0
    )
}

/// Follows job `id` (printed as `shown`, the user's spelling) until it
/// ends; the exit code.
pub async fn follow(client: &Client, id: Uuid, shown: &str) -> Result<u8, CliError> {
    let tty = std::io::stderr().is_terminal();
    let mut last_state: Option<JobState> = None;
    let mut last_line = String::new();
    let mut last_print = Instant::now() - PLAIN_EVERY;
    let mut settle_until: Option<Instant> = None;
    loop {
        // Once the API answered, a later outage is waited out (an API that
        // was never reachable is an error at once).
        let patience = if last_state.is_none() {
            Duration::ZERO
        } else {
            FOLLOW_PATIENCE
        };
        let patient = client.with_retry(RetryPolicy::patient(patience, POLL_INTERVAL * 2));
        let job: Job = patient.job(id).await.or_cli(client)?;
        let state = job.state;
        let metrics: MetricSeries = patient.job_metrics(id, Some(200)).await.or_cli(client)?;
        let step = u64::try_from(metrics.steps_recorded).unwrap_or(0);
        let latest = metrics.points.last();
        let total = expected_steps(&job.spec);
        // The last steps' metrics may land just after the outcome: give
        // them a moment so that the final line shows the whole run.
        let short = state == JobState::Succeeded && total.is_some_and(|t| step < t);
        let settling = state.is_terminal()
            && short
            && *settle_until.get_or_insert_with(|| Instant::now() + SETTLE) > Instant::now();
        let done = state.is_terminal() && !settling;
        let name = state.as_str();
        let mut line = format!("{name:<11} step {step}");
        if let Some(total) = total {
            line = format!("{name:<11} {} {step}/{total}", bar(step, total));
        }
        if let Some(p) = latest {
            line.push_str(&format!("  loss {:.4}", p.loss));
            if let Some(acc) = p.eval_accuracy {
                line.push_str(&format!("  held-out acc {:.1}%", acc * 100.0));
            }
        }
        let mut err = std::io::stderr().lock();
        if last_state != Some(state) {
            if tty && !last_line.is_empty() {
                let _ = writeln!(err);
            }
            let _ = writeln!(err, "job {shown}: {name} ({})", job.state_reason);
            last_state = Some(state);
        }
        if tty {
            let _ = write!(err, "\r{line:<100}");
            let _ = err.flush();
        } else if line != last_line && (last_print.elapsed() >= PLAIN_EVERY || done) {
            let _ = writeln!(err, "{line}");
            last_print = Instant::now();
        }
        last_line = line;
        if done {
            if tty {
                let _ = writeln!(err);
            }
            drop(err);
            return Ok(finish(client, id, shown, state).await);
        }
        drop(err);
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Prints how the job ended (and where its weights are); the exit code.
async fn finish(client: &Client, id: Uuid, shown: &str, state: JobState) -> u8 {
    if let Ok(page) = client.job_events(id, None, Some(EVENTS)).await {
        let result = page
            .events
            .iter()
            .rev()
            .find(|e| e.kind == trainyard_common::EventKind::Result);
        if let Some(Ok(EventData::Result(Outcome::Trained {
            weights_url: url, ..
        }))) = result.map(|r| r.typed())
        {
            println!("weights: {url}");
        }
        if let Some(e) = page.events.iter().rev().find(|e| e.to_state == Some(state)) {
            println!("job {shown} {}: {}", state.as_str(), e.reason);
        }
    }
    match state {
        JobState::Succeeded => 0,
        JobState::Cancelled => EXIT_CANCELLED,
        _ => EXIT_FAILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_bar_fills_with_progress() {
        assert_eq!(bar(0, 10), format!("[{}]   0%", "-".repeat(BAR_WIDTH)));
        assert_eq!(bar(10, 10), format!("[{}] 100%", "#".repeat(BAR_WIDTH)));
        assert!(bar(5, 10).contains(&"#".repeat(BAR_WIDTH / 2)));
        assert!(bar(50, 10).ends_with("100%"), "clamped");
        assert!(bar(3, 0).ends_with("  0%"), "no total");
    }

    fn spec(fields: serde_json::Value) -> UncheckedJobSpec {
        let mut s = json!({"name": "t", "model": {"kind": "mlp", "inputs": 4, "outputs": 2},
            "loss": "cross_entropy", "optimizer": {"kind": "sgd", "lr": 0.1}, "batch_size": 32});
        for (k, v) in fields.as_object().unwrap() {
            s[k] = v.clone();
        }
        serde_json::from_value(s).unwrap()
    }

    #[test]
    fn expected_steps_from_steps_or_a_generated_dataset() {
        let gen = json!({"kind": "classification", "samples": 1000, "features": 4, "classes": 2});
        assert_eq!(
            expected_steps(&spec(json!({"steps": 1200, "dataset": gen}))),
            Some(1200)
        );
        // 800 training samples → 25 batches of 32 per epoch.
        let two_epochs = json!({"epochs": 2, "eval_fraction": 0.2, "dataset": gen,
            "workers": {"min": 1, "max": 1}});
        assert_eq!(expected_steps(&spec(two_epochs)), Some(50));
        let file = json!({"epochs": 2, "dataset": {"kind": "file", "url": "file:///x.npz"}});
        assert_eq!(expected_steps(&spec(file)), None);
    }
}
