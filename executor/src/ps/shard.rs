//! One shard's state and the rules that change it: its values with their
//! optimizer state and version, the sync round being summed, what is
//! published to pulls, and the changes its standby must acknowledge first.
//!
//! [`Shard::take`] is where a pushed gradient lands: it asks
//! [`super::consistency::judge`] what to do and sums or applies it; an
//! applied update is queued for the standby ([`Change`], sent by
//! [`super::standby`]'s replicator thread off the lock) and published —
//! served to pulls, acknowledged to its pushers, checkpointed — only once
//! the standby acknowledged it ([`Visible`]). A shard without a standby
//! publishes every change at once.
//!
//! A shard's values are its ranges in order: the parameter ranges (the
//! head), then the buffer ranges (the tail, [`Range::buffer`]: BatchNorm's
//! running statistics and the like, which the workers' forward passes
//! change and no optimizer does). The optimizer, the scaling by the
//! samples, weight decay and gradient clipping (its norm) see the head
//! only; the tail is *replaced* by the pushed tail whenever the update
//! carries state — every sync round (its sum is rank 0's buffers plus
//! the other workers' zeros, rank 0's values exactly) and, in async and
//! bounded modes, a push of worker rank 0 only — and is kept otherwise.
//! The optimizer state stays zero over the tail, which is the checkpoint
//! format ("each tensor over the pieces") unchanged.
//!
//! Out of sync, shard 0 keeps each rank's place in the data
//! ([`super::places`]), and the shard's cursor is the slowest of them.

use super::consistency::{self, Round, Verdict, STALENESS_BUCKETS};
use super::places::Places;
use super::ranges::{buffer_offset, shard_len, ShardMapError};
use super::stale::{self, MeanStaleness, DC_HISTORY};
use crate::data::Cursor;
use crate::replica::optim::{slice_norm, SliceOptimizer};
use crate::storage::checkpoint::{Loaded, Snapshot};
use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;
use trainyard_common::checkpoint::CursorState;
use trainyard_common::cluster::{Assignment, Range};
use trainyard_common::spec::{Consistency, OptimizerKind, StaleUpdates, UncheckedJobSpec};
use trainyard_dataplane::ps::PushHeader;

/// The rules a job's shards take pushes by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Rules {
    /// When a push is applied.
    pub(super) consistency: Consistency,
    /// The gradient norm's clip.
    pub(super) clip: Option<f64>,
    /// How a stale update is applied (async and bounded).
    pub(super) stale: StaleUpdates,
    /// The spec's momentum, for a `momentum` optimizer (what an out-of-sync
    /// update compensates).
    pub(super) momentum: Option<f64>,
    /// Whether the optimizer scales its step by the gradient's running
    /// magnitude (Adam, AdamW): `share` takes a square root's part then.
    pub(super) adaptive: bool,
}

impl Rules {
    /// The rules of a job of `spec`.
    pub(super) fn of(spec: &UncheckedJobSpec) -> Rules {
        let o = spec.optimizer();
        Rules {
            consistency: spec.consistency_mode(),
            clip: o.grad_clip,
            stale: spec.stale_updates.unwrap_or_default(),
            momentum: (o.kind == OptimizerKind::Momentum).then(|| o.momentum.unwrap_or(0.9)),
            adaptive: matches!(o.kind, OptimizerKind::Adam | OptimizerKind::Adamw),
        }
    }
}

