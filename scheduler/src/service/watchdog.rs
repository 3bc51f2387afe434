//! Live roles that make no progress: the stuck check, and the straggler
//! figures of sync jobs.
//!
//! Each executor's heartbeat says, for each of its worker roles, the last
//! step it completed, the phase it is in and for how long, and its recent
//! step times (`role_progress`, one row per rank of the current
//! generation). A role is **stuck** when the phase is its own work (waiting
//! for data or computing: not waiting on peers, which is what its ring
//! neighbours do while it hangs) and it has been there longer than
//! [`Watchdog::stuck_after`] its median step time — `stuck_factor` ×
//! median, never less than `stuck_floor_seconds`. Only a role with at
//! least one timed step is judged (setup has no median to compare with).
//! A stuck role's executor still answers (its heartbeat carried the
//! report), so it is not killed or declared lost: the **job** leaves it
//! (`job_exclusions`: the planner places none of the job's roles there
//! again), the same round re-places the rank in a new generation, and a
//! `stuck` event says which role, in which phase, for how long, against
//! which bound. Only that job leaves it: the stall may be the job's own
//! (a data source its owner named that stops answering), and one user's
//! job must not take an executor from another's. The executor stops the
//! role when its assignment goes; a thread blocked in a system call ends
//! when the call returns.
//!
//! A **straggler** is a rank of a sync job (a ring, a sync PS) whose own
//! work per step (wall time minus time waiting on peers) over its recent
//! window is at least `straggler_factor` × the median of the other ranks'
//! ([`stragglers`]). The metrics API shows it; when the spec sets
//! `exclude_stragglers`, a whole window shows it, and the job both keeps
//! its minimum of workers and trains faster without it
//! ([`worth_leaving`]), the job leaves its executor like a stuck one's, so
//! that the next generation runs without it.

use crate::lifecycle;
use sqlx::{PgPool, Row};
use trainyard_common::event::{self, EventData};
use trainyard_common::spec::Watchdog;
use trainyard_common::JobSpec;
use uuid::Uuid;

/// The least `watchdog.stuck_floor_seconds` a spec may set, in ms: a rank
/// that has been in its own work for less is never stuck.
const MIN_STUCK_FLOOR_MS: i64 = 1000;

/// Fewest timed steps a rank needs before its straggler figure counts.
pub const MIN_STRAGGLER_WINDOW: u32 = 5;

/// Whether a role that has been `phase_ms` in its own work, whose median
/// step took `median_step_ms` over `window` timed steps, is stuck; the
/// bound (seconds) it passed when it is.
pub fn stuck_bound(phase_ms: u64, median_step_ms: f64, window: u32, w: &Watchdog) -> Option<f64> {
    if window == 0 {
        return None;
    }
    let bound = w.stuck_after(median_step_ms / 1e3);
    (phase_ms as f64 / 1e3 > bound).then_some(bound)
}

/// Least share of a rank's median step its extra own work must be for it
/// to straggle: below that, leaving it out would not speed the job up
/// (own work of a millisecond or two on a comm-bound step scatters by
/// more than any factor between ranks).
pub const MIN_STRAGGLER_SHARE: f64 = 0.05;

/// The median own work of the timed ranks of `ranks` other than rank `i`
/// (the figure `i` is compared with); `None` when there is none.
fn others_median(ranks: &[(f64, u32, f64)], i: usize) -> Option<f64> {
    let mut others: Vec<f64> = (0..ranks.len())
        .filter(|&j| j != i && ranks[j].1 >= MIN_STRAGGLER_WINDOW && ranks[j].0.is_finite())
        .map(|j| ranks[j].0)
        .collect();
    if others.is_empty() {
        return None;
    }
    others.sort_by(f64::total_cmp);
    let n = others.len();
    Some(if n % 2 == 1 {
        others[n / 2]
    } else {
        (others[n / 2 - 1] + others[n / 2]) / 2.0
    })
}

