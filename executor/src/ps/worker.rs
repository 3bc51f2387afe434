//! A parameter-server worker: one training rank that pulls every shard,
//! computes its gradient on its share of the global batch with the shared
//! [`Replica`] and pushes each shard its slice ([`super::links`] moves
//! them, every shard at once). The data cursor travels with the shard
//! versions in sync mode, so a membership change re-splits the rest of the
//! epoch; in async and bounded modes each worker walks its own share of
//! the data, and the next pull travels while this step computes where the
//! consistency allows ([`super::consistency::prefetches`]). There the
//! job's `until` says when it ends: a worker that walked its share says so
//! to shard 0, and rank 0 stops once every worker has (`all`) or once any
//! has (`first`). Each worker takes up its rank's place in the data from
//! shard 0 when a generation starts ([`super::places`]). Rank 0 seeds
//! empty shards, decides which step the shards checkpoint, reports the
//! curve, evaluates and, at the end, writes the final weights.
//!
//! A model's buffers (BatchNorm's running statistics) are the tail of the
//! flat vector: rank 0's pushes carry its buffers there and the others'
//! zeros, and each shard takes rank 0's as they are (`shard.rs`); they come
//! back with the weights on every pull, so every worker's forward starts
//! from rank 0's buffers, as PyTorch's DDP broadcasts them.
//!
//! Sync mode after a lost primary: the promoted standby may be one version
//! behind the other shards. The worker keeps its last step's gradient
//! ([`LastStep`], across generations) and pushes it again to the shards
//! that are behind before it pulls (one that has none pushes a zero
//! gradient over no samples), so it never trains on shards at different
//! versions.

use super::consistency::{self, AfterPull, AfterPush};
use super::links::{self, Exchange, PushReply, ShardMap};
use super::places::take_up_place;
use super::step::{catch_up, CatchingUp, LastStep, PsStep};
use super::to_wire;
use crate::context::Context;
use crate::data::{Batch, Cursor};
use crate::error::{guarded, RoleError};
use crate::replica::progress::{self, accuracy_suffix, ProgressLine};
use crate::replica::{self, Replica};
use crate::reports::Item;
use crate::role::Role;
use crate::storage::checkpoint::Policy;
use std::num::NonZeroU64;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;
use trainyard_common::cluster::{Assignment, LogLevel, StepPhase};
use trainyard_common::spec::{AsyncBuffers, Consistency, Until};
use trainyard_dataplane::ps::{Message, PushHeader};
use trainyard_shutdown::Shutdown;

/// Training batches an async or bounded job's final buffers are
/// recomputed over (BatchNorm's default momentum of 0.1 leaves the old
/// statistics a weight of 0.9⁵⁰ ≈ 0.5 %).
const RECALIBRATION_BATCHES: usize = 50;

/// How often rank 0 asks shard 0 whether every worker walked its share
/// (`until: all`).
const DONE_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Where a PS worker runs: its assignment and rank, its device, and the
/// executor's side of it (stop signal, report channel, shared context,
/// the sandbox its model's process runs in).
pub struct WorkerEnv<'a> {
    /// The job's assignment of this generation.
    pub a: &'a Assignment,
    /// This worker's rank.
    pub rank: u32,
    /// Where the model computes.
    pub device: tch::Device,
    /// The role's stop signal.
    pub stop: &'a Shutdown,
    /// Its reports.
    pub tx: &'a UnboundedSender<Item>,
    /// The executor's shared state.
    pub ctx: &'a Context,
    /// Where a user's module runs.
    pub host: &'a crate::replica::process::Host,
}

/// Runs a PS worker for one generation. `replica` carries the model (and
/// the newest pulled weights) to the next generation.
pub fn work(
    env: &WorkerEnv,
    replica: &mut Option<Replica>,
    last_step: &mut Option<LastStep>,
) -> Result<Option<replica::Outcome>, RoleError> {
    if replica.is_none() {
        *replica = Some(Replica::new(
            &env.a.spec,
            env.device,
            &env.ctx.fetcher,
            env.host,
        )?);
    }
    let Some(rep) = replica.as_mut() else {
        return Err(RoleError::ps_fatal("no replica"));
    };
    let mut worker = Worker::start(env, rep, last_step)?;
    while worker.step()? == Step::Busy {}
    worker.finish()
}