/// One shard's state; it outlives generations on its executor.
pub struct Shard {
    pub(super) ranges: Vec<Range>,
    /// Elements of the parameter ranges: the values from here on are
    /// buffers ([`buffer_offset`]).
    pub(super) head: usize,
    /// The values: shared with pulls being written and with versions still
    /// to be published (an update copies them only while one still is).
    pub(super) weights: Option<Arc<Vec<f32>>>,
    pub(super) opt: SliceOptimizer,
    pub(super) version: u64,
    pub(super) cursor: Cursor,
    pub(super) generation: i64,
    pub(super) expected: u32,
    /// Sum of this version's gradients so far (sync; valid while
    /// `contributors` is not empty; kept allocated across versions).
    acc: Vec<f32>,
    pub(super) acc_samples: u64,
    pub(super) contributors: BTreeSet<u32>,
    /// Workers of this generation that walked their share of the data
    /// (async and bounded; shard 0 counts them for the job's `until`).
    pub(super) done: BTreeSet<u32>,
    /// Each rank's place in the data (async and bounded; shard 0's are the
    /// job's).
    places: Places,
    next_cursor: Cursor,
    lr: f64,
    /// Updates applied.
    pub applied: u64,
    /// Gradients rejected as too stale.
    pub rejected: u64,
    /// Applied gradients by staleness.
    pub staleness: [u64; STALENESS_BUCKETS],
    /// The mean staleness of the updates applied out of sync.
    pub(super) mean_staleness: MeanStaleness,
    /// The optimizer's momentum as the spec gives it (an update that
    /// carries none is applied with it).
    base_momentum: f64,
    /// Delay compensation: the values of the latest versions (newest
    /// last, at most [`DC_HISTORY`]), each shared with its version's pulls.
    history: VecDeque<(u64, Arc<Vec<f32>>)>,
    /// A compensated gradient (kept allocated).
    compensated: Vec<f32>,
    /// Restored from a checkpoint and not yet aligned with rank 0's version.
    pub(super) restored: bool,
    /// The step a pushed gradient asked to be checkpointed once applied.
    pub(super) checkpoint_at: Option<u64>,
    /// The last step checkpointed.
    checkpointed: Option<u64>,
    /// A drain checkpoint was asked for.
    pub(super) drain_asked: bool,
    /// Kept by a standby (set when its generation ends): a shard server
    /// that takes it over is the promoted standby.
    pub(super) was_standby: bool,
    /// Whether changes go to a standby before they are published (this
    /// generation has one and has not given it up).
    pub(super) replicated: bool,
    /// What pulls see.
    pub(super) visible: Visible,
    /// Changes for the standby, oldest first (empty unless `replicated`).
    pub(super) outbox: VecDeque<Change>,
    /// Gradient buffers the replicator has sent, for reuse.
    pub(super) spare: Vec<Vec<f32>>,
}

/// A version as pulls see it.
#[derive(Clone)]
pub(super) struct Published {
    pub(super) version: u64,
    pub(super) weights: Arc<Vec<f32>>,
    pub(super) cursor: Cursor,
}

/// What is published while the standby has not acknowledged everything.
pub(super) enum Visible {
    /// The shard's state itself.
    Current,
    /// The newest state the standby acknowledged (none: nothing yet, or
    /// the state was replaced since); newer changes are on their way.
    Held(Option<Published>),
}

/// One applied update: the gradient sum it applied at version `before`,
/// over `samples` samples with `lr` (and `momentum`, where not the
/// spec's), whether its tail replaced the buffers, and the state after it.
pub(super) struct Update {
    pub(super) grad: Vec<f32>,
    pub(super) before: u64,
    pub(super) samples: u64,
    pub(super) lr: f64,
    pub(super) carries_state: bool,
    pub(super) momentum: Option<f32>,
    pub(super) after: Published,
}

/// A change its standby must have before it is published.
pub(super) enum Change {
    /// One applied update.
    Update(Update),
    /// The state was replaced (initial values, an aligned version, a new
    /// standby): the whole of it.
    Whole,
}

/// What a push the shard took asks of its pusher's answer.
pub(super) struct Taken {
    /// Acknowledged (rather than rejected).
    pub(super) accepted: bool,
    /// The version it produced, where it completed one.
    pub(super) produced: Option<u64>,
}

