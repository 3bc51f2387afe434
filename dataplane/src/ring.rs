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
//! the collective timeout or the caller's stop flag end the collective with a
//! [`RingError`]; the ring is then unusable and the caller builds a new one
//! (normally for the scheduler's next generation).

use crate::frame::{Header, Patient, Tag, HEADER_LEN, MAX_PAYLOAD};
use crate::handshake::{HandshakeError, Hello};
use crate::plane::{self, DataPlane, Endpoint, EndpointKey, RoleKind};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
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

/// How often blocked reads look at the stop flags.
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

/// How values travel in an all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wire {
    /// fp32: exact.
    #[default]
    F32,
    /// bfloat16, rounded to nearest even: half the bytes.
    Bf16,
}

impl Wire {
    /// Bytes per value.
    pub fn bytes(self) -> usize {
        match self {
            Wire::F32 => 4,
            Wire::Bf16 => 2,
        }
    }
}

/// `v` rounded to the nearest bfloat16 (ties to even); NaN stays NaN.
pub fn f32_to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    if v.is_nan() {
        return ((bits >> 16) | 0x0040) as u16;
    }
    let bias = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(bias) >> 16) as u16
}

/// The f32 of a bfloat16.
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

impl Ring {
    /// Registers this rank's endpoint on `plane`, connects to the right
    /// neighbour and waits for the left one.
    pub fn connect(
        plane: &DataPlane,
        cfg: &RingConfig,
        stop: &AtomicBool,
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
                kind: RoleKind::Ring,
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
            kind: RoleKind::Ring as u8,
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
                None if stop.load(Ordering::Relaxed) => return Err(RingError::Stopped),
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

    /// Sums `data` element-wise over all ranks, in place, on every rank.
    pub fn allreduce(&mut self, data: &mut [f32], stop: &AtomicBool) -> Result<(), RingError> {
        self.allreduce_wire(data, Wire::F32, stop)
    }

    /// [`Ring::allreduce`] with the values on the wire as `wire`. With
    /// [`Wire::Bf16`] each rank adds in fp32, but the partial sums travel as
    /// bf16, so rounding compounds over the `N−1` reduce hops; each reduced
    /// chunk is rounded once more by its owner before it is passed on, so
    /// every rank ends with the same bits.
    pub fn allreduce_wire(
        &mut self,
        data: &mut [f32],
        wire: Wire,
        stop: &AtomicBool,
    ) -> Result<(), RingError> {
        self.collective(|ring| ring.allreduce_inner(data, wire, stop))
    }

    fn allreduce_inner(
        &mut self,
        data: &mut [f32],
        wire: Wire,
        stop: &AtomicBool,
    ) -> Result<(), RingError> {
        if data.len() * wire.bytes() <= self.inline_bytes {
            return self.allreduce_inline(data, wire, stop);
        }
        let n = self.world as usize;
        let r = self.rank as usize;
        self.collective = self.collective.wrapping_add(1);
        let coll = self.collective;
        let chunks = Split::new(data.len(), n);
        let per = chunks.max_len().div_ceil(self.segment).max(1);
        let total = 2 * (n - 1) * per;
        // The chunk this rank sends and receives at step `s`.
        let send_chunk = |s: usize| (r + n * 2 - s % n) % n;
        let recv_chunk = |s: usize| (r + n * 2 - 1 - s % n) % n;
        // Every segment as a slice of its own, owned by this thread or, while
        // it is being sent, by the writer (which hands it back).
        let mut table: Vec<Option<&mut [f32]>> = Vec::with_capacity(n * per);
        let mut rest = data;
        for c in 0..n {
            let (_, clen) = chunks.part(c);
            let (mut chunk, tail) = rest.split_at_mut(clen);
            rest = tail;
            let parts = Split::new(clen, per);
            for k in 0..per {
                let (_, l) = parts.part(k);
                let (seg, after) = chunk.split_at_mut(l);
                chunk = after;
                table.push(Some(seg));
            }
        }
        let deadline = Instant::now() + self.timeout;
        let timeout = self.timeout;
        let stats = self.stats.clone();
        let scratch = &mut self.scratch;
        let links = self
            .links
            .as_mut()
            .ok_or_else(|| RingError::Broken("not connected".into()))?;
        // To unblock the sending thread when the collective fails.
        let right_handle = links
            .right
            .try_clone()
            .map_err(|e| RingError::Broken(format!("cloning the socket: {e}")))?;
        let (right, left) = (&mut links.right, &mut links.left);
        std::thread::scope(|scope| {
            let (to_writer, jobs) = channel::<(usize, usize, &mut [f32])>();
            let (returns, back) = channel::<Result<(usize, &mut [f32]), RingError>>();
            let writer_stats = stats.clone();
            let writer = scope.spawn(move || {
                let mut packed: Vec<u16> = Vec::new();
                for (op, idx, seg) in jobs {
                    if stop.load(Ordering::Relaxed) {
                        let _ = returns.send(Err(RingError::Stopped));
                        return;
                    }
                    let sent = match wire {
                        Wire::F32 => {
                            write_frame(right, Tag::Reduce, coll, op, bytemuck::cast_slice(seg))
                        }
                        Wire::Bf16 => {
                            packed.clear();
                            packed.extend(seg.iter().map(|&v| f32_to_bf16(v)));
                            write_frame(right, Tag::Reduce, coll, op, bytemuck::cast_slice(&packed))
                        }
                    };
                    match sent {
                        Ok(bytes) => {
                            writer_stats.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
                            if returns.send(Ok((idx, seg))).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            let _ = returns.send(Err(e));
                            return;
                        }
                    }
                }
            });
            let result = (|| {
                let (mut sent, mut recvd) = (0usize, 0usize);
                let wait = Wait {
                    back: &back,
                    stop,
                    deadline,
                    timeout,
                };
                while recvd < total {
                    while sent < total
                        && (sent < per || sent - per < recvd)
                        && sent < recvd + WINDOW
                    {
                        let idx = send_chunk(sent / per) * per + sent % per;
                        let seg = wait.take(&mut table, idx)?;
                        to_writer
                            .send((sent, idx, seg))
                            .map_err(|_| RingError::Broken("the sending thread ended".into()))?;
                        sent += 1;
                    }
                    let step = recvd / per;
                    let idx = recv_chunk(step) * per + recvd % per;
                    let seg = wait.take(&mut table, idx)?;
                    let mut reader = Patient {
                        stream: left,
                        stop,
                        deadline: Some(deadline),
                    };
                    let h = read_header(&mut reader, timeout)?;
                    expect(&h, Tag::Reduce, coll, recvd, seg.len() * wire.bytes())?;
                    let reducing = step < n - 1;
                    match wire {
                        Wire::F32 if !reducing => {
                            // All-gather: straight into place.
                            read_payload(&mut reader, bytemuck::cast_slice_mut(seg), timeout)?;
                        }
                        Wire::F32 => {
                            scratch.resize(seg.len(), 0.0);
                            read_payload(
                                &mut reader,
                                bytemuck::cast_slice_mut(&mut scratch[..]),
                                timeout,
                            )?;
                            for (d, s) in seg.iter_mut().zip(scratch.iter()) {
                                *d += *s;
                            }
                        }
                        Wire::Bf16 => {
                            scratch.resize(seg.len().div_ceil(2), 0.0);
                            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut scratch[..]);
                            read_payload(&mut reader, &mut bytes[..seg.len() * 2], timeout)?;
                            let src: &[u16] = &bytemuck::cast_slice(&scratch[..])[..seg.len()];
                            combine_bf16(seg, src, reducing, step == n - 2);
                        }
                    }
                    stats
                        .bytes_received
                        .fetch_add((seg.len() * wire.bytes()) as u64, Ordering::Relaxed);
                    table[idx] = Some(seg);
                    recvd += 1;
                }
                while sent < total {
                    let idx = send_chunk(sent / per) * per + sent % per;
                    let seg = wait.take(&mut table, idx)?;
                    to_writer
                        .send((sent, idx, seg))
                        .map_err(|_| RingError::Broken("the sending thread ended".into()))?;
                    sent += 1;
                }
                Ok(())
            })();
            drop(to_writer);
            if result.is_err() {
                // The ring is done for: a writer blocked on a full socket
                // must not hold this rank (and its hand-over) until the
                // write timeout.
                let _ = right_handle.shutdown(Shutdown::Write);
            }
            // Every segment comes back before the scope ends.
            let mut writer_error = None;
            while let Ok(item) = back.recv() {
                if let Err(e) = item {
                    writer_error = Some(e);
                }
            }
            let _ = writer.join();
            match (result, writer_error) {
                (Err(e), _) => Err(e),
                (Ok(()), Some(e)) => Err(e),
                (Ok(()), None) => Ok(()),
            }
        })
    }

