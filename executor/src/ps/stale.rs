//! How an `async` or `bounded` shard applies a gradient that is `s`
//! versions stale, as pure rules (the spec's `stale_updates`): the
//! learning rate it takes, the momentum it is applied with, and delay
//! compensation. [`super::shard`] asks them for every update it applies
//! out of sync; the property tests below check them on their own, and
//! docs/users/parameter-server.md says what each costs.
//!
//! * **Learning rate** (`stale_updates.lr`): `share` applies each push at
//!   `lr / M` for `M` workers (`lr / √M` for Adam and AdamW), so that one
//!   push from every worker moves the values as one sync step over their
//!   batches does: each sample weighs what it weighs in the sync job
//!   (Goyal et al. 2017's linear rule for SGD, Malladi et al. 2022's
//!   square-root rule for Adam); `plain` applies every push at the
//!   schedule's rate (`M` times sync's per sample); `scale` at `lr / (1 +
//!   s)` (Zhang et al. 2016). `share` is the default.
//! * **Momentum** (`stale_updates.momentum`, a `momentum` optimizer):
//!   asynchrony by itself acts like momentum `1 − 1/(1 + s̄)` (Mitliagkas et
//!   al. 2016, "Asynchrony begets momentum"); `compensate` applies the
//!   spec's momentum less that, at least 0. It cuts the push's effective
//!   rate `lr / (1 − μ)` several times: it kept one model under SGD with
//!   momentum 0.9 at a constant rate and no clip from collapsing to
//!   chance, lost another 33 points there, and under-trained every recipe
//!   with a clip (a residual CNN 4–5 points below sync). The default is
//!   `as_given`.
//! * **Delay compensation** (`stale_updates.delay_compensation` = λ > 0,
//!   DC-ASGD, Zheng et al. 2017): the gradient `g`, computed on the values
//!   `w'` of its version, becomes `g + λ·g⊙g⊙(w − w')`, a first-order
//!   correction towards the gradient at the shard's values `w`.

use trainyard_common::spec::{AsyncMomentum, StaleLr};

/// Versions of the values a shard keeps for delay compensation: a
/// gradient staler than this is applied uncompensated.
pub const DC_HISTORY: usize = 16;

/// The mean staleness of the updates a shard applied out of sync.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MeanStaleness {
    sum: f64,
    count: u64,
}

impl MeanStaleness {
    /// Counts an update `s` versions stale; the mean with it.
    pub fn record(&mut self, s: u64) -> f64 {
        self.sum += s as f64;
        self.count += 1;
        self.mean()
    }

    /// The mean so far (0 before any update).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }
}

/// The factor on the schedule's learning rate of an update `s` versions
/// stale, in a generation of `workers` workers, for an `adaptive`
/// optimizer (Adam, AdamW) or not.
pub fn lr_factor(rule: StaleLr, s: u64, workers: u32, adaptive: bool) -> f64 {
    let m = f64::from(workers.max(1));
    match rule {
        StaleLr::Share if adaptive => 1.0 / m.sqrt(),
        StaleLr::Share => 1.0 / m,
        StaleLr::Scale => 1.0 / (1.0 + s as f64),
        StaleLr::Plain => 1.0,
    }
}

/// The momentum an out-of-sync update is applied with: the spec's `mu`,
/// less asynchrony's own where the rule compensates.
pub fn momentum(rule: AsyncMomentum, mu: f64, mean: f64) -> f64 {
    match rule {
        AsyncMomentum::Compensate => (mu - mean / (1.0 + mean)).max(0.0),
        AsyncMomentum::AsGiven => mu,
    }
}

