//! Connection set-up: the listener sends a random challenge, the caller
//! answers with a hello (job, generation, role kind, its rank and the rank
//! it wants) and an HMAC-SHA256 of challenge and hello keyed with the job's
//! secret, and the listener answers with a status byte and the generation
//! it serves. The secret itself never crosses the wire, and a recorded
//! hello cannot be replayed against another challenge.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{Read, Write};
use std::net::TcpStream;
use uuid::Uuid;

/// Bytes of the listener's challenge.
pub const CHALLENGE_LEN: usize = 32;
/// Bytes of an encoded hello without its MAC.
pub const HELLO_LEN: usize = 40;
/// Bytes of the MAC.
pub const MAC_LEN: usize = 32;
/// Bytes of the listener's answer.
pub const REPLY_LEN: usize = 9;

const HELLO_MAGIC: &[u8; 4] = b"TYH1";
const CHALLENGE_MAGIC: &[u8; 4] = b"TYC1";

/// What a caller asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The job.
    pub job: Uuid,
    /// The generation the caller belongs to.
    pub generation: i64,
    /// The role kind of the endpoint ([`crate::EndpointRole`] as a byte).
    pub kind: u8,
    /// The caller's rank (or shard index).
    pub from: u32,
    /// The rank (or shard) it wants to reach.
    pub to: u32,
}

impl Hello {
    /// The wire form, without the MAC.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(HELLO_MAGIC);
        b[4..20].copy_from_slice(self.job.as_bytes());
        b[20..28].copy_from_slice(&self.generation.to_le_bytes());
        b[28] = self.kind;
        b[32..36].copy_from_slice(&self.from.to_le_bytes());
        b[36..40].copy_from_slice(&self.to.to_le_bytes());
        b
    }

    /// Parses the wire form; `None` if the magic is wrong.
    pub fn decode(b: &[u8; HELLO_LEN]) -> Option<Hello> {
        if &b[0..4] != HELLO_MAGIC {
            return None;
        }
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut g = [0u8; 8];
        g.copy_from_slice(&b[20..28]);
        Some(Hello {
            job: Uuid::from_slice(&b[4..20]).ok()?,
            generation: i64::from_le_bytes(g),
            kind: b[28],
            from: word(32),
            to: word(36),
        })
    }
}

/// The listener's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Accepted: the stream now belongs to the endpoint.
    Ok = 0,
    /// No such endpoint here (yet): the caller may retry.
    NotReady = 1,
    /// The endpoint serves another generation (sent along).
    Stale = 2,
    /// The MAC is wrong or the hello malformed.
    Refused = 3,
}

impl Status {
    fn from_byte(b: u8) -> Option<Status> {
        Some(match b {
            0 => Status::Ok,
            1 => Status::NotReady,
            2 => Status::Stale,
            3 => Status::Refused,
            _ => return None,
        })
    }
}

/// Why a connection was not set up.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The peer has no such endpoint yet.
    #[error("the peer has no endpoint for this job and rank yet")]
    NotReady,
    /// The peer serves another generation.
    #[error("the peer serves generation {0}")]
    Stale(i64),
    /// The peer refused the credentials.
    #[error("the peer refused the job secret")]
    Refused,
    /// The peer does not speak this protocol.
    #[error("the peer does not speak the Trainyard data plane")]
    Protocol,
    /// The network failed.
    #[error("network: {0}")]
    Io(#[from] std::io::Error),
}

/// HMAC-SHA256 of challenge and hello under `secret`.
pub fn mac(secret: &[u8], challenge: &[u8; CHALLENGE_LEN], hello: &[u8; HELLO_LEN]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(challenge);
    m.update(hello);
    m.finalize().into_bytes().into()
}

/// Checks a MAC in constant time.
pub fn verify(
    secret: &[u8],
    challenge: &[u8; CHALLENGE_LEN],
    hello: &[u8; HELLO_LEN],
    tag: &[u8],
) -> bool {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(challenge);
    m.update(hello);
    m.verify_slice(tag).is_ok()
}

/// A fresh random challenge (magic and 28 random bytes).
pub fn challenge() -> [u8; CHALLENGE_LEN] {
    let mut c = [0u8; CHALLENGE_LEN];
    c[0..4].copy_from_slice(CHALLENGE_MAGIC);
    c[4..20].copy_from_slice(Uuid::new_v4().as_bytes());
    c[20..32].copy_from_slice(&Uuid::new_v4().as_bytes()[..12]);
    c
}

/// The caller's side on a connected stream.
pub fn call(stream: &mut TcpStream, hello: &Hello, secret: &[u8]) -> Result<(), HandshakeError> {
    let mut ch = [0u8; CHALLENGE_LEN];
    stream.read_exact(&mut ch)?;
    if &ch[0..4] != CHALLENGE_MAGIC {
        return Err(HandshakeError::Protocol);
    }
    let h = hello.encode();
    let mut msg = [0u8; HELLO_LEN + MAC_LEN];
    msg[..HELLO_LEN].copy_from_slice(&h);
    msg[HELLO_LEN..].copy_from_slice(&mac(secret, &ch, &h));
    stream.write_all(&msg)?;
    let mut reply = [0u8; REPLY_LEN];
    stream.read_exact(&mut reply)?;
    let mut g = [0u8; 8];
    g.copy_from_slice(&reply[1..9]);
    match Status::from_byte(reply[0]) {
        Some(Status::Ok) => Ok(()),
        Some(Status::NotReady) => Err(HandshakeError::NotReady),
        Some(Status::Stale) => Err(HandshakeError::Stale(i64::from_le_bytes(g))),
        Some(Status::Refused) => Err(HandshakeError::Refused),
        None => Err(HandshakeError::Protocol),
    }
}

/// The listener's answer on the wire.
pub fn reply(status: Status, generation: i64) -> [u8; REPLY_LEN] {
    let mut r = [0u8; REPLY_LEN];
    r[0] = status as u8;
    r[1..9].copy_from_slice(&generation.to_le_bytes());
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn hello_round_trips(job in any::<u128>(), generation in any::<i64>(), kind in any::<u8>(), from in any::<u32>(), to in any::<u32>()) {
            let h = Hello { job: Uuid::from_u128(job), generation, kind, from, to };
            prop_assert_eq!(Hello::decode(&h.encode()), Some(h));
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), HELLO_LEN)) {
            let mut b = [0u8; HELLO_LEN];
            b.copy_from_slice(&bytes);
            let _ = Hello::decode(&b);
        }
    }

    #[test]
    fn a_mac_binds_secret_challenge_and_hello() {
        let h = Hello {
            job: Uuid::nil(),
            generation: 3,
            kind: 1,
            from: 0,
            to: 1,
        }
        .encode();
        let c = challenge();
        let tag = mac(b"s3cret", &c, &h);
        assert!(verify(b"s3cret", &c, &h, &tag));
        assert!(!verify(b"other", &c, &h, &tag));
        assert!(!verify(b"s3cret", &challenge(), &h, &tag));
        let mut h2 = h;
        h2[20] ^= 1;
        assert!(!verify(b"s3cret", &c, &h2, &tag));
    }
}
