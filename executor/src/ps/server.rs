//! The shard server: one PS role for one generation. It takes over the
//! shard's state (parked from the previous generation, or restored from
//! the newest committed checkpoint), registers the shard's data-plane
//! endpoint and serves each worker's connection on a thread of its own:
//! `Init` seeds an empty shard, `Pull` is answered with the newest
//! published version once it is at least the one asked for, and `Push`
//! hands the gradient to [`Shard::take`] and answers once the version it
//! produced is published (its standby has it) — after which the
//! checkpoint that push asked for is handed to the uploader. `Done` counts
//! a worker that walked its share (the count rides on every `Weights`). A draining
//! executor's shard asks rank 0 for a checkpoint in its answer, once.
//! With a standby, a replicator thread ([`super::standby::replicate`])
//! runs beside the connections.

use super::ranges::shard_len;
use super::shard::{Locked, Rules, Shard};
use super::standby::{self, Reporting, StandbyLink};
use super::{from_wire, read_current, PS_TIMEOUT};
use crate::context::{Context, Drain};
use crate::data::Cursor;
use crate::replica::optim::FlatOptimizer;
use crate::reports::Item;
use crate::storage::checkpoint::Uploader;
use crate::storage::OpenedStorage;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use trainyard_common::cluster::{Assignment, LogLevel, PsPeer, Range, RoleOutcome};
use trainyard_dataplane::frame::Patient;
use trainyard_dataplane::ps::{self, Message, PushHeader, WireError};
use trainyard_dataplane::{DataPlane, EndpointKey, EndpointRole};
use trainyard_shutdown::Shutdown;

/// What a shard server's connection threads share.
struct Served {
    shard: Locked,
    rules: Rules,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    index: u32,
    shards: u32,
    numel: u64,
    uploader: Option<Uploader>,
    /// Whether the executor drains (the shard then asks rank 0 for a
    /// checkpoint).
    drain: Drain,
}

/// A shard role's side of the executor: its assignment, stop signal,
/// reports and shared context.
#[derive(Clone, Copy)]
struct Role<'a> {
    a: &'a Assignment,
    stop: &'a Shutdown,
    tx: &'a UnboundedSender<Item>,
    ctx: &'a Context,
}

impl Role<'_> {
    fn log(&self, level: LogLevel, msg: String) {
        tracing::info!(job = %self.a.key.job_id, "{msg}");
        let _ = self.tx.send(Item::Log(level, msg));
    }
}

/// Runs shard `a.key.index` of a job for one generation; returns its state
/// for the next one.
pub fn serve_shard(
    a: &Assignment,
    stop: &Shutdown,
    tx: &UnboundedSender<Item>,
    plane: &DataPlane,
    parked: Option<Shard>,
    storage: OpenedStorage,
    ctx: &Context,
) -> Option<Shard> {
    let role = Role { a, stop, tx, ctx };
    let primaries = a.primaries();
    let numel: u64 = primaries.iter().map(|p| shard_len(&p.ranges) as u64).sum();
    let Some(me) = primaries.iter().find(|p| p.shard == a.key.index) else {
        role.log(
            LogLevel::Error,
            format!("shard {} is not in its own assignment", a.key.index),
        );
        return parked;
    };
    let mut parked = parked;
    let Some(mut shard) = take_over(role, &mut parked, &me.ranges) else {
        return parked;
    };
    restore_if_empty(role, &mut shard, &me.ranges, numel, &storage);
    let uploader = start_uploader(role, &storage);
    let standby = a.standby_of(a.key.index);
    // A new membership: the half-summed version of the old one is dropped;
    // a new standby (or a new connection to the old one) gets the whole
    // state before anything more is published.
    shard.begin(a.key.generation, a.workers.len() as u32, standby.is_some());
    role.log(
        LogLevel::Info,
        format!(
            "PS shard {} serves {} values ({} ranges) for {} worker(s), {:?}, at version {}{}{} (generation {})",
            a.key.index,
            shard_len(&me.ranges),
            me.ranges.len(),
            shard.expected,
            a.spec.consistency_mode(),
            shard.version,
            if shard.weights.is_some() { "" } else { ", waiting for initial values" },
            standby.map_or(String::new(), |p| format!(", with a standby at {}", p.address)),
            a.key.generation
        ),
    );
    let served = Served {
        shard: Locked::new(shard),
        rules: Rules::of(&a.spec),
        bytes_in: AtomicU64::new(0),
        bytes_out: AtomicU64::new(0),
        index: a.key.index,
        shards: primaries.len() as u32,
        numel,
        uploader,
        drain: ctx.drain.clone(),
    };
    let link = serve(role, plane, &served, standby);
    let Served {
        shard,
        uploader,
        bytes_in,
        bytes_out,
        ..
    } = served;
    if let Some(u) = uploader {
        u.flush(Duration::from_secs(60));
    }
    let shard = shard.into_inner();
    role.log(
        LogLevel::Info,
        shard.stats_line(
            a.key.index,
            bytes_in.load(Ordering::Relaxed),
            bytes_out.load(Ordering::Relaxed),
        ),
    );
    if let Some(link) = link {
        role.log(
            LogLevel::Info,
            format!(
                "PS shard {}: its standby acknowledged {} message(s), {} attempt(s) failed (generation {})",
                a.key.index, link.acked, link.failures, a.key.generation
            ),
        );
    }
    Some(shard)
}

