//! The job's consistency as pure rules: what a shard does with a pushed
//! gradient ([`judge`]); and what a worker does next — with the values it
//! pulled ([`after_pull`]), once its push is answered ([`after_push`]),
//! which step it reports ([`step_done`]) and what it may overlap
//! ([`prefetches`]). No locks, no I/O: [`super::shard`] and
//! [`super::step`] ask and do what the rules say, and the property tests
//! below check the rules on their own.
//!
//! * `sync`: a shard sums one gradient per current-generation worker for
//!   its current version, then applies their mean and publishes the next
//!   version. A gradient of another version is rejected; a second one from
//!   the same worker for this version is acknowledged and changes nothing
//!   (a worker re-pushes after a lost answer, never applied twice).
//! * `async`: every gradient is applied on arrival.
//! * `bounded{staleness: τ}`: a gradient computed at version `v` is applied
//!   iff `current − v ≤ τ`, else rejected (the worker re-pulls and
//!   recomputes).

use trainyard_common::spec::Consistency;

/// Staleness buckets of the histogram (the last one is "this or more").
pub const STALENESS_BUCKETS: usize = 9;

/// Where a sync shard's current version stands when a push arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    /// Workers whose gradient for this version is summed already.
    pub summed: u32,
    /// Whether the pushing worker is one of them.
    pub pushed_already: bool,
    /// Workers the version waits for (the generation's worker count).
    pub expected: u32,
}

/// What a shard does with a pushed gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Refused as too stale (sync: computed at another version); counted
    /// as a rejection, the worker re-pulls.
    Rejected,
    /// Sync: this worker's gradient for this version is summed already;
    /// acknowledged, nothing changes.
    AlreadySummed,
    /// Sync: summed into this version's gradients; more are due.
    Summed {
        /// The first of the version (it starts the sum).
        first: bool,
    },
    /// Applied now, `staleness` versions behind the shard.
    Applied {
        /// How many versions the shard moved on since the gradient's.
        staleness: u64,
        /// Sync: it completes the version and is applied together with
        /// the others' sum (`false` for a lone worker, async and bounded).
        with_sum: bool,
    },
}

/// What a shard at version `current` does with a gradient computed at
/// `computed_at` under `consistency` (`round`: the sync round; ignored by
/// the other modes).
pub fn judge(consistency: Consistency, current: u64, computed_at: u64, round: Round) -> Verdict {
    let staleness = current.saturating_sub(computed_at);
    match consistency {
        Consistency::Sync => {
            if computed_at != current {
                Verdict::Rejected
            } else if round.pushed_already {
                Verdict::AlreadySummed
            } else if round.summed + 1 >= round.expected {
                Verdict::Applied {
                    staleness: 0,
                    with_sum: round.summed > 0,
                }
            } else {
                Verdict::Summed {
                    first: round.summed == 0,
                }
            }
        }
        Consistency::Bounded { staleness: tau } if staleness > u64::from(tau) => Verdict::Rejected,
        Consistency::Async | Consistency::Bounded { .. } => Verdict::Applied {
            staleness,
            with_sum: false,
        },
    }
}

/// What a worker does with the values it pulled from every shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterPull {
    /// Compute its gradient on them.
    Train,
    /// Sync: the shards at `behind` are one version behind the others (a
    /// lost primary's promoted standby): they get that version's gradient
    /// again, then every shard is pulled at `ahead`.
    CatchUp {
        /// The lagging shards' version.
        behind: u64,
        /// The others'.
        ahead: u64,
    },
    /// Sync: the shards are more than one version apart (only a shard
    /// restored from a checkpoint does that); nothing can reconcile them,
    /// training goes on from shard 0's version.
    Mixed,
}

/// What a worker under `consistency` does with values pulled at
/// `versions` (one per shard). Out of sync, shards drift apart freely.
pub fn after_pull(consistency: Consistency, versions: &[u64]) -> AfterPull {
    let lo = versions.iter().copied().min().unwrap_or(0);
    let hi = versions.iter().copied().max().unwrap_or(0);
    match consistency {
        Consistency::Sync if hi == lo + 1 => AfterPull::CatchUp {
            behind: lo,
            ahead: hi,
        },
        Consistency::Sync if hi > lo + 1 => AfterPull::Mixed,
        _ => AfterPull::Train,
    }
}

