//! Binary framing of the data plane: a 16-byte header (tag, collective
//! sequence number, operation index, payload length in bytes, all
//! little-endian `u32`) followed by the raw little-endian payload. A reader
//! checks the length against [`MAX_PAYLOAD`] before it allocates anything,
//! so a peer can never make it buffer more than one segment per frame.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use trainyard_shutdown::Shutdown;

/// Bytes of a frame header.
pub const HEADER_LEN: usize = 16;

/// The largest payload a frame may carry.
pub const MAX_PAYLOAD: usize = 8 << 20;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Tag {
    /// A segment of an all-reduce.
    Reduce = 1,
    /// A segment of a broadcast.
    Broadcast = 2,
    /// Small records of an all-gather.
    Gather = 3,
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the payload is.
    pub tag: u32,
    /// Which collective (counted per connection) it belongs to.
    pub collective: u32,
    /// The operation index within the collective.
    pub op: u32,
    /// Payload bytes.
    pub len: u32,
}

impl Header {
    /// The wire form.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        for (i, v) in [self.tag, self.collective, self.op, self.len]
            .into_iter()
            .enumerate()
        {
            b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Parses a header; `None` for an unknown tag or an oversized length.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Option<Header> {
        let w = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let h = Header {
            tag: w(0),
            collective: w(4),
            op: w(8),
            len: w(12),
        };
        ((1..=3).contains(&h.tag) && h.len as usize <= MAX_PAYLOAD).then_some(h)
    }
}

/// A stream whose reads wait out short read timeouts until `stop` is triggered
/// (then `ConnectionAborted`) or, if given, until `deadline` (then `TimedOut`),
/// so `read_exact` on it is interruptible. Set a short read timeout first.
pub struct Patient<'a> {
    /// The stream.
    pub stream: &'a mut TcpStream,
    /// Gives up once set.
    pub stop: &'a Shutdown,
    /// Gives up after it.
    pub deadline: Option<std::time::Instant>,
}

impl Read for Patient<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.stream.read(buf) {
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if self.stop.is_triggered() {
                        // Not `Interrupted`: `read_exact` would retry that.
                        return Err(std::io::Error::new(ErrorKind::ConnectionAborted, "stopped"));
                    }
                    if self.deadline.is_some_and(|d| std::time::Instant::now() > d) {
                        return Err(std::io::Error::new(
                            ErrorKind::TimedOut,
                            "the peer did not answer in time",
                        ));
                    }
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn headers_round_trip(tag in 1u32..=3, collective in any::<u32>(), op in any::<u32>(), len in 0u32..=MAX_PAYLOAD as u32) {
            let h = Header { tag, collective, op, len };
            prop_assert_eq!(Header::decode(&h.encode()), Some(h));
        }

        #[test]
        fn oversized_or_unknown_frames_are_refused(bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN)) {
            let mut b = [0u8; HEADER_LEN];
            b.copy_from_slice(&bytes);
            if let Some(h) = Header::decode(&b) {
                prop_assert!(h.len as usize <= MAX_PAYLOAD);
                prop_assert!((1..=3).contains(&h.tag));
            }
        }
    }
}