    /// The all-reduce of a small buffer on the caller's thread alone: all
    /// that is in flight fits the sockets' buffers, so writing before
    /// reading cannot deadlock, and no thread hand-off adds latency.
    fn allreduce_inline(
        &mut self,
        data: &mut [f32],
        wire: Wire,
        stop: &AtomicBool,
    ) -> Result<(), RingError> {
        let n = self.world as usize;
        let r = self.rank as usize;
        self.collective = self.collective.wrapping_add(1);
        let coll = self.collective;
        let chunks = Split::new(data.len(), n);
        let deadline = Instant::now() + self.timeout;
        let timeout = self.timeout;
        let (stats, scratch) = (self.stats.clone(), &mut self.scratch);
        let links = self
            .links
            .as_mut()
            .ok_or_else(|| RingError::Broken("not connected".into()))?;
        let mut packed: Vec<u16> = Vec::new();
        for step in 0..2 * (n - 1) {
            let (so, sl) = chunks.part((r + n * 2 - step % n) % n);
            let seg = &data[so..so + sl];
            let bytes = match wire {
                Wire::F32 => write_frame(
                    &mut links.right,
                    Tag::Reduce,
                    coll,
                    step,
                    bytemuck::cast_slice(seg),
                )?,
                Wire::Bf16 => {
                    packed.clear();
                    packed.extend(seg.iter().map(|&v| f32_to_bf16(v)));
                    write_frame(
                        &mut links.right,
                        Tag::Reduce,
                        coll,
                        step,
                        bytemuck::cast_slice(&packed),
                    )?
                }
            };
            stats.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
            let (ro, rl) = chunks.part((r + n * 2 - 1 - step % n) % n);
            let seg = &mut data[ro..ro + rl];
            let mut reader = Patient {
                stream: &mut links.left,
                stop,
                deadline: Some(deadline),
            };
            let h = read_header(&mut reader, timeout)?;
            expect(&h, Tag::Reduce, coll, step, rl * wire.bytes())?;
            scratch.resize(rl, 0.0);
            let buf: &mut [u8] = bytemuck::cast_slice_mut(&mut scratch[..]);
            read_payload(&mut reader, &mut buf[..rl * wire.bytes()], timeout)?;
            stats
                .bytes_received
                .fetch_add((rl * wire.bytes()) as u64, Ordering::Relaxed);
            let reducing = step < n - 1;
            match wire {
                Wire::F32 if reducing => {
                    for (d, s) in seg.iter_mut().zip(scratch.iter()) {
                        *d += *s;
                    }
                }
                Wire::F32 => seg.copy_from_slice(&scratch[..rl]),
                Wire::Bf16 => {
                    let src: &[u16] = &bytemuck::cast_slice(&scratch[..])[..rl];
                    combine_bf16(seg, src, reducing, step == n - 2);
                }
            }
        }
        Ok(())
    }

