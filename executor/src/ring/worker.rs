//! A ring rank's life in one generation.
//!
//! [`run`] connects the rank to its neighbours through the executor's data
//! plane, joins the ring's state ([`mod@super::join`]), trains
//! ([`super::train::train_with`]) and reports; rank 0 writes the final
//! weights and the job's outcome ([`Role::finish`]). The replica outlives
//! the generation: when the ring breaks (a peer died) the rank keeps it at
//! the last completed step and retries until the scheduler's next
//! generation, whose role on the same device takes it over ([`Kept`]). A
//! drained rank leaves a whole checkpoint on its way out.

use super::join::{join, Joining, Resume};
use super::train::{train_with, write_slice};
use super::{COLLECTIVE_TIMEOUT, RING_CONNECT_TIMEOUT};
use crate::error::{guarded, RoleError};
use crate::replica::progress::{accuracy_suffix, ProgressLine, StepStats};
use crate::replica::{Outcome, Replica};
use crate::reports::Item;
use crate::role::Role;
use crate::storage::checkpoint::Checkpointing;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use trainyard_common::cluster::{LogLevel, WorkerPeer};
use trainyard_dataplane::{Ring, RingConfig};

/// What a rank leaves for the next generation on its device.
#[derive(Default)]
pub struct Kept {
    /// The replica, at its last completed step.
    pub replica: Option<Replica>,
    /// When the ring broke (the rebuilt ring's first step says how long
    /// the recovery took).
    pub broke_at: Option<Instant>,
}

/// Runs rank `rank` of `peers` on `device` until the job is done, the ring
/// keeps failing past this generation, or the role is stopped.
pub fn run(role: &Role, rank: u32, peers: &[&WorkerPeer], device: tch::Device, kept: Kept) -> Kept {
    let a = &role.assignment;
    let world = peers.len() as u32;
    let Kept {
        mut replica,
        mut broke_at,
    } = kept;
    let config = RingConfig {
        job: a.key.job_id,
        generation: a.key.generation,
        rank,
        peers: peers.iter().map(|p| p.address.clone()).collect(),
        secret: a.secret.clone().into_bytes(),
        connect_timeout: RING_CONNECT_TIMEOUT,
        collective_timeout: COLLECTIVE_TIMEOUT,
    };
    let mut ckpt = role.checkpointing();
    let me = Rank {
        role,
        rank,
        world,
        device,
    };
    // Trained to the end (and stays around to be joined).
    let mut done = false;
    loop {
        if role.stopping() {
            drain_checkpoint(role, &replica, &mut ckpt);
            return Kept { replica, broke_at };
        }
        let Some(mut ring) = me.connect(&config, done) else {
            if role.stop.retry_pause() {
                return Kept { replica, broke_at };
            }
            continue;
        };
        let result = guarded(|| me.train(&mut ring, &mut replica, &mut broke_at, ckpt.as_mut()));
        match result {
            Ok(out) => {
                if !done {
                    me.done(&ring, &out, replica.as_ref(), ckpt.as_ref());
                }
                done = true;
                // The finished replica is kept: a generation that arrives
                // before the outcome was applied resumes from it (zero steps
                // to go) instead of from scratch.
                if rank == 0 {
                    return Kept { replica, broke_at };
                }
                // The other ranks stay joinable until the job ends: if rank
                // 0's last collective failed where theirs succeeded, it
                // rebuilds the ring with them and receives the final state.
                drop(ring);
                if role.stop.retry_pause() {
                    return Kept { replica, broke_at };
                }
            }
            Err(RoleError::Stopped) => {
                drain_checkpoint(role, &replica, &mut ckpt);
                return Kept { replica, broke_at };
            }
            Err(e) if e.is_transient() => {
                if role.stopping() {
                    drain_checkpoint(role, &replica, &mut ckpt);
                    return Kept { replica, broke_at };
                }
                broke_at.get_or_insert_with(Instant::now);
                // A neighbour may be dead: its peers are probed and an
                // unreachable one reported at once (not after the
                // heartbeat timeout).
                role.ctx.suspects.check(a, format!("ring rank {rank}: {e}"));
                role.log(
                    LogLevel::Warn,
                    format!(
                        "{e} at step {}: keeping the replica and waiting for the ring to form again",
                        replica.as_ref().map_or(0, |r| r.step)
                    ),
                );
                drop(ring);
                if role.stop.retry_pause() {
                    return Kept { replica, broke_at };
                }
            }
            Err(e) => {
                role.end(&e);
                return Kept::default();
            }
        }
    }
}

/// A drained rank leaves a whole checkpoint (it holds the whole state).
fn drain_checkpoint(role: &Role, replica: &Option<Replica>, ckpt: &mut Option<Checkpointing>) {
    let (Some(r), Some(c)) = (replica.as_ref(), ckpt.as_mut()) else {
        return;
    };
    if !role.ctx.drain.is_draining() || c.policy.last_step() == Some(r.step) || r.step == 0 {
        return;
    }
    role.log(
        LogLevel::Info,
        format!("draining: writing a checkpoint of step {}", r.step),
    );
    write_slice(r, c, 0, 1);
    c.uploader.flush(Duration::from_secs(60));
}

