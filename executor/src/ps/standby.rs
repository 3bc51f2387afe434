//! Hot standbys: how a shard keeps one up to date, and the standby role.
//!
//! **The shard's side** ([`replicate`], a thread of the shard server):
//! the shard queues each change it makes ([`Change`]) and publishes it
//! only once this thread has delivered it and the standby acknowledged it
//! ([`Shard::acknowledged`]). The thread takes a change from the queue
//! under the shard's lock and does the network I/O without it, so pulls
//! and pushes of other versions never wait behind the standby. It sends
//! the whole state once per connection (and wherever the standby cannot
//! follow: a rejected update, a replaced state), then every applied
//! update — the gradient sum, version, samples, learning rate, cursor and
//! whether it replaced the shard's buffers, which the standby applies with
//! the same code to the same bits. If the
//! standby cannot be reached the shard publishes nothing new until it can
//! (retrying every [`STANDBY_RETRY`]), until the next generation assigns
//! another standby (or none), or for at most [`STANDBY_GIVE_UP`]: then it
//! gives the standby up for the rest of the generation, says so in an
//! error-level line of the job's log, and publishes unreplicated.
//!
//! **The standby role** ([`serve_standby`]): a PS role of its own on
//! another executor that holds a copy of the shard's state and serves no
//! worker. It takes the shard's connection only (the data plane's
//! handshake: job secret and generation) and answers each message with
//! its version, or refuses an update that does not follow from it. When
//! the scheduler promotes it, its copy is the state the shard server
//! started on its executor takes over ([`crate::roles`] keys PS state by
//! shard, primary or standby alike).

use super::ranges::shard_len;
use super::shard::{Change, Locked, Published, Shard, Update};
use super::{from_wire, read_current, standby_endpoint, to_wire};
use crate::replica::optim::FlatOptimizer;
use crate::reports::Item;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use trainyard_common::cluster::{Assignment, LogLevel, PsPeer, RoleOutcome};
use trainyard_dataplane::frame::Patient;
use trainyard_dataplane::handshake::Hello;
use trainyard_dataplane::ps::{self, Message, WireError};
use trainyard_dataplane::{plane, DataPlane, EndpointKey, EndpointRole};
use trainyard_shutdown::Shutdown;

/// How long a shard waits for its standby: to connect, and to acknowledge
/// one message.
pub const STANDBY_TIMEOUT: Duration = Duration::from_secs(10);

/// Least time between two attempts to reach an unreachable standby.
pub const STANDBY_RETRY: Duration = Duration::from_millis(500);

/// How long a shard keeps failing to reach its standby before it gives it
/// up for the rest of the generation (an error-level line in the job's
/// log says so) and publishes its versions unreplicated.
pub const STANDBY_GIVE_UP: Duration = Duration::from_secs(30);

/// A shard's connection to its standby, owned by the replicator thread.
pub(super) struct StandbyLink {
    job: uuid::Uuid,
    generation: i64,
    shard: u32,
    pub(super) address: String,
    secret: Vec<u8>,
    stream: Option<TcpStream>,
    /// The standby has the shard's whole state (sent on this connection).
    synced: bool,
    /// When the last attempt failed.
    failed_at: Option<Instant>,
    /// Since when every attempt failed.
    failing_since: Option<Instant>,
    /// Messages it acknowledged, and failures, for the log.
    pub(super) acked: u64,
    pub(super) failures: u64,
}

/// The shard's whole state, copied under its lock to be sent without it.
struct WholeState {
    weights: Arc<Vec<f32>>,
    state: Vec<Vec<f32>>,
    optimizer_steps: u64,
    published: Published,
}

/// What the replicator sends next.
enum Job {
    /// One update, with the state it leads to.
    Update(Update),
    /// The whole state.
    Whole(WholeState),
}

/// Why a change was not delivered.
enum Undelivered {
    /// The standby does not hold the state the update follows from: it
    /// gets the whole state, on the same connection.
    Behind,
    /// The standby could not be reached or the connection failed.
    Failed(LinkError),
}

