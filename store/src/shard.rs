//! Checkpoint shards as safetensors files.
//!
//! A shard holds the pieces of the model's tensors one writer owns (a ring
//! rank's slice, a PS shard server's ranges), concatenated in order: the
//! 1-D tensor `weights`, then `state.0`, `state.1`, … for the optimizer's
//! state (momentum; Adam's two moments), each as long as `weights`. The
//! file's metadata lists the pieces (`ranges`, JSON) and the step, so a
//! shard read on its own in Python (`safetensors.torch.load_file`) says
//! what it holds.

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use trainyard_common::cluster::Range;

/// A decoded shard.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    /// The pieces, in order.
    pub ranges: Vec<Range>,
    /// `weights` then each optimizer state tensor.
    pub tensors: Vec<Vec<f32>>,
    /// The step it was written at.
    pub step: u64,
}

fn name(i: usize) -> String {
    if i == 0 {
        "weights".into()
    } else {
        format!("state.{}", i - 1)
    }
}

/// Encodes a shard; every tensor must be as long as the pieces together.
pub fn encode(ranges: &[Range], tensors: &[&[f32]], step: u64) -> Result<Vec<u8>, String> {
    let len: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    if let Some(t) = tensors.iter().find(|t| t.len() as u64 != len) {
        return Err(format!(
            "a shard tensor has {} values, its pieces {len}",
            t.len()
        ));
    }
    let mut views = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        let v = TensorView::new(Dtype::F32, vec![t.len()], bytemuck::cast_slice(t))
            .map_err(|e| e.to_string())?;
        views.push((name(i), v));
    }
    let mut meta = HashMap::new();
    meta.insert(
        "ranges".to_owned(),
        serde_json::to_string(ranges).map_err(|e| e.to_string())?,
    );
    meta.insert("step".to_owned(), step.to_string());
    meta.insert("format".to_owned(), "trainyard-checkpoint-shard/1".into());
    safetensors::serialize(views, Some(meta)).map_err(|e| e.to_string())
}

/// Decodes a shard, checking that its tensors match its pieces.
pub fn decode(bytes: &[u8]) -> Result<Shard, String> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| format!("not a safetensors file: {e}"))?;
    let (_, header) =
        SafeTensors::read_metadata(bytes).map_err(|e| format!("not a safetensors file: {e}"))?;
    let meta = header
        .metadata()
        .clone()
        .ok_or("the shard has no metadata")?;
    let ranges: Vec<Range> = serde_json::from_str(meta.get("ranges").ok_or("no ranges")?)
        .map_err(|e| format!("unreadable ranges: {e}"))?;
    let step = meta
        .get("step")
        .and_then(|s| s.parse().ok())
        .ok_or("no step")?;
    let len: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    let mut tensors = Vec::new();
    for i in 0.. {
        let Ok(t) = st.tensor(&name(i)) else { break };
        if t.dtype() != Dtype::F32 || t.shape() != [len as usize] {
            return Err(format!(
                "tensor {} is {:?} {:?}, expected F32 [{len}]",
                name(i),
                t.dtype(),
                t.shape()
            ));
        }
        tensors.push(
            t.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        );
    }
    if tensors.is_empty() {
        return Err("the shard has no weights".into());
    }
    Ok(Shard {
        ranges,
        tensors,
        step,
    })
}

/// SHA-256 of `bytes`, hex.
pub fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn shards_round_trip(
            lens in proptest::collection::vec(1u64..40, 1..4),
            states in 0usize..3,
            step in 0u64..1_000_000,
        ) {
            let ranges: Vec<Range> = lens
                .iter()
                .enumerate()
                .map(|(i, n)| Range { param: format!("p{i}"), start: 3, end: 3 + n, buffer: false })
                .collect();
            let len: u64 = lens.iter().sum();
            let tensors: Vec<Vec<f32>> = (0..=states)
                .map(|k| (0..len).map(|i| (i as f32) * 0.5 - k as f32).collect())
                .collect();
            let refs: Vec<&[f32]> = tensors.iter().map(|t| t.as_slice()).collect();
            let bytes = encode(&ranges, &refs, step).unwrap();
            let s = decode(&bytes).unwrap();
            prop_assert_eq!(s, Shard { ranges, tensors, step });
        }
    }

    #[test]
    fn mismatches_and_garbage_are_refused() {
        let r = vec![Range {
            param: "w".into(),
            start: 0,
            end: 4,
            buffer: false,
        }];
        assert!(encode(&r, &[&[1.0, 2.0]], 1).is_err());
        assert!(decode(b"garbage").is_err());
        assert!(decode(&[0u8; 8]).is_err());
    }
}
