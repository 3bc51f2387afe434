//! Fuzz target: whatever bytes a peer sends, the data plane's decoders
//! (ring frame headers, the handshake's hello, PS headers and payloads read
//! from a stream, typed as PS messages) answer with a value or an error,
//! never a panic, and never buffer more than they are allowed to: a ring
//! frame's length is bounded by `MAX_PAYLOAD`, a PS payload must be exactly
//! the shard's length, and a PS message that carries no values carries no
//! payload. A message that decodes encodes back to a header that decodes
//! to the same message.

#![no_main]

use libfuzzer_sys::fuzz_target;
use trainyard_dataplane::{frame, handshake, ps};

/// The shard length the PS reader is told to expect.
const SHARD: usize = 64;

fuzz_target!(|data: &[u8]| {
    if let Some(b) = data.get(..frame::HEADER_LEN) {
        let b: [u8; frame::HEADER_LEN] = b.try_into().expect("sliced to length");
        if let Some(h) = frame::Header::decode(&b) {
            assert!(h.len as usize <= frame::MAX_PAYLOAD);
            assert_eq!(frame::Header::decode(&h.encode()), Some(h));
        }
    }
    if let Some(b) = data.get(..handshake::HELLO_LEN) {
        let b: [u8; handshake::HELLO_LEN] = b.try_into().expect("sliced to length");
        if let Some(hello) = handshake::Hello::decode(&b) {
            assert_eq!(handshake::Hello::decode(&hello.encode()), Some(hello));
        }
    }
    if let Some(b) = data.get(..ps::HEADER_LEN) {
        let b: [u8; ps::HEADER_LEN] = b.try_into().expect("sliced to length");
        if let Some(h) = ps::Header::decode(&b) {
            if let Ok(m) = ps::Message::decode(&h) {
                assert!(m.carries_values() || h.len == 0);
                let again = ps::Message::decode(&m.header(h.generation, h.len))
                    .expect("an encoded message decodes");
                // Debug form: a NaN learning rate is not equal to itself.
                assert_eq!(format!("{again:?}"), format!("{m:?}"));
            }
        }
    }
    // A PS connection: messages and their values one after the other.
    let mut stream = std::io::Cursor::new(data);
    let mut buf = Vec::new();
    for _ in 0..8 {
        let Ok(m) = ps::read_message(&mut stream) else {
            break;
        };
        if !m.message.carries_values() {
            assert_eq!(m.len, 0);
            continue;
        }
        if ps::read_values(&mut stream, &m, SHARD, &mut buf).is_err() {
            break;
        }
        assert_eq!(buf.len(), SHARD);
    }
});
