//! Sharing a cluster between users: the fair-share usage formula and the
//! preemption pass, both pure (the service reads their inputs from
//! Postgres and writes what they decide).
//!
//! **Fair share.** Each owner's recent usage is its device-seconds decayed
//! with half-life `H`: a job holding `w` workers (CUDA devices plus CPU
//! workers) from `a` seconds ago to `b` seconds ago (`b = 0` while it still
//! holds them) adds
//!
//! ```text
//!   w · ∫ 2^(−age/H) d(age) over [b, a]  =  w · H/ln 2 · (2^(−b/H) − 2^(−a/H))
//! ```
//!
//! so a device used just now for `s` seconds counts about `s`, one used `H`
//! ago counts half as much. Among waiting jobs of one priority the planner
//! visits the owner with the lowest usage first ([`crate::plan`]); a job
//! that has waited longer than the scheduler's bound goes first and stops
//! later jobs from taking what it needs, so none waits forever.
//!
//! **Preemption** ([`preempt`]). A waiting job that only lacks capacity may
//! take it from placed jobs of *strictly lower* priority, lowest priority
//! (then newest) first: first by shrinking elastic ones towards
//! `workers.min` (a membership change: the ring goes on with fewer ranks),
//! then by preempting whole jobs (the service gives each a grace period to
//! checkpoint, then releases it back to `queued`; it resumes from that
//! checkpoint later). Nothing is taken unless it lets the job start, and
//! shrinks that turn out unnecessary once a whole job is preempted are
//! undone. Lower-priority jobs this round's plan would only now start are
//! held back first (they wait; nothing of theirs runs yet). The pass tries
//! at most [`MAX_TRIALS`] plans a round. A shrunk job grows back by the planner's growth rule once
//! capacity is free again.

use crate::plan::{plan_shared, ExecutorView, JobView, Plan, Sharing};
use std::collections::{BTreeMap, HashMap};
use uuid::Uuid;

/// Most plans one preemption pass tries (each a full plan of the round).
pub const MAX_TRIALS: usize = 64;

/// Decayed device-seconds of `workers` held from `from_age` to `to_age`
/// seconds ago (`to_age ≤ from_age`), with half-life `half_life` seconds.
pub fn decayed(workers: f64, from_age: f64, to_age: f64, half_life: f64) -> f64 {
    let (a, b) = (from_age.max(0.0), to_age.max(0.0).min(from_age.max(0.0)));
    if half_life <= 0.0 || !half_life.is_finite() {
        return workers * (a - b);
    }
    let h = half_life;
    let ln2 = std::f64::consts::LN_2;
    // 2^(−b/H) − 2^(−a/H), written so that a long half-life keeps precision.
    workers * h / ln2 * (-b / h).exp2() * -(-(a - b) * ln2 / h).exp_m1()
}

/// What the preemption pass decided for one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Elastic job `victim` goes from `from` to `to` workers for `by`.
    Shrink {
        /// The shrunk job.
        victim: Uuid,
        /// The waiting job it makes room for.
        by: Uuid,
        /// Workers it holds now.
        from: u32,
        /// Workers it keeps.
        to: u32,
    },
    /// Job `victim` is preempted whole for `by`.
    Preempt {
        /// The preempted job.
        victim: Uuid,
        /// The waiting job it makes room for.
        by: Uuid,
    },
}

/// The reason a preempted job waits with.
pub fn preempted_reason(by: &JobView, victim: &JobView) -> String {
    format!(
        "preempted by job {} of {} (priority {} > {})",
        by.id, by.owner, by.priority, victim.priority
    )
}