impl Shard {
    /// An empty shard of `ranges` for assignment `a`; an error where a
    /// buffer range precedes a parameter range.
    pub(super) fn new(a: &Assignment, ranges: Vec<Range>) -> Result<Shard, ShardMapError> {
        let len = shard_len(&ranges);
        let head = buffer_offset(&ranges)?;
        Ok(Shard {
            ranges,
            head,
            weights: None,
            opt: SliceOptimizer::new(a.spec.optimizer(), len),
            version: 0,
            cursor: Cursor::default(),
            generation: a.key.generation,
            expected: a.workers.len() as u32,
            acc: Vec::new(),
            acc_samples: 0,
            contributors: BTreeSet::new(),
            done: BTreeSet::new(),
            places: Places::default(),
            next_cursor: Cursor::default(),
            lr: 0.0,
            applied: 0,
            rejected: 0,
            staleness: [0; STALENESS_BUCKETS],
            mean_staleness: MeanStaleness::default(),
            base_momentum: a.spec.optimizer().momentum.unwrap_or(0.9),
            history: VecDeque::new(),
            compensated: Vec::new(),
            restored: false,
            checkpoint_at: None,
            checkpointed: None,
            drain_asked: false,
            was_standby: false,
            replicated: false,
            visible: Visible::Current,
            outbox: VecDeque::new(),
            spare: Vec::new(),
        })
    }

    /// Starts a generation: the half-summed version of the old membership
    /// is dropped; with a standby, nothing is published until it has the
    /// whole state.
    pub(super) fn begin(&mut self, generation: i64, expected: u32, standby: bool) {
        self.generation = generation;
        if expected != self.expected {
            // Another number of workers slices the data otherwise: a
            // rank's place means nothing in it, and only the slowest
            // place leaves no sample untrained.
            self.places.regroup(expected, self.cursor);
        }
        self.expected = expected;
        self.acc_samples = 0;
        self.contributors.clear();
        // Ranks are dealt again: each worker says it anew.
        self.done.clear();
        self.outbox.clear();
        self.history.clear();
        self.replicated = standby;
        self.visible = Visible::Current;
        if standby && self.weights.is_some() {
            self.replaced();
        }
    }

    /// The state was replaced: with a standby it gets the whole of it
    /// before anything is published again.
    pub(super) fn replaced(&mut self) {
        if self.replicated {
            self.outbox.push_back(Change::Whole);
            self.visible = Visible::Held(None);
        }
    }

    /// The published version, if any: what a pull may be served.
    pub(super) fn published(&self) -> Option<Published> {
        match &self.visible {
            Visible::Current => Some(Published {
                version: self.version,
                weights: self.weights.clone()?,
                cursor: self.cursor,
            }),
            Visible::Held(p) => p.clone(),
        }
    }

    /// The published version's number, if any.
    pub(super) fn published_version(&self) -> Option<u64> {
        match &self.visible {
            Visible::Current => self.weights.as_ref().map(|_| self.version),
            Visible::Held(p) => p.as_ref().map(|p| p.version),
        }
    }

    /// The standby acknowledged the state `acked` (the state after a
    /// change the replicator sent): publishes it, or the shard's own state
    /// where nothing changed since.
    pub(super) fn acknowledged(&mut self, acked: Published) {
        self.visible = if self.outbox.is_empty() && acked.version == self.version {
            Visible::Current
        } else if self.outbox.iter().any(|c| matches!(c, Change::Whole)) {
            Visible::Held(None)
        } else {
            Visible::Held(Some(acked))
        };
    }

    /// The standby is given up: everything is published from now on.
    pub(super) fn unreplicated(&mut self) {
        self.replicated = false;
        self.outbox.clear();
        self.visible = Visible::Current;
    }

    /// Takes over the shard's pieces of a committed checkpoint: the
    /// weights with the buffers, and the optimizer state, which no
    /// optimizer keeps over buffers (zero there, whatever was written).
    pub(super) fn restore(&mut self, l: &Loaded) {
        self.weights = Some(Arc::new(l.tensors[0].clone()));
        if l.tensors.len() == 1 + self.opt.state().len() {
            let head = self.head;
            for (t, src) in self.opt.state_mut().iter_mut().zip(&l.tensors[1..]) {
                if t.len() == src.len() {
                    t.copy_from_slice(src);
                    t[head.min(src.len())..].fill(0.0);
                }
            }
            self.opt.t = l.optimizer_t;
        }
        self.version = l.step;
        self.cursor = Cursor {
            epoch: l.cursor.epoch,
            offset: l.cursor.offset,
        };
        self.history.clear();
        // The checkpoint's cursor is the slowest rank's place.
        self.places.clear();
        self.restored = true;
        self.checkpointed = Some(l.step);
    }

