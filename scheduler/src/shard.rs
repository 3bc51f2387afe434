//! The PS shard map: a model's parameters cut into byte-balanced shards.
//!
//! All parameter tensors are laid end to end (in the model's creation
//! order) as one flat fp32 index space, and shard `i` of `S` owns the flat
//! range `[i·T/S, (i+1)·T/S)` of the `T` elements. Shards therefore differ
//! by at most one element, and a tensor larger than a fair share is split
//! into ranges across shards — the largest shard is never a hot node. Each
//! shard is described as the tensor slices it owns, which is what the PS
//! data plane moves.

pub use trainyard_common::cluster::Range;
use trainyard_common::model::ParamInfo;

/// The ranges shard `shard` of `shards` owns.
pub fn shard_ranges(params: &[ParamInfo], shards: u32, shard: u32) -> Vec<Range> {
    let shards = u64::from(shards.max(1));
    let total: u64 = params.iter().map(ParamInfo::numel).sum();
    let lo = boundary(total, shards, u64::from(shard));
    let hi = boundary(total, shards, u64::from(shard) + 1);
    let mut out = Vec::new();
    let mut offset = 0u64;
    for p in params {
        let n = p.numel();
        let (a, b) = (lo.max(offset), hi.min(offset + n));
        if a < b {
            out.push(Range {
                param: p.name.clone(),
                start: a - offset,
                end: b - offset,
                buffer: false,
            });
        }
        offset += n;
        if offset >= hi {
            break;
        }
    }
    out
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
                end: 505
            }]
        );
        assert_eq!(
            s1,
            [
                Range {
                    param: "big".into(),
                    start: 505,
                    end: 1000
                },
                Range {
                    param: "b".into(),
                    start: 0,
                    end: 10
                }
            ]
        );
    }

    proptest! {
        #[test]
        fn shards_cover_every_element_exactly_once(
            shapes in prop::collection::vec(prop::collection::vec(1u64..50, 1..3), 1..12),
            shards in 1u32..20,
        ) {
            let params: Vec<ParamInfo> = shapes.iter().enumerate()
                .map(|(i, s)| ParamInfo::new(format!("p{i}"), s))
                .collect();
            let mut covered: Vec<Vec<bool>> = params.iter().map(|p| vec![false; p.numel() as usize]).collect();
            let mut sizes = Vec::new();
            for s in 0..shards {
                let ranges = shard_ranges(&params, shards, s);
                sizes.push(range_elements(&ranges));
                for r in ranges {
                    let i = params.iter().position(|p| p.name == r.param).unwrap();
                    for e in r.start..r.end {
                        prop_assert!(!covered[i][e as usize], "element covered twice");
                        covered[i][e as usize] = true;
                    }
                }
            }
            prop_assert!(covered.iter().flatten().all(|&c| c));
            let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            prop_assert!(max - min <= 1, "unbalanced: {:?}", sizes);
        }
    }
}
