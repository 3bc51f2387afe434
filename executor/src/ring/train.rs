//! The ring's training loop over one generation's ring.
//!
//! [`train_with`] runs [`RingStep`]s until the job's steps or epochs are
//! done: each rank takes its share of the global batch from the data
//! cursor (which every rank holds identically, so a membership change
//! re-splits the rest of the epoch), steps, writes its slice of a
//! checkpoint when the policy (or any rank's vote) says so, and reports
//! the step; rank 0 alone evaluates on the held-out set.

use super::step::RingStep;
use crate::error::RoleError;
use crate::replica::progress::{self, StepStats, Timings};
use crate::replica::{Outcome, Replica};
use crate::storage::checkpoint::{Checkpointing, Snapshot};
use crate::storage::Fetcher;
use std::sync::atomic::Ordering;
use std::time::Instant;
use trainyard_common::checkpoint::{ring_slice, CursorState};
use trainyard_common::cluster::StepPhase;
use trainyard_common::spec::UncheckedJobSpec;
use trainyard_dataplane::Ring;
use trainyard_shutdown::Shutdown;

/// Trains `replica` on `ring` until the job's steps or epochs are done,
/// calling `on_step` after each step (with the held-out figures on rank 0,
/// which alone evaluates).
pub fn train(
    replica: &mut Replica,
    ring: &mut Ring,
    stop: &Shutdown,
    on_step: &mut dyn FnMut(&StepStats),
) -> Result<Outcome, RoleError> {
    train_with(replica, ring, stop, on_step, None)
}

/// [`train`], writing checkpoints as `ckpt`'s policy says: each rank
/// writes its slice of the flat weights and optimizer state.
pub fn train_with(
    replica: &mut Replica,
    ring: &mut Ring,
    stop: &Shutdown,
    on_step: &mut dyn FnMut(&StepStats),
    mut ckpt: Option<&mut Checkpointing>,
) -> Result<Outcome, RoleError> {
    let (rank, world) = (ring.rank(), ring.world());
    replica.set_carries_state(rank == 0);
    let spec = replica.spec().clone();
    let total = replica.total_steps(world);
    let batches = replica.batches(rank, world, replica.cursor);
    let data_stats = replica.data_stats();
    let mut seen = DataSeen::default();
    let mut step = RingStep::default();
    let mut evaluated_at = None;
    while !replica.finished() {
        if stop.is_triggered() {
            return Err(RoleError::Stopped);
        }
        let waited = Instant::now();
        replica.progress.enter(StepPhase::Data);
        let Ok(b) = batches.recv() else {
            return Err(RoleError::Assignment(replica.loader_failure()));
        };
        let data_seconds = waited.elapsed().as_secs_f64();
        replica.progress.enter(StepPhase::Compute);
        let lr = progress::learning_rate(&spec, replica.step + 1, total);
        step.vote = ckpt.as_ref().is_some_and(|c| c.policy.vote());
        let f = step.run(replica, b, ring, lr, stop)?;
        if let Some(c) = ckpt.as_deref_mut() {
            if c.policy
                .due(replica.step, f.votes > 0.0, replica.finished())
            {
                replica.progress.enter(StepPhase::Checkpoint);
                write_slice(replica, c, rank, world);
            }
        }
        let mut stats = progress::step_stats(
            replica.step,
            f.loss,
            lr,
            Timings {
                samples: f.samples,
                data_seconds,
                compute_seconds: f.compute,
                comm_seconds: f.comm,
                comm_bytes: f.comm_bytes,
            },
        );
        stats.epoch_done = f.epoch_done;
        if let Some(d) = &data_stats {
            seen.fill(d, &mut stats);
        }
        if progress::evaluation_due(rank, replica.step, total, replica.finished()) {
            replica.progress.enter(StepPhase::Eval);
            (stats.eval_loss, stats.eval_accuracy) = replica.evaluate_now();
            evaluated_at = Some(replica.step);
        }
        replica.progress.step_done(replica.step, f.comm);
        on_step(&stats);
    }
    if rank == 0 && evaluated_at != Some(replica.step) {
        replica.evaluate_now();
    }
    Ok(replica.outcome())
}

/// A sharded loader's counters at the previous step: each step reports
/// what changed since.
#[derive(Default)]
pub struct DataSeen {
    bytes: u64,
    hits: u64,
    misses: u64,
}

impl DataSeen {
    /// Puts the loader's figures since the previous call into `stats`.
    pub fn fill(&mut self, d: &crate::data::DataStats, stats: &mut StepStats) {
        let (bytes, hits, misses) = (
            d.bytes_read.load(Ordering::Relaxed),
            d.hits.load(Ordering::Relaxed),
            d.misses.load(Ordering::Relaxed),
        );
        stats.data_bytes_read = bytes.saturating_sub(self.bytes);
        stats.data_cache_hits = hits.saturating_sub(self.hits).min(u64::from(u32::MAX)) as u32;
        stats.data_cache_misses =
            misses.saturating_sub(self.misses).min(u64::from(u32::MAX)) as u32;
        stats.prefetch_depth = d
            .ahead
            .load(Ordering::Relaxed)
            .clamp(0, i64::from(u32::MAX)) as u32;
        (self.bytes, self.hits, self.misses) = (bytes, hits, misses);
    }
}

/// Hands this rank's slice of the replica's state to the uploader.
pub fn write_slice(replica: &Replica, c: &mut Checkpointing, rank: u32, world: u32) {
    let (a, b) = ring_slice(replica.numel(), rank, world);
    let snap = Snapshot {
        step: replica.step,
        generation: c.generation,
        shard: rank,
        shards: world,
        ranges: replica.ranges(a, b),
        tensors: replica.snapshot(a, b),
        numel: replica.numel() as u64,
        optimizer_t: replica.optimizer_t(),
        cursor: CursorState {
            epoch: replica.cursor.epoch,
            offset: replica.cursor.offset,
        },
    };
    c.policy.written(replica.step);
    c.uploader.submit(snap);
}

/// Trains `spec` alone (a ring of one) on `device`, calling `on_step` after
/// each step, until done or `stop` is set.
pub fn run(
    spec: &UncheckedJobSpec,
    device: tch::Device,
    fetcher: &Fetcher,
    host: &crate::replica::process::Host,
    stop: &Shutdown,
    on_step: &mut dyn FnMut(&StepStats),
) -> Result<Outcome, RoleError> {
    let mut replica = Replica::new(spec, device, fetcher, host)?;
    train(&mut replica, &mut Ring::solo(), stop, on_step)
}
