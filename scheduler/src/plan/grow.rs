//! Phase 3 of a round: grow placed jobs towards `workers.max`, in visit
//! order, while capacity, the owner's quota and this round's cap allow.
//! It runs after every admission so that one job's growth never keeps
//! another from starting; a starving job that blocked the round (see
//! `Round::blocked`) stops jobs of its priority or lower from growing.

use super::sizing::worker_bytes;
use super::Round;

impl Round<'_> {
    /// Adds workers, one at a time by best fit, to each admitted job.
    pub(super) fn grow(&mut self) {
        for &j in self.order {
            let Some(h) = self.held.get_mut(&j.id) else {
                continue;
            };
            let d = &j.demand;
            if self.blocked.is_some_and(|(p, _)| j.priority <= p) {
                continue;
            }
            let wb = worker_bytes(d, h.strategy);
            let most = d
                .max_workers
                .min(self.sharing.caps.get(&j.id).copied().unwrap_or(u32::MAX));
            let quota = self
                .sharing
                .quotas
                .get(&j.owner)
                .and_then(|q| q.workers(d.device));
            while (h.workers.len() as u32) < most {
                let holding = self.owners.entry(j.owner.as_str()).or_default();
                if quota.is_some_and(|m| holding.workers(d.device) >= m) {
                    break;
                }
                let Some((e, i)) = self.cap.best_worker_slot(d.device, wb, &j.excluded) else {
                    break;
                };
                let Some(t) = self.cap.take_worker(e, d.device, i, wb) else {
                    break;
                };
                h.taken.push(t);
                h.workers.push((e, i));
                self.owners
                    .entry(j.owner.as_str())
                    .or_default()
                    .add(d.device, 1, 0);
            }
        }
    }
}
