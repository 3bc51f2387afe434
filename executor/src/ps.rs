//! The parameter-server pattern: shard servers and the workers that use them.
//!
//! A **shard server** holds its ranges of the model's flat parameters in
//! fp32 with their optimizer state ([`FlatOptimizer`], the same update rules
//! as a ring replica's) and a version, and serves workers over the data
//! plane ([`trainyard_dataplane::ps`]): one thread per worker connection.
//! The job's consistency decides when a pushed gradient is applied:
//!
//! * `sync`: the shard sums one gradient per current-generation worker for
//!   its current version, then applies their mean and publishes the next
//!   version; pulls for that version wait until it exists.
//! * `async`: every gradient is applied on arrival.
//! * `bounded{staleness: τ}`: a gradient computed at version `v` is applied
//!   iff `current − v ≤ τ`, else rejected (the worker re-pulls and
//!   recomputes).
//!
//! Applied staleness (a histogram), rejections and bytes moved are counted
//! and logged. The shard's state outlives its generation on the executor
//! (as a ring replica does): when the membership changes, the next
//! generation's server takes it over, drops the half-summed version of the
//! old membership and waits for the new worker count. A shard that starts
//! empty (a new PS executor) is initialised by rank 0 with the newest
//! weights it pulled.
//!
//! A shard of a job that keeps replicas (the spec's `replicas: 1`) has a
//! **standby** on another executor ([`serve_standby`]): a PS role of its
//! own (index [`STANDBY_INDEX_BASE`] + shard) that holds a copy of the
//! shard's state and serves no worker. The shard connects to it through
//! the data plane's handshake (job secret, generation), sends its whole
//! state once per connection, then every update it applies — the gradient
//! sum, version, samples, learning rate and cursor, which the standby
//! applies with the same code to the same bits — and waits for the
//! standby's acknowledgement before the new version becomes visible: a
//! pull waits while the shard holds a change its standby has not
//! acknowledged. So every version a worker has seen is also on the
//! standby. When the shard's executor is lost the scheduler promotes the
//! standby (it becomes the shard on its executor, at the next generation):
//! the standby's thread hands its state to the shard server started there
//! ([`crate::roles`] keys PS state by shard, primary or standby alike),
//! which serves the workers from the version they were at; a worker whose
//! push was lost with the old primary pulls that version again and
//! recomputes the same gradient from the same data. With several shards
//! in sync mode the others may have completed the next version: a worker
//! keeps its last step's gradient ([`LastStep`], across generations) and
//! pushes it again to the shards that are behind before it pulls (one
//! that has none pushes a zero gradient over no samples), and never trains
//! on shards at different versions. A push is acknowledged — and a
//! checkpoint of its update taken — only once the standby has the update.
//! If the standby cannot be reached the shard stops publishing versions
//! until it can, until the next generation assigns another standby (or
//! none), or for at most [`STANDBY_GIVE_UP`]: then it gives the standby up
//! for the rest of the generation, says so in an error-level line of the
//! job's log, and publishes unreplicated. A standby promoted before it
//! received any state says so at error level too. Not covered: in async
//! and bounded modes an update the standby applied whose acknowledgement
//! died with the primary is recomputed and applied again.
//!
//! A **worker** pulls every shard concurrently, computes its gradient on its
//! share of the global batch (the data cursor travels with the shard
//! versions in sync mode, so a membership change re-splits the rest of the
//! epoch), and pushes each shard its slice concurrently. In async and
//! bounded modes each worker walks its own share of the data. Rank 0
//! reports metrics, evaluates, and at the end writes the final weights.

use crate::context::{Context, Drain};
use crate::control::report::Item;
use crate::error::{guarded, RoleError};
use crate::replica::data::Cursor;
use crate::replica::optim::{slice_norm, FlatOptimizer, SliceOptimizer};
use crate::replica::progress::{self, accuracy_suffix, ProgressLine};
use crate::replica::{self, Replica};
use crate::role::Role;
use crate::storage::checkpoint::{Policy, Snapshot, Uploader};
use crate::storage::Storage;
use std::collections::BTreeSet;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use trainyard_common::checkpoint::CursorState;
use trainyard_common::cluster::{Assignment, LogLevel, PsPeer, Range, STANDBY_INDEX_BASE};
use trainyard_common::spec::Consistency;
use trainyard_dataplane::frame::Patient;
use trainyard_dataplane::handshake::Hello;
use trainyard_dataplane::ps::{self, Header, Kind, WireError};
use trainyard_dataplane::{plane, DataPlane, EndpointKey, EndpointRole};

/// How long a worker waits for a shard's answer (a sync pull waits for the
/// slowest worker's push).
pub const PS_TIMEOUT: Duration = Duration::from_secs(60);

/// Staleness buckets of the histogram (the last one is "this or more").
pub const STALENESS_BUCKETS: usize = 9;

/// How long a shard waits for its standby: to connect, and to acknowledge
/// one message.
pub const STANDBY_TIMEOUT: Duration = Duration::from_secs(10);

/// Least time between two attempts to reach an unreachable standby (each
/// holds the shard's lock while it waits).
pub const STANDBY_RETRY: Duration = Duration::from_millis(500);

/// How long a shard keeps failing to reach its standby before it gives it
/// up for the rest of the generation (an error-level line in the job's
/// log says so) and publishes its versions unreplicated.
pub const STANDBY_GIVE_UP: Duration = Duration::from_secs(30);

/// One shard's state; it outlives generations on its executor.
pub struct Shard {
    ranges: Vec<Range>,
    /// The values: shared with pulls being written (an update copies them
    /// only while one still is, never in sync mode).
    weights: Option<Arc<Vec<f32>>>,
    opt: SliceOptimizer,
    version: u64,
    cursor: Cursor,
    generation: i64,
    expected: u32,
    /// Sum of this version's gradients so far (sync; valid while
    /// `contributors` is not empty; kept allocated across versions).
    acc: Vec<f32>,
    acc_samples: u64,
    contributors: BTreeSet<u32>,
    next_cursor: Cursor,
    lr: f64,
    /// Updates applied.
    pub applied: u64,
    /// Gradients rejected as too stale.
    pub rejected: u64,
    /// Applied gradients by staleness.
    pub staleness: [u64; STALENESS_BUCKETS],
    /// Restored from a checkpoint and not yet aligned with rank 0's version.
    restored: bool,
    /// The step a pushed gradient asked to be checkpointed once applied.
    checkpoint_at: Option<u64>,
    /// The last step checkpointed.
    checkpointed: Option<u64>,
    /// A drain checkpoint was asked for.
    drain_asked: bool,
    /// A change (an update, new values) its standby has not acknowledged
    /// yet: not published (pulls wait). Never set without a standby.
    unreplicated: bool,
    /// The gradient sum of a sync update for the standby (reused).
    sum: Vec<f32>,
    /// Kept by a standby (set when its generation ends): a shard server
    /// that takes it over is the promoted standby.
    was_standby: bool,
}

impl Shard {
    fn new(a: &Assignment, ranges: Vec<Range>) -> Shard {
        let len = shard_len(&ranges);
        Shard {
            ranges,
            weights: None,
            opt: SliceOptimizer::new(&a.spec.optimizer, len),
            version: 0,
            cursor: Cursor::default(),
            generation: a.key.generation,
            expected: a.workers.len() as u32,
            acc: Vec::new(),
            acc_samples: 0,
            contributors: BTreeSet::new(),
            next_cursor: Cursor::default(),
            lr: 0.0,
            applied: 0,
            rejected: 0,
            staleness: [0; STALENESS_BUCKETS],
            restored: false,
            checkpoint_at: None,
            checkpointed: None,
            drain_asked: false,
            unreplicated: false,
            sum: Vec::new(),
            was_standby: false,
        }
    }

    /// Takes over the shard's pieces of a committed checkpoint.
    fn restore(&mut self, l: &crate::storage::checkpoint::Loaded) {
        self.weights = Some(Arc::new(l.tensors[0].clone()));
        if l.tensors.len() == 1 + self.opt.state().len() {
            for (t, src) in self.opt.state_mut().iter_mut().zip(&l.tensors[1..]) {
                if t.len() == src.len() {
                    t.copy_from_slice(src);
                }
            }
            self.opt.t = l.optimizer_t;
        }
        self.version = l.step;
        self.cursor = Cursor {
            epoch: l.cursor.epoch,
            offset: l.cursor.offset,
        };
        self.restored = true;
        self.checkpointed = Some(l.step);
    }

    /// A copy of the shard's values and optimizer state for a checkpoint.
    fn snapshot(&mut self, step: u64, shared: &Served) -> Option<Snapshot> {
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
            shard: shared.index,
            shards: shared.shards,
            ranges: self.ranges.clone(),
            tensors,
            numel: shared.numel,
            optimizer_t: self.opt.t,
            cursor: CursorState {
                epoch: self.cursor.epoch,
                offset: self.cursor.offset,
            },
        })
    }

    /// Applies the mean gradient `(g + extra) / samples` (clipped to norm
    /// `clip`) in one fused pass.
    fn apply(
        &mut self,
        g: &[f32],
        extra: Option<&[f32]>,
        samples: u64,
        lr: f64,
        clip: Option<f64>,
    ) {
        let Some(w) = self.weights.as_mut() else {
            return;
        };
        let mut scale = 1.0 / samples.max(1) as f64;
        if let Some(c) = clip {
            // Per shard: the global norm is not known to any one shard.
            let coef = c / (slice_norm(g, extra, scale) + 1e-6);
            if coef < 1.0 {
                scale *= coef;
            }
        }
        let w: &mut Vec<f32> = Arc::make_mut(w);
        self.opt.step(w, g, extra, scale as f32, lr);
        self.version += 1;
        self.applied += 1;
    }
}