/// Delay compensation in place: `g` (summed over `samples` samples, its
/// mean `g / samples`) computed on `then`, applied to `now`, becomes the
/// sum of `mean + λ·mean⊙mean⊙(now − then)`. Only the parameters (the
/// first `g.len()` values) are touched.
pub fn compensate(g: &mut [f32], now: &[f32], then: &[f32], lambda: f64, samples: u64) {
    let n = samples.max(1) as f32;
    let l = lambda as f32;
    for ((gi, w), w0) in g.iter_mut().zip(now).zip(then) {
        let mean = *gi / n;
        *gi = (mean + l * mean * mean * (w - w0)) * n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// `scale` is Zhang's 1/(1+s): never above 1, 1 for a fresh
        /// gradient, smaller the staler; `plain` is 1.
        #[test]
        fn stale_rates_only_ever_damp(s in 0u64..1000, t in 0u64..1000, m in 1u32..64) {
            for adaptive in [false, true] {
                let f = lr_factor(StaleLr::Scale, s, m, adaptive);
                prop_assert!(f > 0.0 && f <= 1.0);
                prop_assert_eq!(f, 1.0 / (1.0 + s as f64));
                prop_assert_eq!(lr_factor(StaleLr::Scale, 0, m, adaptive), 1.0);
                if s <= t {
                    prop_assert!(lr_factor(StaleLr::Scale, t, m, adaptive) <= f);
                }
                prop_assert_eq!(lr_factor(StaleLr::Plain, s, m, adaptive), 1.0);
            }
        }

        /// `share`: one push from each of `M` workers moves the values by
        /// the schedule's rate once (SGD's rate is linear in the batch),
        /// whatever their staleness; Adam's takes `1/√M` (its square-root
        /// rule); never above the full rate; a lone worker (or none
        /// counted) takes the full rate.
        #[test]
        fn shares_of_a_round_sum_to_one_step(s in 0u64..1000, m in 1u32..64) {
            let f = lr_factor(StaleLr::Share, s, m, false);
            prop_assert!((f * f64::from(m) - 1.0).abs() < 1e-12);
            prop_assert_eq!(f, lr_factor(StaleLr::Share, 0, m, false));
            let a = lr_factor(StaleLr::Share, s, m, true);
            prop_assert!((a * a * f64::from(m) - 1.0).abs() < 1e-12);
            prop_assert!(f <= a && a <= 1.0);
            for adaptive in [false, true] {
                prop_assert_eq!(lr_factor(StaleLr::Share, s, 1, adaptive), 1.0);
                prop_assert_eq!(lr_factor(StaleLr::Share, s, 0, adaptive), 1.0);
            }
        }

        /// The compensated momentum plus asynchrony's own is the spec's
        /// wherever the spec's is the larger; never negative, never more
        /// than the spec's; no staleness, no change.
        #[test]
        fn compensated_momentum_keeps_the_total(mu in 0.0f64..1.0, mean in 0.0f64..100.0) {
            let m = momentum(AsyncMomentum::Compensate, mu, mean);
            let implicit = mean / (1.0 + mean);
            prop_assert!((0.0..=mu).contains(&m));
            if mu >= implicit {
                prop_assert!((m + implicit - mu).abs() < 1e-12);
            } else {
                prop_assert_eq!(m, 0.0);
            }
            prop_assert_eq!(momentum(AsyncMomentum::Compensate, mu, 0.0), mu);
            prop_assert_eq!(momentum(AsyncMomentum::AsGiven, mu, mean), mu);
        }

        #[test]
        fn the_mean_is_the_mean(lags in proptest::collection::vec(0u64..100, 1..50)) {
            let mut m = MeanStaleness::default();
            let mut last = 0.0;
            for &l in &lags {
                last = m.record(l);
            }
            let want = lags.iter().sum::<u64>() as f64 / lags.len() as f64;
            prop_assert!((last - want).abs() < 1e-9);
        }

        /// Delay compensation changes nothing where the values did not
        /// move or λ is 0, and moves the mean gradient by exactly
        /// λ·g²·Δw otherwise.
        #[test]
        fn delay_compensation_is_dc_asgds_term(
            g in proptest::collection::vec(-10.0f32..10.0, 1..20),
            dw in -1.0f32..1.0,
            lambda in 0.0f64..2.0,
            samples in 1u64..64,
        ) {
            let then: Vec<f32> = g.iter().map(|x| x * 0.5).collect();
            let mut same = g.clone();
            compensate(&mut same, &then, &then, lambda, samples);
            let mut off = g.clone();
            let now: Vec<f32> = then.iter().map(|w| w + dw).collect();
            compensate(&mut off, &now, &then, 0.0, samples);
            for ((a, b), c) in same.iter().zip(&off).zip(&g) {
                prop_assert!((a - c).abs() <= 1e-4 * c.abs().max(1.0));
                prop_assert!((b - c).abs() <= 1e-4 * c.abs().max(1.0));
            }
            let mut moved = g.clone();
            compensate(&mut moved, &now, &then, lambda, samples);
            let n = samples as f32;
            for (m, gi) in moved.iter().zip(&g) {
                let mean = gi / n;
                let want = (mean + lambda as f32 * mean * mean * dw) * n;
                prop_assert!((m - want).abs() <= 1e-3 * want.abs().max(1.0));
            }
        }
    }
}
