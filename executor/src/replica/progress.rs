//! What every training loop shares, whatever its pattern: the
//! learning-rate schedule, when to evaluate, the figures of a step, the
//! divergence check, and the progress line in the job's log.
//!
//! The ring loop ([`crate::ring`]) and the PS worker ([`crate::ps`]) both
//! build their [`StepStats`] with [`step_stats`], evaluate when
//! [`evaluation_due`] says so and write a progress line when their
//! [`ProgressLine`] is due, so the two patterns report alike.

use super::TrainError;
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};
use trainyard_common::spec::{Loss, ModelSpec, Schedule, UncheckedJobSpec};

/// One step's figures: the wire type of the reports, so what the loop
/// measures is exactly what the API stores.
pub use trainyard_common::cluster::MetricPoint as StepStats;

/// At most this long between two progress lines in a job's log.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Evaluations during a run (plus one at the end).
pub const EVALUATIONS: u64 = 10;

/// The learning rate at `step` (1-based) of `total`.
pub fn learning_rate(spec: &UncheckedJobSpec, step: u64, total: u64) -> f64 {
    let lr = spec.optimizer().lr;
    match spec.optimizer().schedule {
        Schedule::Constant => lr,
        Schedule::WarmupCosine { warmup_steps } => {
            if step <= warmup_steps {
                lr * step as f64 / warmup_steps.max(1) as f64
            } else {
                let span = total.saturating_sub(warmup_steps).max(1) as f64;
                let t = (step - warmup_steps) as f64 / span;
                0.5 * lr * (1.0 + (std::f64::consts::PI * t.min(1.0)).cos())
            }
        }
    }
}

/// Whether rank `rank` evaluates after global step `step` of `total`:
/// rank 0 alone, [`EVALUATIONS`] times a run and after the last step.
pub fn evaluation_due(rank: u32, step: u64, total: u64, last: bool) -> bool {
    rank == 0 && (step % (total / EVALUATIONS).max(1) == 0 || last)
}

/// A step's loss must be finite: else the job fails, saying how to fix it.
pub fn check_finite(loss: f64, step: u64) -> Result<(), TrainError> {
    if loss.is_finite() {
        Ok(())
    } else {
        Err(TrainError::Diverged(step))
    }
}

/// Where one step's time went, and how much it moved.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    /// Samples the step trained on (all ranks' for a ring).
    pub samples: usize,
    /// Waiting for the batch.
    pub data_seconds: f64,
    /// Forward, backward and the update.
    pub compute_seconds: f64,
    /// The all-reduce, or the pulls and pushes.
    pub comm_seconds: f64,
    /// Bytes this rank sent.
    pub comm_bytes: u64,
}

/// The figures of global step `step` (no evaluation, no staleness yet).
pub fn step_stats(step: u64, loss: f64, lr: f64, t: Timings) -> StepStats {
    let seconds = t.data_seconds + t.compute_seconds + t.comm_seconds;
    StepStats {
        step,
        loss,
        lr,
        samples_per_sec: t.samples as f64 / seconds.max(1e-9),
        data_seconds: t.data_seconds,
        compute_seconds: t.compute_seconds,
        comm_seconds: t.comm_seconds,
        comm_bytes: t.comm_bytes,
        staleness: None,
        rejected: 0,
        eval_accuracy: None,
        eval_loss: None,
        data_bytes_read: 0,
        data_cache_hits: 0,
        data_cache_misses: 0,
        prefetch_depth: 0,
        epoch_done: None,
    }
}

/// When the next progress line is due: after every evaluation, else at
/// most every [`PROGRESS_EVERY`].
pub struct ProgressLine {
    last: Instant,
}

impl Default for ProgressLine {
    fn default() -> ProgressLine {
        ProgressLine {
            last: Instant::now(),
        }
    }
}

impl ProgressLine {
    /// Whether a line is due after `stats`; a due line restarts the clock.
    pub fn due(&mut self, stats: &StepStats) -> bool {
        let due = stats.eval_loss.is_some() || self.last.elapsed() >= PROGRESS_EVERY;
        if due {
            self.last = Instant::now();
        }
        due
    }
}

/// `", held-out accuracy 97.2%"`, or nothing without an accuracy.
pub fn accuracy_suffix(accuracy: Option<f64>) -> String {
    accuracy.map_or(String::new(), |a| {
        format!(", held-out accuracy {:.1}%", a * 100.0)
    })
}

/// Rows of the held-out set one evaluation forward takes: memory stays
/// bounded whatever the set's size.
pub const EVAL_ROWS: i64 = 256;

/// Held-out loss and accuracy (classification, not language models) of
/// `net` on `batch`: in evaluation mode (dropout off, BatchNorm on its
/// running statistics), without gradients, [`EVAL_ROWS`] rows at a time.
pub(crate) fn evaluate(
    spec: &UncheckedJobSpec,
    net: &dyn super::model::Net,
    batch: &(Tensor, Tensor),
    device: tch::Device,
) -> (f64, Option<f64>) {
    let classify =
        spec.loss() == Loss::CrossEntropy && !matches!(spec.model(), ModelSpec::Transformer(_));
    let rows = batch.0.size().first().copied().unwrap_or(0);
    if rows == 0 {
        return (f64::NAN, None);
    }
    let (mut loss_sum, mut correct) = (0.0, 0.0);
    tch::no_grad(|| {
        let mut at = 0;
        while at < rows {
            let n = EVAL_ROWS.min(rows - at);
            let x = batch.0.narrow(0, at, n).to_device(device);
            let y = batch.1.narrow(0, at, n).to_device(device);
            let Ok(out) = net.try_forward(&x, false) else {
                return (f64::NAN, None);
            };
            let Ok(loss) = super::loss_of(spec, &out, &y) else {
                return (f64::NAN, None);
            };
            loss_sum += loss.double_value(&[]) * n as f64;
            if classify {
                correct += out
                    .argmax(-1, false)
                    .eq_tensor(&y.reshape(-1))
                    .to_kind(Kind::Float)
                    .sum(Kind::Float)
                    .double_value(&[]);
            }
            at += n;
        }
        let rows = rows as f64;
        (loss_sum / rows, classify.then_some(correct / rows))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluations_come_ten_times_a_run_and_at_the_end_on_rank_0() {
        let due: Vec<u64> = (1..=100)
            .filter(|&s| evaluation_due(0, s, 100, s == 100))
            .collect();
        assert_eq!(due, [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
        assert!(!(1..=100).any(|s| evaluation_due(1, s, 100, s == 100)));
        assert!(
            evaluation_due(0, 3, 5, false),
            "short runs evaluate every step"
        );
        assert!(evaluation_due(0, 7, 95, true), "the last step always");
    }

    #[test]
    fn figures_and_checks() {
        let t = Timings {
            samples: 64,
            data_seconds: 0.25,
            compute_seconds: 0.5,
            comm_seconds: 0.25,
            comm_bytes: 10,
        };
        let s = step_stats(3, 0.5, 0.1, t);
        assert_eq!((s.step, s.comm_bytes), (3, 10));
        assert!((s.samples_per_sec - 64.0).abs() < 1e-9);
        assert!(check_finite(f64::NAN, 4).is_err());
        assert!(check_finite(1.0, 4).is_ok());
        assert_eq!(accuracy_suffix(Some(0.9721)), ", held-out accuracy 97.2%");
        assert_eq!(accuracy_suffix(None), "");
        let mut line = ProgressLine::default();
        assert!(!line.due(&s));
        assert!(line.due(&StepStats {
            eval_loss: Some(0.1),
            ..s
        }));
    }
}