struct Served {
    shard: Mutex<Shard>,
    changed: Condvar,
    consistency: Consistency,
    clip: Option<f64>,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    index: u32,
    shards: u32,
    numel: u64,
    uploader: Option<Uploader>,
    /// The link to this shard's standby, where it has one.
    standby: Option<Mutex<StandbyLink>>,
    /// The role's report channel (a standby given up is logged there).
    tx: UnboundedSender<Item>,
    job: uuid::Uuid,
    /// Test hook (`TRAINYARD_SLOW_STANDBY`): a pause before each update is
    /// sent — a window in which the other shards have published a version
    /// this one has not, for a kill to land in.
    slow_standby: Option<Duration>,
    /// Whether the executor drains (the shard then asks rank 0 for a
    /// checkpoint).
    drain: Drain,
}

/// A shard's connection to its standby.
struct StandbyLink {
    job: uuid::Uuid,
    generation: i64,
    shard: u32,
    address: String,
    secret: Vec<u8>,
    stream: Option<TcpStream>,
    /// The standby has the shard's whole state (sent on this connection).
    synced: bool,
    /// When the last attempt failed.
    failed_at: Option<Instant>,
    /// Since when every attempt failed.
    failing_since: Option<Instant>,
    /// Given up for this generation after [`STANDBY_GIVE_UP`] of failures.
    abandoned: bool,
    /// Messages it acknowledged, and failures, for the log.
    acked: u64,
    failures: u64,
}

/// A change to a shard's state that its standby must have before it is
/// published.
enum Change<'a> {
    /// One applied update: the gradient sum it applied, at version
    /// `before`, over `samples` samples, with `lr`.
    Update {
        grad: &'a [f32],
        before: u64,
        samples: u64,
        lr: f64,
    },
    /// Anything else (initial values, an aligned version): the whole state.
    Whole,
}

impl StandbyLink {
    /// Sends `change` (or the whole state where the standby may not have
    /// the state it follows from) and waits for the acknowledgement.
    fn send(&mut self, s: &Shard, change: Change<'_>, stop: &AtomicBool) -> Result<(), String> {
        if self.stream.is_none() {
            if self.failed_at.is_some_and(|t| t.elapsed() < STANDBY_RETRY) {
                return Err("the standby was unreachable moments ago".into());
            }
            if let Err(e) = self.connect(stop) {
                self.failed_at = Some(Instant::now());
                self.failures += 1;
                return Err(e);
            }
        }
        let result = self.deliver(s, change, stop);
        match &result {
            Ok(()) => {
                self.synced = true;
                self.acked += 1;
            }
            Err(_) => {
                self.stream = None;
                self.synced = false;
                self.failed_at = Some(Instant::now());
                self.failures += 1;
            }
        }
        result
    }

    /// Opens the connection (the handshake proves the job's secret and
    /// names this generation).
    fn connect(&mut self, stop: &AtomicBool) -> Result<(), String> {
        let hello = Hello {
            job: self.job,
            generation: self.generation,
            kind: EndpointRole::ParameterServer as u8,
            from: self.shard,
            to: STANDBY_INDEX_BASE + self.shard,
        };
        let stream = plane::connect(
            &self.address,
            &hello,
            &self.secret,
            Instant::now() + STANDBY_TIMEOUT,
            stop,
        )
        .map_err(|e| format!("cannot reach the standby at {}: {e}", self.address))?;
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .and_then(|()| stream.set_write_timeout(Some(STANDBY_TIMEOUT)))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|e| e.to_string())?;
        self.stream = Some(stream);
        self.synced = false;
        Ok(())
    }

    /// Sends `change` on the open connection, the whole state where the
    /// standby may not follow it.
    fn deliver(&mut self, s: &Shard, change: Change<'_>, stop: &AtomicBool) -> Result<(), String> {
        match change {
            Change::Update {
                grad,
                before,
                samples,
                lr,
            } if self.synced => {
                let mut h = Header::new(Kind::Update, self.generation);
                h.version = before;
                h.samples = samples;
                h.lr = lr;
                (h.epoch, h.offset) = (s.cursor.epoch, s.cursor.offset);
                match self.call(h, grad, s.version, stop) {
                    Ok(()) => Ok(()),
                    // It does not hold the version this update follows.
                    Err(Failed::Rejected) => self.whole(s, stop),
                    Err(Failed::Broken(e)) => Err(e),
                }
            }
            _ => self.whole(s, stop),
        }
    }

    /// Sends the whole state: the values, then each optimizer state tensor.
    fn whole(&mut self, s: &Shard, stop: &AtomicBool) -> Result<(), String> {
        let Some(w) = s.weights.as_ref() else {
            return Ok(());
        };
        let state = s.opt.state();
        let parts = 1 + state.len();
        for (i, part) in std::iter::once(&w[..])
            .chain(state.iter().map(|t| &t[..]))
            .enumerate()
        {
            let mut h = Header::new(Kind::State, self.generation);
            h.version = s.version;
            h.samples = s.opt.t;
            (h.epoch, h.offset) = (s.cursor.epoch, s.cursor.offset);
            // Part i of `parts`, in the field no other use of State has.
            h.checkpoint = ((parts as u64) << 32) | i as u64;
            self.call(h, part, s.version, stop).map_err(|e| match e {
                Failed::Rejected => "the standby refused the shard's state".to_string(),
                Failed::Broken(e) => e,
            })?;
        }
        Ok(())
    }

    /// One message and its acknowledgement with version `want`.
    fn call(
        &mut self,
        h: Header,
        payload: &[f32],
        want: u64,
        stop: &AtomicBool,
    ) -> Result<(), Failed> {
        let broken = |e: WireError| Failed::Broken(format!("the standby's connection: {e}"));
        let Some(stream) = self.stream.as_mut() else {
            return Err(Failed::Broken("not connected".into()));
        };
        ps::write(stream, h, payload).map_err(broken)?;
        let mut r = Patient {
            stream,
            stop,
            deadline: Some(Instant::now() + STANDBY_TIMEOUT),
        };
        let reply = ps::read_header(&mut r).map_err(broken)?;
        if reply.generation != self.generation || reply.len != 0 {
            return Err(Failed::Broken(format!(
                "the standby answered {:?} for generation {} with {} bytes",
                reply.kind, reply.generation, reply.len
            )));
        }
        match reply.kind {
            Kind::Ack if reply.version == want => Ok(()),
            Kind::Reject => Err(Failed::Rejected),
            other => Err(Failed::Broken(format!(
                "the standby answered {other:?} at version {} where {want} was due",
                reply.version
            ))),
        }
    }
}

/// Why a message to the standby was not acknowledged.
enum Failed {
    /// It does not hold the state the message follows from.
    Rejected,
    /// The connection failed or the answer made no sense: reconnect.
    Broken(String),
}

/// Brings the standby up to date with `change` (no-op without a standby);
/// until it acknowledges, the shard's current version is not published.
fn replicate(served: &Served, s: &mut Shard, change: Change<'_>, stop: &AtomicBool) {
    let Some(link) = served.standby.as_ref() else {
        return;
    };
    if s.weights.is_none() {
        return;
    }
    if let (Some(pause), Change::Update { .. }) = (served.slow_standby, &change) {
        std::thread::sleep(pause);
    }
    let mut link = link.lock().unwrap_or_else(|p| p.into_inner());
    if link.abandoned {
        s.unreplicated = false;
        return;
    }
    // An update the standby cannot follow (it missed an earlier one) is
    // sent as the whole state.
    let change = if s.unreplicated {
        Change::Whole
    } else {
        change
    };
    match link.send(s, change, stop) {
        Ok(()) => {
            link.failing_since = None;
            if s.unreplicated {
                tracing::info!(
                    shard = served.index,
                    version = s.version,
                    "PS standby caught up"
                );
            }
            s.unreplicated = false;
        }
        Err(e) => {
            let since = *link.failing_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= STANDBY_GIVE_UP {
                // Bounded: the job goes on, and says plainly what it lost.
                link.abandoned = true;
                s.unreplicated = false;
                let msg = format!(
                    "PS shard {}: its standby at {} has been unreachable for {} s ({e}); the shard goes on WITHOUT a standby for the rest of generation {}: versions from {} on are not replicated and are lost if this executor is",
                    served.index,
                    link.address,
                    since.elapsed().as_secs(),
                    link.generation,
                    s.version
                );
                tracing::error!(job = %served.job, "{msg}");
                let _ = served.tx.send(Item::Log(LogLevel::Error, msg));
                return;
            }
            if !s.unreplicated {
                tracing::warn!(
                    shard = served.index,
                    version = s.version,
                    "PS standby: {e}; version held back until it answers"
                );
            }
            s.unreplicated = true;
        }
    }
}

/// Elements of a shard's ranges.
pub fn shard_len(ranges: &[Range]) -> usize {
    ranges.iter().map(|r| (r.end - r.start) as usize).sum()
}

