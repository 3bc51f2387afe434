//! The ring: rank `i` of `N` sends to rank `i+1` and receives from rank
//! `i-1` (modulo `N`) over two authenticated TCP connections.
//!
//! [`Ring::allreduce`] sums a flat `f32` buffer on every rank: the buffer is
//! cut into `N` chunks (lengths differ by at most one, any may be empty),
//! `N−1` reduce-scatter steps leave each rank with one fully summed chunk
//! and `N−1` all-gather steps pass the sums on, so every rank ends with the
//! same bits. Each chunk is split into segments: the segment received (and
//! added) at one step is the segment sent at the next, so sends start as
//! soon as their own data is final and up to [`WINDOW`] segments are in
//! flight. The caller's thread receives — straight into place in the
//! all-gather half, into a reused buffer and then added in the
//! reduce-scatter half — while a sending thread scoped to the collective
//! writes; each segment is a disjoint `&mut` slice owned by one thread at a
//! time and handed back and forth, so network, copy and add overlap without
//! a lock or a copy. Buffers up to [`INLINE_BYTES`] skip the sending thread
//! (their latency is the hand-off's). Per rank the traffic is `2(N−1)/N`
//! of the buffer, the bandwidth optimum.
//!
//! [`Ring::broadcast`] pipelines a buffer from one rank around the ring (a
//! new member receives weights and optimizer state this way), and
//! [`Ring::allgather_u64`] shares a few numbers per rank (steps, flags).
//!
//! Fencing: a ring's connections are made for one generation (checked in
//! the handshake), so frames carry the collective and operation they belong
//! to but not the generation.
//!
//! Failures: a closed connection, a frame that does not match the schedule,
//! the collective timeout or the caller's stop signal end the collective with a
//! [`RingError`]; the ring is then unusable and the caller builds a new one
//! (normally for the scheduler's next generation).
//!
//! The module's parts: [`split`] cuts a buffer into chunks and segments,
//! `wire` frames the values (fp32 or bf16) and checks every frame against
//! the schedule, `allreduce` is the pipelined collective, `chain` the
//! broadcast and the all-gather of small records; this file connects a
//! ring (registering the endpoint, the handshake to the right neighbour,
//! waiting for the left one) and fences each collective.

mod allreduce;
mod chain;
pub mod split;
mod wire;

#[cfg(test)]
mod tests;

pub use split::Split;
pub use wire::{bf16_to_f32, f32_to_bf16, Wire};

use crate::frame::MAX_PAYLOAD;
use crate::handshake::{HandshakeError, Hello};
use crate::plane::{self, DataPlane, Endpoint, EndpointKey, EndpointRole};
use std::net::TcpStream;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use trainyard_shutdown::Shutdown;
use uuid::Uuid;

/// Elements per segment: 1 MiB of `f32`.
pub const SEGMENT_ELEMS: usize = 256 * 1024;

/// The segment size: `TRAINYARD_RING_SEGMENT_KIB` (every rank must agree)
/// or [`SEGMENT_ELEMS`].
fn segment_from_env() -> usize {
    std::env::var("TRAINYARD_RING_SEGMENT_KIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(SEGMENT_ELEMS, |kib| (kib * 256).clamp(1, MAX_PAYLOAD / 4))
}

/// All-reduces of at most this many bytes run on the caller's thread alone
/// (a chunk in flight per rank fits any socket buffer).
pub const INLINE_BYTES: usize = 64 * 1024;

/// Segments a rank may send beyond what it has received.
pub const WINDOW: usize = 8;

/// How often blocked reads look at the stop signals.
const POLL: Duration = Duration::from_millis(50);

/// Who is in the ring and how long to wait.
#[derive(Debug, Clone)]
pub struct RingConfig {
    /// The job.
    pub job: Uuid,
    /// The scheduler's generation this ring belongs to.
    pub generation: i64,
    /// This rank.
    pub rank: u32,
    /// The data-plane address of every rank, by rank.
    pub peers: Vec<String>,
    /// The job's secret.
    pub secret: Vec<u8>,
    /// How long to wait for the neighbours to connect.
    pub connect_timeout: Duration,
    /// How long one collective may wait for a peer.
    pub collective_timeout: Duration,
}

/// Why a ring operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The neighbours could not be reached.
    #[error("ring set-up failed: {0}")]
    Connect(String),
    /// A connection broke or a peer sent something unexpected.
    #[error("ring broken: {0}")]
    Broken(String),
    /// A peer did not answer within the collective timeout.
    #[error("a ring peer did not answer within {0:?}")]
    Timeout(Duration),
    /// The caller asked to stop.
    #[error("stopped")]
    Stopped,
}

/// Traffic counters of a ring.
#[derive(Debug, Default)]
pub struct RingStats {
    /// Payload bytes sent to the right neighbour.
    pub bytes_sent: AtomicU64,
    /// Payload bytes received from the left neighbour.
    pub bytes_received: AtomicU64,
}

struct Links {
    right: TcpStream,
    left: TcpStream,
}