/// Which of `ranks` (each rank's median own work per step in ms, its
/// window of timed steps, its median step in ms) are stragglers under
/// `factor`: own work at least `factor` × the median of the *other* ranks'
/// (so that one slow rank of two is still found), the difference at least
/// [`MIN_STRAGGLER_SHARE`] of its step. Ranks with fewer than
/// [`MIN_STRAGGLER_WINDOW`] timed steps neither count nor are judged.
pub fn stragglers(ranks: &[(f64, u32, f64)], factor: f64) -> Vec<bool> {
    (0..ranks.len())
        .map(|i| {
            let (own, window, step) = ranks[i];
            if window < MIN_STRAGGLER_WINDOW || !own.is_finite() {
                return false;
            }
            let Some(median) = others_median(ranks, i) else {
                return false;
            };
            own > 0.0 && own >= factor * median && own - median >= MIN_STRAGGLER_SHARE * step
        })
        .collect()
}

/// Whether a sync job of `n` ranks, at least `min_workers` of them, gains
/// by leaving out a straggler whose own work per step exceeds the others'
/// by `extra_ms`, with a step of `step_ms`. Every rank trains its own
/// batch, so the job trains `n` batches per step; without the straggler
/// it trains `n - 1`, and its step is at best `extra_ms` shorter (the time
/// the others spent waiting on it). That is faster only when
/// `(n - 1) / (step - extra) > n / step`, that is `n × extra > step`; and
/// the job must keep its minimum of workers. A flag alone (shown in the
/// metrics) asks for less: a rank that is slow but not slow enough to be
/// worth its batch is shown and kept.
pub fn worth_leaving(extra_ms: f64, step_ms: f64, n: usize, min_workers: u32) -> bool {
    n >= 2 && n > min_workers as usize && extra_ms.is_finite() && n as f64 * extra_ms > step_ms
}

/// One rank as the watchdog reads it.
struct RankRow {
    job: Uuid,
    rank: i32,
    generation: i64,
    executor: Uuid,
    executor_name: String,
    step: i64,
    phase: String,
    phase_ms: i64,
    median_step_ms: f64,
    busy_ms: f64,
    window: i32,
    spec: JobSpec,
    sync: bool,
}

/// Takes the executors of stuck roles (and of stragglers whose job asks to
/// leave them out) out of their jobs, writing each decision as an event of
/// the job. Returns the (job, executor) pairs left.
pub async fn check(db: &PgPool) -> Result<Vec<(Uuid, Uuid)>, sqlx::Error> {
    let rows = watched_ranks(db).await?;
    let mut left = Vec::new();
    for r in &rows {
        if let Some((reason, data)) = stuck_decision(r) {
            if leave(db, r.job, r.executor, r.rank, &reason, data).await? {
                left.push((r.job, r.executor));
            }
        }
    }
    // Stragglers, per sync job that asks to leave them out.
    let mut i = 0;
    while i < rows.len() {
        let job = rows[i].job;
        let end = rows[i..]
            .iter()
            .position(|r| r.job != job)
            .map_or(rows.len(), |n| i + n);
        let ranks = &rows[i..end];
        i = end;
        leave_stragglers(db, ranks, &mut left).await?;
    }
    Ok(left)
}

