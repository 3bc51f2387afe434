//! A parameter-server worker: one training rank that pulls every shard,
//! computes its gradient on its share of the global batch with the shared
//! [`Replica`] and pushes each shard its slice ([`super::links`] moves
//! them, every shard at once). The data cursor travels with the shard
//! versions in sync mode, so a membership change re-splits the rest of the
//! epoch; in async and bounded modes each worker walks its own share of
//! the data, and the next pull travels while this step computes where the
//! consistency allows ([`super::consistency::prefetches`]). Rank 0 seeds
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
use super::links::{self, PushReply, ShardMap};
use super::step::{catch_up, LastStep, PsStep};
use super::to_wire;
use crate::context::Context;
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
use trainyard_common::spec::{AsyncBuffers, Consistency};
use trainyard_dataplane::ps::{Message, PushHeader};
use trainyard_shutdown::Shutdown;

/// Training batches an async or bounded job's final buffers are
/// recomputed over (BatchNorm's default momentum of 0.1 leaves the old
/// statistics a weight of 0.9⁵⁰ ≈ 0.5 %).
const RECALIBRATION_BATCHES: usize = 50;

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
    let WorkerEnv {
        a,
        rank,
        device,
        stop,
        tx,
        ctx,
        host,
    } = *env;
    let log = |level, msg: String| {
        tracing::info!(job = %a.key.job_id, "{msg}");
        let _ = tx.send(Item::Log(level, msg));
    };
    let world = a.workers.len() as u32;
    let consistency = a.spec.consistency_mode();
    if replica.is_none() {
        *replica = Some(Replica::new(&a.spec, device, &ctx.fetcher, host)?);
    }
    let Some(rep) = replica.as_mut() else {
        return Err(RoleError::ps_fatal("no replica"));
    };
    // Rank 0's pushes carry its buffers (the shards take them as they
    // are); the others push zeros there. Ranks change between generations.
    rep.set_carries_state(rank == 0);
    let map = ShardMap::new(a, rep).map_err(|e| RoleError::ps_fatal(e.to_string()))?;
    let mut links = links::connect(a, rank, &map, stop)?;
    let shards = links.len();
    let generation = a.key.generation;
    // Rank 0 seeds empty shards: at the start with the seeded
    // initialisation, after a PS executor was lost with the newest weights
    // it pulled.
    if rank == 0 {
        let flat = rep.read_range(0, rep.numel());
        for (s, link) in links.iter_mut().enumerate() {
            let init = Message::Init {
                version: rep.step,
                cursor: to_wire(rep.cursor),
            };
            let reply = link.call(&init, &map.gather(s, &flat), 0, stop)?;
            let took = matches!(
                reply,
                Message::Ack {
                    values_taken: true,
                    ..
                }
            );
            if took && rep.step > 0 {
                log(
                    LogLevel::Info,
                    format!("PS shard {s} had no values: restored from this worker's newest pull (version {})", rep.step),
                );
            }
        }
    }
    // A benchmark knob (slow-links-bench measures the step with and
    // without the overlap): `TRAINYARD_PS_PREFETCH=off` turns prefetching
    // off where the consistency would allow it; it never turns it on.
    let prefetch = consistency::prefetches(consistency, world)
        && std::env::var("TRAINYARD_PS_PREFETCH").as_deref() != Ok("off");
    let mut ps = PsStep::new(links, map, prefetch);
    let mut local = rep.cursor;
    let mut stream_at = rep.cursor;
    let mut batches = rep.batches(rank, world, stream_at);
    let data_stats = rep.data_stats();
    let mut seen = crate::ring::train::DataSeen::default();
    let mut rejected = 0u64;
    let mut rejected_since = 0u32;
    // Rank 0 decides when the shards checkpoint: it marks one step's pushes
    // (kept over re-pushes of that step) and every shard checkpoints the
    // values that step produces.
    let mut policy =
        Policy::new(a.spec.checkpoint, ctx.drain.clone()).asked_by(ctx.checkpoint_wanted.clone());
    let mut flag: Option<NonZeroU64> = None;
    let mut asked = false;
    let mut line = ProgressLine::default();
    let mut mixed_warned = false;
    log(
        LogLevel::Info,
        format!(
            "worker {rank} of {world} starts with {shards} PS shard(s), {consistency:?} (generation {generation})"
        ),
    );
    loop {
        if stop.is_triggered() {
            return Err(RoleError::Stopped);
        }
        // Pull every shard at once.
        let pulled = Instant::now();
        ctx.progress.enter(StepPhase::Comm);
        let ex = ps.pull(rep, stop)?;
        let mut comm = pulled.elapsed().as_secs_f64();
        let mut comm_bytes = ex.bytes;
        let version = ex.versions[0];
        match consistency::after_pull(consistency, &ex.versions) {
            AfterPull::Train => {}
            AfterPull::CatchUp { .. } => {
                // A lost primary left its shard a version behind the
                // others: it gets this version's gradients again, then all
                // are pulled at the same version.
                let hi = catch_up(&mut ps, &ex, last_step, a, rank, rep, stop, &log)?;
                ps.expect_all(hi);
                continue;
            }
            AfterPull::Mixed => {
                if !mixed_warned {
                    mixed_warned = true;
                    log(
                        LogLevel::Warn,
                        format!(
                            "worker {rank}: the PS shards are at versions {:?}, more than one apart (a shard restored from a checkpoint): training goes on from shard 0's version",
                            ex.versions
                        ),
                    );
                }
            }
        }
        if consistency == Consistency::Sync {
            rep.step = version;
            rep.cursor = ex.cursor;
        } else {
            rep.cursor = local;
        }
        let total = rep.total_steps(world);
        if rep.finished() {
            break;
        }
        if rep.cursor != stream_at {
            stream_at = rep.cursor;
            batches = rep.batches(rank, world, stream_at);
        }
        let waited = Instant::now();
        ctx.progress.enter(StepPhase::Data);
        let Ok(b) = batches.recv() else {
            return Err(RoleError::ps_fatal(rep.loader_failure()));
        };
        stream_at = b.next;
        let data_seconds = waited.elapsed().as_secs_f64();
        ctx.progress.enter(StepPhase::Compute);
        let computed = Instant::now();
        let computed_grad = ps.gradient(rep, &b, stop);
        let (loss_sum, grad) = computed_grad?;
        let compute = computed.elapsed().as_secs_f64();
        let loss = loss_sum / b.samples.max(1) as f64;
        progress::check_finite(loss, rep.step + 1)?;
        let lr = progress::learning_rate(&a.spec, rep.step + 1, total);
        if rank == 0 && flag.is_none() {
            let step = consistency::step_done(consistency, version, rep.step + 1);
            if policy.due(step, policy.vote() || asked, step >= total) {
                flag = NonZeroU64::new(step);
                policy.written(step);
                asked = false;
            }
        }
        let pushed = Instant::now();
        ctx.progress.enter(StepPhase::Comm);
        let header = PushHeader {
            // Each shard's copy carries the version pulled from it.
            computed_at: version,
            samples: b.samples as u64,
            lr,
            next_cursor: to_wire(b.next),
            checkpoint: flag,
        };
        let out = ps.push(&ex, &grad, header, stop);
        if consistency == Consistency::Sync {
            *last_step = Some(out.last);
        }
        let acks = out.acks?;
        asked |= acks.iter().any(|r| {
            matches!(
                r,
                PushReply::Ack {
                    checkpoint_wanted: true,
                    ..
                }
            )
        });
        comm += pushed.elapsed().as_secs_f64();
        comm_bytes += out.bytes;
        let rejects = acks.iter().filter(|r| !r.accepted()).count() as u32;
        rejected += u64::from(rejects);
        rejected_since += rejects;
        // How many versions the shard had moved on since the pull (an
        // applied push bumps the version by one; sync pushes wait, so 0).
        let staleness = if consistency == Consistency::Sync {
            0
        } else {
            acks.iter()
                .zip(&ex.versions)
                .map(|(r, v)| r.version().saturating_sub(1).saturating_sub(*v))
                .max()
                .unwrap_or(0)
        };
        if ps.settle(consistency, &ex) == AfterPush::Retry {
            // Too stale somewhere: re-pull and recompute this share for
            // the shards that refused it.
            continue;
        }
        flag = None;
        if consistency != Consistency::Sync {
            rep.step += 1;
            local = b.next;
        }
        rep.set_last_loss(loss);
        let step_done = consistency::step_done(consistency, version, rep.step);
        let mut stats = progress::step_stats(
            step_done,
            loss,
            lr,
            progress::Timings {
                samples: b.samples,
                data_seconds,
                compute_seconds: compute,
                comm_seconds: comm,
                comm_bytes,
            },
        );
        stats.staleness = Some(u32::try_from(staleness).unwrap_or(u32::MAX));
        if let Some(d) = &data_stats {
            seen.fill(d, &mut stats);
        }
        stats.rejected = std::mem::take(&mut rejected_since);
        ctx.progress.step_done(stats.step, comm);
        if progress::evaluation_due(rank, stats.step, total, false) {
            ctx.progress.enter(StepPhase::Eval);
            (stats.eval_loss, stats.eval_accuracy) = rep.evaluate_now();
            ctx.progress.enter(StepPhase::Data);
        }
        // Every worker reports (its rank keys the row); the curve is rank 0's.
        let _ = tx.send(Item::Metric(stats));
        if rank == 0 && line.due(&stats) {
            log(
                LogLevel::Info,
                format!(
                    "step {}: loss {loss:.4}, pull+push {:.1} ms of {:.1} ms, {rejected} push(es) rejected so far{}",
                    stats.step,
                    comm * 1e3,
                    (data_seconds + compute + comm) * 1e3,
                    accuracy_suffix(stats.eval_accuracy)
                ),
            );
        }
        if let Some(d) = ctx.hooks.slow_worker(rank) {
            stop.sleep(d);
        }
    }
    log(
        LogLevel::Info,
        format!(
            "worker {rank} done at step {}; {rejected} push(es) were rejected as stale",
            rep.step
        ),
    );
    if rank != 0 {
        return Ok(None);
    }
    if consistency != Consistency::Sync {
        // The prefetched values miss the last pushes: the final weights are
        // pulled afresh.
        ps.pull_fresh(rep, stop)?;
        // The buffers rank 0 pushed were gathered on older weights than
        // these: they are recomputed on them, so that the model evaluates
        // in eval mode as its weights deserve.
        let rules = a.spec.stale_updates.unwrap_or_default();
        let used = if rules.buffers == AsyncBuffers::Recompute {
            rep.recalibrate_buffers(rank, world, RECALIBRATION_BATCHES)?
        } else {
            0
        };
        if used > 0 {
            log(
                LogLevel::Info,
                format!("worker 0: the model's buffers (BatchNorm statistics) recomputed on the final weights over {used} training batches"),
            );
        }
    }
    rep.evaluate_now();
    Ok(Some(rep.outcome()))
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
