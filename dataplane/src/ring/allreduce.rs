//! The pipelined all-reduce: reduce-scatter then all-gather, each chunk in
//! segments, the caller's thread receiving and adding while a thread scoped
//! to the collective sends (see the module map in [`super`]); and the
//! single-threaded form for small buffers.

use super::split::Split;
use super::wire::{
    combine_bf16, expect, f32_to_bf16, read_header, read_payload, write_frame, Wire,
};
use super::{Ring, RingError, POLL, WINDOW};
use crate::frame::{Patient, Tag};

use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::{Duration, Instant};
use trainyard_shutdown::Shutdown;

impl Ring {
    /// Sums `data` element-wise over all ranks, in place, on every rank.
    pub fn allreduce(&mut self, data: &mut [f32], stop: &Shutdown) -> Result<(), RingError> {
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
        stop: &Shutdown,
    ) -> Result<(), RingError> {
        self.collective(|ring| ring.allreduce_inner(data, wire, stop))
    }

    fn allreduce_inner(
        &mut self,
        data: &mut [f32],
        wire: Wire,
        stop: &Shutdown,
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
        let mut table = segments(data, &chunks, n, per);
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
                send_segments(right, jobs, &returns, (wire, coll), &writer_stats, stop);
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
                    receive_segment(
                        &mut reader,
                        seg,
                        scratch,
                        (wire, timeout),
                        (reducing, step == n - 2),
                    )?;
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
                let _ = right_handle.shutdown(std::net::Shutdown::Write);
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
        stop: &Shutdown,
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
}

type Returned<'a> = Result<(usize, &'a mut [f32]), RingError>;

/// `data` cut into `n` chunks of `per` segments each (chunk by chunk), as
/// slices of their own.
fn segments<'d>(
    data: &'d mut [f32],
    chunks: &Split,
    n: usize,
    per: usize,
) -> Vec<Option<&'d mut [f32]>> {
    let mut table = Vec::with_capacity(n * per);
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
    table
}

/// The writer: sends each segment `jobs` hands it to the right neighbour
/// (as `wire`, in collective `coll`) and hands it back on `returns`, or
/// the error that ended it.
fn send_segments<'d>(
    right: &mut std::net::TcpStream,
    jobs: std::sync::mpsc::Receiver<(usize, usize, &'d mut [f32])>,
    returns: &std::sync::mpsc::Sender<Result<(usize, &'d mut [f32]), RingError>>,
    (wire, coll): (Wire, u32),
    stats: &super::RingStats,
    stop: &Shutdown,
) {
    let mut packed: Vec<u16> = Vec::new();
    for (op, idx, seg) in jobs {
        if stop.is_triggered() {
            let _ = returns.send(Err(RingError::Stopped));
            return;
        }
        let sent = match wire {
            Wire::F32 => write_frame(right, Tag::Reduce, coll, op, bytemuck::cast_slice(seg)),
            Wire::Bf16 => {
                packed.clear();
                packed.extend(seg.iter().map(|&v| f32_to_bf16(v)));
                write_frame(right, Tag::Reduce, coll, op, bytemuck::cast_slice(&packed))
            }
        };
        match sent {
            Ok(bytes) => {
                stats.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
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
}

/// Reads one segment's payload from the left neighbour into `seg`: added
/// to it while `reducing` (reduce-scatter), else in its place
/// (all-gather); bf16 payloads widened, the chunk completed by this rank
/// (`complete`) rounded as its owner rounds it.
fn receive_segment(
    reader: &mut Patient<'_>,
    seg: &mut [f32],
    scratch: &mut Vec<f32>,
    (wire, timeout): (Wire, Duration),
    (reducing, complete): (bool, bool),
) -> Result<(), RingError> {
    match wire {
        Wire::F32 if !reducing => {
            // All-gather: straight into place.
            read_payload(reader, bytemuck::cast_slice_mut(seg), timeout)?;
        }
        Wire::F32 => {
            scratch.resize(seg.len(), 0.0);
            read_payload(reader, bytemuck::cast_slice_mut(&mut scratch[..]), timeout)?;
            for (d, s) in seg.iter_mut().zip(scratch.iter()) {
                *d += *s;
            }
        }
        Wire::Bf16 => {
            scratch.resize(seg.len().div_ceil(2), 0.0);
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut scratch[..]);
            read_payload(reader, &mut bytes[..seg.len() * 2], timeout)?;
            let src: &[u16] = &bytemuck::cast_slice(&scratch[..])[..seg.len()];
            combine_bf16(seg, src, reducing, complete);
        }
    }
    Ok(())
}

/// Where the writer hands segments back, and how long to wait for them.
struct Wait<'w, 'a> {
    back: &'w std::sync::mpsc::Receiver<Returned<'a>>,
    stop: &'w Shutdown,
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
            if self.stop.is_triggered() {
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
