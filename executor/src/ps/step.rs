//! One PS worker step, in the ring's shape (`ring/step.rs`): the loop is
//! [`super::worker`]'s, as `ring/train.rs` drives `ring/step.rs`.
//! [`PsStep`] keeps what a worker's exchange with its shards carries from
//! step to step — the links, the versions it waits for, which shards took
//! the current batch, the pull that travelled while the gradient was
//! computed — and does the step's three moves: [`PsStep::pull`] every
//! shard, [`PsStep::gradient`] (overlapped with the next pull where the
//! consistency allows), [`PsStep::push`] each shard its slice, then
//! [`PsStep::settle`] by [`super::consistency::after_push`]'s rule. Also
//! here: what a sync worker keeps of its last step, and how it brings a
//! shard that a lost primary left a version behind back to the others
//! ([`catch_up`], when [`super::consistency::after_pull`] says so).

use super::consistency::{self, AfterPush};
use super::links::{
    apply_pull, exchange_pull, exchange_push, pull_all, Exchange, Link, Pulled, PushReply, ShardMap,
};
use super::to_wire;
use crate::data::{Batch, Cursor};
use crate::error::RoleError;
use crate::replica::progress;
use crate::replica::{Replica, TrainError};
use trainyard_common::cluster::{Assignment, LogLevel};
use trainyard_common::spec::Consistency;
use trainyard_dataplane::ps::PushHeader;
use trainyard_shutdown::Shutdown;

/// A sync PS worker's last step, kept across generations on its device:
/// the gradient slice it pushed to each shard, computed at `version`, and
/// what the pushes carried. When a lost primary left its (promoted) shard
/// at `version` while the other shards moved on to `version + 1`, the
/// worker pushes the slice again to the shards that are behind (a sync
/// shard takes one push per worker and version, so nothing is applied
/// twice) before it pulls: the shards never end at different versions.
pub struct LastStep {
    pub(super) version: u64,
    pub(super) slices: Vec<Vec<f32>>,
    pub(super) push: PushHeader,
}

/// A worker's exchange with its shards, kept across its steps.
pub struct PsStep {
    links: Vec<Link>,
    map: ShardMap,
    /// The least version wanted of each shard at the next pull.
    expect: Vec<u64>,
    /// Shards that took the current batch's gradient (a partly rejected
    /// push is recomputed for the others only, never applied twice).
    accepted: Vec<bool>,
    /// Whether the next pull travels while the gradient is computed.
    prefetch: bool,
    /// That pull's answers.
    prefetched: Option<Vec<Pulled>>,
}

/// What a push gave.
pub struct Pushed {
    /// The step as pushed (what a sync worker keeps for a catch-up).
    pub last: LastStep,
    /// Every shard's answer (one that took this batch already counts as
    /// taking it at the version after the pull).
    pub acks: Result<Vec<PushReply>, RoleError>,
    /// Bytes sent: only to the shards that had not taken the batch.
    pub bytes: u64,
}

impl PsStep {
    /// A worker's exchange over `links`, cut by `map`; `prefetch`: the
    /// next pull overlaps the gradient.
    pub(super) fn new(links: Vec<Link>, map: ShardMap, prefetch: bool) -> PsStep {
        let n = links.len();
        PsStep {
            links,
            map,
            expect: vec![0; n],
            accepted: vec![false; n],
            prefetch,
            prefetched: None,
        }
    }

    /// Pulls every shard at once (or takes the pull that travelled during
    /// the last gradient) into `rep`.
    pub(super) fn pull(
        &mut self,
        rep: &mut Replica,
        stop: &Shutdown,
    ) -> Result<Exchange, RoleError> {
        match self.prefetched.take() {
            Some(results) => apply_pull(&self.links, results, &self.map, rep),
            None => exchange_pull(&mut self.links, &self.expect, &self.map, rep, stop),
        }
    }

