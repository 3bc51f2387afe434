//! A worker's side of the wire: where each shard's values live in the
//! flat weights ([`ShardMap`]), one connection per shard ([`Link`]), and
//! the pulls and pushes a step makes to every shard at once, each on a
//! thread of its own ([`pull_all`], [`exchange_push`]).

use super::ranges::ShardMapError;
use super::{from_wire, to_wire, PS_TIMEOUT};
use crate::data::Cursor;
use crate::error::RoleError;
use crate::replica::Replica;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use trainyard_common::cluster::{Assignment, PsPeer};
use trainyard_dataplane::frame::Patient;
use trainyard_dataplane::handshake::Hello;
use trainyard_dataplane::ps::{self, Message, PushHeader, WireError};
use trainyard_dataplane::{plane, EndpointRole};
use trainyard_shutdown::Shutdown;

/// Where each shard's values live in a worker's flat weights.
pub(super) struct ShardMap {
    pub(super) peers: Vec<PsPeer>,
    /// Per shard: (flat offset, length) of each range, in order.
    pieces: Vec<Vec<(usize, usize)>>,
    pub(super) lens: Vec<usize>,
}

impl ShardMap {
    /// The map of assignment `a`'s primaries over `replica`'s layout.
    pub(super) fn new(a: &Assignment, replica: &Replica) -> Result<ShardMap, ShardMapError> {
        let layout = replica.layout();
        // The flat vector's buffers follow its trainable parameters.
        let trainable = replica.trainable_len();
        let peers: Vec<PsPeer> = a.primaries().into_iter().cloned().collect();
        let mut pieces = Vec::new();
        let mut covered = 0;
        for p in &peers {
            let mut mine = Vec::new();
            for r in &p.ranges {
                let Some((_, off, n)) = layout.iter().find(|(k, _, _)| *k == r.param) else {
                    return Err(ShardMapError::Unknown {
                        shard: p.shard,
                        param: r.param.clone(),
                    });
                };
                if r.end as usize > *n || r.start >= r.end {
                    return Err(ShardMapError::OutOfBounds {
                        shard: p.shard,
                        range: r.clone(),
                        len: *n,
                    });
                }
                if r.buffer != (*off >= trainable) {
                    return Err(ShardMapError::WrongKind {
                        shard: p.shard,
                        range: r.clone(),
                    });
                }
                mine.push((off + r.start as usize, (r.end - r.start) as usize));
                covered += (r.end - r.start) as usize;
            }
            pieces.push(mine);
        }
        if covered != replica.numel() {
            return Err(ShardMapError::Uncovered {
                covered,
                numel: replica.numel(),
            });
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

    /// Shard `s`'s values out of `flat`.
    pub(super) fn gather(&self, s: usize, flat: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.lens[s]);
        for &(off, n) in &self.pieces[s] {
            out.extend_from_slice(&flat[off..off + n]);
        }
        out
    }
}

/// A worker's connection to one shard.
pub(super) struct Link {
    stream: TcpStream,
    generation: i64,
    /// The values of the last `Weights` answer.
    buf: Vec<f32>,
}

/// Connects to every shard of `map` as worker `rank` of assignment `a`.
pub(super) fn connect(
    a: &Assignment,
    rank: u32,
    map: &ShardMap,
    stop: &Shutdown,
) -> Result<Vec<Link>, RoleError> {
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
                RoleError::ps_transient(format!(
                    "cannot reach PS shard {} at {}: {e}",
                    p.shard, p.address
                ))
            })?;
        let io = |e: std::io::Error| {
            RoleError::ps_transient(format!("PS shard {} at {}: {e}", p.shard, p.address))
        };
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(io)?;
        stream.set_write_timeout(Some(PS_TIMEOUT)).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        links.push(Link {
            stream,
            generation: a.key.generation,
            buf: Vec::with_capacity(map.lens[s]),
        });
    }
    Ok(links)
}

impl Link {
    /// Sends `m` with `payload` and reads the answer (the values of a
    /// `Weights` answer, exactly `expect_len` of them, into the buffer).
    pub(super) fn call(
        &mut self,
        m: &Message,
        payload: &[f32],
        expect_len: usize,
        stop: &Shutdown,
    ) -> Result<Message, RoleError> {
        // A shard gone or out of step: the next generation sorts it out.
        let broken = |e: WireError| RoleError::ps_transient(format!("parameter server: {e}"));
        ps::write_message(&mut self.stream, self.generation, m, payload).map_err(broken)?;
        let mut r = Patient {
            stream: &mut self.stream,
            stop,
            deadline: Some(Instant::now() + PS_TIMEOUT),
        };
        let reply = ps::read_message(&mut r).map_err(broken)?;
        if reply.generation != self.generation {
            return Err(broken(WireError::Protocol(format!(
                "the shard answered for generation {}",
                reply.generation
            ))));
        }
        match reply.message {
            Message::Weights { .. } => {
                ps::read_values(&mut r, &reply, expect_len, &mut self.buf).map_err(broken)?
            }
            Message::Stale => {
                return Err(broken(WireError::Protocol(
                    "the shard serves another generation".into(),
                )))
            }
            _ if reply.message.carries_values() => {
                return Err(broken(WireError::Protocol(format!(
                    "{:?} with a payload",
                    reply.message.kind()
                ))))
            }
            _ => {}
        }
        Ok(reply.message)
    }
}

/// What a pull of every shard found.
pub(super) struct Exchange {
    /// Each shard's version.
    pub(super) versions: Vec<u64>,
    /// Each shard's data cursor.
    pub(super) cursors: Vec<Cursor>,
    /// Shard 0's data cursor.
    pub(super) cursor: Cursor,
    /// Bytes pulled.
    pub(super) bytes: u64,
    /// Workers of this generation done with their share (shard 0's count).
    pub(super) finished: u32,
}