/// Runs shard `a.key.index` of a job for one generation; returns its state
/// for the next one.
pub fn serve_shard(
    a: &Assignment,
    stop: &AtomicBool,
    tx: &UnboundedSender<Item>,
    plane: &DataPlane,
    parked: Option<Shard>,
    storage: Result<Arc<Storage>, String>,
    ctx: &Context,
) -> Option<Shard> {
    let log = |level, msg: String| {
        tracing::info!(job = %a.key.job_id, "{msg}");
        let _ = tx.send(Item::Log(level, msg));
    };
    let primaries = a.primaries();
    let numel: u64 = primaries.iter().map(|p| shard_len(&p.ranges) as u64).sum();
    let Some(me) = primaries.iter().find(|p| p.shard == a.key.index) else {
        log(
            LogLevel::Error,
            format!("shard {} is not in its own assignment", a.key.index),
        );
        return parked;
    };
    let len = shard_len(&me.ranges);
    // Only the same ranges carry over (values of other parameters would
    // otherwise be served under these names).
    let mut shard = match parked {
        Some(s) if s.ranges == me.ranges => s,
        _ => Shard::new(a, me.ranges.clone()),
    };
    if std::mem::take(&mut shard.was_standby) && shard.weights.is_none() {
        // Promoted before its primary ever reached it: whatever the
        // primary applied is gone; the values come from the newest
        // checkpoint, else from rank 0's newest pull.
        log(
            LogLevel::Error,
            format!(
                "PS shard {} was promoted from a standby that never received the shard's state (generation {}): updates its primary applied are lost; the shard restarts from the newest checkpoint or rank 0's newest pull",
                a.key.index, a.key.generation
            ),
        );
    }
    // A shard without values (a new PS executor, or the whole fleet was
    // lost) takes its ranges from the newest committed checkpoint.
    if let (None, Some(at), Ok(st)) = (shard.weights.as_ref(), a.resume.as_ref(), storage.as_ref())
    {
        let states = FlatOptimizer::state_tensors(a.spec.optimizer.kind);
        match crate::storage::checkpoint::load(st, at, &me.ranges, numel, states) {
            Ok(l) => {
                shard.restore(&l);
                log(
                    LogLevel::Info,
                    format!(
                        "PS shard {} restored from the checkpoint of step {} (job {})",
                        a.key.index, l.step, at.job_id
                    ),
                );
            }
            Err(e) => log(
                LogLevel::Warn,
                format!(
                    "PS shard {}: cannot restore from the checkpoint of step {}: {e}",
                    a.key.index, at.step
                ),
            ),
        }
    }
    let uploader = match &storage {
        Ok(st) => Some(Uploader::start(
            st.clone(),
            a.key.job_id,
            tx.clone(),
            ctx.uploads.clone(),
            ctx.hooks.upload_delay,
        )),
        Err(e) => {
            log(
                LogLevel::Warn,
                format!("no checkpoints: the object store cannot be opened: {e}"),
            );
            None
        }
    };
    // A new membership: the half-summed version of the old one is dropped.
    shard.generation = a.key.generation;
    shard.expected = a.workers.len() as u32;
    shard.acc_samples = 0;
    shard.contributors.clear();
    let standby = a.standby_of(a.key.index);
    // A new standby (or a new connection to the old one) gets the whole
    // state before anything more is published.
    shard.unreplicated = standby.is_some() && shard.weights.is_some();
    log(
        LogLevel::Info,
        format!(
            "PS shard {} serves {len} values ({} ranges) for {} worker(s), {:?}, at version {}{}{} (generation {})",
            a.key.index,
            me.ranges.len(),
            shard.expected,
            a.spec.consistency_mode(),
            shard.version,
            if shard.weights.is_some() { "" } else { ", waiting for initial values" },
            standby.map_or(String::new(), |p| format!(", with a standby at {}", p.address)),
            a.key.generation
        ),
    );
    let served = Arc::new(Served {
        shard: Mutex::new(shard),
        changed: Condvar::new(),
        consistency: a.spec.consistency_mode(),
        clip: a.spec.optimizer.grad_clip,
        bytes_in: AtomicU64::new(0),
        bytes_out: AtomicU64::new(0),
        index: a.key.index,
        shards: primaries.len() as u32,
        numel,
        uploader,
        tx: tx.clone(),
        slow_standby: ctx.hooks.slow_standby(a.key.index),
        drain: ctx.drain.clone(),
        job: a.key.job_id,
        standby: standby.map(|p| {
            Mutex::new(StandbyLink {
                job: a.key.job_id,
                generation: a.key.generation,
                shard: a.key.index,
                address: p.address.clone(),
                secret: a.secret.as_bytes().to_vec(),
                stream: None,
                synced: false,
                failed_at: None,
                failing_since: None,
                abandoned: false,
                acked: 0,
                failures: 0,
            })
        }),
    });
    // The standby gets the whole state when it is first needed (the first
    // pull or push), not here: an unreachable standby must not keep the
    // shard from registering its endpoint.
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
        while !stop.load(Ordering::Relaxed) {
            if let Some((from, stream)) =
                endpoint.accept(Instant::now() + Duration::from_millis(200), stop)
            {
                let served = served.clone();
                scope.spawn(move || {
                    if let Err(e) = connection(stream, from, generation, &served, stop) {
                        tracing::debug!(error = %e, "PS connection ended");
                    }
                });
            }
            if last_log.elapsed() >= Duration::from_secs(10) {
                last_log = Instant::now();
                let s = served.shard.lock().unwrap_or_else(|p| p.into_inner());
                log(
                    LogLevel::Info,
                    stats_line(
                        a.key.index,
                        &s,
                        served.bytes_in.load(Ordering::Relaxed),
                        served.bytes_out.load(Ordering::Relaxed),
                    ),
                );
            }
        }
        served.changed.notify_all();
    });
    drop(endpoint);
    let mut served = Arc::try_unwrap(served).ok()?;
    if let Some(u) = served.uploader.take() {
        u.flush(Duration::from_secs(60));
    }
    let (bytes_in, bytes_out) = (
        served.bytes_in.load(Ordering::Relaxed),
        served.bytes_out.load(Ordering::Relaxed),
    );
    let shard = served.shard.into_inner().unwrap_or_else(|p| p.into_inner());
    log(
        LogLevel::Info,
        stats_line(a.key.index, &shard, bytes_in, bytes_out),
    );
    if let Some(link) = served.standby {
        let link = link.into_inner().unwrap_or_else(|p| p.into_inner());
        log(
            LogLevel::Info,
            format!(
                "PS shard {}: its standby acknowledged {} message(s), {} attempt(s) failed (generation {})",
                a.key.index, link.acked, link.failures, a.key.generation
            ),
        );
    }
    Some(shard)
}

/// Runs the standby of shard `shard` of a job for one generation: takes
/// the shard's state and updates from the shard (and nothing from anyone
/// else), and returns its copy for the next generation on this executor —
/// where it becomes the shard when the scheduler promotes it.
pub fn serve_standby(
    a: &Assignment,
    shard_index: u32,
    stop: &AtomicBool,
    tx: &UnboundedSender<Item>,
    plane: &DataPlane,
    parked: Option<Shard>,
) -> Option<Shard> {
    let log = |level, msg: String| {
        tracing::info!(job = %a.key.job_id, "{msg}");
        let _ = tx.send(Item::Log(level, msg));
    };
    let Some(me) = a.standby_of(shard_index) else {
        log(
            LogLevel::Error,
            format!("the standby of PS shard {shard_index} is not in its own assignment"),
        );
        return parked;
    };
    let mut shard = match parked {
        Some(s) if s.ranges == me.ranges => s,
        _ => Shard::new(a, me.ranges.clone()),
    };
    shard.generation = a.key.generation;
    shard.acc_samples = 0;
    shard.contributors.clear();
    shard.unreplicated = false;
    log(
        LogLevel::Info,
        format!(
            "PS shard {shard_index} standby {} (generation {})",
            if shard.weights.is_some() {
                format!("holds version {}", shard.version)
            } else {
                "waits for the shard's state".into()
            },
            a.key.generation
        ),
    );
    let len = shard_len(&me.ranges);
    let states = FlatOptimizer::state_tensors(a.spec.optimizer.kind);
    let shared = Mutex::new(shard);
    let clip = a.spec.optimizer.grad_clip;
    let endpoint = plane.register(
        EndpointKey {
            job: a.key.job_id,
            kind: EndpointRole::ParameterServer,
            rank: STANDBY_INDEX_BASE + shard_index,
        },
        a.key.generation,
        a.secret.as_bytes(),
    );
    let generation = a.key.generation;
    std::thread::scope(|scope| {
        while !stop.load(Ordering::Relaxed) {
            let Some((from, stream)) =
                endpoint.accept(Instant::now() + Duration::from_millis(200), stop)
            else {
                continue;
            };
            if from != shard_index {
                tracing::debug!(from, "a standby takes connections from its shard only");
                continue;
            }
            let shared = &shared;
            scope.spawn(move || {
                let standby = Standby {
                    shared,
                    generation,
                    len,
                    states,
                    clip,
                };
                if let Err(e) = standby.connection(stream, stop) {
                    tracing::debug!(error = %e, "PS standby connection ended");
                }
            });
        }
    });
    drop(endpoint);
    let mut shard = shared.into_inner().unwrap_or_else(|p| p.into_inner());
    shard.was_standby = true;
    log(
        LogLevel::Info,
        format!(
            "PS shard {shard_index} standby ends generation {} at version {}{}",
            a.key.generation,
            shard.version,
            if shard.weights.is_some() {
                ""
            } else {
                " without the shard's state"
            }
        ),
    );
    Some(shard)
}