    /// Pulls the newest values of every shard, whatever was prefetched
    /// (a prefetched pull misses the last pushes); shard 0's version then.
    pub(super) fn pull_fresh(
        &mut self,
        rep: &mut Replica,
        stop: &Shutdown,
    ) -> Result<u64, RoleError> {
        self.prefetched = None;
        let zero = vec![0u64; self.links.len()];
        let ex = exchange_pull(&mut self.links, &zero, &self.map, rep, stop)?;
        Ok(ex.versions.first().copied().unwrap_or(0))
    }

    /// Tells shard 0 this worker walked its share of the data; how many
    /// workers of the generation have.
    pub(super) fn say_done(&mut self, stop: &Shutdown) -> Result<u32, RoleError> {
        let Some(link) = self.links.first_mut() else {
            return Err(RoleError::ps_fatal("no PS shard to tell"));
        };
        super::links::say_done(link, stop)
    }

    /// Asks shard 0 where this worker's rank resumes in the data.
    pub(super) fn ask_place(
        &mut self,
        kept: Option<Cursor>,
        stop: &Shutdown,
    ) -> Result<Cursor, RoleError> {
        let Some(link) = self.links.first_mut() else {
            return Err(RoleError::ps_fatal("no PS shard to ask"));
        };
        super::links::ask_place(link, kept, stop)
    }

    /// The next pull waits for every shard to reach `version`.
    pub(super) fn expect_all(&mut self, version: u64) {
        self.expect.fill(version);
    }

    /// The gradient of `b` on `rep`'s values. Async and bounded: the next
    /// pull travels meanwhile, where [`consistency::prefetches`] allows
    /// (its values then miss this step's own push: one more version of
    /// staleness, traded for hiding the pull).
    pub(super) fn gradient(
        &mut self,
        rep: &mut Replica,
        b: &Batch,
        stop: &Shutdown,
    ) -> Result<(f64, Vec<f32>), TrainError> {
        if !self.prefetch {
            return rep.gradient(b);
        }
        let (links, expect, map) = (&mut self.links, &self.expect, &self.map);
        let (g, next) = std::thread::scope(|scope| {
            let pull = scope.spawn(move || pull_all(links, expect, map, stop));
            let g = rep.gradient(b);
            (g, pull.join().ok())
        });
        self.prefetched = next;
        g
    }

    /// Pushes each shard that has not taken this batch yet its slice of
    /// `grad`, with `header` (each shard's copy computed at the version
    /// pulled from it).
    pub(super) fn push(
        &mut self,
        ex: &Exchange,
        grad: &[f32],
        header: PushHeader,
        stop: &Shutdown,
    ) -> Pushed {
        let skipped = self.accepted.clone();
        let last = LastStep {
            version: header.computed_at,
            slices: (0..self.links.len())
                .map(|s| {
                    if skipped[s] {
                        Vec::new()
                    } else {
                        self.map.gather(s, grad)
                    }
                })
                .collect(),
            push: header,
        };
        let to: Vec<Option<u64>> = ex
            .versions
            .iter()
            .zip(&skipped)
            .map(|(v, skip)| (!skip).then_some(*v))
            .collect();
        let acks =
            exchange_push(&mut self.links, &last.push, &to, &last.slices, stop).map(|acks| {
                acks.into_iter()
                    .zip(&ex.versions)
                    .map(|(r, v)| {
                        r.unwrap_or(PushReply::Ack {
                            version: v + 1,
                            checkpoint_wanted: false,
                        })
                    })
                    .collect::<Vec<_>>()
            });
        let bytes = self
            .map
            .lens
            .iter()
            .zip(&skipped)
            .filter(|(_, skipped)| !**skipped)
            .map(|(n, _)| *n as u64 * 4)
            .sum();
        if let Ok(acks) = &acks {
            for (a, r) in self.accepted.iter_mut().zip(acks) {
                *a |= r.accepted();
            }
        }
        Pushed { last, acks, bytes }
    }