/// A connected ring.
pub struct Ring {
    rank: u32,
    world: u32,
    links: Option<Links>,
    collective: u32,
    timeout: Duration,
    broken: Option<String>,
    segment: usize,
    stats: Arc<RingStats>,
    scratch: Vec<f32>,
    inline_bytes: usize,
    _endpoint: Option<Endpoint>,
}

impl Ring {
    /// Registers this rank's endpoint on `plane`, connects to the right
    /// neighbour and waits for the left one.
    pub fn connect(
        plane: &DataPlane,
        cfg: &RingConfig,
        stop: &Shutdown,
    ) -> Result<Ring, RingError> {
        let world = u32::try_from(cfg.peers.len())
            .map_err(|_| RingError::Connect("too many ranks".into()))?;
        if world == 0 || cfg.rank >= world {
            return Err(RingError::Connect(format!("rank {} of {world}", cfg.rank)));
        }
        let mut ring = Ring {
            rank: cfg.rank,
            world,
            links: None,
            collective: 0,
            timeout: cfg.collective_timeout,
            broken: None,
            segment: segment_from_env(),
            stats: Arc::default(),
            scratch: Vec::new(),
            inline_bytes: INLINE_BYTES,
            _endpoint: None,
        };
        if world == 1 {
            return Ok(ring);
        }
        let endpoint = plane.register(
            EndpointKey {
                job: cfg.job,
                kind: EndpointRole::Ring,
                rank: cfg.rank,
            },
            cfg.generation,
            &cfg.secret,
        );
        let deadline = Instant::now() + cfg.connect_timeout;
        let right_rank = (cfg.rank + 1) % world;
        let left_rank = (cfg.rank + world - 1) % world;
        let hello = Hello {
            job: cfg.job,
            generation: cfg.generation,
            kind: EndpointRole::Ring as u8,
            from: cfg.rank,
            to: right_rank,
        };
        let right = plane::connect(
            &cfg.peers[right_rank as usize],
            &hello,
            &cfg.secret,
            deadline,
            stop,
        )
        .map_err(|e| match e {
            HandshakeError::NotReady => RingError::Connect(format!(
                "rank {right_rank} at {} did not take the connection within {:?}",
                cfg.peers[right_rank as usize], cfg.connect_timeout
            )),
            e => RingError::Connect(format!(
                "rank {right_rank} at {}: {e}",
                cfg.peers[right_rank as usize]
            )),
        })?;
        let left = loop {
            match endpoint.accept(deadline, stop) {
                Some((from, s)) if from == left_rank => break s,
                Some(_) => continue,
                None if stop.is_triggered() => return Err(RingError::Stopped),
                None => {
                    return Err(RingError::Connect(format!(
                        "rank {left_rank} did not connect within {:?}",
                        cfg.connect_timeout
                    )))
                }
            }
        };
        let io = |e: std::io::Error| RingError::Connect(e.to_string());
        left.set_read_timeout(Some(POLL)).map_err(io)?;
        right
            .set_write_timeout(Some(cfg.collective_timeout))
            .map_err(io)?;
        right.set_nodelay(true).map_err(io)?;
        ring.links = Some(Links { right, left });
        ring._endpoint = Some(endpoint);
        Ok(ring)
    }

    /// A ring of one: every collective is a no-op.
    pub fn solo() -> Ring {
        Ring {
            rank: 0,
            world: 1,
            links: None,
            collective: 0,
            timeout: Duration::from_secs(1),
            broken: None,
            segment: SEGMENT_ELEMS,
            stats: Arc::default(),
            scratch: Vec::new(),
            inline_bytes: INLINE_BYTES,
            _endpoint: None,
        }
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Ranks in the ring.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// Traffic so far.
    pub fn stats(&self) -> &RingStats {
        &self.stats
    }

    /// Sets the segment size in elements (tests use tiny segments to
    /// exercise the pipeline on small buffers); every rank must agree.
    pub fn set_segment(&mut self, elems: usize) {
        self.segment = elems.clamp(1, MAX_PAYLOAD / 4);
    }

    /// Sets the size up to which all-reduces run on the caller's thread
    /// alone (tests use 0 to exercise the pipelined path on small buffers);
    /// every rank must agree.
    pub fn set_inline_bytes(&mut self, bytes: usize) {
        self.inline_bytes = bytes.min(INLINE_BYTES);
    }

    /// Runs one collective: nothing to do alone; refused once an earlier
    /// one failed; a failure marks the ring broken.
    fn collective(
        &mut self,
        f: impl FnOnce(&mut Ring) -> Result<(), RingError>,
    ) -> Result<(), RingError> {
        if self.world == 1 {
            return Ok(());
        }
        if let Some(why) = &self.broken {
            return Err(RingError::Broken(format!(
                "an earlier collective failed: {why}"
            )));
        }
        let result = f(self);
        if let Err(e) = &result {
            self.broken = Some(e.to_string());
        }
        result
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if let Some(l) = &self.links {
            let _ = l.right.shutdown(std::net::Shutdown::Both);
            let _ = l.left.shutdown(std::net::Shutdown::Both);
        }
    }
}