/// What one [`Worker::step`] did.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// A step was trained, or the shards were caught up, or a stale push
    /// is to be recomputed: more to do.
    Busy,
    /// The worker's share of the job is trained.
    Done,
}

/// One generation of a PS worker: its links to the shards, its place in
/// the data, and what it has reported.
struct Worker<'e> {
    env: &'e WorkerEnv<'e>,
    rep: &'e mut Replica,
    last_step: &'e mut Option<LastStep>,
    consistency: Consistency,
    /// When the job ends (out of sync).
    until: Until,
    /// Workers of this generation that walked their share, as shard 0
    /// last said.
    done_workers: u32,
    world: u32,
    ps: PsStep,
    /// This worker's own place in the data (async and bounded).
    local: Cursor,
    /// Where `batches` streams from.
    stream_at: Cursor,
    batches: std::sync::mpsc::Receiver<Batch>,
    data_stats: Option<std::sync::Arc<crate::data::DataStats>>,
    seen: crate::ring::train::DataSeen,
    /// Pushes rejected as stale, in all and since the last report.
    rejected: u64,
    rejected_since: u32,
    /// Rank 0 decides when the shards checkpoint: it marks one step's
    /// pushes (kept over re-pushes of that step) and every shard
    /// checkpoints the values that step produces.
    policy: Policy,
    flag: Option<NonZeroU64>,
    asked: bool,
    line: ProgressLine,
    mixed_warned: bool,
}

/// A trained batch on its way to the shards: what the step reports.
struct Computed {
    /// The job's steps, as this step counts them (computed once a step).
    total: u64,
    samples: usize,
    loss: f64,
    lr: f64,
    data_seconds: f64,
    compute_seconds: f64,
}