    /// Where worker rank `rank` resumes in the data (async and bounded): its
    /// rank's place, else the place the worker `kept` from an earlier
    /// generation, else the slowest place known (a replacement whose rank
    /// has no record: shard 0 was lost or restored). The answer is the
    /// rank's place from now on.
    pub(super) fn place(&mut self, rank: u32, kept: Option<Cursor>) -> Cursor {
        let at = self.places.take_up(rank, kept, self.cursor);
        self.cursor = self.places.floor(self.cursor);
        at
    }

    /// A copy of the shard's values and optimizer state for a checkpoint
    /// of `step` (none where that step is checkpointed already).
    pub(super) fn snapshot(
        &mut self,
        step: u64,
        index: u32,
        shards: u32,
        numel: u64,
    ) -> Option<Snapshot> {
        let w = self.weights.as_ref()?;
        if self.checkpointed == Some(step) {
            return None;
        }
        self.checkpointed = Some(step);
        let mut tensors = vec![w.to_vec()];
        tensors.extend(self.opt.state().iter().cloned());
        Some(Snapshot {
            step,
            generation: self.generation,
            shard: index,
            shards,
            ranges: self.ranges.clone(),
            tensors,
            numel,
            optimizer_t: self.opt.t,
            cursor: CursorState {
                epoch: self.cursor.epoch,
                offset: self.cursor.offset,
            },
        })
    }

