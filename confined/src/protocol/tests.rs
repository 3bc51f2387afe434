//! The protocol's bounds: sizes a child reports are checked, frames
//! round-trip (a NaN loss too), and no bytes read as a frame panic or
//! allocate past their bound.

use super::frames::{read_frame, size_of, write_frame, Meta, Reply};
use proptest::prelude::*;

fn meta_of(shape: Vec<i64>, dtype: &str) -> Meta {
    Meta {
        name: "t".into(),
        shape,
        dtype: dtype.into(),
    }
}

#[test]
fn sizes_from_a_child_are_checked() {
    assert_eq!(size_of(&meta_of(vec![2, 3], "float32")).unwrap().1, 24);
    assert_eq!(size_of(&meta_of(vec![4], "int64")).unwrap().1, 32);
    assert!(size_of(&meta_of(vec![-1], "float32")).is_err());
    assert!(size_of(&meta_of(vec![i64::MAX, i64::MAX], "float32")).is_err());
    assert!(size_of(&meta_of(vec![1; 17], "float32")).is_err());
    assert!(size_of(&meta_of(vec![1], "float128")).is_err());
}

proptest! {
    #[test]
    fn frames_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..512), loss in any::<f64>()) {
        let mut buf = Vec::new();
        let reply = Reply::Stepped { loss_bits: loss.to_bits() };
        write_frame(&mut buf, &reply, &[&bytes]).unwrap();
        let (back, payload): (Reply, Vec<u8>) = read_frame(&mut buf.as_slice(), 512).unwrap();
        prop_assert_eq!(payload, bytes);
        match back {
            // NaN and infinities too: a diverged loss arrives as one.
            Reply::Stepped { loss_bits } => prop_assert_eq!(loss_bits, loss.to_bits()),
            other => prop_assert!(false, "{other:?}"),
        }
    }

    #[test]
    fn any_bytes_read_as_a_frame_are_an_answer_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        // Whatever a hostile child writes: no panic, no allocation past
        // the bound.
        let _ = read_frame::<Reply>(&mut bytes.as_slice(), 1024);
    }
}

#[test]
fn a_payload_past_its_bound_is_refused_before_it_is_read() {
    let mut buf = Vec::new();
    write_frame(&mut buf, &Reply::Mapped, &[&[0u8; 100]]).unwrap();
    let e = read_frame::<Reply>(&mut buf.as_slice(), 99).unwrap_err();
    assert!(e.to_string().contains("more than the 99 allowed"), "{e}");
}