impl<'e> Worker<'e> {
    /// Connects to the shards (rank 0 seeds empty ones) and places the
    /// worker in the data.
    fn start(
        env: &'e WorkerEnv<'e>,
        rep: &'e mut Replica,
        last_step: &'e mut Option<LastStep>,
    ) -> Result<Worker<'e>, RoleError> {
        let WorkerEnv {
            a, rank, stop, ctx, ..
        } = *env;
        let world = a.workers.len() as u32;
        let consistency = a.spec.consistency_mode();
        // Rank 0's pushes carry its buffers (the shards take them as they
        // are); the others push zeros there. Ranks change between
        // generations.
        rep.set_carries_state(rank == 0);
        let map = ShardMap::new(a, rep).map_err(|e| RoleError::ps_fatal(e.to_string()))?;
        let mut links = links::connect(a, rank, &map, stop)?;
        let shards = links.len();
        if rank == 0 {
            seed_empty_shards(env, rep, &map, &mut links)?;
        }
        // A benchmark knob (slow-links-bench measures the step with and
        // without the overlap): `TRAINYARD_PS_PREFETCH=off` turns
        // prefetching off where the consistency would allow it; it never
        // turns it on.
        let prefetch = consistency::prefetches(consistency, world)
            && std::env::var("TRAINYARD_PS_PREFETCH").as_deref() != Ok("off");
        let mut ps = PsStep::new(links, map, prefetch);
        if consistency != Consistency::Sync {
            if let Some(at) = take_up_place(rep, &mut ps, world, stop)? {
                send_log(
                    env,
                    LogLevel::Info,
                    format!(
                        "worker {rank} resumes its share of the data at epoch {}, sample {} (step {}): rank {rank}'s place as shard 0 keeps it",
                        at.epoch, at.offset, rep.step
                    ),
                );
            }
        }
        let cursor = rep.cursor;
        let batches = rep.batches(rank, world, cursor);
        let data_stats = rep.data_stats();
        let worker = Worker {
            env,
            consistency,
            until: a.spec.until_mode(),
            done_workers: 0,
            world,
            ps,
            local: cursor,
            stream_at: cursor,
            batches,
            data_stats,
            seen: Default::default(),
            rejected: 0,
            rejected_since: 0,
            policy: Policy::new(a.spec.checkpoint, ctx.drain.clone())
                .asked_by(ctx.checkpoint_wanted.clone()),
            flag: None,
            asked: false,
            line: ProgressLine::default(),
            mixed_warned: false,
            rep,
            last_step,
        };
        worker.log(
            LogLevel::Info,
            format!(
                "worker {rank} of {world} starts with {shards} PS shard(s), {consistency:?} (generation {})",
                a.key.generation
            ),
        );
        Ok(worker)
    }

    fn log(&self, level: LogLevel, msg: String) {
        send_log(self.env, level, msg);
    }

    /// Pulls every shard, trains one batch and pushes its gradient.
    fn step(&mut self) -> Result<Step, RoleError> {
        let WorkerEnv { stop, ctx, .. } = *self.env;
        if stop.is_triggered() {
            return Err(RoleError::Stopped);
        }
        // Pull every shard at once.
        let pulled = Instant::now();
        ctx.progress.enter(StepPhase::Comm);
        let ex = self.ps.pull(self.rep, stop)?;
        let pull_seconds = pulled.elapsed().as_secs_f64();
        let version = ex.versions[0];
        if !self.shards_agree(&ex)? {
            return Ok(Step::Busy);
        }
        if self.consistency == Consistency::Sync {
            self.rep.step = version;
            self.rep.cursor = ex.cursor;
        } else {
            self.rep.cursor = self.local;
        }
        if self.rep.finished() {
            return Ok(Step::Done);
        }
        if self.until == Until::First && ex.finished > 0 {
            // Another worker walked its share first: the job ends here.
            self.done_workers = ex.finished;
            return Ok(Step::Done);
        }
        let (b, computed, grad) = self.compute()?;
        let pushed = Instant::now();
        ctx.progress.enter(StepPhase::Comm);
        let Some((staleness, push_bytes)) = self.push(&ex, &b, &computed, &grad)? else {
            // Too stale somewhere: re-pull and recompute this share for
            // the shards that refused it.
            return Ok(Step::Busy);
        };
        let comm = pull_seconds + pushed.elapsed().as_secs_f64();
        let comm_bytes = ex.bytes + push_bytes;
        if self.consistency != Consistency::Sync {
            self.rep.step += 1;
            self.local = b.next;
        }
        self.rep.set_last_loss(computed.loss);
        self.report(version, &computed, (comm, comm_bytes), staleness);
        if let Some(d) = ctx.hooks.slow_worker(self.env.rank) {
            stop.sleep(d);
        }
        Ok(Step::Busy)
    }

    /// Whether the shards' versions let this worker train (the version of
    /// shard 0's values); a shard a lost primary left a version behind
    /// gets this version's gradients again first.
    fn shards_agree(&mut self, ex: &Exchange) -> Result<bool, RoleError> {
        match consistency::after_pull(self.consistency, &ex.versions) {
            AfterPull::Train => {}
            AfterPull::CatchUp { .. } => {
                // All are then pulled at the same version.
                let env = self.env;
                let log = |level, msg| send_log(env, level, msg);
                let hi = catch_up(
                    &mut self.ps,
                    ex,
                    CatchingUp {
                        last_step: self.last_step,
                        a: env.a,
                        rank: env.rank,
                        rep: self.rep,
                        stop: env.stop,
                        log: &log,
                    },
                )?;
                self.ps.expect_all(hi);
                return Ok(false);
            }
            AfterPull::Mixed => {
                if !self.mixed_warned {
                    self.mixed_warned = true;
                    self.log(
                        LogLevel::Warn,
                        format!(
                            "worker {}: the PS shards are at versions {:?}, more than one apart (a shard restored from a checkpoint): training goes on from shard 0's version",
                            self.env.rank, ex.versions
                        ),
                    );
                }
            }
        }
        Ok(true)
    }

    /// The next batch of this worker's share, and its loss and gradient.
    fn compute(&mut self) -> Result<(Batch, Computed, Vec<f32>), RoleError> {
        let WorkerEnv {
            a, rank, stop, ctx, ..
        } = *self.env;
        let total = self.rep.total_steps(self.world);
        if self.rep.cursor != self.stream_at {
            self.stream_at = self.rep.cursor;
            self.batches = self.rep.batches(rank, self.world, self.stream_at);
        }
        let waited = Instant::now();
        ctx.progress.enter(StepPhase::Data);
        let Ok(b) = self.batches.recv() else {
            return Err(RoleError::ps_fatal(self.rep.loader_failure()));
        };
        self.stream_at = b.next;
        let data_seconds = waited.elapsed().as_secs_f64();
        ctx.progress.enter(StepPhase::Compute);
        let computed = Instant::now();
        let (loss_sum, grad) = self.ps.gradient(self.rep, &b, stop)?;
        let compute_seconds = computed.elapsed().as_secs_f64();
        let loss = loss_sum / b.samples.max(1) as f64;
        progress::check_finite(loss, self.rep.step + 1)?;
        let lr = progress::learning_rate(&a.spec, self.rep.step + 1, total);
        let c = Computed {
            total,
            samples: b.samples,
            loss,
            lr,
            data_seconds,
            compute_seconds,
        };
        Ok((b, c, grad))
    }

    /// Pushes `grad` of batch `b` to every shard that has not taken it
    /// (rank 0 marking the step the shards checkpoint, when one is due);
    /// the staleness it met and the bytes it sent, or `None` where a shard
    /// refused it as too stale and the share is to be recomputed.
    fn push(
        &mut self,
        ex: &Exchange,
        b: &Batch,
        c: &Computed,
        grad: &[f32],
    ) -> Result<Option<(u64, u64)>, RoleError> {
        let version = ex.versions[0];
        if self.env.rank == 0 && self.flag.is_none() {
            let total = c.total;
            let step = consistency::step_done(self.consistency, version, self.rep.step + 1);
            if self
                .policy
                .due(step, self.policy.vote() || self.asked, step >= total)
            {
                self.flag = NonZeroU64::new(step);
                self.policy.written(step);
                self.asked = false;
            }
        }
        let header = PushHeader {
            // Each shard's copy carries the version pulled from it.
            computed_at: version,
            samples: b.samples as u64,
            lr: c.lr,
            next_cursor: to_wire(b.next),
            checkpoint: self.flag,
        };
        let out = self.ps.push(ex, grad, header, self.env.stop);
        if self.consistency == Consistency::Sync {
            *self.last_step = Some(out.last);
        }
        let acks = out.acks?;
        self.asked |= acks.iter().any(|r| {
            matches!(
                r,
                PushReply::Ack {
                    checkpoint_wanted: true,
                    ..
                }
            )
        });
        let rejects = acks.iter().filter(|r| !r.accepted()).count() as u32;
        self.rejected += u64::from(rejects);
        self.rejected_since += rejects;
        // How many versions the shard had moved on since the pull (an
        // applied push bumps the version by one; sync pushes wait, so 0).
        let staleness = if self.consistency == Consistency::Sync {
            0
        } else {
            acks.iter()
                .zip(&ex.versions)
                .map(|(r, v)| r.version().saturating_sub(1).saturating_sub(*v))
                .max()
                .unwrap_or(0)
        };
        if self.ps.settle(self.consistency, ex) == AfterPush::Retry {
            return Ok(None);
        }
        self.flag = None;
        Ok(Some((staleness, out.bytes)))
    }

    /// Reports the step done: its metrics (held-out figures where an
    /// evaluation is due) and, from rank 0, a progress line now and then.
    fn report(&mut self, version: u64, c: &Computed, comm: (f64, u64), staleness: u64) {
        let WorkerEnv { rank, tx, ctx, .. } = *self.env;
        let (comm_seconds, comm_bytes) = comm;
        let total = c.total;
        let step_done = consistency::step_done(self.consistency, version, self.rep.step);
        let mut stats = progress::step_stats(
            step_done,
            c.loss,
            c.lr,
            progress::Timings {
                samples: c.samples,
                data_seconds: c.data_seconds,
                compute_seconds: c.compute_seconds,
                comm_seconds,
                comm_bytes,
            },
        );
        stats.staleness = Some(u32::try_from(staleness).unwrap_or(u32::MAX));
        if let Some(d) = &self.data_stats {
            self.seen.fill(d, &mut stats);
        }
        stats.rejected = std::mem::take(&mut self.rejected_since);
        ctx.progress.step_done(stats.step, comm_seconds);
        if progress::evaluation_due(rank, stats.step, total, false) {
            ctx.progress.enter(StepPhase::Eval);
            (stats.eval_loss, stats.eval_accuracy) = self.rep.evaluate_now();
            ctx.progress.enter(StepPhase::Data);
        }
        // Every worker reports (its rank keys the row); the curve is rank 0's.
        let _ = tx.send(Item::Metric(stats));
        if rank == 0 && self.line.due(&stats) {
            self.log(
                LogLevel::Info,
                format!(
                    "step {}: loss {:.4}, pull+push {:.1} ms of {:.1} ms, {} push(es) rejected so far{}",
                    stats.step,
                    c.loss,
                    comm_seconds * 1e3,
                    (c.data_seconds + c.compute_seconds + comm_seconds) * 1e3,
                    self.rejected,
                    accuracy_suffix(stats.eval_accuracy)
                ),
            );
        }
    }

    /// Out of sync, a worker that walked its share tells shard 0; under
    /// `until: all` rank 0 then waits until every worker has.
    fn say_done(&mut self) -> Result<(), RoleError> {
        let WorkerEnv { rank, stop, .. } = *self.env;
        if self.consistency == Consistency::Sync || !self.rep.finished() {
            return Ok(());
        }
        let mut done = self.ps.say_done(stop)?;
        self.done_workers = done;
        if rank != 0 || self.until != Until::All || done >= self.world {
            return Ok(());
        }
        // Waiting on peers, not stuck in its own work (the watchdog reads it).
        self.env.ctx.progress.enter(StepPhase::Comm);
        let waited = Instant::now();
        self.log(
            LogLevel::Info,
            format!(
                "worker 0 walked its share; {done} of {} workers have: waiting for the rest (until: all)",
                self.world
            ),
        );
        while done < self.world {
            if stop.sleep(DONE_POLL) {
                return Err(RoleError::Stopped);
            }
            done = self.ps.say_done(stop)?;
        }
        self.done_workers = done;
        self.log(
            LogLevel::Info,
            format!(
                "every worker walked its share; worker 0 waited {:.1} s",
                waited.elapsed().as_secs_f64()
            ),
        );
        Ok(())
    }

    /// After the last step: rank 0 pulls the final weights (out of sync:
    /// afresh, its buffers recomputed on them) and evaluates them; the
    /// job's outcome, rank 0's only.
    fn finish(mut self) -> Result<Option<replica::Outcome>, RoleError> {
        let WorkerEnv { a, rank, stop, .. } = *self.env;
        self.log(
            LogLevel::Info,
            format!(
                "worker {rank} done at step {}; {} push(es) were rejected as stale",
                self.rep.step, self.rejected
            ),
        );
        self.say_done()?;
        if rank != 0 {
            return Ok(None);
        }
        let Worker {
            rep,
            mut ps,
            consistency,
            world,
            ..
        } = self;
        if consistency != Consistency::Sync {
            // The prefetched values miss the last pushes: the final
            // weights are pulled afresh.
            let updates = ps.pull_fresh(rep, stop)?;
            let until = match self.until {
                Until::All => "all",
                Until::First => "first",
            };
            send_log(
                self.env,
                LogLevel::Info,
                format!(
                    "the job ends (until: {until}): {} of {world} workers walked their share of the data; shard 0 applied {updates} updates",
                    self.done_workers
                ),
            );
            // The buffers rank 0 pushed were gathered on older weights
            // than these: they are recomputed on them, so that the model
            // evaluates in eval mode as its weights deserve.
            let rules = a.spec.stale_updates.unwrap_or_default();
            let used = if rules.buffers == AsyncBuffers::Recompute {
                rep.recalibrate_buffers(rank, world, RECALIBRATION_BATCHES)?
            } else {
                0
            };
            if used > 0 {
                send_log(
                    self.env,
                    LogLevel::Info,
                    format!("worker 0: the model's buffers (BatchNorm statistics) recomputed on the final weights over {used} training batches"),
                );
            }
        }
        rep.evaluate_now();
        Ok(Some(rep.outcome()))
    }
}