    /// Copies `data` of rank `root` into `data` of every rank.
    pub fn broadcast(
        &mut self,
        data: &mut [f32],
        root: u32,
        stop: &AtomicBool,
    ) -> Result<(), RingError> {
        let root = root % self.world;
        self.collective(|ring| ring.broadcast_inner(data, root, stop))
    }

    fn broadcast_inner(
        &mut self,
        data: &mut [f32],
        root: u32,
        stop: &AtomicBool,
    ) -> Result<(), RingError> {
        self.collective = self.collective.wrapping_add(1);
        let coll = self.collective;
        let ops = data.len().div_ceil(self.segment).max(1);
        let parts = Split::new(data.len(), ops);
        let forwards = (self.rank + 1) % self.world != root;
        let deadline = Instant::now() + self.timeout;
        let (rank, timeout, stats) = (self.rank, self.timeout, self.stats.clone());
        let links = self
            .links
            .as_mut()
            .ok_or_else(|| RingError::Broken("not connected".into()))?;
        // A chain from the root: nobody writes before it has read, so plain
        // blocking writes cannot deadlock.
        for op in 0..ops {
            let (o, l) = parts.part(op);
            if rank != root {
                let mut reader = Patient {
                    stream: &mut links.left,
                    stop,
                    deadline: Some(deadline),
                };
                let h = read_header(&mut reader, timeout)?;
                expect(&h, Tag::Broadcast, coll, op, l * 4)?;
                read_payload(
                    &mut reader,
                    bytemuck::cast_slice_mut(&mut data[o..o + l]),
                    timeout,
                )?;
            }
            if rank == root || forwards {
                let bytes = write_frame(
                    &mut links.right,
                    Tag::Broadcast,
                    coll,
                    op,
                    bytemuck::cast_slice(&data[o..o + l]),
                )?;
                stats.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Every rank's `mine` (all of the same length, a few values), by rank.
    pub fn allgather_u64(
        &mut self,
        mine: &[u64],
        stop: &AtomicBool,
    ) -> Result<Vec<Vec<u64>>, RingError> {
        let n = self.world as usize;
        let mut all = vec![Vec::new(); n];
        all[self.rank as usize] = mine.to_vec();
        self.collective(|ring| ring.allgather_inner(&mut all, mine.len(), stop))?;
        Ok(all)
    }

    fn allgather_inner(
        &mut self,
        all: &mut [Vec<u64>],
        len: usize,
        stop: &AtomicBool,
    ) -> Result<(), RingError> {
        let n = self.world as usize;
        let r = self.rank as usize;
        self.collective = self.collective.wrapping_add(1);
        let coll = self.collective;
        let deadline = Instant::now() + self.timeout;
        let timeout = self.timeout;
        let links = self
            .links
            .as_mut()
            .ok_or_else(|| RingError::Broken("not connected".into()))?;
        for s in 0..n - 1 {
            // A few bytes: they fit the socket's buffer, so writing before
            // reading cannot deadlock.
            let out: Vec<u8> = all[(r + n - s) % n]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            write_frame(&mut links.right, Tag::Gather, coll, s, &out)?;
            let mut reader = Patient {
                stream: &mut links.left,
                stop,
                deadline: Some(deadline),
            };
            let h = read_header(&mut reader, timeout)?;
            expect(&h, Tag::Gather, coll, s, len * 8)?;
            let mut bytes = vec![0u8; len * 8];
            read_payload(&mut reader, &mut bytes, timeout)?;
            all[(r + n - s - 1) % n] = bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
        }
        Ok(())
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
            let _ = l.right.shutdown(Shutdown::Both);
            let _ = l.left.shutdown(Shutdown::Both);
        }
    }
}

/// Folds received bf16 values into `seg`: added while reducing (and, at the
/// last reduce step, where the chunk is complete, rounded once to bf16 as
/// every other rank will receive it), copied while gathering.
fn combine_bf16(seg: &mut [f32], src: &[u16], reducing: bool, complete: bool) {
    if reducing {
        for (d, s) in seg.iter_mut().zip(src) {
            *d += bf16_to_f32(*s);
        }
        if complete {
            for d in seg.iter_mut() {
                *d = bf16_to_f32(f32_to_bf16(*d));
            }
        }
    } else {
        for (d, s) in seg.iter_mut().zip(src) {
            *d = bf16_to_f32(*s);
        }
    }
}

type Returned<'a> = Result<(usize, &'a mut [f32]), RingError>;

/// Where the writer hands segments back, and how long to wait for them.
struct Wait<'w, 'a> {
    back: &'w std::sync::mpsc::Receiver<Returned<'a>>,
    stop: &'w AtomicBool,
    deadline: Instant,
    timeout: Duration,
}

impl<'a> Wait<'_, 'a> {
    /// Takes segment `idx` out of `table`, first waiting for the writer to
    /// hand it back if it is being sent.
    fn take(
        &self,
        table: &mut [Option<&'a mut [f32]>],
        idx: usize,
    ) -> Result<&'a mut [f32], RingError> {
        loop {
            if let Some(seg) = table[idx].take() {
                return Ok(seg);
            }
            if self.stop.load(Ordering::Relaxed) {
                return Err(RingError::Stopped);
            }
            if Instant::now() > self.deadline {
                return Err(RingError::Timeout(self.timeout));
            }
            match self.back.recv_timeout(POLL) {
                Ok(Ok((i, seg))) => table[i] = Some(seg),
                Ok(Err(e)) => return Err(e),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(RingError::Broken("the sending thread ended".into()))
                }
            }
        }
    }
}