/// What a standby's connection thread works on.
struct Standby<'a> {
    shared: &'a Mutex<Shard>,
    generation: i64,
    len: usize,
    states: usize,
    clip: Option<f64>,
}

impl Standby<'_> {
    /// Takes the shard's messages until it closes or `stop`.
    fn connection(&self, mut stream: TcpStream, stop: &AtomicBool) -> Result<(), WireError> {
        stream.set_read_timeout(Some(Duration::from_millis(50)))?;
        stream.set_write_timeout(Some(STANDBY_TIMEOUT))?;
        stream.set_nodelay(true)?;
        let mut writer = stream.try_clone()?;
        let mut buf = Vec::new();
        // The parts of a whole state received so far (installed together
        // with the last, so a broken transfer leaves the old state whole).
        let mut staged: Vec<Vec<f32>> = Vec::new();
        loop {
            let mut r = Patient {
                stream: &mut stream,
                stop,
                deadline: None,
            };
            let h = ps::read_header(&mut r)?;
            if h.generation != self.generation {
                ps::write(&mut writer, Header::new(Kind::Stale, self.generation), &[])?;
                return Ok(());
            }
            let mut answer = Header::new(Kind::Ack, self.generation);
            match h.kind {
                Kind::State => {
                    let (parts, part) = (
                        (h.checkpoint >> 32) as usize,
                        (h.checkpoint & 0xffff_ffff) as usize,
                    );
                    if parts != 1 + self.states || part != staged.len() {
                        return Err(WireError::Protocol(format!(
                            "state part {part} of {parts} where part {} of {} was due",
                            staged.len(),
                            1 + self.states
                        )));
                    }
                    ps::read_payload(&mut r, &h, self.len, &mut buf)?;
                    staged.push(std::mem::take(&mut buf));
                    let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                    if staged.len() == parts {
                        let mut parts = std::mem::take(&mut staged).into_iter();
                        s.weights = parts.next().map(Arc::new);
                        for (t, src) in s.opt.state_mut().iter_mut().zip(parts) {
                            *t = src;
                        }
                        s.opt.t = h.samples;
                        s.version = h.version;
                        s.cursor = Cursor {
                            epoch: h.epoch,
                            offset: h.offset,
                        };
                        s.restored = false;
                    }
                    answer.version = h.version;
                }
                Kind::Update => {
                    ps::read_payload(&mut r, &h, self.len, &mut buf)?;
                    let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                    if s.weights.is_none() || s.version != h.version || !staged.is_empty() {
                        answer.kind = Kind::Reject;
                        answer.version = s.version;
                    } else {
                        s.apply(&buf, None, h.samples, h.lr, self.clip);
                        s.cursor = Cursor {
                            epoch: h.epoch,
                            offset: h.offset,
                        };
                        answer.version = s.version;
                    }
                }
                other => {
                    return Err(WireError::Protocol(format!(
                        "a shard sent {other:?} to its standby"
                    )))
                }
            }
            ps::write(&mut writer, answer, &[])?;
        }
    }
}

fn stats_line(index: u32, s: &Shard, bytes_in: u64, bytes_out: u64) -> String {
    format!(
        "PS shard {index}: version {}, {} updates applied, {} rejected as stale, staleness histogram {:?}{}",
        s.version,
        s.applied,
        s.rejected,
        s.staleness,
        if bytes_in + bytes_out > 0 {
            format!(", {} MiB pushed in, {} MiB pulled out", bytes_in >> 20, bytes_out >> 20)
        } else {
            String::new()
        }
    )
}

