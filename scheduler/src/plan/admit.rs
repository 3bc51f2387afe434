//! Phase 2 of a round: repair placed jobs and admit waiting ones, each all
//! or nothing. In visit order, each job must hold its minimum set — every
//! PS shard (with its standby, for a job that keeps replicas and is not
//! placed yet) and `workers.min` workers — on top of what it kept in the
//! first phase, or it gives back everything and waits with its reason.
//! Since no partially placed job holds resources, two jobs never deadlock
//! each other; later jobs that fit may still start (backfill).
//!
//! The steps of one attempt take capacity in a fixed order — trim to the
//! allowed workers, then minimum workers, PS shards, standbys — because
//! where a role lands depends on what was taken before it.

use super::capacity::{Capacity, Taken};
use super::quota::Room;
use super::sizing::{decide, kind_name, mib, ps_bytes, replicas, worker_bytes};
use super::{plan, Held, JobView, Kept, Round};
use std::collections::BTreeSet;
use trainyard_common::spec::Strategy;
use uuid::Uuid;

/// Why an attempt failed.
enum Wait {
    /// The owner's quota (the job counts as over quota).
    Quota(String),
    /// Capacity (preemption and the provisioner may help a waiting job).
    Capacity(String),
}

/// One job's attempt at its minimum set, with the roles it holds so far.
struct Attempt<'a> {
    j: &'a JobView,
    shards: u32,
    /// A PS job that keeps standbys.
    replicated: bool,
    /// Memory each worker is charged.
    worker_bytes: u64,
    /// RAM each shard, and each standby, is charged.
    shard_bytes: u64,
    roles: Kept,
}

impl<'a> Round<'a> {
    /// Visits every job once, placing its minimum set or recording why it
    /// waits.
    pub(super) fn admit(&mut self) {
        for &j in self.order {
            self.admit_job(j);
        }
    }

    fn admit_job(&mut self, j: &'a JobView) {
        let Some((strategy, shards)) = self.shape(j) else {
            return;
        };
        let d = &j.demand;
        let mut roles = self.kept.remove(&j.id).unwrap_or_default();
        roles.ps.resize(shards as usize, None);
        roles.standbys.resize(shards as usize, None);
        // A shard whose primary is gone continues on its standby, where
        // its state already is.
        for (p, sb) in roles.ps.iter_mut().zip(roles.standbys.iter_mut()) {
            if p.is_none() {
                *p = sb.take();
            }
        }
        let mut a = Attempt {
            j,
            shards,
            replicated: strategy == Strategy::ParameterServer && replicas(d) > 0,
            worker_bytes: worker_bytes(d, strategy),
            shard_bytes: ps_bytes(d, shards),
            roles,
        };
        let room = self.room(j);
        match a.fill(&mut self.cap, &room) {
            Ok(ps_ram) => {
                let Kept {
                    workers,
                    ps,
                    standbys,
                    taken,
                } = a.roles;
                self.owners.entry(j.owner.as_str()).or_default().add(
                    d.device,
                    workers.len() as u32,
                    ps_ram,
                );
                self.held.insert(
                    j.id,
                    Held {
                        strategy,
                        workers,
                        ps: ps.into_iter().flatten().collect(),
                        standbys,
                        taken,
                    },
                );
            }
            Err(wait) => self.wait(j, a.roles.taken, wait),
        }
    }

    /// The job's strategy and shard count: its placement's, or decided now.
    /// `None` when it waits before taking anything (held back, behind a
    /// starving job, no strategy yet, no tensors for the PS pattern), with
    /// the reason recorded.
    fn shape(&mut self, j: &JobView) -> Option<(Strategy, u32)> {
        let d = &j.demand;
        if let Some(why) = self.sharing.held_back.get(&j.id) {
            self.out.waiting.insert(j.id, why.clone());
            return None;
        }
        if let Some((p, first)) = self
            .blocked
            .filter(|(p, _)| j.current.is_none() && j.priority <= *p)
        {
            self.out.waiting.insert(
                j.id,
                format!("job {first} (priority {p}) has waited longest and starts first"),
            );
            return None;
        }
        let (strategy, shards) = match &j.current {
            Some(cur) => (cur.strategy, cur.parameter_servers.len() as u32),
            None => match decide(d, self.cap.smallest_eligible(d.device)) {
                Ok((s, n, why)) => {
                    if !why.is_empty() {
                        self.out.decisions.insert(j.id, why);
                    }
                    (s, n)
                }
                Err(why) => {
                    self.out.waiting.insert(j.id, why);
                    return None;
                }
            },
        };
        if strategy == Strategy::ParameterServer && d.params.is_none() {
            self.out.waiting.insert(j.id, "the parameter-server pattern needs the model's tensors; TorchScript models must be inspected first".into());
            return None;
        }
        Some((strategy, shards))
    }

    /// A failed attempt: gives back all the job took, kept roles included,
    /// and records why it waits. A starving job that fits the cluster alone
    /// blocks the round for its priority.
    fn wait(&mut self, j: &JobView, taken: Vec<Taken>, wait: Wait) {
        for t in taken.into_iter().rev() {
            self.cap.give_back(t);
        }
        let why = match wait {
            Wait::Quota(why) => {
                self.out.over_quota.insert(j.id);
                why
            }
            Wait::Capacity(why) => {
                if j.current.is_none() {
                    self.out.capacity_waiting.insert(j.id);
                    if j.starving && self.blocked.is_none() {
                        let alone = JobView {
                            current: None,
                            starving: false,
                            ..j.clone()
                        };
                        if plan(std::slice::from_ref(&alone), self.executors)
                            .placements
                            .contains_key(&j.id)
                        {
                            self.blocked = Some((j.priority, j.id));
                        }
                    }
                }
                why
            }
        };
        self.out.waiting.insert(j.id, why);
        self.out.decisions.remove(&j.id);
    }
}