/// Writes a frame; returns the payload bytes.
fn write_frame(
    w: &mut TcpStream,
    tag: Tag,
    coll: u32,
    op: usize,
    payload: &[u8],
) -> Result<u64, RingError> {
    let h = Header {
        tag: tag as u32,
        collective: coll,
        op: op as u32,
        len: payload.len() as u32,
    };
    let broken =
        |e: std::io::Error| RingError::Broken(format!("sending to the right neighbour: {e}"));
    w.write_all(&h.encode()).map_err(broken)?;
    w.write_all(payload).map_err(broken)?;
    Ok(payload.len() as u64)
}

fn receive_error(e: std::io::Error, timeout: Duration) -> RingError {
    match e.kind() {
        std::io::ErrorKind::ConnectionAborted => RingError::Stopped,
        std::io::ErrorKind::TimedOut => RingError::Timeout(timeout),
        _ => RingError::Broken(format!("receiving from the left neighbour: {e}")),
    }
}

fn read_header(r: &mut Patient<'_>, timeout: Duration) -> Result<Header, RingError> {
    let mut hb = [0u8; HEADER_LEN];
    r.read_exact(&mut hb)
        .map_err(|e| receive_error(e, timeout))?;
    Header::decode(&hb).ok_or_else(|| {
        RingError::Broken("malformed frame header (unknown tag or oversized length)".into())
    })
}

