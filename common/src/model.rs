//! Model sizes and the memory arithmetic of the two training patterns.
//!
//! Parameter counts of the built-in models are computed from their spec with
//! the same layer shapes the executor builds with `tch::nn`, so the scheduler
//! can place and shard a job before any executor has seen it. The per-role
//! byte counts follow ../shared/DESIGN.md ("Background"): in fp32 a parameter
//! costs 4 B of weights and 4 B of gradient on a worker, and the optimizer adds
//! 0 (SGD), 4 (momentum) or 8 (Adam) bytes wherever its state lives. A
//! buffer travels with the weights but has no optimizer state; a frozen
//! parameter stays in the worker's module ([`MemoryEstimate::with_state`]).

use crate::spec::{ModelSpec, OptimizerKind, UncheckedJobSpec};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Bytes of one fp32 value.
pub const F32_BYTES: u64 = 4;

/// Kernel size of every convolution of the built-in CNN (padding keeps the size).
pub const CNN_KERNEL: u64 = 3;

/// The transformer's feed-forward layer is this many times wider than the model.
pub const TRANSFORMER_FF_MULT: u64 = 4;

/// What a tensor of a model is to training.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TensorKind {
    /// A parameter the optimizer trains.
    #[default]
    Parameter,
    /// A buffer (`named_buffers()`: BatchNorm's running statistics, a
    /// counter): model state that training changes but no optimizer does.
    /// It travels with the weights (rank 0's values win) and is
    /// checkpointed with them.
    Buffer,
    /// A parameter with `requires_grad=False`: kept as it is, never updated,
    /// never sharded.
    Frozen,
}

impl TensorKind {
    /// Whether this is the default kind (for `skip_serializing_if`).
    pub fn is_parameter(&self) -> bool {
        *self == TensorKind::Parameter
    }

    /// Whether the tensor lives in the flat vector that the patterns sum,
    /// shard and checkpoint (parameters, then buffers).
    pub fn is_flat(&self) -> bool {
        *self != TensorKind::Frozen
    }
}

fn f32_dtype() -> String {
    "float32".to_owned()
}

fn is_f32(d: &str) -> bool {
    d == "float32"
}

/// One tensor of a model's `state_dict()`: its PyTorch name (dotted, as
/// `state_dict()` spells it, for the built-in models too), shape, what it
/// is to training and its dtype.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ParamInfo {
    /// Name, e.g. `fc0.weight` or `bn.running_mean`.
    pub name: String,
    /// Shape, e.g. `[128, 64]`.
    pub shape: Vec<u64>,
    /// Parameter (default), buffer or frozen parameter.
    #[serde(default, skip_serializing_if = "TensorKind::is_parameter")]
    pub kind: TensorKind,
    /// PyTorch's dtype name without `torch.` (`float32`, the default;
    /// `int64` for `num_batches_tracked`).
    #[serde(default = "f32_dtype", skip_serializing_if = "is_f32")]
    pub dtype: String,
}

impl ParamInfo {
    /// A float32 parameter.
    pub fn new(name: impl Into<String>, shape: &[u64]) -> Self {
        ParamInfo {
            name: name.into(),
            shape: shape.to_vec(),
            kind: TensorKind::Parameter,
            dtype: f32_dtype(),
        }
    }

    /// A tensor of another kind or dtype.
    pub fn with(mut self, kind: TensorKind, dtype: &str) -> Self {
        self.kind = kind;
        self.dtype = dtype.to_owned();
        self
    }

    /// Elements (saturating: absurd sizes stay absurd instead of wrapping).
    pub fn numel(&self) -> u64 {
        self.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }
}

fn linear(out: &mut Vec<ParamInfo>, name: &str, inputs: u64, outputs: u64) {
    out.push(ParamInfo::new(format!("{name}.weight"), &[outputs, inputs]));
    out.push(ParamInfo::new(format!("{name}.bias"), &[outputs]));
}

fn layer_norm(out: &mut Vec<ParamInfo>, name: &str, width: u64) {
    out.push(ParamInfo::new(format!("{name}.weight"), &[width]));
    out.push(ParamInfo::new(format!("{name}.bias"), &[width]));
}