/// Serves one worker's connection until it closes or `stop`.
fn connection(
    mut stream: TcpStream,
    from: u32,
    generation: i64,
    served: &Served,
    stop: &AtomicBool,
) -> Result<(), WireError> {
    stream.set_read_timeout(Some(Duration::from_millis(50)))?;
    // A worker that stops reading (its host vanished) must not hold this
    // thread, and with it the hand-over to the next generation, forever.
    stream.set_write_timeout(Some(PS_TIMEOUT))?;
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut buf = Vec::new();
    let len = served
        .shard
        .lock()
        .map(|s| shard_len(&s.ranges))
        .unwrap_or(0);
    loop {
        let mut r = Patient {
            stream: &mut stream,
            stop,
            deadline: None,
        };
        let h = ps::read_header(&mut r)?;
        if h.generation != generation {
            ps::write(&mut writer, Header::new(Kind::Stale, generation), &[])?;
            return Ok(());
        }
        match h.kind {
            Kind::Init => {
                ps::read_payload(&mut r, &h, len, &mut buf)?;
                let mut s = served.shard.lock().unwrap_or_else(|p| p.into_inner());
                let took = s.weights.is_none();
                if took {
                    s.weights = Some(Arc::new(std::mem::take(&mut buf)));
                    s.version = h.version;
                    s.cursor = Cursor {
                        epoch: h.epoch,
                        offset: h.offset,
                    };
                    replicate(served, &mut s, Change::Whole, stop);
                    served.changed.notify_all();
                } else if s.restored {
                    // Restored from a checkpoint while the other shards
                    // lived on: its values are the checkpoint's, its version
                    // and cursor follow the job's (sync mode needs one).
                    s.restored = false;
                    if h.version > s.version {
                        s.version = h.version;
                        s.cursor = Cursor {
                            epoch: h.epoch,
                            offset: h.offset,
                        };
                    }
                    replicate(served, &mut s, Change::Whole, stop);
                    served.changed.notify_all();
                }
                let mut ack = Header::new(Kind::Ack, generation);
                ack.version = s.version;
                // Tells rank 0 whether its values were taken.
                ack.samples = u64::from(took);
                drop(s);
                ps::write(&mut writer, ack, &[])?;
            }
            Kind::Pull => {
                if h.len != 0 {
                    return Err(WireError::Protocol("a pull carries no payload".into()));
                }
                let mut s = served.shard.lock().unwrap_or_else(|p| p.into_inner());
                // A shard restored from a checkpoint serves once rank 0's
                // `Init` has aligned its version with the job's.
                // A version its standby has not acknowledged is not
                // published; a waiting pull retries reaching the standby.
                while (s.weights.is_none() || s.restored || s.unreplicated || s.version < h.version)
                    && !stop.load(Ordering::Relaxed)
                {
                    if s.unreplicated && !s.restored {
                        replicate(served, &mut s, Change::Whole, stop);
                        if !s.unreplicated {
                            served.changed.notify_all();
                            continue;
                        }
                    }
                    s = served
                        .changed
                        .wait_timeout(s, Duration::from_millis(100))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                let Some(w) = s.weights.clone() else {
                    return Ok(());
                };
                let mut out = Header::new(Kind::Weights, generation);
                out.version = s.version;
                (out.epoch, out.offset) = (s.cursor.epoch, s.cursor.offset);
                drop(s);
                // Straight from the shard's values: no copy per pull.
                ps::write(&mut writer, out, &w)?;
                drop(w);
                served
                    .bytes_out
                    .fetch_add(len as u64 * 4, Ordering::Relaxed);
            }
            Kind::Push => {
                ps::read_payload(&mut r, &h, len, &mut buf)?;
                served.bytes_in.fetch_add(len as u64 * 4, Ordering::Relaxed);
                let Some((accepted, version, snap, ask)) = push(served, from, &h, &buf, stop)
                else {
                    return Err(WireError::Protocol(
                        "stopped before the standby acknowledged the update".into(),
                    ));
                };
                let mut out =
                    Header::new(if accepted { Kind::Ack } else { Kind::Reject }, generation);
                out.version = version;
                out.checkpoint = u64::from(ask);
                ps::write(&mut writer, out, &[])?;
                if let (Some(snap), Some(u)) = (snap, served.uploader.as_ref()) {
                    // Blocks while the previous checkpoint is still uploading.
                    u.submit(snap);
                }
            }
            other => {
                return Err(WireError::Protocol(format!(
                    "a worker sent {other:?}, which only shards send"
                )))
            }
        }
    }
}

/// Takes a pushed gradient: whether it was accepted, and the shard's
/// version right after (for an applied push, the version it produced).
fn push(
    served: &Served,
    from: u32,
    h: &Header,
    grad: &[f32],
    stop: &AtomicBool,
) -> Option<(bool, u64, Option<Snapshot>, bool)> {
    let mut s = served.shard.lock().unwrap_or_else(|p| p.into_inner());
    let before = s.version;
    let accepted = take(&mut s, served, from, h, grad, stop);
    if accepted && h.checkpoint != 0 {
        s.checkpoint_at = Some(h.checkpoint);
    }
    // An update is acknowledged (and checkpointed) only once its standby
    // has it — or the standby was given up ([`STANDBY_GIVE_UP`]), which
    // bounds this wait.
    while s.version > before && s.unreplicated && !stop.load(Ordering::Relaxed) {
        replicate(served, &mut s, Change::Whole, stop);
        if s.unreplicated {
            s = served
                .changed
                .wait_timeout(s, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        } else {
            served.changed.notify_all();
        }
    }
    if s.version > before && s.unreplicated {
        // Stopping with an update its standby does not have: no answer.
        return None;
    }
    // The update the flagged push was part of is applied: checkpoint it.
    let snap = if s.version > before {
        s.checkpoint_at
            .take()
            .and_then(|step| s.snapshot(step, served))
    } else {
        None
    };
    // A draining shard server asks rank 0 for a checkpoint, once.
    let ask = served.drain.is_draining() && !s.drain_asked;
    if ask && from == 0 {
        s.drain_asked = true;
    }
    Some((accepted, s.version, snap, ask && from == 0))
}

fn take(
    s: &mut Shard,
    served: &Served,
    from: u32,
    h: &Header,
    grad: &[f32],
    stop: &AtomicBool,
) -> bool {
    if s.weights.is_none() {
        return false;
    }
    let staleness = s.version.saturating_sub(h.version);
    match served.consistency {
        Consistency::Sync => {
            if h.version != s.version || s.contributors.contains(&from) {
                s.rejected += u64::from(h.version != s.version);
                return h.version == s.version;
            }
            let first = s.contributors.is_empty();
            s.acc_samples += h.samples;
            s.contributors.insert(from);
            s.next_cursor = Cursor {
                epoch: h.epoch,
                offset: h.offset,
            };
            s.lr = h.lr;
            if s.contributors.len() as u32 >= s.expected {
                // The last gradient is summed into the others inside the
                // update's pass (a lone worker's is used as it is).
                let (samples, lr) = (s.acc_samples, s.lr);
                let acc = std::mem::take(&mut s.acc);
                let extra = (!first).then_some(&acc[..]);
                let before = s.version;
                s.apply(grad, extra, samples, lr, served.clip);
                s.staleness[0] += 1;
                s.cursor = s.next_cursor;
                s.acc_samples = 0;
                s.contributors.clear();
                if served.standby.is_some() {
                    // The standby applies the sum the update's pass formed
                    // (`(g + extra) · scale` there and `sum · scale` here
                    // round alike), so both hold the same bits.
                    let mut sum = std::mem::take(&mut s.sum);
                    let g = match extra {
                        None => grad,
                        Some(e) => {
                            sum.clear();
                            sum.extend(grad.iter().zip(e).map(|(a, b)| a + b));
                            &sum[..]
                        }
                    };
                    let change = Change::Update {
                        grad: g,
                        before,
                        samples,
                        lr,
                    };
                    replicate(served, s, change, stop);
                    s.sum = sum;
                }
                s.acc = acc;
                served.changed.notify_all();
            } else if first {
                s.acc.clear();
                s.acc.extend_from_slice(grad);
            } else {
                for (a, g) in s.acc.iter_mut().zip(grad) {
                    *a += *g;
                }
            }
            true
        }
        Consistency::Async | Consistency::Bounded { .. } => {
            if let Consistency::Bounded { staleness: tau } = served.consistency {
                if staleness > u64::from(tau) {
                    s.rejected += 1;
                    return false;
                }
            }
            let before = s.version;
            s.apply(grad, None, h.samples, h.lr, served.clip);
            s.staleness[(staleness as usize).min(STALENESS_BUCKETS - 1)] += 1;
            let change = Change::Update {
                grad,
                before,
                samples: h.samples,
                lr: h.lr,
            };
            replicate(served, s, change, stop);
            served.changed.notify_all();
            true
        }
    }
}

/// Where each shard's values live in a worker's flat weights.
struct ShardMap {
    peers: Vec<PsPeer>,
    /// Per shard: (flat offset, length) of each range, in order.
    pieces: Vec<Vec<(usize, usize)>>,
    lens: Vec<usize>,
}

impl ShardMap {
    fn new(a: &Assignment, replica: &Replica) -> Result<ShardMap, String> {
        let layout = replica.layout();
        let peers: Vec<PsPeer> = a.primaries().into_iter().cloned().collect();
        let mut pieces = Vec::new();
        let mut covered = 0;
        for p in &peers {
            let mut mine = Vec::new();
            for r in &p.ranges {
                let Some((_, off, n)) = layout.iter().find(|(k, _, _)| *k == r.param) else {
                    return Err(format!(
                        "shard {} holds a range of {:?}, which this model does not have",
                        p.shard, r.param
                    ));
                };
                if r.end as usize > *n || r.start >= r.end {
                    return Err(format!(
                        "shard {} holds {}[{}..{}] but the tensor has {n} values",
                        p.shard, r.param, r.start, r.end
                    ));
                }
                mine.push((off + r.start as usize, (r.end - r.start) as usize));
                covered += (r.end - r.start) as usize;
            }
            pieces.push(mine);
        }
        if covered != replica.numel() {
            return Err(format!(
                "the shards hold {covered} values but the model has {}",
                replica.numel()
            ));
        }
        let lens = pieces
            .iter()
            .map(|p| p.iter().map(|(_, n)| n).sum())
            .collect();
        Ok(ShardMap {
            peers,
            pieces,
            lens,
        })
    }

    fn gather(&self, s: usize, flat: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.lens[s]);
        for &(off, n) in &self.pieces[s] {
            out.extend_from_slice(&flat[off..off + n]);
        }
        out
    }
}

/// A worker's connection to one shard.
struct Link {
    stream: TcpStream,
    buf: Vec<f32>,
}

impl Link {
    fn call(
        &mut self,
        h: Header,
        payload: &[f32],
        expect_len: usize,
        stop: &AtomicBool,
    ) -> Result<Header, RoleError> {
        let broken = |e: WireError| {
            RoleError::Ring(trainyard_dataplane::RingError::Broken(format!(
                "parameter server: {e}"
            )))
        };
        ps::write(&mut self.stream, h, payload).map_err(broken)?;
        let mut r = Patient {
            stream: &mut self.stream,
            stop,
            deadline: Some(Instant::now() + PS_TIMEOUT),
        };
        let reply = ps::read_header(&mut r).map_err(broken)?;
        if reply.generation != h.generation {
            return Err(broken(WireError::Protocol(format!(
                "the shard answered for generation {}",
                reply.generation
            ))));
        }
        if reply.kind != Kind::Weights && reply.len != 0 {
            return Err(broken(WireError::Protocol(format!(
                "{:?} with a payload",
                reply.kind
            ))));
        }
        match reply.kind {
            Kind::Weights => {
                ps::read_payload(&mut r, &reply, expect_len, &mut self.buf).map_err(broken)?
            }
            Kind::Stale => {
                return Err(broken(WireError::Protocol(
                    "the shard serves another generation".into(),
                )))
            }
            _ => {}
        }
        Ok(reply)
    }
}

/// What a PS worker's step measured.
struct Exchange {
    versions: Vec<u64>,
    /// Each shard's data cursor.
    cursors: Vec<Cursor>,
    cursor: Cursor,
    bytes: u64,
}

/// A sync PS worker's last step, kept across generations on its device:
/// the gradient slice it pushed to each shard, computed at `version`, and
/// what the pushes carried. When a lost primary left its (promoted) shard
/// at `version` while the other shards moved on to `version + 1`, the
/// worker pushes the slice again to the shards that are behind (a sync
/// shard takes one push per worker and version, so nothing is applied
/// twice) before it pulls: the shards never end at different versions.
pub struct LastStep {
    version: u64,
    slices: Vec<Vec<f32>>,
    samples: u64,
    lr: f64,
    next: Cursor,
    checkpoint: u64,
}

/// Runs a PS worker for one generation. `replica` carries the model (and
/// the newest pulled weights) to the next generation.
#[allow(clippy::too_many_arguments)]
pub fn work(
    a: &Assignment,
    rank: u32,
    device: tch::Device,
    replica: &mut Option<Replica>,
    last_step: &mut Option<LastStep>,
    stop: &AtomicBool,
    tx: &UnboundedSender<Item>,
    ctx: &Context,
) -> Result<Option<replica::Outcome>, RoleError> {
    let log = |level, msg: String| {
        tracing::info!(job = %a.key.job_id, "{msg}");
        let _ = tx.send(Item::Log(level, msg));
    };
    let world = a.workers.len() as u32;
    let consistency = a.spec.consistency_mode();
    if replica.is_none() {
        *replica = Some(Replica::new(&a.spec, device, &ctx.fetcher)?);
    }
    let Some(rep) = replica.as_mut() else {
        return Err(RoleError::ps_fatal("no replica"));
    };
    let map = ShardMap::new(a, rep).map_err(RoleError::ps_fatal)?;
    let deadline = Instant::now() + PS_TIMEOUT;
    let mut links = Vec::new();
    for (s, p) in map.peers.iter().enumerate() {
        let hello = Hello {
            job: a.key.job_id,
            generation: a.key.generation,
            kind: EndpointRole::ParameterServer as u8,
            from: rank,
            to: p.shard,
        };
        let stream = plane::connect(&p.address, &hello, a.secret.as_bytes(), deadline, stop)
            .map_err(|e| {
                RoleError::Ring(trainyard_dataplane::RingError::Connect(format!(
                    "PS shard {} at {}: {e}",
                    p.shard, p.address
                )))
            })?;
        let io = |e: std::io::Error| {
            RoleError::Ring(trainyard_dataplane::RingError::Connect(e.to_string()))
        };
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(io)?;
        stream.set_write_timeout(Some(PS_TIMEOUT)).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        links.push(Link {
            stream,
            buf: Vec::with_capacity(map.lens[s]),
        });
    }
    let generation = a.key.generation;
    // Rank 0 seeds empty shards: at the start with the seeded
    // initialisation, after a PS executor was lost with the newest weights
    // it pulled.
    if rank == 0 {
        let flat = rep.read_range(0, rep.numel());
        for (s, link) in links.iter_mut().enumerate() {
            let mut h = Header::new(Kind::Init, generation);
            h.version = rep.step;
            (h.epoch, h.offset) = (rep.cursor.epoch, rep.cursor.offset);
            let reply = link.call(h, &map.gather(s, &flat), 0, stop)?;
            if reply.samples == 1 && rep.step > 0 {
                log(
                    LogLevel::Info,
                    format!("PS shard {s} had no values: restored from this worker's newest pull (version {})", rep.step),
                );
            }
        }
    }
    let mut expect = vec![0u64; links.len()];
    let mut local = rep.cursor;
    let mut stream_at = rep.cursor;
    let mut batches = rep.batches(rank, world, stream_at);
    let mut rejected = 0u64;
    let mut rejected_since = 0u32;
    let mut prefetched: Option<Vec<Result<Header, RoleError>>> = None;
    // Prefetching makes every push at least one version stale: only where
    // that cannot turn into rejections (async, or a bound that leaves room
    // for every other worker's push and this one).
    let prefetch = match consistency {
        Consistency::Sync => false,
        Consistency::Async => true,
        Consistency::Bounded { staleness } => staleness >= world,
    };
    // Shards that took the current batch's gradient (a partly rejected push
    // is recomputed for the others only, never applied twice).
    let mut accepted = vec![false; links.len()];
    // Rank 0 decides when the shards checkpoint: it marks one step's pushes
    // (kept over re-pushes of that step) and every shard checkpoints the
    // values that step produces.
    let mut policy = Policy::new(a.spec.checkpoint, ctx.drain.clone());
    let mut flag: Option<u64> = None;
    let mut asked = false;
    let mut line = ProgressLine::default();
    let mut mixed_warned = false;
    log(
        LogLevel::Info,
        format!(
            "worker {rank} of {world} starts with {} PS shard(s), {consistency:?} (generation {generation})",
            links.len()
        ),
    );
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(RoleError::Stopped);
        }
        // Pull every shard at once.
        let pulled = Instant::now();
        let ex = match prefetched.take() {
            Some(results) => apply_pull(&links, results, &map, rep)?,
            None => exchange_pull(&mut links, &expect, generation, &map, rep, stop)?,
        };
        let mut comm = pulled.elapsed().as_secs_f64();
        let mut comm_bytes = ex.bytes;
        let version = ex.versions[0];
        let lo = ex.versions.iter().copied().min().unwrap_or(0);
        let hi = ex.versions.iter().copied().max().unwrap_or(0);
        if consistency == Consistency::Sync && hi == lo + 1 {
            // A lost primary left its shard a version behind the others:
            // it gets this version's gradients again, then all are pulled
            // at the same version.
            let hi = catch_up(
                &mut links,
                &ex,
                last_step,
                generation,
                &map,
                a,
                rank,
                rep.total_steps(world),
                stop,
                &log,
            )?;
            expect.fill(hi);
            continue;
        }
        if consistency == Consistency::Sync && hi > lo + 1 && !mixed_warned {
            // Only a shard restored from a checkpoint gets here; nothing
            // can reconcile it with the others' versions.
            mixed_warned = true;
            log(
                LogLevel::Warn,
                format!(
                    "worker {rank}: the PS shards are at versions {:?}, more than one apart (a shard restored from a checkpoint): training goes on from shard 0's version",
                    ex.versions
                ),
            );
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
        let Ok(b) = batches.recv() else {
            return Err(RoleError::ps_fatal("the data loader stopped"));
        };
        stream_at = b.next;
        let data_seconds = waited.elapsed().as_secs_f64();
        let computed = Instant::now();
        // Async and bounded: the next pull travels while this step computes
        // (its values then miss this step's own push: one more version of
        // staleness, traded for hiding the pull).
        let (computed_grad, next) = if !prefetch {
            (rep.gradient(&b), None)
        } else {
            let links = &mut links;
            let (expect, map) = (&expect, &map);
            std::thread::scope(|scope| {
                let pull = scope.spawn(move || pull_all(links, expect, generation, map, stop));
                let g = rep.gradient(&b);
                (g, pull.join().ok())
            })
        };
        prefetched = next;
        let (loss_sum, grad) = computed_grad?;
        let compute = computed.elapsed().as_secs_f64();
        let loss = loss_sum / b.samples.max(1) as f64;
        progress::check_finite(loss, rep.step + 1)?;
        let lr = progress::learning_rate(&a.spec, rep.step + 1, total);
        if rank == 0 && flag.is_none() {
            let step = if consistency == Consistency::Sync {
                version + 1
            } else {
                rep.step + 1
            };
            if policy.due(step, policy.vote() || asked, step >= total) {
                flag = Some(step);
                policy.written(step);
                asked = false;
            }
        }
        let pushed = Instant::now();
        let skipped_before = accepted.clone();
        let step = LastStep {
            version,
            slices: (0..links.len())
                .map(|s| {
                    if accepted[s] {
                        Vec::new()
                    } else {
                        map.gather(s, &grad)
                    }
                })
                .collect(),
            samples: b.samples as u64,
            lr,
            next: b.next,
            checkpoint: flag.unwrap_or(0),
        };
        let headers: Vec<Option<Header>> = ex
            .versions
            .iter()
            .zip(&accepted)
            .map(|(v, skip)| (!skip).then(|| step.header(generation, *v)))
            .collect();
        let acks = exchange_push(&mut links, &headers, &step.slices, generation, stop);
        if consistency == Consistency::Sync {
            *last_step = Some(step);
        }
        let mut acks = acks?;
        for ((h, skipped), v) in acks.iter_mut().zip(&skipped_before).zip(&ex.versions) {
            if *skipped {
                h.version = v + 1;
            }
        }
        asked |= acks
            .iter()
            .any(|h| h.kind == Kind::Ack && h.checkpoint != 0);
        comm += pushed.elapsed().as_secs_f64();
        // Only what went out: shards that took this batch already got none.
        comm_bytes += acks
            .iter()
            .zip(&map.lens)
            .zip(&skipped_before)
            .filter(|(_, skipped)| !**skipped)
            .map(|((_, n), _)| *n as u64 * 4)
            .sum::<u64>();
        let rejects = acks.iter().filter(|h| h.kind == Kind::Reject).count() as u32;
        for (a, h) in accepted.iter_mut().zip(&acks) {
            *a |= h.kind == Kind::Ack;
        }
        let all_ok = accepted.iter().all(|a| *a);
        rejected += u64::from(rejects);
        rejected_since += rejects;
        // How many versions the shard had moved on since the pull (an
        // applied push bumps the version by one; sync pushes wait, so 0).
        let staleness = if consistency == Consistency::Sync {
            0
        } else {
            acks.iter()
                .zip(&ex.versions)
                .map(|(h, v)| h.version.saturating_sub(1).saturating_sub(*v))
                .max()
                .unwrap_or(0)
        };
        match consistency {
            Consistency::Sync => {
                // A sync shard never applies a push twice (it counts one per
                // worker and version): every step pushes to all of them.
                accepted.fill(false);
                flag = None;
                for (e, v) in expect.iter_mut().zip(&ex.versions) {
                    *e = v + 1;
                }
            }
            _ => {
                if !all_ok {
                    // Too stale somewhere: re-pull and recompute this share
                    // for the shards that refused it.
                    continue;
                }
                accepted.fill(false);
                flag = None;
                rep.step += 1;
                local = b.next;
            }
        }
        rep.set_last_loss(loss);
        let step_done = if consistency == Consistency::Sync {
            version + 1
        } else {
            rep.step
        };
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
        stats.rejected = std::mem::take(&mut rejected_since);
        if progress::evaluation_due(rank, stats.step, total, false) {
            (stats.eval_loss, stats.eval_accuracy) = rep.evaluate_now();
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
            std::thread::sleep(d);
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
        let zero = vec![0u64; links.len()];
        exchange_pull(&mut links, &zero, generation, &map, rep, stop)?;
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
            work(
                a,
                rank,
                device,
                &mut replica,
                &mut last_step,
                &role.stop,
                &role.tx,
                &role.ctx,
            )
        });
        match result {
            // The finished model is kept for a generation that may still come.
            Ok(Some(out)) => {
                role.finish(&out);
                return KeptWorker { replica, last_step };
            }
            Ok(None) | Err(RoleError::Stopped) => return KeptWorker { replica, last_step },
            Err(e) if e.is_transient() => {
                if !role.stopping() {
                    role.log(
                        LogLevel::Warn,
                        format!("{e}: keeping the model and retrying until the next generation"),
                    );
                }
                if role.pause(Duration::from_millis(500)) {
                    return KeptWorker { replica, last_step };
                }
            }
            Err(e) => {
                role.fail(e.to_string());
                return KeptWorker::default();
            }
        }
    }
}

