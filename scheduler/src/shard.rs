//! The PS shard map: a model's flat tensors cut into byte-balanced shards.
//!
//! The flat vector the PS pattern moves is the model's trainable
//! parameters laid end to end (in the model's order), then its buffers
//! (BatchNorm's running statistics, counters); frozen parameters never
//! leave the workers' modules and are not sharded. The parameters form one
//! flat index space of `P` elements and the buffers another of `B`; shard
//! `i` of `S` owns the parameter range `[i·P/S, (i+1)·P/S)` and, after it,
//! the buffer range `[i·B/S, (i+1)·B/S)`. Cutting the two apart keeps every
//! shard's bytes equal although a buffer carries no optimizer state, and
//! puts every shard's buffer ranges at its tail, where a shard expects the
//! values it takes as they are instead of optimizing them. Shards
//! therefore differ by at most one element of each kind, and a tensor
//! larger than a fair share is split into ranges across shards — the
//! largest shard is never a hot node. Each shard is described as the
//! tensor slices it owns (a buffer's marked [`Range::buffer`]), which is
//! what the PS data plane moves.

pub use trainyard_common::cluster::Range;
use trainyard_common::model::{ParamInfo, TensorKind};

/// The ranges shard `shard` of `shards` owns: its share of the parameters,
/// then its share of the buffers.
pub fn shard_ranges(params: &[ParamInfo], shards: u32, shard: u32) -> Vec<Range> {
    let mut out = Vec::new();
    for kind in [TensorKind::Parameter, TensorKind::Buffer] {
        let tensors: Vec<&ParamInfo> = params.iter().filter(|p| p.kind == kind).collect();
        share(
            &tensors,
            shards,
            shard,
            kind == TensorKind::Buffer,
            &mut out,
        );
    }
    out
}

/// Appends shard `shard` of `shards`'s share of `tensors` (one flat index
/// space) to `out`.
fn share(tensors: &[&ParamInfo], shards: u32, shard: u32, buffer: bool, out: &mut Vec<Range>) {
    let shards = u64::from(shards.max(1));
    let total: u64 = tensors.iter().map(|p| p.numel()).sum();
    let lo = boundary(total, shards, u64::from(shard));
    let hi = boundary(total, shards, u64::from(shard) + 1);
    let mut offset = 0u64;
    for p in tensors {
        if offset >= hi {
            break;
        }
        let n = p.numel();
        let (a, b) = (lo.max(offset), hi.min(offset + n));
        if a < b {
            out.push(Range {
                param: p.name.clone(),
                start: a - offset,
                end: b - offset,
                buffer,
            });
        }
        offset += n;
    }
}

/// Elements in a list of ranges.
pub fn range_elements(ranges: &[Range]) -> u64 {
    ranges.iter().map(|r| r.end - r.start).sum()
}

