//! The bounds on one job's attempt in the admit phase: what its owner's
//! [`Quota`] leaves, given what the owner's other placed jobs hold, and
//! this round's cap on a shrunk elastic job — with the reasons a job over
//! its quota waits with. Admission checks the minimum set against them;
//! growth reads the quota directly.

use super::sizing::{kind_name, mib};
use super::{Holding, JobView, Quota, Round};

/// The bounds the owner's quota and this round's cap set on one job.
pub(super) struct Room {
    pub(super) quota: Quota,
    /// What the owner's other placed jobs hold.
    pub(super) holding: Holding,
    /// Workers of the job's kind the quota leaves the owner.
    pub(super) workers: u32,
    /// Most workers the job keeps: the quota's room and this round's cap
    /// (never below its minimum).
    pub(super) allowed: u32,
    /// PS RAM the quota leaves the owner.
    pub(super) ps_ram: u64,
}

impl Round<'_> {
    /// What the owner's quota, given its other placed jobs, and this
    /// round's cap leave the job.
    pub(super) fn room(&self, j: &JobView) -> Room {
        let d = &j.demand;
        let quota = self
            .sharing
            .quotas
            .get(&j.owner)
            .copied()
            .unwrap_or_default();
        let holding = self
            .owners
            .get(j.owner.as_str())
            .copied()
            .unwrap_or_default();
        let workers = quota
            .workers(d.device)
            .map_or(u32::MAX, |m| m.saturating_sub(holding.workers(d.device)));
        let allowed = workers.min(
            self.sharing
                .caps
                .get(&j.id)
                .copied()
                .unwrap_or(u32::MAX)
                .max(d.min_workers),
        );
        let ps_ram = quota
            .ps_ram_bytes
            .map_or(u64::MAX, |m| m.saturating_sub(holding.ps_ram_bytes));
        Room {
            quota,
            holding,
            workers,
            allowed,
            ps_ram,
        }
    }
}

impl Room {
    /// Why a job whose minimum workers exceed the owner's room waits.
    pub(super) fn over_workers(&self, j: &JobView) -> String {
        let d = &j.demand;
        format!(
            "over its owner's quota: {} may hold {} {} worker(s) at once, its other jobs hold {}, this job needs {}",
            j.owner,
            self.quota.workers(d.device).unwrap_or(0),
            kind_name(d.device),
            self.holding.workers(d.device),
            d.min_workers
        )
    }

    /// Why a job whose PS RAM (`need`) exceeds the owner's room waits.
    pub(super) fn over_ps_ram(&self, j: &JobView, need: u64) -> String {
        format!(
            "over its owner's quota: {} may hold {} MiB of PS RAM at once, its other jobs hold {} MiB, this job needs {} MiB",
            j.owner,
            mib(self.quota.ps_ram_bytes.unwrap_or(0)),
            mib(self.holding.ps_ram_bytes),
            mib(need)
        )
    }
}
