//! Comparing two trained models on the same held-out rows.
//!
//! A test that asks "did the faults cost accuracy?" compares a faulted run
//! with a clean one. Both are different trajectories, so their accuracies
//! differ by chance; on a few hundred held-out rows one point is a handful
//! of rows. A fixed band around the difference then fails on noise, or is
//! too wide to catch a real loss. The rows both models got right (or both
//! wrong) say nothing about which is better; only the rows where they
//! disagree do. [`Paired`] counts those and asks, with an exact one-sided
//! sign test (McNemar's exact test), how likely the candidate's excess of
//! misses would be if both models were equally good.

/// How two models' per-row results on the same held-out rows compare.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Paired {
    /// Rows the baseline got right and the candidate got wrong.
    pub only_baseline: u64,
    /// Rows the candidate got right and the baseline got wrong.
    pub only_candidate: u64,
    /// The chance of at least `only_baseline` such rows among the
    /// disagreements if each disagreement went either way with equal odds.
    pub p_worse: f64,
}

impl Paired {
    /// Compares `candidate` with `baseline`, row by row (panics when they
    /// are not results on the same number of rows).
    pub fn new(candidate: &[bool], baseline: &[bool]) -> Paired {
        assert_eq!(
            candidate.len(),
            baseline.len(),
            "per-row results of the same held-out rows"
        );
        let (mut only_baseline, mut only_candidate) = (0u64, 0u64);
        for (&c, &b) in candidate.iter().zip(baseline) {
            match (c, b) {
                (false, true) => only_baseline += 1,
                (true, false) => only_candidate += 1,
                _ => {}
            }
        }
        Paired {
            only_baseline,
            only_candidate,
            p_worse: binomial_upper_tail(only_baseline + only_candidate, only_baseline),
        }
    }

    /// Whether the candidate is worse than the baseline beyond what chance
    /// explains at significance `alpha`.
    pub fn candidate_is_worse(&self, alpha: f64) -> bool {
        self.p_worse < alpha
    }
}

/// P(X >= k) for X ~ Binomial(n, 1/2), summed in log space so that a few
/// thousand disagreements do not overflow.
fn binomial_upper_tail(n: u64, k: u64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > n {
        return 0.0;
    }
    let ln_half_n = n as f64 * 0.5f64.ln();
    // ln C(n, i), built up from ln C(n, 0) = 0.
    let mut ln_choose = 0.0f64;
    let mut total = 0.0f64;
    for i in 0..=n {
        if i > 0 {
            ln_choose += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        if i >= k {
            total += (ln_choose + ln_half_n).exp();
        }
    }
    total.min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails_of_small_binomials_are_exact() {
        assert_eq!(binomial_upper_tail(4, 0), 1.0);
        assert!((binomial_upper_tail(4, 4) - 1.0 / 16.0).abs() < 1e-12);
        assert!((binomial_upper_tail(4, 3) - 5.0 / 16.0).abs() < 1e-12);
        assert!((binomial_upper_tail(10, 10) - 1.0 / 1024.0).abs() < 1e-12);
        assert_eq!(binomial_upper_tail(3, 4), 0.0);
        // Symmetry: P(X >= k) + P(X >= n - k + 1) = 1.
        for n in 1..60 {
            for k in 1..=n {
                let sum = binomial_upper_tail(n, k) + binomial_upper_tail(n, n - k + 1);
                assert!((sum - 1.0).abs() < 1e-9, "n {n} k {k}: {sum}");
            }
        }
        assert!(binomial_upper_tail(5000, 2600) < 0.01);
        assert!(binomial_upper_tail(5000, 2500) > 0.49);
    }

    #[test]
    fn only_disagreements_count() {
        let baseline = [true, true, true, false, false, true];
        let candidate = [true, false, true, false, true, false];
        let p = Paired::new(&candidate, &baseline);
        assert_eq!((p.only_baseline, p.only_candidate), (2, 1));
        assert!(!p.candidate_is_worse(0.01));
        // Equal models are never worse; a better candidate is not worse.
        assert!(!Paired::new(&baseline, &baseline).candidate_is_worse(0.5));
        assert!(!Paired::new(&baseline, &candidate).candidate_is_worse(0.01));
    }

    #[test]
    fn a_real_loss_is_caught_and_a_handful_of_rows_is_not() {
        // 359 held-out rows (a fifth of digits): the candidate misses 4 rows
        // the baseline gets and gets none the baseline misses -- one point
        // and more, yet well within chance.
        let baseline = vec![true; 359];
        let mut candidate = baseline.clone();
        for row in candidate.iter_mut().take(4) {
            *row = false;
        }
        assert!(!Paired::new(&candidate, &baseline).candidate_is_worse(0.01));
        // Twelve such rows (3.3 points) are not chance.
        for row in candidate.iter_mut().take(12) {
            *row = false;
        }
        assert!(Paired::new(&candidate, &baseline).candidate_is_worse(0.01));
    }
}
