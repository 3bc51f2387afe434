//! A job's held-out accuracy over wall time, as it trains: what "time to
//! accuracy" is read from. The matrix polls each running job's latest
//! evaluation (worker rank 0's, on the job's own held-out rows) and keeps
//! each new figure with the seconds since the job started; the final
//! model is still judged by PyTorch ([`super::run`]).

use crate::Platform;
use chrono::Utc;
use trainyard_common::api::Job;

/// Seconds since the job started, and its held-out accuracy (points)
/// then, one point per new evaluation.
pub type Curve = Vec<(f64, f64)>;

/// Polls job `id` once: adds its latest evaluation to `curve` where it is
/// new; the job once it has ended.
pub fn poll(p: &Platform, id: &str, curve: &mut Curve) -> Option<Job> {
    let job = p.poll_job(id)?;
    if let Some(started) = job.started_at {
        let m = p.metrics(id, Some(1));
        let latest = m.points.last().and_then(|s| s.eval_accuracy);
        if let Some(a) = latest.map(|a| a * 100.0) {
            if curve.last().is_none_or(|(_, last)| *last != a) {
                let t = (Utc::now() - started).num_milliseconds() as f64 / 1e3;
                curve.push((t.max(0.0), a));
            }
        }
    }
    job.state.is_terminal().then_some(job)
}

/// The first time `curve` reached `target` points, if it did.
pub fn time_to(curve: &Curve, target: f64) -> Option<f64> {
    curve.iter().find(|(_, a)| *a >= target).map(|(t, _)| *t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_figure_at_or_above_the_target_counts() {
        let c = vec![(1.0, 80.0), (2.0, 95.5), (3.0, 94.0), (4.0, 97.0)];
        assert_eq!(time_to(&c, 95.5), Some(2.0));
        assert_eq!(time_to(&c, 96.0), Some(4.0));
        assert_eq!(time_to(&c, 98.0), None);
        assert_eq!(time_to(&Vec::new(), 1.0), None);
    }
}