/// The ranks that may be stuck, and every rank of jobs that leave
/// stragglers out, by job and rank.
async fn watched_ranks(db: &PgPool) -> Result<Vec<RankRow>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT p.job_id, p.rank, p.generation, p.executor_id, e.name, p.step, p.phase, p.phase_ms,
                p.median_step_ms, p.busy_ms, p.window_steps, j.spec
         FROM role_progress p
         JOIN jobs j ON j.id = p.job_id AND j.generation = p.generation
              AND j.state IN ('scheduling', 'running', 'recovering')
         JOIN executors e ON e.id = p.executor_id AND e.state = 'live'
         JOIN assignments a ON a.job_id = p.job_id AND a.generation = p.generation
              AND a.role = 'worker' AND a.index = p.rank AND a.executor_id = p.executor_id
         -- Every round runs this: only ranks that may be stuck (a second or
         -- more in their own work; no floor is under 1 s) and the ranks of
         -- jobs that leave stragglers out are read, so that a healthy
         -- fleet costs no spec decoding here.
         WHERE (p.phase IN ('data', 'compute') AND p.phase_ms >= $1)
            OR j.exclude_stragglers
         ORDER BY p.job_id, p.rank",
    )
    .bind(MIN_STUCK_FLOOR_MS)
    .fetch_all(db)
    .await?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            let job: Uuid = r.get("job_id");
            let spec = JobSpec::from_stored(r.get("spec"))
                .map_err(
                    |e| tracing::error!(job = %job, error = %e, "not watching the job's ranks"),
                )
                .ok()?;
            let sync = spec.consistency_mode() == trainyard_common::spec::Consistency::Sync;
            Some(RankRow {
                job: r.get("job_id"),
                rank: r.get("rank"),
                generation: r.get("generation"),
                executor: r.get("executor_id"),
                executor_name: r.get("name"),
                step: r.get("step"),
                phase: r.get("phase"),
                phase_ms: r.get("phase_ms"),
                median_step_ms: r.get("median_step_ms"),
                busy_ms: r.get("busy_ms"),
                window: r.get("window_steps"),
                spec,
                sync,
            })
        })
        .collect())
}

/// Why rank `r` is stuck (and the event that says it), if it is: longer
/// in its own work than its bound.
fn stuck_decision(r: &RankRow) -> Option<(String, EventData)> {
    let w = r.spec.watchdog;
    let own = matches!(r.phase.as_str(), "data" | "compute");
    let bound = own
        .then(|| {
            stuck_bound(
                r.phase_ms.max(0) as u64,
                r.median_step_ms,
                r.window.max(0) as u32,
                &w,
            )
        })
        .flatten()?;
    let reason = format!(
        "rank {} on executor {} is stuck: {:.1} s in {} since step {} without completing a step, over its bound of {:.1} s (max({} × its median step of {:.3} s, {} s)); its executor still answers, so it is not declared lost: this job leaves it and the rank is re-placed",
        r.rank,
        r.executor_name,
        r.phase_ms as f64 / 1e3,
        r.phase,
        r.step,
        bound,
        w.stuck_factor,
        r.median_step_ms / 1e3,
        w.stuck_floor_seconds
    );
    let data = EventData::Stuck(event::Stuck {
        rank: r.rank.max(0) as u32,
        generation: r.generation,
        executor: r.executor,
        executor_name: r.executor_name.clone(),
        phase: r.phase.clone(),
        phase_seconds: r.phase_ms as f64 / 1e3,
        step: r.step.max(0) as u64,
        median_step_seconds: r.median_step_ms / 1e3,
        bound_seconds: bound,
        stuck_factor: w.stuck_factor,
        stuck_floor_seconds: w.stuck_floor_seconds,
    });
    Some((reason, data))
}