/// A shard without values (a new PS executor, or the whole fleet was
/// lost) takes its `ranges` from the newest committed checkpoint.
fn restore_if_empty(
    role: Role<'_>,
    shard: &mut Shard,
    ranges: &[Range],
    numel: u64,
    storage: &OpenedStorage,
) {
    let a = role.a;
    let (None, Some(at), Ok(st)) = (shard.weights.as_ref(), a.resume.as_ref(), storage.as_ref())
    else {
        return;
    };
    let states = FlatOptimizer::state_tensors(a.spec.optimizer().kind);
    match crate::storage::checkpoint::load(st, at, ranges, numel, states) {
        Ok(l) => {
            shard.restore(&l);
            role.log(
                LogLevel::Info,
                format!(
                    "PS shard {} restored from the checkpoint of step {} (job {})",
                    a.key.index, l.step, at.job_id
                ),
            );
        }
        Err(e) => role.log(
            LogLevel::Warn,
            format!(
                "PS shard {}: cannot restore from the checkpoint of step {}: {e}",
                a.key.index, at.step
            ),
        ),
    }
}

/// The uploader of the shard's checkpoints (`None`, said in the log,
/// where the object store cannot be opened).
fn start_uploader(role: Role<'_>, storage: &OpenedStorage) -> Option<Uploader> {
    match storage {
        Ok(st) => Some(Uploader::start(
            st.clone(),
            role.a.key.job_id,
            role.tx.clone(),
            role.ctx.uploads.clone(),
            role.ctx.hooks.upload_delay,
        )),
        Err(e) => {
            role.log(
                LogLevel::Warn,
                format!("no checkpoints: the object store cannot be opened: {e}"),
            );
            None
        }
    }
}

/// The shard this generation serves: the `parked` one where it holds the
/// same `ranges` (values of other parameters would otherwise be served
/// under these names), else a new empty one; `None` (the parked shard
/// left where it was) where no generation can serve these ranges, and the
/// job is failed.
fn take_over(role: Role<'_>, parked: &mut Option<Shard>, ranges: &[Range]) -> Option<Shard> {
    let a = role.a;
    let mut shard = match parked.take() {
        Some(s) if s.ranges == ranges => s,
        other => {
            *parked = other;
            match Shard::new(a, ranges.to_vec()) {
                Ok(s) => s,
                Err(e) => {
                    let reason = format!("PS shard {}'s assignment: {e}", a.key.index);
                    role.log(LogLevel::Error, reason.clone());
                    let _ = role.tx.send(Item::Outcome(RoleOutcome::Failed { reason }));
                    return None;
                }
            }
        }
    };
    if std::mem::take(&mut shard.was_standby) && shard.weights.is_none() {
        // Promoted before its primary ever reached it: whatever the
        // primary applied is gone; the values come from the newest
        // checkpoint, else from rank 0's newest pull.
        role.log(
            LogLevel::Error,
            format!(
                "PS shard {} was promoted from a standby that never received the shard's state (generation {}): updates its primary applied are lost; the shard restarts from the newest checkpoint or rank 0's newest pull",
                a.key.index, a.key.generation
            ),
        );
    }
    Some(shard)
}