    /// After a push was answered: what the worker does next by the
    /// consistency's rule; a step that is done clears which shards took
    /// it, and a sync worker next waits for the version after `ex`'s.
    pub(super) fn settle(&mut self, c: Consistency, ex: &Exchange) -> AfterPush {
        let next = consistency::after_push(c, &self.accepted);
        if next == AfterPush::Next {
            self.accepted.fill(false);
            if c == Consistency::Sync {
                // A sync shard counts one push per worker and version:
                // every step pushes to all of them.
                for (e, v) in self.expect.iter_mut().zip(&ex.versions) {
                    *e = v + 1;
                }
            }
        }
        next
    }
}

/// The worker that catches the shards up ([`catch_up`]): its last sync
/// step, its assignment and rank, its model, its stop signal and its log.
pub(super) struct CatchingUp<'a> {
    pub(super) last_step: &'a Option<LastStep>,
    pub(super) a: &'a Assignment,
    pub(super) rank: u32,
    pub(super) rep: &'a Replica,
    pub(super) stop: &'a Shutdown,
    pub(super) log: &'a dyn Fn(LogLevel, String),
}

/// Sync: brings the shards that are a version behind the others (a lost
/// primary's promoted standby) to the others' version by pushing them
/// this worker's gradient of that version again — or, where this worker
/// has none (it joined since, or its last step was another version), a
/// zero gradient over no samples, which counts it as a contributor and
/// changes neither the sum nor the samples (rank 0's carries the buffers
/// it pulled from the shards, so the round leaves them as they are).
/// Returns the version all shards are to be pulled at. The shards are at
/// most one version apart.
pub(super) fn catch_up(
    ps: &mut PsStep,
    ex: &Exchange,
    w: CatchingUp<'_>,
) -> Result<u64, RoleError> {
    let CatchingUp {
        last_step,
        a,
        rank,
        rep,
        stop,
        log,
    } = w;
    let (links, map) = (&mut ps.links, &ps.map);
    let world = a.workers.len() as u32;
    let total = rep.total_steps(world);
    let lo = ex.versions.iter().copied().min().unwrap_or(0);
    let (ahead, hi) = ex
        .versions
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|(_, v)| *v)
        .unwrap_or((0, 0));
    let mine = last_step
        .as_ref()
        .filter(|l| l.version == lo && l.slices.len() == links.len())
        .filter(|l| {
            ex.versions
                .iter()
                .zip(&l.slices)
                .zip(&map.lens)
                .all(|((v, sl), n)| *v != lo || sl.len() == *n)
        });
    let zeros: Vec<Vec<f32>>;
    let (push, slices) = match mine {
        Some(l) => (l.push, &l.slices),
        None => {
            // A sync round replaces the shards' buffers with its sum's tail:
            // rank 0's holds the buffers as pulled, the others' zeros.
            let mut flat = vec![0.0; rep.numel()];
            if rank == 0 {
                let p = rep.trainable_len().min(flat.len());
                flat[p..].copy_from_slice(&rep.read_range(p, rep.numel() - p));
            }
            zeros = (0..links.len()).map(|s| map.gather(s, &flat)).collect();
            (
                PushHeader {
                    computed_at: lo,
                    samples: 0,
                    lr: progress::learning_rate(&a.spec, lo + 1, total),
                    next_cursor: to_wire(ex.cursors[ahead]),
                    checkpoint: None,
                },
                &zeros,
            )
        }
    };
    let behind: Vec<usize> = (0..links.len()).filter(|s| ex.versions[*s] == lo).collect();
    log(
        LogLevel::Warn,
        format!(
            "worker {rank}: PS shard(s) {behind:?} are at version {lo}, the others at {hi} (a lost primary's standby): {} them this worker's gradient of version {lo} again",
            if mine.is_some() { "pushing" } else { "it has none; pushing" }
        ),
    );
    let to: Vec<Option<u64>> = ex
        .versions
        .iter()
        .map(|v| (*v == lo).then_some(lo))
        .collect();
    let acks = exchange_push(links, &push, &to, slices, stop)?;
    for (s, r) in acks.iter().enumerate() {
        if let Some(r) = r.filter(|r| !r.accepted()) {
            return Err(RoleError::ps_fatal(format!(
                "PS shard {s} answered {r:?} to version {lo}'s gradient while the others are at {hi}"
            )));
        }
    }
    Ok(hi)
}