/// The trainable tensors of a built-in model in the order the executor
/// creates them, or `None` for a TorchScript model (its tensors are learnt by
/// inspecting the file). The PS shard map and the memory arithmetic both
/// start from this list.
pub fn parameters(model: &ModelSpec) -> Option<Vec<ParamInfo>> {
    let mut p = Vec::new();
    match model {
        ModelSpec::Mlp(m) => {
            let mut dims = vec![u64::from(m.inputs)];
            dims.extend(m.hidden.iter().map(|&h| u64::from(h)));
            dims.push(u64::from(m.outputs));
            for (i, w) in dims.windows(2).enumerate() {
                linear(&mut p, &format!("fc{i}"), w[0], w[1]);
            }
        }
        ModelSpec::Cnn(c) => {
            let mut cin = u64::from(c.channels);
            for (i, &cout) in c.conv_channels.iter().enumerate() {
                let cout = u64::from(cout);
                p.push(ParamInfo::new(
                    format!("conv{i}.weight"),
                    &[cout, cin, CNN_KERNEL, CNN_KERNEL],
                ));
                p.push(ParamInfo::new(format!("conv{i}.bias"), &[cout]));
                cin = cout;
            }
            // Each convolution is followed by a 2×2 max-pool.
            let pools = c.conv_channels.len() as u32;
            let flat = cin
                .saturating_mul(u64::from(c.height) >> pools)
                .saturating_mul(u64::from(c.width) >> pools);
            linear(&mut p, "fc0", flat, u64::from(c.hidden));
            linear(&mut p, "fc1", u64::from(c.hidden), u64::from(c.classes));
        }
        ModelSpec::Transformer(t) => {
            let w = u64::from(t.width);
            let ff = TRANSFORMER_FF_MULT * w;
            p.push(ParamInfo::new("tok_emb.weight", &[u64::from(t.vocab), w]));
            p.push(ParamInfo::new("pos_emb.weight", &[u64::from(t.context), w]));
            for l in 0..t.layers {
                let b = format!("blocks.{l}");
                layer_norm(&mut p, &format!("{b}.ln1"), w);
                linear(&mut p, &format!("{b}.attn.qkv"), w, 3 * w);
                linear(&mut p, &format!("{b}.attn.proj"), w, w);
                layer_norm(&mut p, &format!("{b}.ln2"), w);
                linear(&mut p, &format!("{b}.mlp.fc"), w, ff);
                linear(&mut p, &format!("{b}.mlp.proj"), ff, w);
            }
            layer_norm(&mut p, "ln_f", w);
            linear(&mut p, "head", w, u64::from(t.vocab));
        }
        ModelSpec::Torchscript(_) => return None,
    }
    Some(p)
}