/// This rank of the job's ring.
struct Rank<'a> {
    role: &'a Role,
    rank: u32,
    world: u32,
    device: tch::Device,
}

impl Rank<'_> {
    /// This generation's ring (a ring of one alone); `None` where it could
    /// not be connected (said, and the peers checked, unless the rank is
    /// stopping or done).
    fn connect(&self, config: &RingConfig, done: bool) -> Option<Ring> {
        if self.world == 1 {
            return Some(Ring::solo());
        }
        let role = self.role;
        match Ring::connect(&role.plane, config, &role.stop) {
            Ok(r) => Some(r),
            Err(e) => {
                if !role.stopping() && !done {
                    role.log(LogLevel::Warn, format!("{e}; retrying"));
                    role.ctx
                        .suspects
                        .check(&role.assignment, format!("ring rank {}: {e}", self.rank));
                }
                None
            }
        }
    }

    /// Joins the ring's state (the replica made, loaded or received) and
    /// trains to the end of the job, reporting each step.
    fn train(
        &self,
        ring: &mut Ring,
        replica: &mut Option<Replica>,
        broke_at: &mut Option<Instant>,
        ckpt: Option<&mut Checkpointing>,
    ) -> Result<Outcome, RoleError> {
        let role = self.role;
        let a = &role.assignment;
        let load = |r: &mut Replica| role.resume_into(r);
        let host = role.host();
        let source = join(
            ring,
            replica,
            Joining {
                spec: &a.spec,
                device: self.device,
                fetcher: &role.ctx.fetcher,
                host: &host,
                stop: &role.stop,
                resume: a.resume.as_ref().map(|_| &load as Resume<'_>),
            },
        )?;
        let Some(r) = replica.as_mut() else {
            return Err(RoleError::Assignment("no replica after joining".into()));
        };
        match source.filter(|_| self.world > 1) {
            Some(s) if s != self.rank => role.log(
                LogLevel::Info,
                format!(
                    "received weights and optimizer state of step {} from rank {s}",
                    r.step
                ),
            ),
            Some(_) => role.log(
                LogLevel::Info,
                format!(
                    "sent weights and optimizer state of step {} to the ring",
                    r.step
                ),
            ),
            None => {}
        }
        r.progress = role.ctx.progress.clone();
        let mut line = ProgressLine::default();
        let slow = role.ctx.hooks.slow_worker(self.rank);
        let mut on_step = |s: &StepStats| {
            if let Some(d) = slow {
                role.stop.sleep(d);
            }
            if let Some(t) = broke_at.take() {
                role.log(
                    LogLevel::Info,
                    format!(
                        "ring of {} rebuilt (generation {}): first step {} ran {:.2} s after the previous ring broke",
                        self.world,
                        a.key.generation,
                        s.step,
                        t.elapsed().as_secs_f64()
                    ),
                );
            }
            if self.rank == 0 {
                self.report(s, &mut line);
            }
        };
        train_with(r, ring, &role.stop, &mut on_step, ckpt)
    }

    /// Rank 0's step: its metrics, an epoch's summary, a progress line
    /// now and then.
    fn report(&self, s: &StepStats, line: &mut ProgressLine) {
        let tx = &self.role.tx;
        let _ = tx.send(Item::Metric(*s));
        if let Some(e) = s.epoch_done {
            let _ = tx.send(Item::Log(
                LogLevel::Info,
                format!(
                    "epoch {} consumed {} samples, sample-id hash {:016x}",
                    e.epoch, e.samples, e.id_hash
                ),
            ));
        }
        if line.due(s) {
            let _ = tx.send(Item::Log(
                LogLevel::Info,
                format!(
                    "step {}: loss {:.4}, {:.0} samples/s, all-reduce {:.1} ms ({:.2} GB/s bus){}",
                    s.step,
                    s.loss,
                    s.samples_per_sec,
                    s.comm_seconds * 1e3,
                    s.comm_bytes as f64 / s.comm_seconds.max(1e-9) / 1e9,
                    accuracy_suffix(s.eval_accuracy)
                ),
            ));
        }
    }

    /// The first time the rank finished: said, and rank 0 (once the final
    /// checkpoint is in) writes the final weights and the job's outcome.
    fn done(
        &self,
        ring: &Ring,
        out: &Outcome,
        replica: Option<&Replica>,
        ckpt: Option<&Checkpointing>,
    ) {
        let bw = ring.stats().bytes_sent.load(Ordering::Relaxed);
        self.role.log(
            LogLevel::Info,
            format!(
                "rank {} of {} done at step {}: weights sha256 {} ({} MiB sent on the ring)",
                self.rank,
                self.world,
                out.steps,
                out.weights_sha256,
                bw >> 20
            ),
        );
        if self.rank == 0 {
            // The final checkpoint is in before the job ends.
            if let Some(c) = ckpt {
                c.uploader.flush(Duration::from_secs(120));
            }
            self.role.finish(out, replica);
        }
    }
}