fn read_payload(r: &mut Patient<'_>, buf: &mut [u8], timeout: Duration) -> Result<(), RingError> {
    r.read_exact(buf).map_err(|e| receive_error(e, timeout))
}

fn expect(h: &Header, tag: Tag, coll: u32, op: usize, bytes: usize) -> Result<(), RingError> {
    if h.tag != tag as u32 || h.collective != coll || h.op as usize != op || h.len as usize != bytes
    {
        return Err(RingError::Broken(format!(
            "out of step: expected {tag:?} collective {coll} op {op} of {bytes} bytes, got tag {} collective {} op {} of {} bytes",
            h.tag, h.collective, h.op, h.len
        )));
    }
    Ok(())
}

/// `len` elements cut into `parts` contiguous parts whose lengths differ by
/// at most one (the first `len % parts` are one longer).
#[derive(Debug, Clone, Copy)]
pub struct Split {
    len: usize,
    parts: usize,
}

impl Split {
    /// The split of `len` into `parts` (at least one).
    pub fn new(len: usize, parts: usize) -> Split {
        Split {
            len,
            parts: parts.max(1),
        }
    }

    /// Start and length of part `i`.
    pub fn part(&self, i: usize) -> (usize, usize) {
        let (q, r) = (self.len / self.parts, self.len % self.parts);
        (i * q + i.min(r), q + usize::from(i < r))
    }