/// Number of trainable parameters of a built-in model, or `None` for a
/// TorchScript model.
pub fn parameter_count(model: &ModelSpec) -> Option<u64> {
    Some(
        parameters(model)?
            .iter()
            .fold(0u64, |a, p| a.saturating_add(p.numel())),
    )
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
    /// Hot standbys of each PS shard (the spec's `replicas`): each holds
    /// what its shard holds, on another executor, so the PS tier takes
    /// `(1 + ps_replicas) × ps_tier_bytes` of RAM in all.
    #[serde(default)]
    pub ps_replicas: u32,
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
            ps_replicas: 0,
        }
    }

    /// The estimate for a model's tensors as inspection (or
    /// [`parameters`]) lists them: its [`TensorKind::Parameter`] elements
    /// are the trainable parameters ([`MemoryEstimate::new`]), and its
    /// buffers and frozen parameters are counted by
    /// [`MemoryEstimate::with_state`].
    pub fn of(tensors: &[ParamInfo], optimizer: OptimizerKind, sync: bool) -> Self {
        let count = |kind: TensorKind| {
            tensors
                .iter()
                .filter(|t| t.kind == kind)
                .map(ParamInfo::numel)
                .fold(0u64, u64::saturating_add)
        };
        MemoryEstimate::new(count(TensorKind::Parameter), optimizer, sync).with_state(
            count(TensorKind::Buffer),
            count(TensorKind::Frozen),
            sync,
        )
    }

    /// Adds a model's state besides its trainable parameters (call it
    /// once; the byte counts add up). A buffer element travels in the flat
    /// vector the patterns sum and shard, but no optimizer keeps state for
    /// it: it costs 4 B of weights and 4 B of the gradient-sized vector on
    /// a worker of either pattern, 4 B on the PS tier (plus 4 B of the
    /// accumulator of a `sync` shard). A frozen parameter never leaves the
    /// worker's module: 4 B there, nothing on the PS tier. `parameters`
    /// stays the trainable count.
    pub fn with_state(mut self, buffer_elements: u64, frozen_elements: u64, sync: bool) -> Self {
        let worker = buffer_elements
            .saturating_mul(2 * F32_BYTES)
            .saturating_add(frozen_elements.saturating_mul(F32_BYTES));
        let tier = buffer_elements.saturating_mul(F32_BYTES + if sync { F32_BYTES } else { 0 });
        self.allreduce_worker_bytes = self.allreduce_worker_bytes.saturating_add(worker);
        self.ps_worker_bytes = self.ps_worker_bytes.saturating_add(worker);
        self.ps_tier_bytes = self.ps_tier_bytes.saturating_add(tier);
        self
    }

    /// The same estimate for a PS tier that keeps `replicas` hot standbys
    /// of each shard.
    pub fn with_ps_replicas(mut self, replicas: u32) -> Self {
        self.ps_replicas = replicas;
        self
    }

    /// RAM of the whole PS tier with its standbys.
    pub fn ps_tier_total_bytes(&self) -> u64 {
        self.ps_tier_bytes
            .saturating_mul(1 + u64::from(self.ps_replicas))
    }

    /// Bytes one of `shards` PS shards holds (shards balanced by bytes).
    pub fn ps_shard_bytes(&self, shards: u32) -> u64 {
        self.ps_tier_bytes.div_ceil(u64::from(shards.max(1)))
    }
}

impl UncheckedJobSpec {
    /// The memory each role needs, for built-in models (the spec knows its
    /// model; the arithmetic lives here, with the parameter counts).
    pub fn estimate(&self) -> Option<MemoryEstimate> {
        let tensors = parameters(self.model.as_ref()?)?;
        Some(
            MemoryEstimate::of(&tensors, self.optimizer.as_ref()?.kind, self.is_sync())
                .with_ps_replicas(self.ps_replicas()),
        )
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

    /// Buffers cost weights and a gradient-sized slot on workers and their
    /// values (and a sync accumulator) on the PS tier, never optimizer
    /// state; frozen parameters cost their weights on workers only.
    #[test]
    fn buffers_and_frozen_tensors_are_counted_where_they_live() {
        let tensors = [
            ParamInfo::new("fc.weight", &[10, 10]),
            ParamInfo::new("emb.weight", &[5, 4]).with(TensorKind::Frozen, "float32"),
            ParamInfo::new("bn.running_mean", &[10]).with(TensorKind::Buffer, "float32"),
            ParamInfo::new("bn.num_batches_tracked", &[]).with(TensorKind::Buffer, "int64"),
        ];
        for sync in [false, true] {
            let e = MemoryEstimate::of(&tensors, OptimizerKind::Adam, sync);
            let base = MemoryEstimate::new(100, OptimizerKind::Adam, sync);
            assert_eq!(e.parameters, 100);
            assert_eq!(
                e.allreduce_worker_bytes,
                base.allreduce_worker_bytes + 11 * 8 + 20 * 4
            );
            assert_eq!(e.ps_worker_bytes, base.ps_worker_bytes + 11 * 8 + 20 * 4);
            let acc = if sync { 4 } else { 0 };
            assert_eq!(e.ps_tier_bytes, base.ps_tier_bytes + 11 * (4 + acc));
        }
        // Parameters alone: the same as `new`.
        assert_eq!(
            MemoryEstimate::of(&tensors[..1], OptimizerKind::Sgd, true),
            MemoryEstimate::new(100, OptimizerKind::Sgd, true)
        );
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
