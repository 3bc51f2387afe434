//! Phase 1 of a round: keep what can stay. Each placed job takes back its
//! roles whose executor is live, not excluded for it, and still has room,
//! before any job is admitted, so that placements stay stable and
//! generations few. What a job kept waits in `Round::kept` for the second
//! phase, which completes the job's minimum set or gives it all back.

use super::sizing::{ps_bytes, replicas, worker_bytes};
use super::{Kept, Round};

impl Round<'_> {
    /// Takes the capacity each placed job's current roles hold, where they
    /// can stay.
    pub(super) fn keep(&mut self) {
        for &j in self.order {
            let Some(cur) = &j.current else { continue };
            if self.sharing.held_back.contains_key(&j.id) {
                continue;
            }
            let d = &j.demand;
            let mut taken = Vec::new();
            let mut workers = Vec::new();
            let mut ps = vec![None; cur.parameter_servers.len()];
            let mut standbys = vec![None; cur.parameter_servers.len()];
            let wb = worker_bytes(d, cur.strategy);
            // Roles on executors the job now excludes are not kept.
            let ok = |e: &uuid::Uuid| !j.excluded.contains(e);
            for w in cur.workers.iter().filter(|w| ok(&w.executor)) {
                if let Some(t) = self.cap.take_worker(w.executor, d.device, w.device, wb) {
                    taken.push(t);
                    workers.push((w.executor, w.device));
                }
            }
            let ps_bytes = ps_bytes(d, cur.parameter_servers.len() as u32);
            for p in cur.parameter_servers.iter().filter(|p| ok(&p.executor)) {
                if let Some(t) = self.cap.take_ps(p.executor, ps_bytes) {
                    taken.push(t);
                    if let Some(slot) = ps.get_mut(p.shard as usize) {
                        *slot = Some(p.executor);
                    }
                }
            }
            if replicas(d) > 0 {
                for p in &cur.parameter_servers {
                    let Some(sb) = p.standby.filter(|&e| e != p.executor && ok(&e)) else {
                        continue;
                    };
                    if let Some(t) = self.cap.take_ps(sb, ps_bytes) {
                        taken.push(t);
                        if let Some(slot) = standbys.get_mut(p.shard as usize) {
                            *slot = Some(sb);
                        }
                    }
                }
            }
            self.kept.insert(
                j.id,
                Kept {
                    workers,
                    ps,
                    standbys,
                    taken,
                },
            );
        }
    }
}
