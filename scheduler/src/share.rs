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
    let mut search = Search {
        jobs,
        executors,
        trials: 0,
    };
    let mut s = sharing.clone();
    let mut p = plan_shared(jobs, executors, &s);
    let by_id: HashMap<Uuid, &JobView> = jobs.iter().map(|j| (j.id, j)).collect();
    let mut waiting: Vec<&JobView> = jobs
        .iter()
        .filter(|j| j.current.is_none() && p.capacity_waiting.contains(&j.id))
        .collect();
    waiting.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.seq, j.id));
    // Victim → the job it was shrunk or preempted for.
    let mut cause: BTreeMap<Uuid, Uuid> = BTreeMap::new();
    for w in waiting {
        if search.trials >= MAX_TRIALS {
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
        if victims.is_empty() || !fits_alone(w, executors) {
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
        let Some((trial, t)) = search.make_room(w, &victims, &s, &p) else {
            continue;
        };
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
    let actions = actions(&cause, &s, sharing, &by_id);
    (s, actions, p)
}

/// Whether waiting job `w` would fit the whole cluster: a job that would
/// not takes nothing (and costs no trials round after round).
fn fits_alone(w: &JobView, executors: &[ExecutorView]) -> bool {
    let alone = JobView {
        current: None,
        starving: false,
        ..w.clone()
    };
    crate::plan::plan(std::slice::from_ref(&alone), executors)
        .placements
        .contains_key(&w.id)
}

/// The preemption pass's plans tried, bounded by [`MAX_TRIALS`].
struct Search<'a> {
    jobs: &'a [JobView],
    executors: &'a [ExecutorView],
    trials: usize,
}

impl Search<'_> {
    /// The plan of `sharing`, counted as a trial.
    fn try_plan(&mut self, sharing: &Sharing) -> Plan {
        self.trials += 1;
        plan_shared(self.jobs, self.executors, sharing)
    }

    /// Room for waiting job `w` on `victims` (in the order they give it):
    /// the sharing `s` with caps (elastic jobs shrunk, one worker at a
    /// time) or held-back jobs added, and its plan; `None` where the
    /// trials run out first.
    fn make_room(
        &mut self,
        w: &JobView,
        victims: &[&JobView],
        s: &Sharing,
        p: &Plan,
    ) -> Option<(Sharing, Plan)> {
        let mut trial = s.clone();
        let mut shrunk = Vec::new();
        // Shrink elastic jobs first, one worker at a time.
        for v in victims {
            let n = p.placements[&v.id].workers.len() as u32;
            let mut k = n;
            while k > v.demand.min_workers && self.trials < MAX_TRIALS {
                k -= 1;
                trial.caps.insert(v.id, k);
                let t = self.try_plan(&trial);
                if k < n && !shrunk.contains(&v.id) {
                    shrunk.push(v.id);
                }
                if t.placements.contains_key(&w.id) {
                    return Some((trial, t));
                }
            }
        }
        // Then whole jobs.
        let t = self.hold_back(w, victims, &mut trial, &mut shrunk)?;
        // Shrinks a whole preemption made unnecessary are undone.
        Some(self.undo_shrinks(w, trial, t, shrunk))
    }

    /// Holds victims back, one whole job at a time, until `w` fits; the
    /// plan where it does.
    fn hold_back(
        &mut self,
        w: &JobView,
        victims: &[&JobView],
        trial: &mut Sharing,
        shrunk: &mut Vec<Uuid>,
    ) -> Option<Plan> {
        for v in victims {
            if self.trials >= MAX_TRIALS {
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
            let t = self.try_plan(trial);
            if t.placements.contains_key(&w.id) {
                return Some(t);
            }
        }
        None
    }

    /// `trial` (where `w` fits, plan `t`) without the caps in `shrunk`
    /// that `w` does not need after all, newest first.
    fn undo_shrinks(
        &mut self,
        w: &JobView,
        mut trial: Sharing,
        mut t: Plan,
        mut shrunk: Vec<Uuid>,
    ) -> (Sharing, Plan) {
        for v in shrunk.clone().into_iter().rev() {
            if self.trials >= MAX_TRIALS {
                break;
            }
            let mut undo = trial.clone();
            undo.caps.remove(&v);
            let u = self.try_plan(&undo);
            if u.placements.contains_key(&w.id) {
                trial = undo;
                t = u;
                shrunk.retain(|id| *id != v);
            }
        }
        (trial, t)
    }
}

/// What the pass decided, as actions: a running job held back is
/// preempted, one capped below what it holds is shrunk (a job held back
/// before it started just waits).
fn actions(
    cause: &BTreeMap<Uuid, Uuid>,
    s: &Sharing,
    sharing: &Sharing,
    by_id: &HashMap<Uuid, &JobView>,
) -> Vec<Action> {
    let mut actions = Vec::new();
    for (&victim, &by) in cause {
        let running = by_id.get(&victim).is_some_and(|j| j.current.is_some());
        if s.held_back.contains_key(&victim) && !sharing.held_back.contains_key(&victim) {
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
    actions
}

#[cfg(test)]
mod tests;