/// Serves the workers' connections (each on a thread of its own) until
/// `stop`, with a replicator beside them where the shard has a `standby`;
/// the standby's link once it is done, for its counters.
fn serve(
    role: Role<'_>,
    plane: &DataPlane,
    served: &Served,
    standby: Option<&PsPeer>,
) -> Option<StandbyLink> {
    let Role { a, stop, tx, ctx } = role;
    let report = Reporting {
        index: a.key.index,
        job: a.key.job_id,
        tx,
        slow: ctx.hooks.slow_standby(a.key.index),
    };
    // The replicator reaches the standby in its own time: an unreachable
    // standby never keeps the shard from registering its endpoint.
    let endpoint = plane.register(
        EndpointKey {
            job: a.key.job_id,
            kind: EndpointRole::ParameterServer,
            rank: a.key.index,
        },
        a.key.generation,
        a.secret.as_bytes(),
    );
    let generation = a.key.generation;
    let mut last_log = Instant::now();
    std::thread::scope(|scope| {
        let replicator = standby.map(|p| {
            let (link, report) = (StandbyLink::new(a, p), &report);
            scope.spawn(move || standby::replicate(&served.shard, link, report, stop))
        });
        while !stop.is_triggered() {
            if let Some((from, stream)) =
                endpoint.accept(Instant::now() + Duration::from_millis(200), stop)
            {
                scope.spawn(move || {
                    let ended = connection(stream, from, generation, served, stop);
                    if let Err(e) = &ended {
                        tracing::debug!(error = %e, "PS connection ended");
                    }
                    // A worker's connection that ends while this generation
                    // runs may be its death: its peers are probed, and an
                    // unreachable one reported at once.
                    if !stop.is_triggered() {
                        let how = ended
                            .err()
                            .map_or_else(|| "closed".to_owned(), |e| e.to_string());
                        ctx.suspects.check(
                            a,
                            format!(
                                "PS shard {}: the connection of worker {from} ended ({how})",
                                a.key.index
                            ),
                        );
                    }
                });
            }
            if last_log.elapsed() >= Duration::from_secs(10) {
                last_log = Instant::now();
                let line = served.shard.lock().stats_line(
                    a.key.index,
                    served.bytes_in.load(Ordering::Relaxed),
                    served.bytes_out.load(Ordering::Relaxed),
                );
                role.log(LogLevel::Info, line);
            }
        }
        served.shard.changed();
        replicator.and_then(|r| r.join().ok())
    })
}

/// Serves one worker's connection until it closes or `stop`.
fn connection(
    mut stream: TcpStream,
    from: u32,
    generation: i64,
    served: &Served,
    stop: &Shutdown,
) -> Result<(), WireError> {
    stream.set_read_timeout(Some(Duration::from_millis(50)))?;
    // A worker that stops reading (its host vanished) must not hold this
    // thread, and with it the hand-over to the next generation, forever.
    stream.set_write_timeout(Some(PS_TIMEOUT))?;
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut buf = Vec::new();
    let len = shard_len(&served.shard.lock().ranges);
    loop {
        let mut r = Patient {
            stream: &mut stream,
            stop,
            deadline: None,
        };
        let Some(m) = read_current(&mut r, &mut writer, generation)? else {
            return Ok(());
        };
        match m.message {
            Message::Init { version, cursor } => {
                ps::read_values(&mut r, &m, len, &mut buf)?;
                let ack = init(served, version, from_wire(cursor), &mut buf);
                ps::write_message(&mut writer, generation, &ack, &[])?;
            }
            Message::Pull { at_least } => {
                let mut s = served.shard.lock();
                // A shard restored from a checkpoint serves once rank 0's
                // `Init` has aligned its version with the job's; a version
                // its standby has not acknowledged is not published.
                let published = loop {
                    if stop.is_triggered() {
                        return Ok(());
                    }
                    if !s.restored && s.published_version().is_some_and(|v| v >= at_least) {
                        if let Some(p) = s.published() {
                            break p;
                        }
                    }
                    s = served.shard.wait(s);
                };
                let finished = s.done.len() as u32;
                drop(s);
                let out = Message::Weights {
                    version: published.version,
                    cursor: super::to_wire(published.cursor),
                    finished,
                };
                // Straight from the shard's values: no copy per pull.
                ps::write_message(&mut writer, generation, &out, &published.weights)?;
                drop(published);
                served
                    .bytes_out
                    .fetch_add(len as u64 * 4, Ordering::Relaxed);
            }
            Message::Push(push) => {
                ps::read_values(&mut r, &m, len, &mut buf)?;
                served.bytes_in.fetch_add(len as u64 * 4, Ordering::Relaxed);
                let Some(answer) = take(served, from, &push, &buf, stop) else {
                    return Err(WireError::Protocol(
                        "stopped before the standby acknowledged the update".into(),
                    ));
                };
                ps::write_message(&mut writer, generation, &answer.message, &[])?;
                if let (Some(snap), Some(u)) = (answer.snapshot, served.uploader.as_ref()) {
                    // Blocks while the previous checkpoint is still uploading.
                    u.submit(snap);
                }
            }
            Message::Done => {
                let workers = {
                    let mut s = served.shard.lock();
                    s.done.insert(from);
                    s.done.len() as u32
                };
                let answer = Message::Finished { workers };
                ps::write_message(&mut writer, generation, &answer, &[])?;
            }
            Message::Where { kept } => {
                let at = served.shard.lock().place(from, kept.map(from_wire));
                let answer = Message::Place {
                    cursor: super::to_wire(at),
                };
                ps::write_message(&mut writer, generation, &answer, &[])?;
            }
            other => {
                return Err(WireError::Protocol(format!(
                    "a worker sent {:?}, which only shards send",
                    other.kind()
                )))
            }
        }
    }
}