/// Why the connection to the standby failed (it is opened again).
#[derive(Debug, thiserror::Error)]
pub(super) enum LinkError {
    /// The standby's address did not answer the handshake.
    #[error("cannot reach the standby at {address}: {source}")]
    Unreachable {
        /// Where it was sought.
        address: String,
        /// Why.
        source: trainyard_dataplane::handshake::HandshakeError,
    },
    /// The socket's options could not be set.
    #[error("the standby's socket: {0}")]
    Socket(std::io::Error),
    /// A message could not be written or read.
    #[error("the standby's connection: {0}")]
    Wire(#[from] WireError),
    /// No connection was open.
    #[error("not connected")]
    NotConnected,
    /// An answer for another generation, or one with a payload.
    #[error("the standby answered {kind:?} for generation {generation} with {len} bytes")]
    Stray {
        /// The message's kind.
        kind: String,
        /// Its generation.
        generation: i64,
        /// Its payload's bytes.
        len: u64,
    },
    /// An answer other than the acknowledgement due.
    #[error("the standby answered {reply} where version {want} was due")]
    Unexpected {
        /// The answer.
        reply: String,
        /// The version due.
        want: u64,
    },
    /// The standby refused the whole state.
    #[error("the standby refused the shard's state")]
    Refused,
}

/// Why a message to the standby was not acknowledged.
enum Failed {
    /// It does not hold the state the message follows from.
    Rejected,
    /// The connection failed or the answer made no sense: reconnect.
    Broken(LinkError),
}

/// Who the replicator reports to.
pub(super) struct Reporting<'a> {
    /// The shard's index.
    pub(super) index: u32,
    /// The job.
    pub(super) job: uuid::Uuid,
    /// The role's report channel (a standby given up is logged there).
    pub(super) tx: &'a UnboundedSender<Item>,
    /// Test hook (`TRAINYARD_SLOW_STANDBY`): a pause before each update is
    /// sent — a window in which the other shards have published a version
    /// this one has not, for a kill to land in.
    pub(super) slow: Option<Duration>,
}

impl StandbyLink {
    /// The link of assignment `a`'s shard to its standby at `peer`.
    pub(super) fn new(a: &Assignment, peer: &PsPeer) -> StandbyLink {
        StandbyLink {
            job: a.key.job_id,
            generation: a.key.generation,
            shard: a.key.index,
            address: peer.address.clone(),
            secret: a.secret.as_bytes().to_vec(),
            stream: None,
            synced: false,
            failed_at: None,
            failing_since: None,
            acked: 0,
            failures: 0,
        }
    }