/// A line of the job's log (and this executor's).
fn send_log(env: &WorkerEnv, level: LogLevel, msg: String) {
    tracing::info!(job = %env.a.key.job_id, "{msg}");
    let _ = env.tx.send(Item::Log(level, msg));
}

/// Rank 0 seeds empty shards: at the start with the seeded
/// initialisation, after a PS executor was lost with the newest weights
/// it pulled.
fn seed_empty_shards(
    env: &WorkerEnv,
    rep: &Replica,
    map: &ShardMap,
    links: &mut [links::Link],
) -> Result<(), RoleError> {
    let flat = rep.read_range(0, rep.numel());
    for (s, link) in links.iter_mut().enumerate() {
        let init = Message::Init {
            version: rep.step,
            cursor: to_wire(rep.cursor),
        };
        let reply = link.call(&init, &map.gather(s, &flat), 0, env.stop)?;
        let took = matches!(
            reply,
            Message::Ack {
                values_taken: true,
                ..
            }
        );
        if took && rep.step > 0 {
            send_log(
                env,
                LogLevel::Info,
                format!(
                    "PS shard {s} had no values: restored from this worker's newest pull (version {})",
                    rep.step
                ),
            );
        }
    }
    Ok(())
}

/// What a PS worker leaves for the next generation on its device.
#[derive(Default)]
pub struct KeptWorker {
    /// The model, holding the newest weights it pulled.
    pub replica: Option<Replica>,
    /// Its last sync step, for shards a lost primary left a version behind.
    pub last_step: Option<LastStep>,
}

