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
//! flight; a reader thread receives into reused buffers while the caller's
//! thread sends and adds, so network, copy and add overlap. Per rank the
//! traffic is `2(N−1)/N` of the buffer, the bandwidth optimum.
//!
//! [`Ring::broadcast`] pipelines a buffer from one rank around the ring (a
//! new member receives weights and optimizer state this way), and
//! [`Ring::allgather_u64`] shares a few numbers per rank (steps, flags).
//!
//! Failures: a closed connection, a frame that does not match the schedule,
//! the collective timeout or the caller's stop flag end the collective with a
//! [`RingError`]; the ring is then unusable and the caller builds a new one
//! (normally for the scheduler's next generation).

use crate::frame::{self, Header, Tag, HEADER_LEN, MAX_PAYLOAD};
use crate::handshake::{HandshakeError, Hello};
use crate::plane::{self, DataPlane, Endpoint, EndpointKey, RoleKind};
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
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

type Incoming = std::io::Result<(Header, Vec<f32>)>;

struct Links {
    right: TcpStream,
    left: TcpStream,
    incoming: Receiver<Incoming>,
    pool: Sender<Vec<f32>>,
    shutdown: Arc<AtomicBool>,
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
    packed: Vec<u16>,
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
            packed: Vec::new(),
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
        let shutdown = Arc::new(AtomicBool::new(false));
        let (tx, incoming) = channel();
        let (pool, pool_rx) = channel::<Vec<f32>>();
        let mut reader = left.try_clone().map_err(io)?;
        let flag = shutdown.clone();
        let stats = ring.stats.clone();
        std::thread::Builder::new()
            .name(format!("ring-rx-{}", cfg.rank))
            .spawn(move || read_loop(&mut reader, &tx, &pool_rx, &flag, &stats))
            .map_err(io)?;
        ring.links = Some(Links {
            right,
            left,
            incoming,
            pool,
            shutdown,
        });
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
            packed: Vec::new(),
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

    /// Sums `data` element-wise over all ranks, in place, on every rank.
    pub fn allreduce(&mut self, data: &mut [f32], stop: &AtomicBool) -> Result<(), RingError> {
        self.allreduce_wire(data, Wire::F32, stop)
    }

    /// [`Ring::allreduce`] with the values on the wire as `wire`. With
    /// [`Wire::Bf16`] partial sums still accumulate in fp32; each reduced
    /// chunk is rounded to bf16 once, by its owner, before it is passed on,
    /// so every rank ends with the same bits.
    pub fn allreduce_wire(
        &mut self,
        data: &mut [f32],
        wire: Wire,
        stop: &AtomicBool,
    ) -> Result<(), RingError> {
        if self.world == 1 {
            return Ok(());
        }
        self.usable()?;
        let result = self.allreduce_inner(data, wire, stop);
        self.note(result)
    }

