//! Whether a job's training loss diverged, judged on rank 0's curve by the
//! job's [`Divergence`] policy.
//!
//! The rule (the policy's contract): a step whose loss is not finite, or
//! `window_steps` points of the curve in a row whose loss is above
//! `factor` × the curve's early value, the smallest loss of its first
//! [`EARLY_STEPS`] points. The window counts only points after those
//! first ones, so a high first loss that training then brings down never
//! trips it, and it is judged only once the early value is known (the
//! first [`EARLY_STEPS`] points are in) and positive (a factor of a
//! non-positive loss says nothing). A loss that falls and then climbs
//! back — training that lost what it learned, as an async job with
//! uncompensated momentum does, back to chance — never rises above its
//! early value: [`detect_collapse`] finds it, `window_steps` points in a
//! row above both `factor` × the curve's best (the lowest mean of
//! `window_steps` points in a row before them) and half its early value.
//! The half keeps a healthy curve's swings near zero loss (a harder shard
//! of data after an easier one) out of it. [`detect`] is pure: the API feeds it
//! the stored curve after each report of rank 0's metrics, so every
//! pattern (ring, parameter servers in any consistency, scripts that
//! report a loss) is judged alike; the executor's own check of a
//! non-finite loss names its finding with [`Finding::NotFinite`] too.

use crate::event::Diverged;
use crate::spec::{Divergence, DivergenceAction};

/// How many of the curve's first points give its early value.
pub const EARLY_STEPS: usize = 5;

/// One point of rank 0's loss curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossPoint {
    /// The step (1-based).
    pub step: u64,
    /// Its training loss (not finite when it diverged).
    pub loss: f64,
}

/// How the loss diverged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Finding {
    /// A step's loss is not finite.
    NotFinite {
        /// The first such step.
        step: u64,
    },
    /// The loss came down and climbed back: above `factor` × its best
    /// window mean and half its early value for the policy's window.
    Collapsed {
        /// The window's first step.
        first_step: u64,
        /// Its last step: where the collapse was found.
        step: u64,
        /// The loss at `step`.
        loss: f64,
        /// The lowest mean of `window_steps` points in a row before.
        best: f64,
        /// The early value.
        early: f64,
        /// The bound every loss of the window is above.
        threshold: f64,
    },
    /// The loss stayed above `factor` × its early value for the policy's
    /// window.
    StayedAbove {
        /// The window's first step.
        first_step: u64,
        /// Its last step: where the divergence was found.
        step: u64,
        /// The loss at `step`.
        loss: f64,
        /// The early value.
        early: f64,
        /// `factor` × `early`, which every loss of the window is above.
        threshold: f64,
    },
}

impl Finding {
    /// The step where the divergence was found.
    pub fn step(&self) -> u64 {
        match *self {
            Finding::NotFinite { step }
            | Finding::StayedAbove { step, .. }
            | Finding::Collapsed { step, .. } => step,
        }
    }

    /// Whether the loss was not finite (which fails a job whatever its
    /// policy's action: the weights it produced are not finite either).
    pub fn not_finite(&self) -> bool {
        matches!(self, Finding::NotFinite { .. })
    }

    /// What the job does about it under `policy`.
    pub fn action(&self, policy: &Divergence) -> DivergenceAction {
        if self.not_finite() {
            DivergenceAction::Fail
        } else {
            policy.action
        }
    }

    /// The `diverged` event's data for this finding under `policy`, with
    /// the curve's `early` value when known.
    pub fn event(&self, policy: &Divergence, early: Option<f64>) -> Diverged {
        let (loss, first_step, best) = match *self {
            Finding::NotFinite { .. } => (None, None, None),
            Finding::StayedAbove {
                first_step, loss, ..
            } => (Some(loss), Some(first_step), None),
            Finding::Collapsed {
                first_step,
                loss,
                best,
                ..
            } => (Some(loss), Some(first_step), Some(best)),
        };
        Diverged {
            step: self.step(),
            loss,
            not_finite: self.not_finite(),
            first_step,
            early: early.filter(|e| e.is_finite()),
            best,
            factor: policy.factor,
            window_steps: policy.window_steps,
            action: self.action(policy),
        }
    }