fn exchange_pull(
    links: &mut [Link],
    expect: &[u64],
    generation: i64,
    map: &ShardMap,
    rep: &mut Replica,
    stop: &AtomicBool,
) -> Result<Exchange, RoleError> {
    let results = pull_all(links, expect, generation, map, stop);
    apply_pull(links, results, map, rep)
}

/// Pulls every shard at once into the links' buffers.
fn pull_all(
    links: &mut [Link],
    expect: &[u64],
    generation: i64,
    map: &ShardMap,
    stop: &AtomicBool,
) -> Vec<Result<Header, RoleError>> {
    std::thread::scope(|scope| {
        let joins: Vec<_> = links
            .iter_mut()
            .enumerate()
            .map(|(s, link)| {
                let mut h = Header::new(Kind::Pull, generation);
                h.version = expect[s];
                let len = map.lens[s];
                scope.spawn(move || link.call(h, &[], len, stop))
            })
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(RoleError::ps_fatal("a pull thread panicked")))
            })
            .collect()
    })
}

/// Loads pulled values into the replica's weights.
fn apply_pull(
    links: &[Link],
    results: Vec<Result<Header, RoleError>>,
    map: &ShardMap,
    rep: &mut Replica,
) -> Result<Exchange, RoleError> {
    let mut versions = Vec::new();
    let mut cursors = Vec::new();
    let mut cursor = Cursor::default();
    let mut bytes = 0;
    for (s, r) in results.into_iter().enumerate() {
        let h = r?;
        if h.kind != Kind::Weights {
            return Err(RoleError::ps_fatal(format!(
                "shard {s} answered a pull with {:?}",
                h.kind
            )));
        }
        let mut at = 0;
        for &(off, n) in &map.pieces[s] {
            rep.load_range(off, &links[s].buf[at..at + n]);
            at += n;
        }
        bytes += map.lens[s] as u64 * 4;
        let at = Cursor {
            epoch: h.epoch,
            offset: h.offset,
        };
        if s == 0 {
            cursor = at;
        }
        cursors.push(at);
        versions.push(h.version);
    }
    Ok(Exchange {
        versions,
        cursors,
        cursor,
        bytes,
    })
}