    /// Applies the mean gradient `(g + extra) / samples` (clipped to norm
    /// `clip`) to the parameters in one fused pass, with `momentum` where
    /// given (else the spec's); where the update `carries_state`, the
    /// buffers become `g + extra`'s tail as it is.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply(
        &mut self,
        g: &[f32],
        extra: Option<&[f32]>,
        samples: u64,
        lr: f64,
        clip: Option<f64>,
        carries_state: bool,
        momentum: Option<f32>,
    ) {
        let Some(w) = self.weights.as_mut() else {
            return;
        };
        let head = self.head.min(g.len()).min(w.len());
        let (g, g_tail) = g.split_at(head);
        let (extra, extra_tail) = match extra {
            Some(e) => (Some(&e[..head]), Some(&e[head..])),
            None => (None, None),
        };
        let mut scale = 1.0 / samples.max(1) as f64;
        if let Some(c) = clip {
            // Per shard: the global norm is not known to any one shard.
            // Buffers are no gradient: they take no part in it.
            let coef = c / (slice_norm(g, extra, scale) + 1e-6);
            if coef < 1.0 {
                scale *= coef;
            }
        }
        let w: &mut Vec<f32> = Arc::make_mut(w);
        let (w, w_tail) = w.split_at_mut(head);
        // A push of no samples (a worker whose share of an epoch's last
        // step is empty) is no gradient: PyTorch would take no step, and an
        // Adam or momentum step on zeros would still move the weights.
        if samples > 0 {
            self.opt
                .set_momentum(momentum.map_or(self.base_momentum, f64::from));
            self.opt.step(w, g, extra, scale as f32, lr);
        }
        if carries_state {
            // Rank 0's buffers, plus the others' zeros in a sync round:
            // formed as the standby's replayed sum is, so both hold the
            // same bits.
            match extra_tail {
                None => {
                    let n = w_tail.len().min(g_tail.len());
                    w_tail[..n].copy_from_slice(&g_tail[..n]);
                }
                Some(e) => {
                    for ((wi, a), b) in w_tail.iter_mut().zip(g_tail).zip(e) {
                        *wi = a + b;
                    }
                }
            }
        }
        self.version += 1;
        self.applied += 1;
    }

    /// Takes a gradient `grad` pushed by worker `from` with header `push`
    /// under the job's `rules`.
    pub(super) fn take(
        &mut self,
        rules: &Rules,
        from: u32,
        push: &PushHeader,
        grad: &[f32],
    ) -> Taken {
        let refused = Taken {
            accepted: false,
            produced: None,
        };
        if self.weights.is_none() {
            return refused;
        }
        let round = Round {
            summed: self.contributors.len() as u32,
            pushed_already: self.contributors.contains(&from),
            expected: self.expected,
        };
        let before = self.version;
        let (samples, next) = (push.samples, super::from_wire(push.next_cursor));
        match consistency::judge(rules.consistency, self.version, push.computed_at, round) {
            Verdict::Rejected => {
                self.rejected += 1;
                return refused;
            }
            Verdict::AlreadySummed => {}
            Verdict::Summed { first } => {
                self.sum_in(from, samples, push.lr, next);
                if first {
                    self.acc.clear();
                    self.acc.extend_from_slice(grad);
                } else {
                    for (a, g) in self.acc.iter_mut().zip(grad) {
                        *a += *g;
                    }
                }
            }
            Verdict::Applied {
                staleness,
                with_sum,
            } if rules.consistency == Consistency::Sync => {
                self.sum_in(from, samples, push.lr, next);
                // The last gradient is summed into the others inside the
                // update's pass (a lone worker's is used as it is).
                let (samples, lr) = (self.acc_samples, self.lr);
                let acc = std::mem::take(&mut self.acc);
                let extra = with_sum.then_some(&acc[..]);
                // Every worker of the round is in the sum, rank 0 with its
                // buffers and the others with zeros there: the round
                // carries rank 0's buffers.
                self.apply(grad, extra, samples, lr, rules.clip, true, None);
                self.staleness[consistency::bucket(staleness)] += 1;
                self.cursor = self.next_cursor;
                self.acc_samples = 0;
                self.contributors.clear();
                // The standby applies the sum the update's pass formed
                // (`(g + extra) · scale` there and `sum · scale` here
                // round alike), so both hold the same bits.
                self.queue_update(grad, extra, before, samples, lr, true, None);
                self.acc = acc;
            }
            Verdict::Applied { staleness, .. } => {
                // Async and bounded workers pull whatever is newest: the
                // published version stays visible while the standby takes
                // this one (the update then writes a copy of the values).
                self.hold_published();
                // Only rank 0's buffers are the job's; the others push
                // zeros in their place.
                let carries_state = from == 0;
                let mean = self.mean_staleness.record(staleness);
                let lr = push.lr
                    * stale::lr_factor(rules.stale.lr, staleness, self.expected, rules.adaptive);
                // As f32, the optimizer's and the wire's precision: the
                // standby applies the same bits.
                let momentum = rules
                    .momentum
                    .map(|mu| stale::momentum(rules.stale.momentum, mu, mean) as f32);
                let mut g = std::mem::take(&mut self.compensated);
                let compensated = self.delay_compensate(rules, push, grad, &mut g);
                let grad = if compensated { &g[..] } else { grad };
                self.apply(grad, None, samples, lr, rules.clip, carries_state, momentum);
                // The worker's next step starts there: its standby and its
                // checkpoints carry the slowest rank's place.
                self.places.moved(from, next);
                self.cursor = self.places.floor(self.cursor);
                self.staleness[consistency::bucket(staleness)] += 1;
                self.queue_update(grad, None, before, samples, lr, carries_state, momentum);
                self.compensated = g;
            }
        }
        Taken {
            accepted: true,
            produced: (self.version > before).then_some(self.version),
        }
    }

    /// Delay compensation of an out-of-sync gradient into `out` (whether it
    /// applies: λ > 0 and the values of its version are still kept), and
    /// the current values kept for the gradients to come.
    fn delay_compensate(
        &mut self,
        rules: &Rules,
        push: &PushHeader,
        grad: &[f32],
        out: &mut Vec<f32>,
    ) -> bool {
        let lambda = rules.stale.delay_compensation;
        let Some(now) = self.weights.clone().filter(|_| lambda > 0.0) else {
            return false;
        };
        let then = self
            .history
            .iter()
            .find(|(v, _)| *v == push.computed_at)
            .map(|(_, w)| w.clone());
        if self.history.len() == DC_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back((self.version, now.clone()));
        let Some(then) = then else {
            return false;
        };
        out.clear();
        out.extend_from_slice(grad);
        let head = self.head.min(out.len()).min(now.len()).min(then.len());
        stale::compensate(
            &mut out[..head],
            &now[..head],
            &then[..head],
            lambda,
            push.samples,
        );
        true
    }

    /// Counts worker `from`'s gradient into this sync version's round.
    fn sum_in(&mut self, from: u32, samples: u64, lr: f64, next: Cursor) {
        self.acc_samples += samples;
        self.contributors.insert(from);
        self.next_cursor = next;
        self.lr = lr;
    }

    /// Keeps the published state visible as it is (with a standby, while
    /// it is the shard's own state).
    fn hold_published(&mut self) {
        if !self.replicated || !matches!(self.visible, Visible::Current) {
            return;
        }
        if let Some(weights) = self.weights.clone() {
            self.visible = Visible::Held(Some(Published {
                version: self.version,
                weights,
                cursor: self.cursor,
            }));
        }
    }

    /// Queues the update just applied for the standby (nothing without
    /// one: it is published at once).
    #[allow(clippy::too_many_arguments)]
    fn queue_update(
        &mut self,
        grad: &[f32],
        extra: Option<&[f32]>,
        before: u64,
        samples: u64,
        lr: f64,
        carries_state: bool,
        momentum: Option<f32>,
    ) {
        if !self.replicated {
            return;
        }
        let Some(weights) = self.weights.clone() else {
            return;
        };
        let mut sum = self.spare.pop().unwrap_or_default();
        sum.clear();
        match extra {
            None => sum.extend_from_slice(grad),
            Some(e) => sum.extend(grad.iter().zip(e).map(|(a, b)| a + b)),
        }
        let after = Published {
            version: self.version,
            weights,
            cursor: self.cursor,
        };
        self.outbox.push_back(Change::Update(Update {
            grad: sum,
            before,
            samples,
            lr,
            carries_state,
            momentum,
            after,
        }));
        if matches!(self.visible, Visible::Current) {
            // Sync: the values changed in place, and the workers pull only
            // the version this update makes; they wait for the standby.
            self.visible = Visible::Held(None);
        }
    }

    /// The shard's one-line statistics.
    pub(super) fn stats_line(&self, index: u32, bytes_in: u64, bytes_out: u64) -> String {
        format!(
            "PS shard {index}: version {}, {} updates applied, {} rejected as stale, staleness histogram {:?}{}",
            self.version,
            self.applied,
            self.rejected,
            self.staleness,
            if bytes_in + bytes_out > 0 {
                format!(", {} MiB pushed in, {} MiB pulled out", bytes_in >> 20, bytes_out >> 20)
            } else {
                String::new()
            }
        )
    }
}

/// A shard behind its lock, with the condition its waiters wait on (pulls
/// for a version, pushes for their acknowledgement, the replicator for
/// changes).
pub(super) struct Locked {
    state: Mutex<Shard>,
    changed: Condvar,
}

impl Locked {
    /// `shard` behind a lock.
    pub(super) fn new(shard: Shard) -> Locked {
        Locked {
            state: Mutex::new(shard),
            changed: Condvar::new(),
        }
    }

    /// The shard.
    pub(super) fn lock(&self) -> MutexGuard<'_, Shard> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits (at most [`WAIT`]) for a change, releasing the lock meanwhile.
    pub(super) fn wait<'a>(&self, guard: MutexGuard<'a, Shard>) -> MutexGuard<'a, Shard> {
        self.changed
            .wait_timeout(guard, WAIT)
            .unwrap_or_else(|p| p.into_inner())
            .0
    }

    /// Wakes every waiter.
    pub(super) fn changed(&self) {
        self.changed.notify_all();
    }

    /// The shard, once nobody else holds it.
    pub(super) fn into_inner(self) -> Shard {
        self.state.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long a waiter sleeps before it looks at its stop signal again.
const WAIT: Duration = Duration::from_millis(100);