    /// The longest part.
    pub fn max_len(&self) -> usize {
        self.len.div_ceil(self.parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_split_covers_its_range_in_order(len in 0usize..10_000, parts in 1usize..64) {
            let s = Split::new(len, parts);
            let mut at = 0;
            for i in 0..parts {
                let (o, l) = s.part(i);
                prop_assert_eq!(o, at);
                prop_assert!(l == len / parts || l == len / parts + 1);
                prop_assert!(l <= s.max_len());
                at += l;
            }
            prop_assert_eq!(at, len);
        }
    }

    fn rings(n: usize, segment: usize) -> (Vec<DataPlane>, Vec<Ring>) {
        let planes: Vec<DataPlane> = (0..n)
            .map(|_| DataPlane::bind("127.0.0.1:0").unwrap())
            .collect();
        let peers: Vec<String> = planes.iter().map(|p| p.local_addr().to_string()).collect();
        let job = Uuid::new_v4();
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let cfg = RingConfig {
                    job,
                    generation: 1,
                    rank: r as u32,
                    peers: peers.clone(),
                    secret: b"secret".to_vec(),
                    connect_timeout: Duration::from_secs(10),
                    collective_timeout: Duration::from_secs(10),
                };
                (r, cfg)
            })
            .collect();
        let rings = std::thread::scope(|s| {
            let joins: Vec<_> = handles
                .into_iter()
                .map(|(r, cfg)| {
                    let plane = &planes[r];
                    s.spawn(move || {
                        let mut ring = Ring::connect(plane, &cfg, &AtomicBool::new(false)).unwrap();
                        ring.set_segment(segment);
                        ring
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        (planes, rings)
    }

    #[test]
    fn in_process_rings_sum_exactly_for_awkward_lengths() {
        for (n, inline) in (1..=4).flat_map(|n| [(n, 0), (n, INLINE_BYTES)]) {
            let (_planes, mut rings) = rings(n, 3);
            for r in &mut rings {
                r.set_inline_bytes(inline);
            }
            for len in [0usize, 1, 2, 5, 7, 64, 1001] {
                let inputs: Vec<Vec<f32>> = (0..n)
                    .map(|r| (0..len).map(|i| (r * 1000 + i) as f32).collect())
                    .collect();
                let want: Vec<f32> = (0..len)
                    .map(|i| (0..n).map(|r| (r * 1000 + i) as f32).sum())
                    .collect();
                let outs: Vec<Vec<f32>> = std::thread::scope(|s| {
                    let joins: Vec<_> = rings
                        .iter_mut()
                        .zip(inputs)
                        .map(|(ring, mut v)| {
                            s.spawn(move || {
                                ring.allreduce(&mut v, &AtomicBool::new(false)).unwrap();
                                v
                            })
                        })
                        .collect();
                    joins.into_iter().map(|j| j.join().unwrap()).collect()
                });
                for o in outs {
                    assert_eq!(o, want, "n={n} len={len}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn bf16_rounding_is_nearest(v in -1e30f32..1e30) {
            let r = bf16_to_f32(f32_to_bf16(v));
            prop_assert!((r - v).abs() <= v.abs() / 256.0, "{} -> {}", v, r);
        }
    }

    #[test]
    fn bf16_rings_sum_closely_and_agree_bit_for_bit() {
        for (n, inline) in [2usize, 3, 5]
            .into_iter()
            .flat_map(|n| [(n, 0), (n, INLINE_BYTES)])
        {
            let (_planes, mut rings) = rings(n, 7);
            for r in &mut rings {
                r.set_inline_bytes(inline);
            }
            let len = 1000;
            let inputs: Vec<Vec<f32>> = (0..n)
                .map(|r| {
                    (0..len)
                        .map(|i| ((r * 31 + i * 17) % 101) as f32 / 101.0 - 0.5)
                        .collect()
                })
                .collect();
            let want: Vec<f32> = (0..len)
                .map(|i| inputs.iter().map(|v| v[i]).sum())
                .collect();
            let outs: Vec<Vec<f32>> = std::thread::scope(|s| {
                let joins: Vec<_> = rings
                    .iter_mut()
                    .zip(inputs)
                    .map(|(ring, mut v)| {
                        s.spawn(move || {
                            ring.allreduce_wire(&mut v, Wire::Bf16, &AtomicBool::new(false))
                                .unwrap();
                            v
                        })
                    })
                    .collect();
                joins.into_iter().map(|j| j.join().unwrap()).collect()
            });
            for o in &outs {
                assert_eq!(o, &outs[0], "n={n}: ranks agree");
                for (g, w) in o.iter().zip(&want) {
                    assert!((g - w).abs() <= 0.02 * n as f32, "n={n}: {g} vs {w}");
                }
            }
        }
    }

    #[test]
    fn a_dead_neighbour_breaks_the_collective_promptly() {
        let (_planes, mut rings) = rings(3, 1024);
        let dead = rings.pop().unwrap();
        drop(dead);
        let started = Instant::now();
        let mut v = vec![1.0f32; 10_000];
        let err = rings[0]
            .allreduce(&mut v, &AtomicBool::new(false))
            .unwrap_err();
        assert!(matches!(err, RingError::Broken(_)), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(rings[0].allreduce(&mut v, &AtomicBool::new(false)).is_err());
    }
}