impl LastStep {
    /// The push of this step's slice to a shard at `version`.
    fn header(&self, generation: i64, version: u64) -> Header {
        let mut h = Header::new(Kind::Push, generation);
        h.version = version;
        h.samples = self.samples;
        h.lr = self.lr;
        h.checkpoint = self.checkpoint;
        (h.epoch, h.offset) = (self.next.epoch, self.next.offset);
        h
    }
}

/// Sync: brings the shards that are a version behind the others (a lost
/// primary's promoted standby) to the others' version by pushing them
/// this worker's gradient of that version again — or, where this worker
/// has none (it joined since, or its last step was another version), a
/// zero gradient over no samples, which counts it as a contributor and
/// changes neither the sum nor the samples. Returns the version all shards
/// are to be pulled at. The shards are at most one version apart.
#[allow(clippy::too_many_arguments)]
fn catch_up(
    links: &mut [Link],
    ex: &Exchange,
    last_step: &Option<LastStep>,
    generation: i64,
    map: &ShardMap,
    a: &Assignment,
    rank: u32,
    total: u64,
    stop: &AtomicBool,
    log: &dyn Fn(LogLevel, String),
) -> Result<u64, RoleError> {
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
    let (step, slices) = match mine {
        Some(l) => (
            LastStep {
                slices: Vec::new(),
                ..*l
            },
            &l.slices,
        ),
        None => {
            zeros = map.lens.iter().map(|n| vec![0.0; *n]).collect();
            (
                LastStep {
                    version: lo,
                    slices: Vec::new(),
                    samples: 0,
                    lr: progress::learning_rate(&a.spec, lo + 1, total),
                    next: ex.cursors[ahead],
                    checkpoint: 0,
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
    let headers: Vec<Option<Header>> = ex
        .versions
        .iter()
        .map(|v| (*v == lo).then(|| step.header(generation, lo)))
        .collect();
    let acks = exchange_push(links, &headers, slices, generation, stop)?;
    for (s, h) in acks.iter().enumerate() {
        if ex.versions[s] == lo && h.kind != Kind::Ack {
            return Err(RoleError::ps_fatal(format!(
                "PS shard {s} answered {:?} to version {lo}'s gradient while the others are at {hi}",
                h.kind
            )));
        }
    }
    Ok(hi)
}

/// Pushes `payloads[s]` with `headers[s]` to every shard that has a header
/// (the others took this batch already: acknowledged as they are).
fn exchange_push(
    links: &mut [Link],
    headers: &[Option<Header>],
    payloads: &[Vec<f32>],
    generation: i64,
    stop: &AtomicBool,
) -> Result<Vec<Header>, RoleError> {
    let results: Vec<Result<Header, RoleError>> = std::thread::scope(|scope| {
        let joins: Vec<_> = links
            .iter_mut()
            .zip(headers)
            .zip(payloads)
            .map(|((link, h), payload)| {
                let h = *h;
                scope.spawn(move || match h {
                    // Took this batch already: nothing to send, and no
                    // staleness to count again.
                    None => Ok(Header::new(Kind::Ack, generation)),
                    Some(h) => link.call(h, payload, 0, stop),
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(RoleError::ps_fatal("a push thread panicked")))
            })
            .collect()
    });
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use trainyard_common::cluster::{RoleKey, RoleKind as Role, WorkerPeer};
    use trainyard_common::spec::Strategy;

    const LEN: u64 = 46;

    fn assignment(plane: &DataPlane, index: u32, consistency: serde_json::Value) -> Assignment {
        let spec: trainyard_common::JobSpec = serde_json::from_value(json!({
            "name": "standby", "model": {"kind": "mlp", "inputs": 8, "hidden": [4], "outputs": 2},
            "dataset": {"kind": "classification", "samples": 100, "features": 8, "classes": 2},
            "loss": "cross_entropy", "optimizer": {"kind": "adam", "lr": 0.01, "grad_clip": 0.5},
            "batch_size": 4, "steps": 10, "strategy": "parameter_server", "replicas": 1,
            "consistency": consistency, "workers": {"min": 2, "max": 2}
        }))
        .unwrap();
        let address = plane.local_addr().to_string();
        let ranges = vec![Range {
            param: "w".into(),
            start: 0,
            end: LEN,
        }];
        let peer = |shard| PsPeer {
            shard,
            executor_id: uuid::Uuid::nil(),
            address: address.clone(),
            ranges: ranges.clone(),
        };
        Assignment {
            key: RoleKey {
                job_id: uuid::Uuid::from_u128(7),
                generation: 3,
                role: Role::Ps,
                index,
            },
            device: None,
            strategy: Strategy::ParameterServer,
            secret: "s3cret".into(),
            spec: spec.into(),
            workers: (0..2)
                .map(|rank| WorkerPeer {
                    rank,
                    executor_id: uuid::Uuid::nil(),
                    address: address.clone(),
                    device: 0,
                })
                .collect(),
            parameter_servers: vec![peer(0), peer(STANDBY_INDEX_BASE)],
            resume: None,
        }
    }

    /// A connection to `to` as `from`, speaking the PS protocol.
    fn dial(plane: &DataPlane, from: u32, to: u32) -> TcpStream {
        dial_at(plane, from, to, 3)
    }

    /// [`dial`] in `generation`.
    fn dial_at(plane: &DataPlane, from: u32, to: u32, generation: i64) -> TcpStream {
        let hello = Hello {
            job: uuid::Uuid::from_u128(7),
            generation,
            kind: EndpointRole::ParameterServer as u8,
            from,
            to,
        };
        let s = plane::connect(
            &plane.local_addr().to_string(),
            &hello,
            b"s3cret",
            Instant::now() + Duration::from_secs(10),
            &AtomicBool::new(false),
        )
        .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s
    }

    fn call(s: &mut TcpStream, h: Header, payload: &[f32], buf: &mut Vec<f32>) -> Header {
        ps::write(s, h, payload).unwrap();
        let reply = ps::read_header(s).unwrap();
        if reply.kind == Kind::Weights {
            ps::read_payload(s, &reply, LEN as usize, buf).unwrap();
        }
        reply
    }

    fn grad(seed: u32) -> Vec<f32> {
        (0..LEN as u32)
            .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 997.0 - 0.5)
            .collect()
    }

    /// Two workers train three sync steps (and three async ones) through a
    /// shard with a standby: the standby ends with the shard's very bits
    /// (values, Adam's moments and step count, version, cursor), and it
    /// refuses an update that does not follow from its version.
    #[test]
    fn a_standby_ends_with_the_shards_very_bits_and_refuses_an_update_it_cannot_follow() {
        for consistency in [json!("sync"), json!("async")] {
            let plane = DataPlane::bind("127.0.0.1:0").unwrap();
            let primary = assignment(&plane, 0, consistency.clone());
            let standby = assignment(&plane, STANDBY_INDEX_BASE, consistency.clone());
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let stop = AtomicBool::new(false);
            let (shard, copy) = std::thread::scope(|scope| {
                let sb = scope.spawn(|| serve_standby(&standby, 0, &stop, &tx, &plane, None));
                let pr = scope.spawn(|| {
                    serve_shard(
                        &primary,
                        &stop,
                        &tx,
                        &plane,
                        None,
                        Err("no store".into()),
                        &Context::for_tests(),
                    )
                });
                let mut w: Vec<TcpStream> = (0..2).map(|r| dial(&plane, r, 0)).collect();
                let mut buf = Vec::new();
                let init: Vec<f32> = (0..LEN).map(|i| i as f32 / 100.0).collect();
                let ack = call(&mut w[0], Header::new(Kind::Init, 3), &init, &mut buf);
                assert_eq!((ack.kind, ack.samples), (Kind::Ack, 1));
                for step in 0..3u32 {
                    for (r, link) in w.iter_mut().enumerate() {
                        let mut pull = Header::new(Kind::Pull, 3);
                        pull.version = if consistency == "sync" {
                            u64::from(step)
                        } else {
                            0
                        };
                        let got = call(link, pull, &[], &mut buf);
                        assert_eq!(got.kind, Kind::Weights);
                        let mut push = Header::new(Kind::Push, 3);
                        push.version = got.version;
                        push.samples = 4;
                        push.lr = 0.01;
                        (push.epoch, push.offset) = (0, u64::from(step + 1) * 8);
                        let g = grad(step * 2 + r as u32);
                        assert_eq!(call(link, push, &g, &mut buf).kind, Kind::Ack);
                    }
                }
                // The latest version is published: the standby has it.
                let mut pull = Header::new(Kind::Pull, 3);
                pull.version = if consistency == "sync" { 3 } else { 6 };
                let last = call(&mut w[0], pull, &[], &mut buf);
                assert_eq!(last.kind, Kind::Weights);
                // An update the standby cannot follow is refused.
                let mut odd = dial(&plane, 0, STANDBY_INDEX_BASE);
                let mut h = Header::new(Kind::Update, 3);
                h.version = 999;
                let reply = call(&mut odd, h, &grad(9), &mut buf);
                assert_eq!(reply.kind, Kind::Reject);
                assert_eq!(reply.version, last.version);
                stop.store(true, Ordering::Relaxed);
                (pr.join().unwrap().unwrap(), sb.join().unwrap().unwrap())
            });
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let (a, b) = (shard.weights.unwrap(), copy.weights.unwrap());
            assert_eq!(bits(&a), bits(&b), "{consistency}");
            assert_ne!(
                bits(&a),
                bits(&(0..LEN).map(|i| i as f32 / 100.0).collect::<Vec<_>>())
            );
            for (x, y) in shard.opt.state().iter().zip(copy.opt.state()) {
                assert_eq!(bits(x), bits(y));
            }
            assert_eq!(shard.opt.t, copy.opt.t);
            assert_eq!(shard.version, copy.version);
            assert_eq!(
                (shard.cursor.epoch, shard.cursor.offset),
                (copy.cursor.epoch, copy.cursor.offset)
            );
            let want = if consistency == "sync" { 3 } else { 6 };
            assert_eq!(shard.version, want, "{consistency}");
        }
    }

    /// The primary dies after its standby applied an update but before
    /// the last worker read its acknowledgement: the standby, promoted (it
    /// becomes the shard on its executor at the next generation), serves
    /// the version the primary had reached, with the primary's very bits;
    /// the worker's push of the version already applied is refused, never
    /// applied twice; and the shard trains on. A standby promoted before
    /// it ever received state says so in an error-level line.
    #[test]
    fn a_promoted_standby_serves_the_applied_version_and_never_applies_a_push_twice() {
        let plane = DataPlane::bind("127.0.0.1:0").unwrap();
        let primary = assignment(&plane, 0, json!("sync"));
        let standby = assignment(&plane, STANDBY_INDEX_BASE, json!("sync"));
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let stop = AtomicBool::new(false);
        let init: Vec<f32> = (0..LEN).map(|i| i as f32 / 100.0).collect();
        let push_at = |version: u64, r: u32, generation: i64| {
            let mut push = Header::new(Kind::Push, generation);
            push.version = version;
            push.samples = 4;
            push.lr = 0.01;
            (push.epoch, push.offset) = (0, (version + 1) * 8);
            (push, grad(version as u32 * 2 + r))
        };
        let (dead, copy) = std::thread::scope(|scope| {
            let sb = scope.spawn(|| serve_standby(&standby, 0, &stop, &tx, &plane, None));
            let pr = scope.spawn(|| {
                serve_shard(
                    &primary,
                    &stop,
                    &tx,
                    &plane,
                    None,
                    Err("no store".into()),
                    &Context::for_tests(),
                )
            });
            let mut w: Vec<TcpStream> = (0..2).map(|r| dial(&plane, r, 0)).collect();
            let mut buf = Vec::new();
            call(&mut w[0], Header::new(Kind::Init, 3), &init, &mut buf);
            let (h, g) = push_at(0, 0, 3);
            assert_eq!(call(&mut w[0], h, &g, &mut buf).kind, Kind::Ack);
            // The last push completes version 1; its answer is never read.
            let (h, g) = push_at(0, 1, 3);
            ps::write(&mut w[1], h, &g).unwrap();
            // Version 1 exists once the standby has it.
            let mut pull = Header::new(Kind::Pull, 3);
            pull.version = 1;
            assert_eq!(call(&mut w[0], pull, &[], &mut buf).version, 1);
            stop.store(true, Ordering::Relaxed);
            (pr.join().unwrap().unwrap(), sb.join().unwrap().unwrap())
        });
        assert_eq!((dead.version, copy.version), (1, 1));

        // Generation 4: the standby's executor holds the shard, no standby.
        let mut promoted = assignment(&plane, 0, json!("sync"));
        promoted.key.generation = 4;
        promoted.parameter_servers.retain(|p| p.shard == 0);
        let stop = AtomicBool::new(false);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let shard = std::thread::scope(|scope| {
            let sh = scope.spawn(|| {
                serve_shard(
                    &promoted,
                    &stop,
                    &tx,
                    &plane,
                    Some(copy),
                    Err("no store".into()),
                    &Context::for_tests(),
                )
            });
            let mut w: Vec<TcpStream> = (0..2).map(|r| dial_at(&plane, r, 0, 4)).collect();
            let mut buf = Vec::new();
            let got = call(&mut w[1], Header::new(Kind::Pull, 4), &[], &mut buf);
            assert_eq!((got.kind, got.version), (Kind::Weights, 1));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&buf), bits(dead.weights.as_ref().unwrap()));
            // The push whose acknowledgement was lost, again: refused.
            let (h, g) = push_at(0, 1, 4);
            let again = call(&mut w[1], h, &g, &mut buf);
            assert_eq!((again.kind, again.version), (Kind::Reject, 1));
            // Training goes on from version 1.
            for (r, link) in w.iter_mut().enumerate() {
                let (h, g) = push_at(1, r as u32, 4);
                assert_eq!(call(link, h, &g, &mut buf).kind, Kind::Ack);
            }
            let mut pull = Header::new(Kind::Pull, 4);
            pull.version = 2;
            assert_eq!(call(&mut w[0], pull, &[], &mut buf).version, 2);
            stop.store(true, Ordering::Relaxed);
            sh.join().unwrap().unwrap()
        });
        assert_eq!((shard.version, shard.applied), (2, 2));
        let mut errors = || {
            let mut out = Vec::new();
            while let Ok(item) = rx.try_recv() {
                if let Item::Log(LogLevel::Error, m) = item {
                    out.push(m);
                }
            }
            out
        };
        assert!(errors().is_empty());

        // A standby that never got its shard's state, promoted.
        let mut empty = Shard::new(&promoted, shard.ranges.clone());
        empty.was_standby = true;
        let stop = AtomicBool::new(true);
        serve_shard(
            &promoted,
            &stop,
            &tx,
            &plane,
            Some(empty),
            Err("no store".into()),
            &Context::for_tests(),
        );
        let errors = errors();
        assert!(
            errors
                .iter()
                .any(|m| m.contains("never received the shard's state")),
            "{errors:?}"
        );
    }

    /// A whole state sent out of order, or a payload of the wrong length,
    /// ends the connection without touching the standby's state.
    #[test]
    fn a_standby_refuses_malformed_state() {
        let plane = DataPlane::bind("127.0.0.1:0").unwrap();
        let standby = assignment(&plane, STANDBY_INDEX_BASE, json!("sync"));
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let stop = AtomicBool::new(false);
        let copy = std::thread::scope(|scope| {
            let sb = scope.spawn(|| serve_standby(&standby, 0, &stop, &tx, &plane, None));
            // Part 1 of 3 before part 0.
            let mut s = dial(&plane, 0, STANDBY_INDEX_BASE);
            let mut h = Header::new(Kind::State, 3);
            h.checkpoint = (3 << 32) | 1;
            ps::write(&mut s, h, &vec![1.0; LEN as usize]).unwrap();
            assert!(ps::read_header(&mut s).is_err());
            // Part 0 one value short.
            let mut s = dial(&plane, 0, STANDBY_INDEX_BASE);
            h.checkpoint = 3 << 32;
            ps::write(&mut s, h, &vec![1.0; LEN as usize - 1]).unwrap();
            assert!(ps::read_header(&mut s).is_err());
            // A worker's message.
            let mut s = dial(&plane, 0, STANDBY_INDEX_BASE);
            ps::write(&mut s, Header::new(Kind::Pull, 3), &[]).unwrap();
            assert!(ps::read_header(&mut s).is_err());
            stop.store(true, Ordering::Relaxed);
            sb.join().unwrap().unwrap()
        });
        assert!(copy.weights.is_none());
    }
}