impl Attempt<'_> {
    /// Completes the minimum set within `room`, step by step; on success
    /// the PS RAM (shards and standbys) the job holds.
    fn fill(&mut self, cap: &mut Capacity, room: &Room) -> Result<u64, Wait> {
        self.check_quota(room)?;
        self.trim(cap, room.allowed);
        self.min_workers(cap)?;
        self.ps_shards(cap)?;
        self.standbys(cap, room)?;
        // A placed job whose kept shards exceed a lowered quota waits too.
        let ps_ram = self.shard_bytes.saturating_mul(self.ps_roles());
        if ps_ram > room.ps_ram {
            return Err(Wait::Quota(room.over_ps_ram(self.j, ps_ram)));
        }
        Ok(ps_ram)
    }

    /// The minimum set's workers and PS RAM must fit the owner's quota.
    fn check_quota(&self, room: &Room) -> Result<(), Wait> {
        let (j, d) = (self.j, &self.j.demand);
        if d.min_workers > room.workers {
            return Err(Wait::Quota(room.over_workers(j)));
        }
        let min_ps_ram = self
            .shard_bytes
            .saturating_mul(u64::from(self.shards))
            .saturating_mul(if self.replicated && j.current.is_none() {
                2
            } else {
                1
            });
        if min_ps_ram > room.ps_ram {
            return Err(Wait::Quota(room.over_ps_ram(j, min_ps_ram)));
        }
        Ok(())
    }

    /// Gives back kept workers beyond `allowed`, last first.
    fn trim(&mut self, cap: &mut Capacity, allowed: u32) {
        let r = &mut self.roles;
        while r.workers.len() as u32 > allowed {
            if let Some(w) = r.workers.pop() {
                cap.drop_worker(&mut r.taken, w, self.j.demand.device);
            }
        }
    }

    /// Adds workers by best fit up to `workers.min`.
    fn min_workers(&mut self, cap: &mut Capacity) -> Result<(), Wait> {
        let (j, d, wb) = (self.j, &self.j.demand, self.worker_bytes);
        let r = &mut self.roles;
        while (r.workers.len() as u32) < d.min_workers {
            let Some((e, i)) = cap.best_worker_slot(d.device, wb, &j.excluded) else {
                return Err(Wait::Capacity(format!(
                    "needs {} {} worker device(s) with {} MiB free, has {}",
                    d.min_workers,
                    kind_name(d.device),
                    mib(wb),
                    r.workers.len()
                )));
            };
            if let Some(t) = cap.take_worker(e, d.device, i, wb) {
                r.taken.push(t);
                r.workers.push((e, i));
            }
        }
        Ok(())
    }

    /// Places every shard that has no executor, where the most RAM is.
    fn ps_shards(&mut self, cap: &mut Capacity) -> Result<(), Wait> {
        let bytes = self.shard_bytes;
        for shard in 0..self.roles.ps.len() {
            if self.roles.ps[shard].is_some() {
                continue;
            }
            let mine = self.executors_used();
            let r = &mut self.roles;
            match cap
                .best_ps_executor(bytes, &mine, None, &self.j.excluded)
                .and_then(|e| cap.take_ps(e, bytes).map(|t| (e, t)))
            {
                Some((e, t)) => {
                    r.taken.push(t);
                    r.ps[shard] = Some(e);
                }
                None => {
                    return Err(Wait::Capacity(format!(
                        "needs {} PS shard(s) with {} MiB of RAM each, found room for {}",
                        self.shards,
                        mib(bytes),
                        r.ps.iter().flatten().count()
                    )))
                }
            }
        }
        Ok(())
    }

    /// Standbys: part of a new job's minimum set; a placed job gets them
    /// as capacity (and its owner's PS RAM quota) allows, and runs without
    /// them meanwhile.
    fn standbys(&mut self, cap: &mut Capacity, room: &Room) -> Result<(), Wait> {
        if !self.replicated {
            return Ok(());
        }
        let (bytes, placed) = (self.shard_bytes, self.j.current.is_some());
        for shard in 0..self.roles.ps.len() {
            if self.roles.standbys[shard].is_some() {
                continue;
            }
            if placed && bytes.saturating_mul(self.ps_roles() + 1) > room.ps_ram {
                continue;
            }
            let mine = self.executors_used();
            let r = &mut self.roles;
            match cap
                .best_ps_executor(bytes, &mine, r.ps[shard], &self.j.excluded)
                .and_then(|e| cap.take_ps(e, bytes).map(|t| (e, t)))
            {
                Some((e, t)) => {
                    r.taken.push(t);
                    r.standbys[shard] = Some(e);
                }
                None if placed => {}
                None => {
                    return Err(Wait::Capacity(format!(
                        "needs a standby for each of its {} PS shard(s) on an executor other than the shard's, with {} MiB of RAM, found room for {}",
                        self.shards,
                        mib(bytes),
                        r.standbys.iter().flatten().count()
                    )))
                }
            }
        }
        Ok(())
    }

    /// Shards and standbys placed so far.
    fn ps_roles(&self) -> u64 {
        let r = &self.roles;
        (r.ps.iter().flatten().count() + r.standbys.iter().flatten().count()) as u64
    }

    /// Executors holding a shard or standby of this job.
    fn executors_used(&self) -> BTreeSet<Uuid> {
        let r = &self.roles;
        r.ps.iter().chain(&r.standbys).flatten().copied().collect()
    }
}