/// Runs the preemption pass over `sharing`'s plan: returns the sharing
/// with the caps and held-back jobs it decided added, the actions, and the
/// plan they give.
pub fn preempt(
    jobs: &[JobView],
    executors: &[ExecutorView],
    sharing: &Sharing,
) -> (Sharing, Vec<Action>, Plan) {
    let mut s = sharing.clone();
    let mut p = plan_shared(jobs, executors, &s);
    let by_id: HashMap<Uuid, &JobView> = jobs.iter().map(|j| (j.id, j)).collect();
    let mut waiting: Vec<&JobView> = jobs
        .iter()
        .filter(|j| j.current.is_none() && p.capacity_waiting.contains(&j.id))
        .collect();
    waiting.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.seq, j.id));
    let mut trials = 0;
    // Victim → the job it was shrunk or preempted for.
    let mut cause: BTreeMap<Uuid, Uuid> = BTreeMap::new();
    for w in waiting {
        if trials >= MAX_TRIALS {
            break;
        }
        if !p.capacity_waiting.contains(&w.id) {
            continue; // An earlier decision made room for it too.
        }
        let mut victims: Vec<&JobView> = p
            .placements
            .keys()
            .filter_map(|id| by_id.get(id).copied())
            .filter(|v| v.priority < w.priority && !cause.contains_key(&v.id))
            .collect();
        if victims.is_empty() {
            continue;
        }
        // A job that would not fit even the whole cluster takes nothing
        // (and costs no trials round after round).
        let alone = JobView {
            current: None,
            starving: false,
            ..w.clone()
        };
        if !crate::plan::plan(std::slice::from_ref(&alone), executors)
            .placements
            .contains_key(&w.id)
        {
            continue;
        }
        // Jobs this plan would only start now go first (nothing of theirs
        // runs yet), then the lowest priority, newest first.
        victims.sort_by_key(|v| {
            (
                v.current.is_some(),
                v.priority,
                std::cmp::Reverse(v.seq),
                v.id,
            )
        });
        let mut trial = s.clone();
        let mut tp = None;
        let mut shrunk = Vec::new();
        // Shrink elastic jobs first, one worker at a time.
        'shrink: for v in &victims {
            let n = p.placements[&v.id].workers.len() as u32;
            let mut k = n;
            while k > v.demand.min_workers && trials < MAX_TRIALS {
                k -= 1;
                trial.caps.insert(v.id, k);
                trials += 1;
                let t = plan_shared(jobs, executors, &trial);
                if k < n && !shrunk.contains(&v.id) {
                    shrunk.push(v.id);
                }
                if t.placements.contains_key(&w.id) {
                    tp = Some(t);
                    break 'shrink;
                }
            }
        }
        // Then whole jobs.
        if tp.is_none() {
            for v in &victims {
                if trials >= MAX_TRIALS {
                    break;
                }
                trial.caps.remove(&v.id);
                shrunk.retain(|id| *id != v.id);
                let why = if v.current.is_some() {
                    preempted_reason(w, v)
                } else {
                    format!(
                        "job {} of higher priority ({} > {}) needs the room this job would take",
                        w.id, w.priority, v.priority
                    )
                };
                trial.held_back.insert(v.id, why);
                trials += 1;
                let t = plan_shared(jobs, executors, &trial);
                if t.placements.contains_key(&w.id) {
                    tp = Some(t);
                    break;
                }
            }
            // Shrinks a whole preemption made unnecessary are undone.
            if let Some(mut t) = tp.take() {
                for v in shrunk.clone().into_iter().rev() {
                    if trials >= MAX_TRIALS {
                        break;
                    }
                    let mut undo = trial.clone();
                    undo.caps.remove(&v);
                    trials += 1;
                    let u = plan_shared(jobs, executors, &undo);
                    if u.placements.contains_key(&w.id) {
                        trial = undo;
                        t = u;
                        shrunk.retain(|id| *id != v);
                    }
                }
                tp = Some(t);
            }
        }
        let Some(t) = tp else { continue };
        // Keep only what this job's trial added.
        for (v, _) in trial.caps.iter().filter(|(v, _)| !s.caps.contains_key(*v)) {
            cause.insert(*v, w.id);
        }
        for v in trial
            .held_back
            .keys()
            .filter(|v| !s.held_back.contains_key(*v))
        {
            cause.insert(*v, w.id);
        }
        s = trial;
        p = t;
    }
    let mut actions = Vec::new();
    for (&victim, &by) in &cause {
        let running = by_id.get(&victim).is_some_and(|j| j.current.is_some());
        if s.held_back.contains_key(&victim) && !sharing.held_back.contains_key(&victim) {
            // A job held back before it started is not preempted: it waits.
            if running {
                actions.push(Action::Preempt { victim, by });
            }
        } else if let Some(&to) = s.caps.get(&victim) {
            let held = by_id
                .get(&victim)
                .and_then(|j| j.current.as_ref())
                .map_or(0, |c| c.workers.len() as u32);
            if to < held {
                actions.push(Action::Shrink {
                    victim,
                    by,
                    from: held,
                    to,
                });
            }
        }
    }
    (s, actions, p)
}

#[cfg(test)]
mod tests;