/// What a worker does once every shard answered its push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterPush {
    /// The step is done: the next batch.
    Next,
    /// Some shards refused the gradient as too stale: re-pull and
    /// recompute the same batch for them (the others keep theirs: no
    /// gradient is applied twice).
    Retry,
}

/// What a worker under `consistency` does when the shards took
/// (`accepted[s]`) or refused its push. A sync shard never applies a push
/// twice (one per worker and version), so a sync worker always moves on.
pub fn after_push(consistency: Consistency, accepted: &[bool]) -> AfterPush {
    match consistency {
        Consistency::Sync => AfterPush::Next,
        _ if accepted.iter().all(|a| *a) => AfterPush::Next,
        _ => AfterPush::Retry,
    }
}

/// The step a worker reports for a step done: in sync mode the version
/// its push completes (`version + 1`, one global step per version), out
/// of sync its own steps (`local`, after this one).
pub fn step_done(consistency: Consistency, version: u64, local: u64) -> u64 {
    match consistency {
        Consistency::Sync => version + 1,
        _ => local,
    }
}

/// The histogram bucket of an applied gradient's staleness.
pub fn bucket(staleness: u64) -> usize {
    usize::try_from(staleness).map_or(STALENESS_BUCKETS - 1, |s| s.min(STALENESS_BUCKETS - 1))
}