    /// The job's reason: what diverged where, with the figures, and what
    /// to change. `early` is the curve's early value when known (for a
    /// non-finite loss it may not be).
    pub fn reason(&self, policy: &Divergence, early: Option<f64>) -> String {
        let action = self.action(policy);
        let what = match *self {
            Finding::NotFinite { step } => format!(
                "the loss diverged: it is not finite at step {step}{}",
                match early {
                    Some(e) => format!(" (early loss {e:.4})"),
                    None => String::new(),
                }
            ),
            Finding::StayedAbove {
                first_step,
                step,
                loss,
                early,
                threshold,
            } => format!(
                "the loss diverged: it stayed above {} × its early value {early:.4} (= {threshold:.4}) \
                 for {} steps in a row, steps {first_step}–{step} (loss {loss:.4} at step {step})",
                policy.factor, policy.window_steps
            ),
            Finding::Collapsed {
                first_step,
                step,
                loss,
                best,
                early,
                threshold,
            } => format!(
                "the loss collapsed: having come down to {best:.4} (the mean of {w} steps in a row), \
                 it stayed above {} × that and half its early value {early:.4} (= {threshold:.4}) \
                 for {w} steps in a row, steps {first_step}–{step} (loss {loss:.4} at step {step})",
                policy.factor,
                w = policy.window_steps
            ),
        };
        match (action, self.not_finite()) {
            (DivergenceAction::Fail, true) => {
                format!("{what}; lower optimizer.lr or set optimizer.grad_clip")
            }
            (DivergenceAction::Fail, false) => format!(
                "{what}; lower optimizer.lr, set optimizer.grad_clip, or set divergence.action \
                 to warn to train on regardless"
            ),
            (DivergenceAction::Warn, _) => {
                format!("{what}; divergence.action is warn: training goes on")
            }
        }
    }
}

/// The early value of a curve whose first points are `early`: the
/// smallest of its first [`EARLY_STEPS`] losses, once there are that many
/// and all are finite.
pub fn early_value(early: &[LossPoint]) -> Option<f64> {
    let first = early.get(..EARLY_STEPS)?;
    if first.iter().any(|p| !p.loss.is_finite()) {
        return None;
    }
    first.iter().map(|p| p.loss).reduce(f64::min)
}

/// Judges a curve under `policy`: `early` is its first points (up to
/// [`EARLY_STEPS`]), `recent` points after them, both in step order. The
/// first non-finite loss of either is a [`Finding::NotFinite`]; else the
/// first `window_steps` points of `recent` in a row above `factor` × the
/// early value are a [`Finding::StayedAbove`], found at the last of them.
///
/// A caller that judges a curve as it grows passes as `recent` its last
/// `window_steps − 1` points judged before and the new ones: every window
/// that ends at a new point is then seen, and no more is read.
pub fn detect(policy: &Divergence, early: &[LossPoint], recent: &[LossPoint]) -> Option<Finding> {
    if let Some(p) = early.iter().chain(recent).find(|p| !p.loss.is_finite()) {
        return Some(Finding::NotFinite { step: p.step });
    }
    let e = early_value(early).filter(|e| *e > 0.0)?;
    let window = usize::try_from(policy.window_steps).ok()?.max(1);
    let threshold = policy.factor * e;
    let mut run = 0;
    for (i, p) in recent.iter().enumerate() {
        run = if p.loss > threshold { run + 1 } else { 0 };
        if run == window {
            let first = recent[i + 1 - window];
            return Some(Finding::StayedAbove {
                first_step: first.step,
                step: p.step,
                loss: p.loss,
                early: e,
                threshold,
            });
        }
    }
    None
}