/// A PS worker's life in one generation: trains until done, retrying when a
/// shard is unreachable (until the scheduler's next generation).
pub fn run_worker(role: &Role, rank: u32, device: tch::Device, kept: KeptWorker) -> KeptWorker {
    let KeptWorker {
        mut replica,
        mut last_step,
    } = kept;
    let a = &role.assignment;
    loop {
        if role.stopping() {
            return KeptWorker { replica, last_step };
        }
        let result = guarded(|| {
            let host = role.host();
            let env = WorkerEnv {
                a,
                rank,
                device,
                stop: &role.stop,
                tx: &role.tx,
                ctx: &role.ctx,
                host: &host,
            };
            work(&env, &mut replica, &mut last_step)
        });
        match result {
            // The finished model is kept for a generation that may still come.
            Ok(Some(out)) => {
                role.finish(&out, replica.as_ref());
                return KeptWorker { replica, last_step };
            }
            Ok(None) | Err(RoleError::Stopped) => return KeptWorker { replica, last_step },
            Err(e) if e.is_transient() => {
                if !role.stopping() {
                    role.ctx.suspects.check(a, format!("PS worker {rank}: {e}"));
                    role.log(
                        LogLevel::Warn,
                        format!("{e}: keeping the model and retrying until the next generation"),
                    );
                }
                if role.stop.retry_pause() {
                    return KeptWorker { replica, last_step };
                }
            }
            Err(e) => {
                role.end(&e);
                return KeptWorker::default();
            }
        }
    }
}
