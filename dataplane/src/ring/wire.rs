//! How a ring's values travel: fp32 or bf16 ([`Wire`]), and the frames
//! that carry them, each checked against the schedule on arrival (tag,
//! collective, operation, length) so a peer out of step breaks the ring
//! instead of corrupting a sum.

use super::RingError;
use crate::frame::{Header, Patient, Tag, HEADER_LEN};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

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

/// Folds received bf16 values into `seg`: added while reducing (and, at the
/// last reduce step, where the chunk is complete, rounded once to bf16 as
/// every other rank will receive it), copied while gathering.
pub(super) fn combine_bf16(seg: &mut [f32], src: &[u16], reducing: bool, complete: bool) {
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

/// Writes a frame; returns the payload bytes.
pub(super) fn write_frame(
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

pub(super) fn read_header(r: &mut Patient<'_>, timeout: Duration) -> Result<Header, RingError> {
    let mut hb = [0u8; HEADER_LEN];
    r.read_exact(&mut hb)
        .map_err(|e| receive_error(e, timeout))?;
    Header::decode(&hb).ok_or_else(|| {
        RingError::Broken("malformed frame header (unknown tag or oversized length)".into())
    })
}

pub(super) fn read_payload(
    r: &mut Patient<'_>,
    buf: &mut [u8],
    timeout: Duration,
) -> Result<(), RingError> {
    r.read_exact(buf).map_err(|e| receive_error(e, timeout))
}

pub(super) fn expect(
    h: &Header,
    tag: Tag,
    coll: u32,
    op: usize,
    bytes: usize,
) -> Result<(), RingError> {
    if h.tag != tag as u32 || h.collective != coll || h.op as usize != op || h.len as usize != bytes
    {
        return Err(RingError::Broken(format!(
            "out of step: expected {tag:?} collective {coll} op {op} of {bytes} bytes, got tag {} collective {} op {} of {} bytes",
            h.tag, h.collective, h.op, h.len
        )));
    }
    Ok(())
}