/// Leaves the straggler among `ranks` (one sync job's, in rank order) out
/// where the job asks to and it is worth it: at most one rank a round,
/// none where a rank of the job already left (`left`).
async fn leave_stragglers(
    db: &PgPool,
    ranks: &[RankRow],
    left: &mut Vec<(Uuid, Uuid)>,
) -> Result<(), sqlx::Error> {
    let w = ranks[0].spec.watchdog;
    if !w.exclude_stragglers || !ranks[0].sync || ranks.len() < 2 {
        return Ok(());
    }
    let busy: Vec<(f64, u32, f64)> = ranks
        .iter()
        .map(|r| (r.busy_ms, r.window.max(0) as u32, r.median_step_ms))
        .collect();
    let slow = stragglers(&busy, w.straggler_factor);
    let min_workers = ranks[0].spec.workers.min;
    // Only a window's worth of steps makes a straggler persistent, and
    // one rank at most leaves per round: the next generation's ranks
    // are judged afresh.
    for (i, (r, _)) in ranks
        .iter()
        .zip(&slow)
        .enumerate()
        .filter(|(_, (r, s))| **s && r.window as u32 >= w.window_steps)
    {
        if left.iter().any(|(j, _)| *j == r.job) {
            break;
        }
        let extra = r.busy_ms - others_median(&busy, i).unwrap_or(r.busy_ms);
        if !worth_leaving(extra, r.median_step_ms, ranks.len(), min_workers) {
            continue;
        }
        let others: Vec<String> = ranks
            .iter()
            .filter(|o| o.rank != r.rank)
            .map(|o| format!("{:.1}", o.busy_ms))
            .collect();
        let reason = format!(
            "rank {} on executor {} straggles: {:.1} ms of its own work per step over its last {} steps, at least {} × the other ranks' median ({} ms); the {} others wait {:.1} ms of each {:.1} ms step on it, so they train more samples a second without it; the job asks to leave stragglers out, so the job leaves its executor and the next generation runs without it",
            r.rank,
            r.executor_name,
            r.busy_ms,
            r.window,
            w.straggler_factor,
            others.join(", "),
            ranks.len() - 1,
            extra,
            r.median_step_ms,
        );
        let data = EventData::Straggler(event::Straggler {
            rank: r.rank.max(0) as u32,
            generation: r.generation,
            executor: r.executor,
            executor_name: r.executor_name.clone(),
            busy_ms: r.busy_ms,
            window_steps: r.window.max(0) as u64,
            others_busy_ms: ranks
                .iter()
                .filter(|o| o.rank != r.rank)
                .map(|o| o.busy_ms)
                .collect(),
            straggler_factor: w.straggler_factor,
        });
        if leave(db, r.job, r.executor, r.rank, &reason, data).await? {
            left.push((r.job, r.executor));
        }
    }
    Ok(())
}

