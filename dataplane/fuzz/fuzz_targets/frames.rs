//! Fuzz target: whatever bytes a peer sends, the data plane's decoders
//! (ring frame headers, the handshake's hello, PS headers and payloads read
//! from a stream) answer with a value or an error, never a panic, and never
//! buffer more than they are allowed to: a ring frame's length is bounded by
//! `MAX_PAYLOAD`, a PS payload must be exactly the shard's length.

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
    // A PS connection: headers and payloads one after the other.
    let mut stream = std::io::Cursor::new(data);
    let mut buf = Vec::new();
    for _ in 0..8 {
        let Ok(h) = ps::read_header(&mut stream) else {
            break;
        };
        if ps::read_payload(&mut stream, &h, SHARD, &mut buf).is_err() {
            break;
        }
        assert_eq!(buf.len(), SHARD);
    }
});