/// Tells shard 0 that `link`'s worker has walked its share of the data;
/// how many workers of this generation have.
pub(super) fn say_done(link: &mut Link, stop: &Shutdown) -> Result<u32, RoleError> {
    match link.call(&Message::Done, &[], 0, stop)? {
        Message::Finished { workers } => Ok(workers),
        other => Err(RoleError::ps_fatal(format!(
            "shard 0 answered Done with {:?}",
            other.kind()
        ))),
    }
}

/// Asks shard 0 where this worker's rank resumes in the data, telling it
/// the place the worker `kept` from an earlier generation, if any.
pub(super) fn ask_place(
    link: &mut Link,
    kept: Option<Cursor>,
    stop: &Shutdown,
) -> Result<Cursor, RoleError> {
    let ask = Message::Where {
        kept: kept.map(to_wire),
    };
    match link.call(&ask, &[], 0, stop)? {
        Message::Place { cursor } => Ok(from_wire(cursor)),
        other => Err(RoleError::ps_fatal(format!(
            "shard 0 answered Where with {:?}",
            other.kind()
        ))),
    }
}

/// A shard's answer to a pull, as far as the values.
pub(super) type Pulled = Result<Message, RoleError>;

/// Pulls every shard at once into the links' buffers: shard `s` once it is
/// at version `expect[s]`.
pub(super) fn pull_all(
    links: &mut [Link],
    expect: &[u64],
    map: &ShardMap,
    stop: &Shutdown,
) -> Vec<Pulled> {
    std::thread::scope(|scope| {
        let joins: Vec<_> = links
            .iter_mut()
            .enumerate()
            .map(|(s, link)| {
                let m = Message::Pull {
                    at_least: expect[s],
                };
                let len = map.lens[s];
                scope.spawn(move || link.call(&m, &[], len, stop))
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
pub(super) fn apply_pull(
    links: &[Link],
    results: Vec<Pulled>,
    map: &ShardMap,
    rep: &mut Replica,
) -> Result<Exchange, RoleError> {
    let mut versions = Vec::new();
    let mut cursors = Vec::new();
    let mut cursor = Cursor::default();
    let mut bytes = 0;
    let mut done = 0;
    for (s, r) in results.into_iter().enumerate() {
        let Message::Weights {
            version,
            cursor: c,
            finished,
        } = r?
        else {
            return Err(RoleError::ps_fatal(format!(
                "shard {s} answered a pull with something else than its values"
            )));
        };
        let mut at = 0;
        for &(off, n) in &map.pieces[s] {
            rep.load_range(off, &links[s].buf[at..at + n]);
            at += n;
        }
        bytes += map.lens[s] as u64 * 4;
        let c = from_wire(c);
        if s == 0 {
            cursor = c;
            done = finished;
        }
        cursors.push(c);
        versions.push(version);
    }
    Ok(Exchange {
        versions,
        cursors,
        cursor,
        bytes,
        finished: done,
    })
}

/// Pulls every shard (see [`pull_all`]) and loads the values.
pub(super) fn exchange_pull(
    links: &mut [Link],
    expect: &[u64],
    map: &ShardMap,
    rep: &mut Replica,
    stop: &Shutdown,
) -> Result<Exchange, RoleError> {
    let results = pull_all(links, expect, map, stop);
    apply_pull(links, results, map, rep)
}

/// A shard's answer to a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PushReply {
    /// Taken; the shard is at `version` (for an applied push, the version
    /// it produced); a draining shard asks rank 0 for a checkpoint.
    Ack {
        version: u64,
        checkpoint_wanted: bool,
    },
    /// Too stale: the shard is at `version`.
    Rejected { version: u64 },
}

impl PushReply {
    /// Whether the push was taken.
    pub(super) fn accepted(self) -> bool {
        matches!(self, PushReply::Ack { .. })
    }

    /// The shard's version in the answer.
    pub(super) fn version(self) -> u64 {
        match self {
            PushReply::Ack { version, .. } | PushReply::Rejected { version } => version,
        }
    }
}

/// Pushes `payloads[s]`, computed at `versions[s]`, to every shard that has
/// a version (the others took this batch already: `None` in the answer);
/// each shard's header is `push` with its version.
pub(super) fn exchange_push(
    links: &mut [Link],
    push: &PushHeader,
    versions: &[Option<u64>],
    payloads: &[Vec<f32>],
    stop: &Shutdown,
) -> Result<Vec<Option<PushReply>>, RoleError> {
    let results: Vec<Result<Option<PushReply>, RoleError>> = std::thread::scope(|scope| {
        let joins: Vec<_> = links
            .iter_mut()
            .zip(versions)
            .zip(payloads)
            .enumerate()
            .map(|(s, ((link, v), payload))| {
                let m = v.map(|computed_at| {
                    Message::Push(PushHeader {
                        computed_at,
                        ..*push
                    })
                });
                scope.spawn(move || {
                    // Took this batch already: nothing to send, and no
                    // staleness to count again.
                    let Some(m) = m else { return Ok(None) };
                    match link.call(&m, payload, 0, stop)? {
                        Message::Ack {
                            version,
                            checkpoint_wanted,
                            ..
                        } => Ok(Some(PushReply::Ack {
                            version,
                            checkpoint_wanted,
                        })),
                        Message::Rejected { version } => Ok(Some(PushReply::Rejected { version })),
                        other => Err(RoleError::ps_fatal(format!(
                            "PS shard {s} answered a push with {:?}",
                            other.kind()
                        ))),
                    }
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