    /// Sends `job` (the whole state where the standby may not hold the
    /// state it follows from) and waits for the acknowledgement.
    fn send(&mut self, job: &Job, stop: &Shutdown) -> Result<Published, Undelivered> {
        if self.stream.is_none() {
            if let Err(e) = self.connect(stop) {
                self.failed_at = Some(Instant::now());
                self.failures += 1;
                return Err(Undelivered::Failed(e));
            }
        }
        let result = self.deliver(job, stop);
        match &result {
            Ok(_) => {
                self.synced = true;
                self.acked += 1;
            }
            Err(Undelivered::Behind) => self.synced = false,
            Err(Undelivered::Failed(_)) => {
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
    fn connect(&mut self, stop: &Shutdown) -> Result<(), LinkError> {
        let hello = Hello {
            job: self.job,
            generation: self.generation,
            kind: EndpointRole::ParameterServer as u8,
            from: self.shard,
            to: standby_endpoint(self.shard),
        };
        let stream = plane::connect(
            &self.address,
            &hello,
            &self.secret,
            Instant::now() + STANDBY_TIMEOUT,
            stop,
        )
        .map_err(|source| LinkError::Unreachable {
            address: self.address.clone(),
            source,
        })?;
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .and_then(|()| stream.set_write_timeout(Some(STANDBY_TIMEOUT)))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(LinkError::Socket)?;
        self.stream = Some(stream);
        self.synced = false;
        Ok(())
    }

    /// Sends `job` on the open connection.
    fn deliver(&mut self, job: &Job, stop: &Shutdown) -> Result<Published, Undelivered> {
        match job {
            Job::Update(Update {
                grad,
                before,
                samples,
                lr,
                carries_state,
                momentum,
                after,
            }) => {
                let m = Message::Update {
                    before: *before,
                    samples: *samples,
                    lr: *lr,
                    cursor: to_wire(after.cursor),
                    carries_state: *carries_state,
                    momentum: *momentum,
                };
                match self.call(&m, grad, after.version, stop) {
                    Ok(()) => Ok(after.clone()),
                    // It does not hold the version this update follows.
                    Err(Failed::Rejected) => Err(Undelivered::Behind),
                    Err(Failed::Broken(e)) => Err(Undelivered::Failed(e)),
                }
            }
            Job::Whole(w) => self.whole(w, stop).map_err(Undelivered::Failed),
        }
    }

    /// Sends the whole state: the values, then each optimizer state tensor.
    fn whole(&mut self, w: &WholeState, stop: &Shutdown) -> Result<Published, LinkError> {
        let parts = 1 + w.state.len();
        let p = &w.published;
        for (i, part) in std::iter::once(&w.weights[..])
            .chain(w.state.iter().map(|t| &t[..]))
            .enumerate()
        {
            let m = Message::State {
                version: p.version,
                cursor: to_wire(p.cursor),
                optimizer_steps: w.optimizer_steps,
                part: i as u32,
                parts: parts as u32,
            };
            self.call(&m, part, p.version, stop).map_err(|e| match e {
                Failed::Rejected => LinkError::Refused,
                Failed::Broken(e) => e,
            })?;
        }
        Ok(w.published.clone())
    }

    /// One message and its acknowledgement with version `want`.
    fn call(
        &mut self,
        m: &Message,
        payload: &[f32],
        want: u64,
        stop: &Shutdown,
    ) -> Result<(), Failed> {
        let broken = |e: WireError| Failed::Broken(LinkError::Wire(e));
        let Some(stream) = self.stream.as_mut() else {
            return Err(Failed::Broken(LinkError::NotConnected));
        };
        ps::write_message(stream, self.generation, m, payload).map_err(broken)?;
        let mut r = Patient {
            stream,
            stop,
            deadline: Some(Instant::now() + STANDBY_TIMEOUT),
        };
        let reply = ps::read_message(&mut r).map_err(broken)?;
        if reply.generation != self.generation || reply.len != 0 {
            return Err(Failed::Broken(LinkError::Stray {
                kind: format!("{:?}", reply.message.kind()),
                generation: reply.generation,
                len: u64::from(reply.len),
            }));
        }
        match reply.message {
            Message::Ack { version, .. } if version == want => Ok(()),
            Message::Rejected { .. } => Err(Failed::Rejected),
            other => Err(Failed::Broken(LinkError::Unexpected {
                reply: format!("{other:?}"),
                want,
            })),
        }
    }
}

/// The replicator: delivers the shard's changes to its standby until
/// `stop` (or the standby is given up), publishing each once it is
/// acknowledged. Returns the link, for its counters.
pub(super) fn replicate(
    shard: &Locked,
    mut link: StandbyLink,
    report: &Reporting<'_>,
    stop: &Shutdown,
) -> StandbyLink {
    loop {
        let job = {
            let mut s = shard.lock();
            loop {
                if stop.is_triggered() || !s.replicated {
                    return link;
                }
                let retry_due = link.failed_at.is_none_or(|t| t.elapsed() >= STANDBY_RETRY);
                if retry_due && s.weights.is_some() && !s.outbox.is_empty() {
                    break;
                }
                s = shard.wait(s);
            }
            next_job(&mut s, link.synced)
        };
        let Some(job) = job else { continue };
        if let (Some(pause), Job::Update(_)) = (report.slow, &job) {
            stop.sleep(pause);
        }
        let result = link.send(&job, stop);
        let mut s = shard.lock();
        if let Job::Update(u) = job {
            s.spare.push(u.grad);
        }
        match result {
            Ok(acked) => {
                if link.failing_since.take().is_some() {
                    tracing::info!(
                        shard = report.index,
                        version = acked.version,
                        "PS standby caught up"
                    );
                }
                s.acknowledged(acked);
            }
            // It gets the whole state now, on the same connection.
            Err(Undelivered::Behind) => s.outbox.push_front(Change::Whole),
            Err(Undelivered::Failed(e)) => {
                // Whatever the standby holds now, it gets the whole state.
                s.outbox.push_front(Change::Whole);
                let first = link.failing_since.is_none();
                let since = *link.failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= STANDBY_GIVE_UP {
                    // Bounded: the job goes on, and says plainly what it lost.
                    s.unreplicated();
                    let msg = format!(
                        "PS shard {}: its standby at {} has been unreachable for {} s ({e}); the shard goes on WITHOUT a standby for the rest of generation {}: versions from {} on are not replicated and are lost if this executor is",
                        report.index,
                        link.address,
                        since.elapsed().as_secs(),
                        link.generation,
                        s.version
                    );
                    tracing::error!(job = %report.job, "{msg}");
                    let _ = report.tx.send(Item::Log(LogLevel::Error, msg));
                } else if first {
                    tracing::warn!(
                        shard = report.index,
                        version = s.version,
                        "PS standby: {e}; versions held back until it answers"
                    );
                }
            }
        }
        drop(s);
        shard.changed();
    }
}

/// Takes the next change off the queue: the update at its head, or the
/// whole state (copied now) where the standby is not known to follow.
fn next_job(s: &mut Shard, synced: bool) -> Option<Job> {
    let whole = !synced || matches!(s.outbox.front(), Some(Change::Whole));
    if !whole {
        return match s.outbox.pop_front()? {
            Change::Update(u) => Some(Job::Update(u)),
            Change::Whole => None,
        };
    }
    // The whole state includes every queued update.
    for c in s.outbox.drain(..) {
        if let Change::Update(u) = c {
            s.spare.push(u.grad);
        }
    }
    let weights = s.weights.clone()?;
    Some(Job::Whole(WholeState {
        state: s.opt.state().to_vec(),
        optimizer_steps: s.opt.t,
        published: Published {
            version: s.version,
            weights: weights.clone(),
            cursor: s.cursor,
        },
        weights,
    }))
}

/// Runs the standby of shard `shard_index` of a job for one generation:
/// takes the shard's state and updates from the shard (and nothing from
/// anyone else), and returns its copy for the next generation on this
/// executor — where it becomes the shard when the scheduler promotes it.
pub fn serve_standby(
    a: &Assignment,
    shard_index: u32,
    stop: &Shutdown,
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
        parked => match Shard::new(a, me.ranges.clone()) {
            Ok(s) => s,
            Err(e) => {
                let reason = format!("the standby of PS shard {shard_index}'s assignment: {e}");
                log(LogLevel::Error, reason.clone());
                let _ = tx.send(Item::Outcome(RoleOutcome::Failed { reason }));
                return parked;
            }
        },
    };
    let expected = shard.expected;
    shard.begin(a.key.generation, expected, false);
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
    let states = FlatOptimizer::state_tensors(a.spec.optimizer().kind);
    let shared = Mutex::new(shard);
    let clip = a.spec.optimizer().grad_clip;
    let endpoint = plane.register(
        EndpointKey {
            job: a.key.job_id,
            kind: EndpointRole::ParameterServer,
            rank: standby_endpoint(shard_index),
        },
        a.key.generation,
        a.secret.as_bytes(),
    );
    let generation = a.key.generation;
    std::thread::scope(|scope| {
        while !stop.is_triggered() {
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
    fn connection(&self, mut stream: TcpStream, stop: &Shutdown) -> Result<(), WireError> {
        stream.set_read_timeout(Some(Duration::from_millis(50)))?;
        stream.set_write_timeout(Some(STANDBY_TIMEOUT))?;
        stream.set_nodelay(true)?;
        let mut writer = stream.try_clone()?;
        let mut buf = Vec::new();
        // The parts of a whole state received so far (installed together
        // with the last, so a broken transfer leaves the old state whole).
        let mut staged: Vec<Vec<f32>> = Vec::new();
        let ack = |version| Message::Ack {
            version,
            values_taken: false,
            checkpoint_wanted: false,
        };
        loop {
            let mut r = Patient {
                stream: &mut stream,
                stop,
                deadline: None,
            };
            let Some(m) = read_current(&mut r, &mut writer, self.generation)? else {
                return Ok(());
            };
            let answer = match m.message {
                Message::State {
                    version,
                    cursor,
                    optimizer_steps,
                    part,
                    parts,
                } => {
                    let (part, parts) = (part as usize, parts as usize);
                    if parts != 1 + self.states || part != staged.len() {
                        return Err(WireError::Protocol(format!(
                            "state part {part} of {parts} where part {} of {} was due",
                            staged.len(),
                            1 + self.states
                        )));
                    }
                    ps::read_values(&mut r, &m, self.len, &mut buf)?;
                    staged.push(std::mem::take(&mut buf));
                    let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                    if staged.len() == parts {
                        let mut parts = std::mem::take(&mut staged).into_iter();
                        s.weights = parts.next().map(Arc::new);
                        for (t, src) in s.opt.state_mut().iter_mut().zip(parts) {
                            *t = src;
                        }
                        s.opt.t = optimizer_steps;
                        s.version = version;
                        s.cursor = from_wire(cursor);
                        s.restored = false;
                    }
                    ack(version)
                }
                Message::Update {
                    before,
                    samples,
                    lr,
                    cursor,
                    carries_state,
                    momentum,
                } => {
                    ps::read_values(&mut r, &m, self.len, &mut buf)?;
                    let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                    if s.weights.is_none() || s.version != before || !staged.is_empty() {
                        Message::Rejected { version: s.version }
                    } else {
                        // The shard's very update: its buffers replaced
                        // where the shard's were.
                        s.apply(&buf, None, samples, lr, self.clip, carries_state, momentum);
                        s.cursor = from_wire(cursor);
                        ack(s.version)
                    }
                }
                other => {
                    return Err(WireError::Protocol(format!(
                        "a shard sent {:?} to its standby",
                        other.kind()
                    )))
                }
            };
            ps::write_message(&mut writer, self.generation, &answer, &[])?;
        }
    }
}