    fn allreduce_inner(
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
        let per = chunks.max_len().div_ceil(self.segment).max(1);
        let total = 2 * (n - 1) * per;
        // The chunk this rank sends and receives at step `s`.
        let send_chunk = |s: usize| (r + n * 2 - s % n) % n;
        let recv_chunk = |s: usize| (r + n * 2 - 1 - s % n) % n;
        let range = |chunk: usize, k: usize| {
            let (start, len) = chunks.part(chunk);
            let (o, l) = Split::new(len, per).part(k);
            start + o..start + o + l
        };
        let deadline = Instant::now() + self.timeout;
        let (mut sent, mut recvd) = (0usize, 0usize);
        while recvd < total {
            while sent < total && (sent < per || sent - per < recvd) && sent < recvd + WINDOW {
                let seg = range(send_chunk(sent / per), sent % per);
                self.send_values(coll, sent, &data[seg], wire)?;
                sent += 1;
            }
            let (h, buf) = self.receive(deadline, stop)?;
            let step = recvd / per;
            let seg = range(recv_chunk(step), recvd % per);
            expect(&h, Tag::Reduce, coll, recvd, seg.len() * wire.bytes())?;
            let dst = &mut data[seg];
            match wire {
                Wire::F32 => {
                    let src = &buf[..dst.len()];
                    if step < n - 1 {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d += *s;
                        }
                    } else {
                        dst.copy_from_slice(src);
                    }
                }
                Wire::Bf16 => {
                    let src: &[u16] = &bytemuck::cast_slice(&buf[..])[..dst.len()];
                    if step < n - 1 {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d += bf16_to_f32(*s);
                        }
                        if step == n - 2 {
                            // This chunk is now fully reduced here: round it
                            // once, as every other rank will receive it.
                            for d in dst.iter_mut() {
                                *d = bf16_to_f32(f32_to_bf16(*d));
                            }
                        }
                    } else {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d = bf16_to_f32(*s);
                        }
                    }
                }
            }
            self.recycle(buf);
            recvd += 1;
        }
        while sent < total {
            let seg = range(send_chunk(sent / per), sent % per);
            self.send_values(coll, sent, &data[seg], wire)?;
            sent += 1;
        }
        Ok(())
    }

    fn send_values(
        &mut self,
        coll: u32,
        op: usize,
        values: &[f32],
        wire: Wire,
    ) -> Result<(), RingError> {
        match wire {
            Wire::F32 => self.send(Tag::Reduce, coll, op, bytemuck::cast_slice(values)),
            Wire::Bf16 => {
                let mut packed = std::mem::take(&mut self.packed);
                packed.clear();
                packed.extend(values.iter().map(|&v| f32_to_bf16(v)));
                let r = self.send(Tag::Reduce, coll, op, bytemuck::cast_slice(&packed));
                self.packed = packed;
                r
            }
        }
    }

    /// Copies `data` of rank `root` into `data` of every rank.
    pub fn broadcast(
        &mut self,
        data: &mut [f32],
        root: u32,
        stop: &AtomicBool,
    ) -> Result<(), RingError> {
        if self.world == 1 {
            return Ok(());
        }
        self.usable()?;
        let result = self.broadcast_inner(data, root % self.world, stop);
        self.note(result)
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
        for op in 0..ops {
            let (o, l) = parts.part(op);
            if self.rank != root {
                let (h, buf) = self.receive(deadline, stop)?;
                expect(&h, Tag::Broadcast, coll, op, l * 4)?;
                data[o..o + l].copy_from_slice(&buf[..l]);
                self.recycle(buf);
            }
            if self.rank == root || forwards {
                self.send(
                    Tag::Broadcast,
                    coll,
                    op,
                    bytemuck::cast_slice(&data[o..o + l]),
                )?;
            }
        }
        Ok(())
    }

    /// Every rank's `mine` (all of the same length), by rank.
    pub fn allgather_u64(
        &mut self,
        mine: &[u64],
        stop: &AtomicBool,
    ) -> Result<Vec<Vec<u64>>, RingError> {
        let n = self.world as usize;
        let mut all = vec![Vec::new(); n];
        all[self.rank as usize] = mine.to_vec();
        if n == 1 {
            return Ok(all);
        }
        self.usable()?;
        let result = (|| {
            self.collective = self.collective.wrapping_add(1);
            let coll = self.collective;
            let r = self.rank as usize;
            let deadline = Instant::now() + self.timeout;
            for s in 0..n - 1 {
                let out: Vec<u8> = all[(r + n - s) % n]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                self.send(Tag::Gather, coll, s, &out)?;
                let (h, buf) = self.receive(deadline, stop)?;
                expect(&h, Tag::Gather, coll, s, mine.len() * 8)?;
                let bytes: &[u8] = bytemuck::cast_slice(&buf);
                all[(r + n - s - 1) % n] = bytes[..mine.len() * 8]
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect();
                self.recycle(buf);
            }
            Ok(all)
        })();
        self.note(result)
    }

    fn usable(&self) -> Result<(), RingError> {
        match &self.broken {
            Some(why) => Err(RingError::Broken(format!(
                "an earlier collective failed: {why}"
            ))),
            None => Ok(()),
        }
    }

    fn note<T>(&mut self, r: Result<T, RingError>) -> Result<T, RingError> {
        if let Err(e) = &r {
            self.broken = Some(e.to_string());
        }
        r
    }

    fn send(&mut self, tag: Tag, coll: u32, op: usize, payload: &[u8]) -> Result<(), RingError> {
        let links = self
            .links
            .as_mut()
            .ok_or_else(|| RingError::Broken("not connected".into()))?;
        let h = Header {
            tag: tag as u32,
            collective: coll,
            op: op as u32,
            len: payload.len() as u32,
        };
        let broken =
            |e: std::io::Error| RingError::Broken(format!("sending to the right neighbour: {e}"));
        links.right.write_all(&h.encode()).map_err(broken)?;
        links.right.write_all(payload).map_err(broken)?;
        self.stats
            .bytes_sent
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn receive(
        &mut self,
        deadline: Instant,
        stop: &AtomicBool,
    ) -> Result<(Header, Vec<f32>), RingError> {
        let links = self
            .links
            .as_ref()
            .ok_or_else(|| RingError::Broken("not connected".into()))?;
        loop {
            if stop.load(Ordering::Relaxed) {
                return Err(RingError::Stopped);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RingError::Timeout(self.timeout));
            }
            match links.incoming.recv_timeout(left.min(POLL)) {
                Ok(Ok(x)) => return Ok(x),
                Ok(Err(e)) => {
                    return Err(RingError::Broken(format!(
                        "receiving from the left neighbour: {e}"
                    )))
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(RingError::Broken("the receiving thread ended".into()))
                }
            }
        }
    }

    fn recycle(&self, buf: Vec<f32>) {
        if let Some(l) = &self.links {
            let _ = l.pool.send(buf);
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if let Some(l) = &self.links {
            l.shutdown.store(true, Ordering::Relaxed);
            let _ = l.right.shutdown(Shutdown::Both);
            let _ = l.left.shutdown(Shutdown::Both);
        }
    }
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

fn read_loop(
    stream: &mut TcpStream,
    tx: &Sender<Incoming>,
    pool: &Receiver<Vec<f32>>,
    shutdown: &AtomicBool,
    stats: &RingStats,
) {
    loop {
        let mut hb = [0u8; HEADER_LEN];
        if let Err(e) = frame::read_full(stream, &mut hb, shutdown) {
            let _ = tx.send(Err(e));
            return;
        }
        let Some(h) = Header::decode(&hb) else {
            let _ = tx.send(Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "malformed frame header (unknown tag or oversized length)",
            )));
            return;
        };
        let len = h.len as usize;
        let mut buf = pool.try_recv().unwrap_or_default();
        buf.resize(len.div_ceil(4), 0.0);
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf[..]);
        if let Err(e) = frame::read_full(stream, &mut bytes[..len], shutdown) {
            let _ = tx.send(Err(e));
            return;
        }
        stats
            .bytes_received
            .fetch_add(len as u64, Ordering::Relaxed);
        if tx.send(Ok((h, buf))).is_err() {
            return;
        }
    }
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
        for n in 1..=4 {
            let (_planes, mut rings) = rings(n, 3);
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
        for n in [2usize, 3, 5] {
            let (_planes, mut rings) = rings(n, 7);
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
