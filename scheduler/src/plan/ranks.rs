//! Phase 4 of a round: turn what each admitted job holds into its
//! [`Placement`]. Allreduce rings keep workers of one host adjacent (by
//! host label, then executor id); in the parameter-server pattern kept
//! workers keep their relative order and new ones follow. PS shards get
//! their byte-balanced tensor ranges from [`crate::shard`].

use super::{Placement, Plan, PsRole, Round, WorkerRole};
use crate::shard::shard_ranges;
use std::collections::HashMap;
use trainyard_common::spec::Strategy;
use uuid::Uuid;

impl Round<'_> {
    /// Sets ranks and shard maps, and hands back the finished plan.
    pub(super) fn ranks(mut self) -> Plan {
        for &j in self.order {
            let Some(h) = self.held.remove(&j.id) else {
                continue;
            };
            let mut workers = h.workers;
            match h.strategy {
                Strategy::Allreduce => {
                    // Same-host ranks adjacent: order by host label, then id.
                    let hosts = &self.cap.hosts;
                    workers.sort_by(|a, b| {
                        (hosts.get(&a.0), a.0, a.1).cmp(&(hosts.get(&b.0), b.0, b.1))
                    });
                }
                _ => {
                    // Kept workers keep their relative order; new ones follow.
                    let prev: HashMap<(Uuid, u32), u32> = j
                        .current
                        .iter()
                        .flat_map(|c| c.workers.iter().map(|w| ((w.executor, w.device), w.rank)))
                        .collect();
                    workers.sort_by_key(|w| (prev.get(w).copied().unwrap_or(u32::MAX), w.0, w.1));
                }
            }
            let shards = h.ps.len() as u32;
            let params = j.demand.params.as_deref().unwrap_or(&[]);
            self.out.placements.insert(
                j.id,
                Placement {
                    strategy: h.strategy,
                    workers: workers
                        .into_iter()
                        .enumerate()
                        .map(|(r, (executor, device))| WorkerRole {
                            rank: r as u32,
                            executor,
                            device,
                        })
                        .collect(),
                    parameter_servers: h
                        .ps
                        .into_iter()
                        .zip(h.standbys)
                        .enumerate()
                        .map(|(s, (executor, standby))| PsRole {
                            shard: s as u32,
                            executor,
                            ranges: shard_ranges(params, shards, s as u32),
                            standby,
                        })
                        .collect(),
                },
            );
        }
        self.out
    }
}