/// Takes rank 0's initial `values` at `version` and `cursor` where the
/// shard has none, or aligns the version of a shard restored from a
/// checkpoint; the `Ack` that answers it.
fn init(served: &Served, version: u64, cursor: Cursor, values: &mut Vec<f32>) -> Message {
    let mut s = served.shard.lock();
    let took = s.weights.is_none();
    if took {
        s.weights = Some(Arc::new(std::mem::take(values)));
        s.version = version;
        s.cursor = cursor;
        s.replaced();
        served.shard.changed();
    } else if s.restored {
        // Restored from a checkpoint while the other shards lived on: its
        // values are the checkpoint's, its version and cursor follow the
        // job's (sync mode needs one).
        s.restored = false;
        if version > s.version {
            s.version = version;
            s.cursor = cursor;
        }
        s.replaced();
        served.shard.changed();
    }
    Message::Ack {
        version: s.version,
        // Tells rank 0 whether its values were taken.
        values_taken: took,
        checkpoint_wanted: false,
    }
}

/// The answer to a push, and the checkpoint it completed.
struct Answer {
    message: Message,
    snapshot: Option<crate::storage::checkpoint::Snapshot>,
}

/// Takes worker `from`'s pushed gradient and waits until what it produced
/// is published; `None` when stopped before the standby acknowledged it.
fn take(
    served: &Served,
    from: u32,
    push: &PushHeader,
    grad: &[f32],
    stop: &Shutdown,
) -> Option<Answer> {
    let mut s = served.shard.lock();
    let taken = s.take(&served.rules, from, push, grad);
    if taken.accepted {
        if let Some(step) = push.checkpoint {
            s.checkpoint_at = Some(step.get());
        }
    }
    // The update the flagged push was part of is applied: checkpoint
    // it (the values it produced, copied now).
    let snapshot = taken.produced.and_then(|_| {
        let step = s.checkpoint_at.take()?;
        s.snapshot(step, served.index, served.shards, served.numel)
    });
    if taken.produced.is_some() {
        served.shard.changed();
    }
    // An update is acknowledged (and checkpointed) only once its
    // standby has it — or the standby was given up
    // ([`super::standby::STANDBY_GIVE_UP`]), which bounds this wait.
    if let Some(v) = taken.produced {
        while s.published_version().is_none_or(|p| p < v) {
            if stop.is_triggered() {
                // Stopping with an update its standby does not have: no answer.
                return None;
            }
            s = served.shard.wait(s);
        }
    }
    // A draining shard server asks rank 0 for a checkpoint, once.
    let ask = served.drain.is_draining() && !s.drain_asked && from == 0;
    if ask {
        s.drain_asked = true;
    }
    let version = taken.produced.unwrap_or(s.version);
    let message = if taken.accepted {
        Message::Ack {
            version,
            values_taken: false,
            checkpoint_wanted: ask,
        }
    } else {
        Message::Rejected { version }
    };
    Some(Answer { message, snapshot })
}
