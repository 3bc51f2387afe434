//! One ring step: this rank's gradient, summed with every other rank's.
//!
//! [`RingStep::run`] computes this rank's gradient on its share of the
//! global batch ([`Replica::forward_backward`]), flattens it together with
//! the sample count, the loss and this rank's checkpoint vote into one
//! buffer, sums that buffer around the ring (reduce-scatter + all-gather,
//! optionally with the gradient in bf16), and hands the sum to
//! [`Replica::apply_summed`], which applies the same mean gradient on every
//! rank. The replica's weights change only after the all-reduce completed,
//! and the buffers its forward moved are put back when the all-reduce
//! fails, so a broken ring leaves it at its last completed step.

use crate::data::Batch;
use crate::error::RoleError;
use crate::replica::Replica;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tch::Tensor;
use trainyard_common::cluster::StepPhase;
use trainyard_common::spec::Compression;
use trainyard_dataplane::{Ring, Wire};
use trainyard_shutdown::Shutdown;

/// What one step measured.
pub struct StepFigures {
    /// Mean loss over every rank's samples.
    pub loss: f64,
    /// Samples of the global batch.
    pub samples: usize,
    /// Forward, backward and the update, in seconds.
    pub compute: f64,
    /// The all-reduce, in seconds.
    pub comm: f64,
    /// Bytes this rank sent.
    pub comm_bytes: u64,
    /// Ranks that asked for a checkpoint at this step.
    pub votes: f32,
    /// The epoch this step completed, with what the ranks consumed in it.
    pub epoch_done: Option<trainyard_common::cluster::EpochAccount>,
}

/// 16-bit limbs of a batch's id hash in the all-reduce: each rank writes
/// its hash into slots of its own (the others add zeros), so the sum
/// carries every rank's hash exactly, even in f32.
const HASH_LIMBS: usize = 4;

/// A rank's step state kept across steps: the all-reduce buffer and
/// whether this rank asks for a checkpoint at the coming step.
#[derive(Default)]
pub struct RingStep {
    buf: Vec<f32>,
    /// This rank asks for a checkpoint at the coming step (summed over the
    /// ring with the gradient).
    pub vote: bool,
}

impl RingStep {
    /// One step of `replica` on this rank's share `b`, summed over `ring`.
    pub fn run(
        &mut self,
        replica: &mut Replica,
        b: Batch,
        ring: &mut Ring,
        lr: f64,
        stop: &Shutdown,
    ) -> Result<StepFigures, RoleError> {
        let computed = Instant::now();
        let n = replica.numel();
        let epoch = replica.cursor.epoch;
        // Put back if the exchange fails (see `Replica::save_buffers`).
        let saved = (ring.world() > 1).then(|| replica.save_buffers()).flatten();
        let (loss_sum, flat) = replica.forward_backward(&b)?;
        let compute = computed.elapsed().as_secs_f64();
        let comm_started = Instant::now();
        replica.progress.enter(StepPhase::Comm);
        let sent_before = ring.stats().bytes_sent.load(Ordering::Relaxed);
        let vote = f32::from(u8::from(self.vote));
        let (total, loss_sum, summed, votes, id_hash) = if ring.world() == 1 {
            // Alone: the gradient stays where it is, on its device.
            (b.samples as f32, loss_sum, flat, vote, b.id_hash)
        } else {
            let (rank, world) = (ring.rank() as usize, ring.world() as usize);
            self.buf.resize(n + 3 + HASH_LIMBS * world, 0.0);
            match &flat {
                Some(f) => f
                    .to_device(tch::Device::Cpu)
                    .copy_data(&mut self.buf[..n], n),
                None => self.buf[..n].fill(0.0),
            }
            self.buf[n] = b.samples as f32;
            self.buf[n + 1] = loss_sum as f32;
            self.buf[n + 2] = vote;
            let limbs = &mut self.buf[n + 3..];
            limbs.fill(0.0);
            for i in 0..HASH_LIMBS {
                limbs[rank * HASH_LIMBS + i] = ((b.id_hash >> (16 * i)) & 0xFFFF) as f32;
            }
            let exchanged = match replica.spec().compression {
                Compression::None => ring.allreduce(&mut self.buf, stop),
                Compression::Bf16 => {
                    // The gradient in bf16; the buffers, the sample count
                    // and the loss stay exact.
                    let (grad, counts) = self.buf.split_at_mut(replica.trainable_len());
                    ring.allreduce_wire(grad, Wire::Bf16, stop)
                        .and_then(|()| ring.allreduce(counts, stop))
                }
            };
            if let Err(e) = exchanged {
                if let Some(b) = &saved {
                    replica.restore_buffers(b);
                }
                return Err(e.into());
            }
            let summed = Tensor::from_slice(&self.buf[..n]).to_device(replica.device());
            let mut id_hash = 0u64;
            for r in 0..world {
                let mut h = 0u64;
                for i in 0..HASH_LIMBS {
                    h |= (self.buf[n + 3 + r * HASH_LIMBS + i] as u64 & 0xFFFF) << (16 * i);
                }
                id_hash = id_hash.wrapping_add(h);
            }
            (
                self.buf[n],
                f64::from(self.buf[n + 1]),
                Some(summed),
                self.buf[n + 2],
                id_hash,
            )
        };
        let comm = comm_started.elapsed().as_secs_f64();
        replica.progress.enter(StepPhase::Compute);
        let comm_bytes = ring.stats().bytes_sent.load(Ordering::Relaxed) - sent_before;
        let applied = Instant::now();
        let loss = loss_sum / f64::from(total.max(1.0));
        replica.apply_summed(summed, total, loss, lr, b.next)?;
        let epoch_done = replica.account(epoch, total as u64, id_hash);
        let compute = compute + applied.elapsed().as_secs_f64();
        Ok(StepFigures {
            loss,
            samples: total as usize,
            compute,
            comm,
            comm_bytes,
            votes,
            epoch_done,
        })
    }
}

/// One step of a ring of one on the batch `(x, y)` (the benchmark's
/// entry): forward, backward, gradients flattened, the optimizer on the
/// flat weights, the model's tensors updated. Returns the loss.
pub fn step_on(replica: &mut Replica, x: &Tensor, y: &Tensor, lr: f64) -> Result<f64, RoleError> {
    let b = Batch {
        x: x.shallow_clone(),
        y: y.shallow_clone(),
        samples: x.size().first().copied().unwrap_or(0).max(0) as usize,
        next: replica.cursor,
        id_hash: 0,
    };
    let f = RingStep::default().run(replica, b, &mut Ring::solo(), lr, &Shutdown::new())?;
    Ok(f.loss)
}
