//! Model sizes and the memory arithmetic of the two training patterns.
//!
//! Parameter counts of the built-in models are computed from their spec with
//! the same layer shapes the executor builds with `tch::nn`, so the scheduler
//! can place and shard a job before any executor has seen it. The per-role
//! byte counts follow ../shared/DESIGN.md ("Background"): in fp32 a parameter
//! costs 4 B of weights and 4 B of gradient on a worker, and the optimizer adds
//! 0 (SGD), 4 (momentum) or 8 (Adam) bytes wherever its state lives.

use crate::spec::{ModelSpec, OptimizerKind};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Bytes of one fp32 value.
pub const F32_BYTES: u64 = 4;

/// Kernel size of every convolution of the built-in CNN (padding keeps the size).
pub const CNN_KERNEL: u64 = 3;

/// The transformer's feed-forward layer is this many times wider than the model.
pub const TRANSFORMER_FF_MULT: u64 = 4;

/// Number of trainable parameters of a built-in model, or `None` for a
/// TorchScript model (its size is learnt by inspecting the file).
///
/// Saturates instead of overflowing: absurd sizes are rejected by the memory
/// check that follows rather than wrapping round to small numbers.
pub fn parameter_count(model: &ModelSpec) -> Option<u64> {
    let linear = |i: u64, o: u64| i.saturating_mul(o).saturating_add(o);
    match model {
        ModelSpec::Mlp(m) => {
            let mut dims = vec![u64::from(m.inputs)];
            dims.extend(m.hidden.iter().map(|&h| u64::from(h)));
            dims.push(u64::from(m.outputs));
            Some(
                dims.windows(2)
                    .fold(0u64, |acc, w| acc.saturating_add(linear(w[0], w[1]))),
            )
        }
        ModelSpec::Cnn(c) => {
            let mut total = 0u64;
            let mut cin = u64::from(c.channels);
            for &cout in &c.conv_channels {
                let cout = u64::from(cout);
                total = total.saturating_add(
                    cin.saturating_mul(cout)
                        .saturating_mul(CNN_KERNEL * CNN_KERNEL)
                        .saturating_add(cout),
                );
                cin = cout;
            }
            // Each convolution is followed by a 2×2 max-pool.
            let pools = c.conv_channels.len() as u32;
            let flat = cin
                .saturating_mul(u64::from(c.height) >> pools)
                .saturating_mul(u64::from(c.width) >> pools);
            total = total
                .saturating_add(linear(flat, u64::from(c.hidden)))
                .saturating_add(linear(u64::from(c.hidden), u64::from(c.classes)));
            Some(total)
        }
        ModelSpec::Transformer(t) => {
            let w = u64::from(t.width);
            let embeddings = (u64::from(t.vocab) + u64::from(t.context)).saturating_mul(w);
            let layer_norm = 2 * w;
            let attention = linear(w, 3 * w).saturating_add(linear(w, w));
            let feed_forward = linear(w, TRANSFORMER_FF_MULT * w)
                .saturating_add(linear(TRANSFORMER_FF_MULT * w, w));
            let block = (2 * layer_norm)
                .saturating_add(attention)
                .saturating_add(feed_forward);
            Some(
                embeddings
                    .saturating_add(block.saturating_mul(u64::from(t.layers)))
                    .saturating_add(layer_norm)
                    .saturating_add(linear(w, u64::from(t.vocab))),
            )
        }
        ModelSpec::Torchscript(_) => None,
    }
}

/// Bytes of optimizer state per parameter.
pub fn optimizer_state_bytes(kind: OptimizerKind) -> u64 {
    match kind {
        OptimizerKind::Sgd => 0,
        OptimizerKind::Momentum => F32_BYTES,
        OptimizerKind::Adam | OptimizerKind::Adamw => 2 * F32_BYTES,
    }
}

/// What each role of each pattern needs to hold a model, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MemoryEstimate {
    /// Trainable parameters.
    pub parameters: u64,
    /// A ring all-reduce worker: weights + gradients + optimizer state.
    pub allreduce_worker_bytes: u64,
    /// A parameter-server worker: weights + gradients.
    pub ps_worker_bytes: u64,
    /// The whole PS tier: weights + optimizer state (+ a gradient accumulator
    /// in sync mode), to be divided among the shards.
    pub ps_tier_bytes: u64,
}

impl MemoryEstimate {
    /// The estimate for `parameters` parameters trained with `optimizer`;
    /// `sync` adds the accumulator that synchronous PS shards keep.
    pub fn new(parameters: u64, optimizer: OptimizerKind, sync: bool) -> Self {
        let opt = optimizer_state_bytes(optimizer);
        let per = |b: u64| parameters.saturating_mul(b);
        MemoryEstimate {
            parameters,
            allreduce_worker_bytes: per(2 * F32_BYTES + opt),
            ps_worker_bytes: per(2 * F32_BYTES),
            ps_tier_bytes: per(F32_BYTES + opt + if sync { F32_BYTES } else { 0 }),
        }
    }

    /// Bytes one of `shards` PS shards holds (shards balanced by bytes).
    pub fn ps_shard_bytes(&self, shards: u32) -> u64 {
        self.ps_tier_bytes.div_ceil(u64::from(shards.max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{CnnSpec, MlpSpec, TransformerSpec};

    #[test]
    fn mlp_count_matches_hand_arithmetic() {
        let m = ModelSpec::Mlp(MlpSpec {
            inputs: 64,
            hidden: vec![128, 64],
            outputs: 10,
        });
        assert_eq!(
            parameter_count(&m),
            Some(64 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10)
        );
    }

    #[test]
    fn cnn_count_matches_hand_arithmetic() {
        let c = ModelSpec::Cnn(CnnSpec {
            channels: 1,
            height: 8,
            width: 8,
            conv_channels: vec![16, 32],
            hidden: 64,
            classes: 10,
        });
        let conv = (16 * 9 + 16) + (16 * 32 * 9 + 32); // 1 input channel
        let flat = 32 * 2 * 2;
        assert_eq!(
            parameter_count(&c),
            Some(conv + flat * 64 + 64 + 64 * 10 + 10)
        );
    }

    #[test]
    fn transformer_block_is_12w2_plus_13w() {
        let t = |layers| {
            parameter_count(&ModelSpec::Transformer(TransformerSpec {
                vocab: 100,
                context: 32,
                layers,
                heads: 4,
                width: 64,
            }))
            .unwrap()
        };
        let w = 64u64;
        assert_eq!(t(3) - t(2), 12 * w * w + 13 * w);
    }

    #[test]
    fn design_doc_example_10b_adam_is_160gb() {
        let e = MemoryEstimate::new(10_000_000_000, OptimizerKind::Adam, false);
        assert_eq!(e.allreduce_worker_bytes, 160_000_000_000);
        assert_eq!(e.ps_worker_bytes, 80_000_000_000);
        assert_eq!(e.ps_tier_bytes, 120_000_000_000);
        assert_eq!(e.ps_shard_bytes(4), 30_000_000_000);
    }
}