/// Keeps `job` off `executor` from now on, for its `rank`, with an event
/// of `kind`; false when the job had left it already (another replica of
/// the check came first).
async fn leave(
    db: &PgPool,
    job: Uuid,
    executor: Uuid,
    rank: i32,
    reason: &str,
    data: EventData,
) -> Result<bool, sqlx::Error> {
    let mut tx = db.begin().await?;
    let new: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO job_exclusions (job_id, executor_id, kind, reason) VALUES ($1, $2, $3, $4)
         ON CONFLICT DO NOTHING RETURNING executor_id",
    )
    .bind(job)
    .bind(executor)
    .bind(data.kind().as_str())
    .bind(reason)
    .fetch_optional(&mut *tx)
    .await?;
    if new.is_none() {
        return Ok(false);
    }
    sqlx::query("DELETE FROM role_progress WHERE job_id = $1 AND rank = $2")
        .bind(job)
        .bind(rank)
        .execute(&mut *tx)
        .await?;
    lifecycle::event(&mut tx, job, &data, reason).await?;
    lifecycle::notify(&mut tx, job).await?;
    tx.commit().await?;
    tracing::warn!(%job, %executor, rank, "{reason}");
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A role is stuck exactly when it has been in its own work longer
        /// than both the floor and factor × its median, and never before
        /// its first timed step.
        #[test]
        fn stuck_means_past_the_floor_and_the_factor(
            phase_ms in 0u64..1_000_000,
            median_ms in 0.0f64..100_000.0,
            window in 0u32..100,
            factor in 2.0f64..100.0,
            floor in 1.0f64..1000.0,
        ) {
            let w = Watchdog { stuck_factor: factor, stuck_floor_seconds: floor, ..Watchdog::default() };
            let verdict = stuck_bound(phase_ms, median_ms, window, &w);
            let secs = phase_ms as f64 / 1e3;
            if window == 0 {
                prop_assert!(verdict.is_none());
            } else {
                prop_assert_eq!(verdict.is_some(), secs > floor && secs > factor * median_ms / 1e3);
            }
            if let Some(b) = verdict {
                prop_assert!(b >= floor && secs > b);
            }
        }

        /// Ranks that all work alike are never stragglers; one rank made
        /// `factor` times slower than every other is, and only it.
        #[test]
        fn only_the_slow_rank_straggles(
            base in 1.0f64..1000.0,
            n in 2usize..16,
            slow in 0usize..16,
            factor in 1.1f64..10.0,
            jitter in proptest::collection::vec(0.95f64..1.05, 16),
        ) {
            let slow = slow % n;
            let even: Vec<(f64, u32, f64)> = (0..n).map(|i| (base * jitter[i], 50, base * jitter[i])).collect();
            prop_assert!(stragglers(&even, 1.2).iter().all(|s| !s));
            let mut one = even.clone();
            one[slow].0 = base * 1.05 * factor * 1.01;
            one[slow].2 = one[slow].0;
            let found = stragglers(&one, factor);
            for (i, s) in found.iter().enumerate() {
                prop_assert_eq!(*s, i == slow, "rank {} of {:?}", i, one);
            }
        }
    }

    proptest! {
        /// Leaving a straggler out is worth it exactly when the job's
        /// samples a second rise (each rank trains one batch a step, the
        /// others' step shortens by the straggler's extra work), and never
        /// below the job's minimum of workers.
        #[test]
        fn a_straggler_leaves_only_when_the_rest_train_faster(
            step in 1.0f64..10_000.0,
            share in 0.0f64..1.0,
            n in 1usize..64,
            min in 1u32..64,
        ) {
            let extra = share * step;
            let before = n as f64 / step;
            let after = (n as f64 - 1.0) / (step - extra);
            let verdict = worth_leaving(extra, step, n, min);
            if n <= min as usize {
                prop_assert!(!verdict);
            } else if (after - before).abs() > 1e-9 * before {
                prop_assert_eq!(verdict, after > before, "{} {} {}", after, before, n);
            }
        }
    }

    #[test]
    fn a_slow_rank_of_a_fast_step_stays_when_its_ring_is_at_its_minimum() {
        // 2 ms against 0.6 ms of a 12 ms step: flagged, but two ranks at a
        // minimum of two keep it, and three ranks would not train faster.
        let ranks = [(2.0, 50, 12.0), (0.6, 50, 12.0)];
        assert_eq!(stragglers(&ranks, 3.0), vec![true, false]);
        assert!(!worth_leaving(1.4, 12.0, 2, 2));
        assert!(!worth_leaving(1.4, 12.0, 3, 2));
        assert!(worth_leaving(64.0, 72.0, 3, 2));
    }

    #[test]
    fn ranks_without_a_window_are_neither_judged_nor_counted() {
        assert_eq!(
            stragglers(&[(100.0, 2, 100.0), (1.0, 50, 100.0)], 2.0),
            vec![false, false]
        );
        assert_eq!(
            stragglers(
                &[(100.0, 50, 100.0), (1.0, 50, 100.0), (1000.0, 1, 1000.0)],
                2.0
            ),
            vec![true, false, false]
        );
    }

    #[test]
    fn own_work_too_small_a_share_of_the_step_is_no_straggler() {
        // 3 ms against 1 ms is 3 ×, but 2 ms of a 100 ms (comm-bound) step.
        assert_eq!(
            stragglers(&[(3.0, 50, 100.0), (1.0, 50, 100.0)], 2.0),
            vec![false, false]
        );
        assert_eq!(
            stragglers(&[(30.0, 50, 100.0), (1.0, 50, 100.0)], 2.0),
            vec![true, false]
        );
    }
}
