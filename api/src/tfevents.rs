//! TensorBoard's event-file format, written by hand: the bytes of
//! `GET /v1/jobs/{id}/tensorboard` ([`crate::routes::tensorboard`]).
//!
//! An event file is a sequence of TFRecords (a little-endian `u64` length,
//! the masked CRC32C of those 8 bytes, the data, the masked CRC32C of the
//! data) whose data are `tensorflow.Event` protobuf messages: first one
//! carrying only `file_version` (`brain.Event:2`), then scalar events, each
//! a `Summary` with one `simple_value`. The few protobuf fields involved are
//! encoded here directly (no protobuf dependency); the CRC32C (Castagnoli)
//! is a table-driven implementation checked against the published test
//! vectors. Everything here is pure: the route feeds it rows and streams
//! the bytes out.

/// The `file_version` of the first event: what TensorBoard's readers expect.
pub const FILE_VERSION: &str = "brain.Event:2";

/// The reflected Castagnoli polynomial.
const CASTAGNOLI: u32 = 0x82F6_3B78;

const CRC_TABLE: [u32; 256] = crc_table();

const fn crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ CASTAGNOLI
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

/// CRC32C (Castagnoli) of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc = CRC_TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// The masked CRC TFRecord stores (so that a CRC of data holding CRCs is
/// not degenerate).
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends one TFRecord holding `data` to `out`.
pub fn write_record(out: &mut Vec<u8>, data: &[u8]) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A field key: field number and wire type.
fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    key(out, field, LEN);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// The `Event` that opens a file: `wall_time` and `file_version`.
pub fn version_event(wall_time: f64) -> Vec<u8> {
    let mut e = Vec::with_capacity(32);
    key(&mut e, 1, FIXED64);
    e.extend_from_slice(&wall_time.to_le_bytes());
    bytes_field(&mut e, 3, FILE_VERSION.as_bytes());
    e
}

/// A scalar `Event`: `wall_time`, `step` and a `Summary` of one value
/// (`tag`, `simple_value`).
pub fn scalar_event(wall_time: f64, step: i64, tag: &str, value: f32) -> Vec<u8> {
    // Summary.Value { tag = 1; simple_value = 2 }
    let mut v = Vec::with_capacity(tag.len() + 8);
    bytes_field(&mut v, 1, tag.as_bytes());
    key(&mut v, 2, FIXED32);
    v.extend_from_slice(&value.to_le_bytes());
    // Summary { repeated Value value = 1 }
    let mut s = Vec::with_capacity(v.len() + 4);
    bytes_field(&mut s, 1, &v);
    // Event { wall_time = 1; step = 2; summary = 5 }
    let mut e = Vec::with_capacity(s.len() + 24);
    key(&mut e, 1, FIXED64);
    e.extend_from_slice(&wall_time.to_le_bytes());
    key(&mut e, 2, VARINT);
    // int64 is encoded as its two's complement, as protobuf does.
    varint(&mut e, step as u64);
    bytes_field(&mut e, 5, &s);
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn crc32c_matches_the_published_vectors() {
        // RFC 3720 (iSCSI), appendix B.4, and the classic check value.
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let ascending: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&ascending), 0x46DD_794E);
        let descending: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(crc32c(&descending), 0x113F_DB5C);
    }

    #[test]
    // The mask as TFRecord's format states it, against the rotation used.
    #[allow(clippy::manual_rotate)]
    fn the_mask_rotates_and_adds_the_constant() {
        let crc = crc32c(b"123456789");
        assert_eq!(
            masked_crc(b"123456789"),
            ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8)
        );
    }

    #[test]
    fn a_record_frames_its_data() {
        let mut out = Vec::new();
        write_record(&mut out, b"abc");
        assert_eq!(out.len(), 8 + 4 + 3 + 4);
        assert_eq!(&out[..8], &3u64.to_le_bytes());
        assert_eq!(&out[8..12], &masked_crc(&3u64.to_le_bytes()).to_le_bytes());
        assert_eq!(&out[12..15], b"abc");
        assert_eq!(&out[15..], &masked_crc(b"abc").to_le_bytes());
    }

    #[test]
    fn the_version_event_is_the_expected_protobuf() {
        let e = version_event(1.5);
        let mut want = vec![0x09];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        want.push(0x1a);
        want.push(13);
        want.extend_from_slice(b"brain.Event:2");
        assert_eq!(e, want);
    }

    #[test]
    fn a_scalar_event_is_the_expected_protobuf() {
        let e = scalar_event(2.0, 300, "train/loss", 0.25);
        let mut value = vec![0x0a, 10];
        value.extend_from_slice(b"train/loss");
        value.push(0x15);
        value.extend_from_slice(&0.25f32.to_le_bytes());
        let mut summary = vec![0x0a, value.len() as u8];
        summary.extend_from_slice(&value);
        let mut want = vec![0x09];
        want.extend_from_slice(&2.0f64.to_le_bytes());
        // 300 as a varint: 0xac 0x02.
        want.extend_from_slice(&[0x10, 0xac, 0x02]);
        want.push(0x2a);
        want.push(summary.len() as u8);
        want.extend_from_slice(&summary);
        assert_eq!(e, want);
    }

    /// Reads a varint back (the test's own decoder).
    fn read_varint(b: &[u8], i: &mut usize) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let byte = b[*i];
            *i += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return v;
            }
            shift += 7;
        }
    }

    proptest! {
        #[test]
        fn varints_round_trip(v in any::<u64>()) {
            let mut out = Vec::new();
            varint(&mut out, v);
            prop_assert!(out.len() <= 10);
            let mut i = 0;
            prop_assert_eq!(read_varint(&out, &mut i), v);
            prop_assert_eq!(i, out.len());
        }

        #[test]
        fn records_of_any_data_frame_and_check(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut out = Vec::new();
            write_record(&mut out, &data);
            let len = u64::from_le_bytes(out[..8].try_into().unwrap()) as usize;
            prop_assert_eq!(len, data.len());
            prop_assert_eq!(u32::from_le_bytes(out[8..12].try_into().unwrap()), masked_crc(&out[..8]));
            prop_assert_eq!(&out[12..12 + len], &data[..]);
            prop_assert_eq!(u32::from_le_bytes(out[12 + len..].try_into().unwrap()), masked_crc(&data));
        }

        #[test]
        fn scalar_events_carry_their_step_and_tag(step in 0i64..i64::MAX, tag in "[a-z/_]{1,40}", value in any::<f32>()) {
            let e = scalar_event(1.0, step, &tag, value);
            let mut i = 9;
            prop_assert_eq!(e[i], 0x10);
            i += 1;
            prop_assert_eq!(read_varint(&e, &mut i), step as u64);
            prop_assert_eq!(e[i], 0x2a);
            let tail = &e[e.len() - 4..];
            prop_assert_eq!(tail, &value.to_le_bytes()[..]);
            prop_assert!(e.windows(tag.len()).any(|w| w == tag.as_bytes()));
        }
    }
}