/// Whether a worker of `world` may pull the next values while it computes
/// this step's gradient. Prefetching makes every push at least one version
/// stale: only where that cannot turn into rejections (async, or a bound
/// that leaves room for every other worker's push and this one).
pub fn prefetches(consistency: Consistency, world: u32) -> bool {
    match consistency {
        Consistency::Sync => false,
        Consistency::Async => true,
        Consistency::Bounded { staleness } => staleness >= world,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn consistency() -> impl Strategy<Value = Consistency> {
        prop_oneof![
            Just(Consistency::Sync),
            Just(Consistency::Async),
            (0u32..20).prop_map(|staleness| Consistency::Bounded { staleness }),
        ]
    }

    proptest! {
        /// Async takes everything; bounded takes exactly what is at most τ
        /// behind; neither ever sums; the staleness is the version lag.
        #[test]
        fn async_and_bounded_apply_exactly_what_is_fresh_enough(current in 0u64..1000, computed_at in 0u64..1000, tau in 0u32..50) {
            let round = Round { summed: 0, pushed_already: false, expected: 1 };
            let lag = current.saturating_sub(computed_at);
            prop_assert_eq!(judge(Consistency::Async, current, computed_at, round), Verdict::Applied { staleness: lag, with_sum: false });
            let bounded = judge(Consistency::Bounded { staleness: tau }, current, computed_at, round);
            if lag <= u64::from(tau) {
                prop_assert_eq!(bounded, Verdict::Applied { staleness: lag, with_sum: false });
            } else {
                prop_assert_eq!(bounded, Verdict::Rejected);
            }
        }

        /// Sync never applies a gradient of another version, never counts a
        /// worker twice, and applies exactly when the last expected worker's
        /// gradient arrives.
        #[test]
        fn sync_applies_once_every_expected_worker_pushed(current in 0u64..100, computed_at in 0u64..100, summed in 0u32..8, pushed_already in any::<bool>(), expected in 1u32..8) {
            let round = Round { summed, pushed_already, expected };
            let v = judge(Consistency::Sync, current, computed_at, round);
            if computed_at != current {
                prop_assert_eq!(v, Verdict::Rejected);
            } else if pushed_already {
                prop_assert_eq!(v, Verdict::AlreadySummed);
                prop_assert!(v != Verdict::Rejected);
            } else if summed + 1 >= expected {
                prop_assert_eq!(v, Verdict::Applied { staleness: 0, with_sum: summed > 0 });
            } else {
                prop_assert_eq!(v, Verdict::Summed { first: summed == 0 });
            }
        }

        /// A sync shard driven by any order of pushes (repeats, stale ones,
        /// workers from 0 to n) moves one version per complete round, each
        /// worker counted once per version, and never applies anything
        /// else.
        #[test]
        fn a_sync_shard_moves_one_version_per_complete_round(workers in 1u32..6, pushes in proptest::collection::vec((0u32..6, 0u64..3), 0..200)) {
            let (mut version, mut summed) = (0u64, std::collections::BTreeSet::new());
            let mut applied = 0u64;
            for (from, lag) in pushes {
                let from = from % workers;
                let computed_at = version.saturating_sub(lag);
                let round = Round { summed: summed.len() as u32, pushed_already: summed.contains(&from), expected: workers };
                match judge(Consistency::Sync, version, computed_at, round) {
                    Verdict::Rejected => prop_assert!(computed_at != version),
                    Verdict::AlreadySummed => prop_assert!(summed.contains(&from)),
                    Verdict::Summed { first } => {
                        prop_assert_eq!(first, summed.is_empty());
                        prop_assert!(summed.insert(from));
                    }
                    Verdict::Applied { staleness, with_sum } => {
                        prop_assert_eq!(staleness, 0);
                        prop_assert_eq!(with_sum, !summed.is_empty());
                        prop_assert!(summed.insert(from));
                        prop_assert_eq!(summed.len() as u32, workers);
                        summed.clear();
                        version += 1;
                        applied += 1;
                    }
                }
            }
            prop_assert_eq!(applied, version);
        }

        /// Only a sync worker ever stops to reconcile shards: it catches
        /// up exactly when they are one version apart, gives up exactly
        /// when further apart, and trains on shards at one version.
        #[test]
        fn only_sync_workers_reconcile_shards(c in consistency(), versions in proptest::collection::vec(0u64..6, 1..6)) {
            let lo = *versions.iter().min().unwrap();
            let hi = *versions.iter().max().unwrap();
            let next = after_pull(c, &versions);
            match (c, hi - lo) {
                (Consistency::Sync, 0) => prop_assert_eq!(next, AfterPull::Train),
                (Consistency::Sync, 1) => prop_assert_eq!(next, AfterPull::CatchUp { behind: lo, ahead: hi }),
                (Consistency::Sync, _) => prop_assert_eq!(next, AfterPull::Mixed),
                _ => prop_assert_eq!(next, AfterPull::Train),
            }
        }

        /// A sync worker always moves on; out of sync a worker retries
        /// exactly when some shard refused, and a retried batch is the
        /// same batch (the step it reports does not move).
        #[test]
        fn a_worker_retries_exactly_what_was_refused(c in consistency(), accepted in proptest::collection::vec(any::<bool>(), 1..6), version in 0u64..100, local in 0u64..100) {
            let next = after_push(c, &accepted);
            if c == Consistency::Sync {
                prop_assert_eq!(next, AfterPush::Next);
                prop_assert_eq!(step_done(c, version, local), version + 1);
            } else {
                prop_assert_eq!(next == AfterPush::Retry, accepted.iter().any(|a| !a));
                prop_assert_eq!(step_done(c, version, local), local);
            }
        }

        /// A bounded worker that retries converges: re-pulled values are
        /// the shard's newest, whose gradient is 0 versions stale and
        /// taken under every τ.
        #[test]
        fn a_retried_push_on_fresh_values_is_taken(tau in 0u32..20, current in 0u64..1000) {
            let round = Round { summed: 0, pushed_already: false, expected: 1 };
            prop_assert_ne!(judge(Consistency::Bounded { staleness: tau }, current, current, round), Verdict::Rejected);
        }

        #[test]
        fn buckets_stay_in_the_histogram(staleness in any::<u64>()) {
            let b = bucket(staleness);
            prop_assert!(b < STALENESS_BUCKETS);
            prop_assert_eq!(b as u64, staleness.min(STALENESS_BUCKETS as u64 - 1));
        }

        /// Prefetching only where a push one version staler is still taken.
        #[test]
        fn a_worker_prefetches_only_where_it_costs_no_rejection(c in consistency(), world in 1u32..64) {
            let p = prefetches(c, world);
            match c {
                Consistency::Sync => prop_assert!(!p),
                Consistency::Async => prop_assert!(p),
                Consistency::Bounded { staleness } => {
                    // Every other worker's push and this one's prefetch.
                    let worst = u64::from(world);
                    let taken = judge(c, worst, 0, Round { summed: 0, pushed_already: false, expected: 1 }) != Verdict::Rejected;
                    prop_assert_eq!(p, taken, "τ={} world={}", staleness, world);
                }
            }
        }
    }
}