/// Judges a curve for a collapse under `policy`: `early` is its early
/// value, `best` the lowest mean of `window_steps` points in a row judged
/// before, `recent` its latest points in step order (those judged before
/// reach `window_steps − 1` back, as for [`detect`]). Returns the first
/// window of `recent` whose every loss is above both `factor` × the best
/// mean of the windows before it and half the early value, and the best
/// mean once `recent`'s windows are counted in.
pub fn detect_collapse(
    policy: &Divergence,
    early: f64,
    best: Option<f64>,
    recent: &[LossPoint],
) -> (Option<Finding>, Option<f64>) {
    let Ok(window) = usize::try_from(policy.window_steps) else {
        return (None, best);
    };
    let window = window.max(1);
    let mut best = best;
    if !(early.is_finite() && early > 0.0) || recent.len() < window {
        return (None, best);
    }
    for end in window - 1..recent.len() {
        let w = &recent[end + 1 - window..=end];
        if let Some(b) = best {
            let threshold = (policy.factor * b).max(0.5 * early);
            if w.iter().all(|p| p.loss > threshold) {
                let last = w[window - 1];
                let finding = Finding::Collapsed {
                    first_step: w[0].step,
                    step: last.step,
                    loss: last.loss,
                    best: b,
                    early,
                    threshold,
                };
                return (Some(finding), best);
            }
        }
        let mean = w.iter().map(|p| p.loss).sum::<f64>() / window as f64;
        if mean.is_finite() {
            best = Some(best.map_or(mean, |b| b.min(mean)));
        }
    }
    (None, best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(factor: f64, window_steps: u32) -> Divergence {
        Divergence {
            action: DivergenceAction::Fail,
            factor,
            window_steps,
        }
    }

    fn curve(losses: &[f64]) -> Vec<LossPoint> {
        losses
            .iter()
            .enumerate()
            .map(|(i, &loss)| LossPoint {
                step: i as u64 + 1,
                loss,
            })
            .collect()
    }

    /// Splits a whole curve as the API does: the first points, then the
    /// rest.
    fn judge(p: &Divergence, losses: &[f64]) -> Option<Finding> {
        let c = curve(losses);
        let k = c.len().min(EARLY_STEPS);
        detect(p, &c[..k], &c[k..])
    }

    #[test]
    fn a_loss_that_stays_high_for_the_window_diverges_at_its_last_step() {
        let p = policy(3.0, 4);
        let mut losses = vec![2.0, 1.5, 1.0, 1.2, 1.1];
        losses.extend([3.5, 3.2, 3.1]);
        assert_eq!(judge(&p, &losses), None, "three of four");
        losses.push(3.01);
        assert_eq!(
            judge(&p, &losses),
            Some(Finding::StayedAbove {
                first_step: 6,
                step: 9,
                loss: 3.01,
                early: 1.0,
                threshold: 3.0
            })
        );
        // One step at the threshold breaks the run.
        let broken = [2.0, 1.5, 1.0, 1.2, 1.1, 3.5, 3.2, 3.0, 3.1, 3.3, 3.4];
        assert_eq!(judge(&p, &broken), None);
        // The first run that lasts the window counts, not a later one.
        let twice = [
            1.0, 1.0, 1.0, 1.0, 1.0, 4.0, 4.0, 4.0, 4.0, 1.0, 5.0, 5.0, 5.0, 5.0,
        ];
        assert_eq!(judge(&p, &twice).map(|f| f.step()), Some(9));
    }

    /// Judges a whole curve for a collapse as the API does: in reports of
    /// `chunk` points, each with the `window − 1` before it.
    fn collapse(p: &Divergence, losses: &[f64], chunk: usize) -> Option<Finding> {
        let c = curve(losses);
        let early = early_value(&c)?;
        let window = p.window_steps as usize;
        let mut best = None;
        let mut at = EARLY_STEPS;
        while at < c.len() {
            let end = (at + chunk).min(c.len());
            let from = at.saturating_sub(window - 1).max(EARLY_STEPS);
            let (f, b) = detect_collapse(p, early, best, &c[from..end]);
            if f.is_some() {
                return f;
            }
            best = b;
            at = end;
        }
        None
    }

    #[test]
    fn a_loss_that_learned_and_climbed_back_to_chance_collapsed() {
        let p = policy(3.0, 4);
        // 2.3 at first, down to 0.05, back up to chance: never 3 × 2.3.
        let mut losses = vec![2.3; 5];
        losses.extend([1.0, 0.5, 0.1, 0.05, 0.05, 0.05, 0.05, 0.06]);
        losses.extend([2.2, 2.3, 2.3]);
        assert_eq!(judge(&p, &losses), None, "no early-value divergence");
        assert_eq!(collapse(&p, &losses, 1), None, "three of four");
        losses.push(2.31);
        let f = collapse(&p, &losses, 1).expect("a collapse");
        assert!(
            matches!(
                f,
                Finding::Collapsed {
                    first_step: 14,
                    step: 17,
                    ..
                }
            ),
            "{f:?}"
        );
        assert_eq!(collapse(&p, &losses, 3), Some(f), "reports of any size");
        assert!(f.reason(&p, Some(2.3)).contains("collapsed"));
        // Near zero, a harder stretch 3 × the best is no collapse: it
        // stays below half the early value.
        let mut swings = vec![2.3; 5];
        swings.extend([
            0.5, 0.01, 0.01, 0.01, 0.01, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05,
        ]);
        assert_eq!(collapse(&p, &swings, 1), None);
    }

    #[test]
    fn a_high_first_loss_that_comes_down_is_no_divergence() {
        // 1 step window: a first loss 10 × the early value is not judged.
        let p = policy(1.5, 1);
        assert_eq!(judge(&p, &[20.0, 2.0, 1.0, 0.9, 0.8, 0.7]), None);
        // Not judged before the early value is known.
        assert_eq!(judge(&p, &[1.0, 1.0, 1.0, 1.0]), None);
        // Nor on a zero early loss.
        assert_eq!(judge(&p, &[0.0, 0.0, 0.0, 0.0, 0.0, 5.0]), None);
    }

    #[test]
    fn a_non_finite_loss_is_found_at_its_step_whatever_the_rest() {
        let p = policy(1e6, 100_000);
        assert_eq!(
            judge(&p, &[1.0, f64::NAN]),
            Some(Finding::NotFinite { step: 2 })
        );
        assert_eq!(
            judge(&p, &[1.0, 1.0, 1.0, 1.0, 1.0, 0.5, f64::INFINITY, f64::NAN]),
            Some(Finding::NotFinite { step: 7 })
        );
    }

    #[test]
    fn the_reason_names_the_step_the_figures_and_the_remedies() {
        let mut p = policy(3.0, 50);
        let f = Finding::StayedAbove {
            first_step: 11,
            step: 60,
            loss: 9.5,
            early: 2.0,
            threshold: 6.0,
        };
        let r = f.reason(&p, Some(2.0));
        for w in [
            "diverged",
            "3 × its early value 2.0000",
            "6.0000",
            "50 steps",
            "steps 11–60",
            "optimizer.lr",
            "optimizer.grad_clip",
            "divergence.action",
        ] {
            assert!(r.contains(w), "{w}: {r}");
        }
        let nf = Finding::NotFinite { step: 7 }.reason(&p, None);
        assert!(nf.contains("not finite at step 7") && nf.contains("optimizer.lr"));
        assert!(!nf.contains("divergence.action"), "{nf}");
        p.action = DivergenceAction::Warn;
        assert_eq!(f.action(&p), DivergenceAction::Warn);
        assert!(f.reason(&p, Some(2.0)).contains("training goes on"));
        // A non-finite loss fails the job whatever the action.
        assert_eq!(
            Finding::NotFinite { step: 1 }.action(&p),
            DivergenceAction::Fail
        );
    }

    fn losses() -> impl Strategy<Value = Vec<f64>> {
        prop::collection::vec(1e-3f64..1e3, 0..80)
    }

    /// Curves of a low start and long runs of high losses: windows are
    /// found often enough to test.
    fn high_or_low() -> impl Strategy<Value = Vec<f64>> {
        (
            prop::collection::vec(0.5f64..2.0, EARLY_STEPS),
            prop::collection::vec((any::<bool>(), 1usize..15), 0..8),
        )
            .prop_map(|(start, runs)| {
                let mut ls = start;
                for (high, n) in runs {
                    ls.extend(std::iter::repeat_n(if high { 50.0 } else { 1.0 }, n));
                }
                ls
            })
    }

    proptest! {
        /// A curve that never climbs back (each loss at most the one
        /// before) never collapses, whatever the reports' sizes.
        #[test]
        fn a_falling_curve_never_collapses(start in 0.1f64..100.0, steps in proptest::collection::vec(0.5f64..1.0, 5..200), window in 1u32..20, chunk in 1usize..30) {
            let mut l = start;
            let losses: Vec<f64> = steps.iter().map(|f| { l *= f; l }).collect();
            let p = policy(3.0, window);
            prop_assert_eq!(collapse(&p, &losses, chunk), None);
        }

        /// Where a collapse is found, every loss of its window is above
        /// both bounds, and the verdict does not depend on how the curve
        /// was reported.
        #[test]
        fn a_collapse_is_its_rule(losses in proptest::collection::vec(0.01f64..5.0, 5..120), window in 1u32..10, c1 in 1usize..20, c2 in 1usize..20) {
            let p = policy(3.0, window);
            let a = collapse(&p, &losses, c1);
            prop_assert_eq!(a, collapse(&p, &losses, c2));
            if let Some(Finding::Collapsed { first_step, step, best, early, threshold, .. }) = a {
                prop_assert_eq!(threshold, (3.0 * best).max(0.5 * early));
                for s in first_step..=step {
                    prop_assert!(losses[s as usize - 1] > threshold);
                }
            }
        }

        /// A loss that never rises above its start never diverges.
        #[test]
        fn a_non_increasing_curve_never_diverges(
            mut ls in losses(), factor in 1.5f64..1e6, window in 1u32..60
        ) {
            ls.sort_by(|a, b| b.total_cmp(a));
            prop_assert_eq!(judge(&policy(factor, window), &ls), None);
        }

        /// A loss bounded by `factor` × its smallest value never diverges.
        #[test]
        fn a_curve_within_the_factor_never_diverges(
            ls in prop::collection::vec(1.0f64..1.49, 0..80), window in 1u32..60
        ) {
            prop_assert_eq!(judge(&policy(1.5, window), &ls), None);
        }

        /// The verdict is exactly the rule's, computed naively: the first
        /// window after the early steps whose every loss is above the bound.
        #[test]
        fn the_verdict_is_the_rule(
            ls in high_or_low(), factor in 1.5f64..20.0, window in 1u32..30
        ) {
            let p = policy(factor, window);
            let w = window as usize;
            let expected = (ls.len() >= EARLY_STEPS).then(|| {
                let early = ls[..EARLY_STEPS].iter().cloned().fold(f64::INFINITY, f64::min);
                (EARLY_STEPS + w..=ls.len())
                    .find(|&end| ls[end - w..end].iter().all(|&l| l > factor * early))
                    .map(|end| end as u64)
            }).flatten();
            let found = judge(&p, &ls);
            prop_assert_eq!(found.map(|f| f.step()), expected);
            if let Some(f) = found {
                prop_assert!(!f.not_finite());
                let spans_the_window = matches!(f, Finding::StayedAbove { first_step, step, .. }
                    if first_step + u64::from(window) == step + 1);
                prop_assert!(spans_the_window, "{:?}", f);
            }
        }

        /// Judging a growing curve report by report, each time with the
        /// window's worth of earlier points and the new ones, finds what
        /// judging it whole finds.
        #[test]
        fn judging_as_it_grows_is_judging_it_whole(
            ls in high_or_low(), factor in 1.5f64..20.0, window in 1u32..30,
            cuts in prop::collection::vec(1usize..12, 1..20)
        ) {
            let p = policy(factor, window);
            let c = curve(&ls);
            let k = c.len().min(EARLY_STEPS);
            let whole = judge(&p, &ls);
            let (mut judged, mut first) = (0, None);
            for n in cuts.iter().cycle().take(200) {
                if judged >= c.len() || first.is_some() {
                    break;
                }
                let upto = (judged + n).min(c.len());
                // The caller's query: the points after the early ones, the
                // last `window - 1` judged and the new.
                let from = judged.saturating_sub(window as usize - 1).max(k);
                let recent = &c[from.min(upto)..upto];
                first = detect(&p, &c[..k.min(upto)], recent);
                judged = upto;
            }
            prop_assert_eq!(first.map(|f| f.step()), whole.map(|f| f.step()));
        }

        /// Scaling every loss by the same positive number changes nothing:
        /// the rule is relative to the early value.
        #[test]
        fn the_verdict_is_scale_free(
            ls in losses(), factor in 1.5f64..20.0, window in 1u32..30, scale in 1e-3f64..1e3
        ) {
            let p = policy(factor, window);
            let scaled: Vec<f64> = ls.iter().map(|l| l * scale).collect();
            let a = judge(&p, &ls).map(|f| f.step());
            let b = judge(&p, &scaled).map(|f| f.step());
            // Only a loss within rounding of the threshold may differ.
            let near = ls.iter().any(|&l| {
                let early = ls.iter().take(EARLY_STEPS).cloned().fold(f64::INFINITY, f64::min);
                ((l - factor * early) / l).abs() < 1e-9
            });
            prop_assert!(a == b || near, "{:?} vs {:?}", a, b);
        }

        /// Any non-finite loss is found, at the first such step.
        #[test]
        fn a_non_finite_loss_is_always_found(
            mut ls in losses(), at in any::<prop::sample::Index>(), nan in any::<bool>(),
            factor in 1.5f64..1e6, window in 1u32..100_000
        ) {
            ls.push(1.0);
            let i = at.index(ls.len());
            ls[i] = if nan { f64::NAN } else { f64::INFINITY };
            prop_assert_eq!(
                judge(&policy(factor, window), &ls),
                Some(Finding::NotFinite { step: i as u64 + 1 })
            );
        }

    }
}