fn boundary(total: u64, shards: u64, i: u64) -> u64 {
    // u128 keeps total·i from overflowing for any model that fits in memory.
    (u128::from(total) * u128::from(i) / u128::from(shards)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use trainyard_common::model::parameters;
    use trainyard_common::spec::{CnnSpec, MlpSpec, ModelSpec, TransformerSpec};

    fn realistic_models() -> Vec<ModelSpec> {
        vec![
            ModelSpec::Mlp(MlpSpec {
                inputs: 64,
                hidden: vec![128, 64],
                outputs: 10,
            }),
            ModelSpec::Mlp(MlpSpec {
                inputs: 784,
                hidden: vec![4096, 4096, 1024],
                outputs: 10,
            }),
            ModelSpec::Cnn(CnnSpec {
                channels: 3,
                height: 32,
                width: 32,
                conv_channels: vec![32, 64, 128],
                hidden: 256,
                classes: 100,
            }),
            ModelSpec::Transformer(TransformerSpec {
                vocab: 256,
                context: 256,
                layers: 6,
                heads: 8,
                width: 512,
            }),
            ModelSpec::Transformer(TransformerSpec {
                vocab: 50_000,
                context: 1024,
                layers: 12,
                heads: 12,
                width: 768,
            }),
        ]
    }

    #[test]
    fn realistic_models_are_balanced_within_10_percent() {
        for m in realistic_models() {
            let params = parameters(&m).unwrap();
            for shards in 1..=16u32 {
                let sizes: Vec<u64> = (0..shards)
                    .map(|s| range_elements(&shard_ranges(&params, shards, s)))
                    .collect();
                let mean = sizes.iter().sum::<u64>() as f64 / f64::from(shards);
                let max = *sizes.iter().max().unwrap() as f64;
                assert!(max <= mean * 1.1, "{m:?} with {shards} shards: {sizes:?}");
            }
        }
    }

    #[test]
    fn a_large_tensor_is_split_across_shards() {
        let params = vec![
            ParamInfo::new("big", &[100, 10]),
            ParamInfo::new("b", &[10]),
        ];
        let s0 = shard_ranges(&params, 2, 0);
        let s1 = shard_ranges(&params, 2, 1);
        assert_eq!(
            s0,
            [Range {
                param: "big".into(),
                start: 0,
                end: 505,
                buffer: false,
            }]
        );
        assert_eq!(
            s1,
            [
                Range {
                    param: "big".into(),
                    start: 505,
                    end: 1000,
                    buffer: false,
                },
                Range {
                    param: "b".into(),
                    start: 0,
                    end: 10,
                    buffer: false,
                }
            ]
        );
    }

    #[test]
    fn buffers_follow_each_shards_parameters_and_frozen_tensors_are_not_sharded() {
        let params = vec![
            ParamInfo::new("bn.running_mean", &[4]).with(TensorKind::Buffer, "float32"),
            ParamInfo::new("fc.weight", &[6]),
            ParamInfo::new("emb.weight", &[100]).with(TensorKind::Frozen, "float32"),
            ParamInfo::new("bn.num_batches_tracked", &[]).with(TensorKind::Buffer, "int64"),
            ParamInfo::new("fc.bias", &[2]),
        ];
        let r = |param: &str, start, end, buffer| Range {
            param: param.into(),
            start,
            end,
            buffer,
        };
        assert_eq!(
            shard_ranges(&params, 2, 0),
            [
                r("fc.weight", 0, 4, false),
                r("bn.running_mean", 0, 2, true)
            ]
        );
        assert_eq!(
            shard_ranges(&params, 2, 1),
            [
                r("fc.weight", 4, 6, false),
                r("fc.bias", 0, 2, false),
                r("bn.running_mean", 2, 4, true),
                r("bn.num_batches_tracked", 0, 1, true)
            ]
        );
    }

    fn kind() -> impl Strategy<Value = TensorKind> {
        prop_oneof![
            3 => Just(TensorKind::Parameter),
            2 => Just(TensorKind::Buffer),
            1 => Just(TensorKind::Frozen),
        ]
    }

    proptest! {
        /// Every element of every parameter and buffer is in exactly one
        /// shard, frozen tensors in none; each shard's buffer ranges are
        /// its tail; shards differ by at most one element of each kind.
        #[test]
        fn shards_cover_every_flat_element_exactly_once_with_buffers_at_the_tail(
            tensors in prop::collection::vec((prop::collection::vec(1u64..50, 0..3), kind()), 1..12),
            shards in 1u32..20,
        ) {
            let params: Vec<ParamInfo> = tensors.iter().enumerate()
                .map(|(i, (s, k))| ParamInfo::new(format!("p{i}"), s).with(*k, "float32"))
                .collect();
            let mut covered: Vec<Vec<bool>> = params.iter().map(|p| vec![false; p.numel() as usize]).collect();
            let mut sizes = [Vec::new(), Vec::new()];
            for s in 0..shards {
                let ranges = shard_ranges(&params, shards, s);
                let head = ranges.iter().take_while(|r| !r.buffer).count();
                prop_assert!(ranges[head..].iter().all(|r| r.buffer), "a buffer range before a parameter range: {:?}", ranges);
                sizes[0].push(range_elements(&ranges[..head]));
                sizes[1].push(range_elements(&ranges[head..]));
                for r in ranges {
                    let i = params.iter().position(|p| p.name == r.param).unwrap();
                    prop_assert_eq!(r.buffer, params[i].kind == TensorKind::Buffer);
                    prop_assert!(params[i].kind.is_flat());
                    for e in r.start..r.end {
                        prop_assert!(!covered[i][e as usize], "element covered twice");
                        covered[i][e as usize] = true;
                    }
                }
            }
            for (p, c) in params.iter().zip(&covered) {
                prop_assert_eq!(c.iter().all(|&c| c), p.kind.is_flat(), "{}", p.name);
                prop_assert!(p.kind.is_flat() || !c.iter().any(|&c| c));
            }
            for s in &sizes {
                let (min, max) = (s.iter().min().unwrap(), s.iter().max().unwrap());
                prop_assert!(max - min <= 1, "unbalanced: {:?}", sizes);
            }
        }
    }
}
