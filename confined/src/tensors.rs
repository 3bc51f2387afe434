//! A model's tensors as training sees them, under PyTorch's `state_dict()`
//! names: the parameters the optimizer trains, the buffers (model state
//! that training changes but no optimizer does), frozen parameters
//! (`requires_grad=False`, kept as they are) and tied names (a parameter
//! two submodules share, trained once and saved under both names).
//!
//! The patterns move one flat f32 vector: the trainable parameters, then
//! the buffers, each sorted by name ([`ModelTensors::layout`]). Buffers of
//! other dtypes travel as f32 values — exact for integers up to 2^24 (a
//! `num_batches_tracked` of 16.7 million batches) — and are written back
//! in their own dtype ([`ModelTensors::write_buffers`]), so an int64 buffer
//! stays int64 in checkpoints' consumers, the final weights and the saved
//! module.

use crate::torchscript::Module;
use tch::{Kind, Tensor};
use trainyard_common::model::{ParamInfo, TensorKind};

/// PyTorch's name of a dtype (`torch.float32` without `torch.`).
pub fn dtype_name(k: Kind) -> &'static str {
    match k {
        Kind::Float => "float32",
        Kind::Double => "float64",
        Kind::Half => "float16",
        Kind::BFloat16 => "bfloat16",
        Kind::Int64 => "int64",
        Kind::Int => "int32",
        Kind::Int16 => "int16",
        Kind::Int8 => "int8",
        Kind::Uint8 => "uint8",
        Kind::Bool => "bool",
        _ => "unsupported",
    }
}

/// The tensors of one model.
pub struct ModelTensors {
    /// Trained by the optimizer (float32), sorted by name.
    pub trainable: Vec<(String, Tensor)>,
    /// Buffers, sorted by name: the module's own tensors.
    pub buffers: Vec<(String, Tensor)>,
    /// Parameters with `requires_grad=False`, sorted by name.
    pub frozen: Vec<(String, Tensor)>,
    /// `(alias, name)`: a second name of a parameter listed under `name`.
    pub aliases: Vec<(String, String)>,
}

fn shape_of(t: &Tensor) -> Vec<u64> {
    t.size().iter().map(|&d| d.max(0) as u64).collect()
}

impl ModelTensors {
    /// A built-in model's tensors: every variable of its `VarStore`
    /// (trainable, no buffers).
    pub fn of_varstore(vs: &tch::nn::VarStore) -> ModelTensors {
        let mut trainable: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        trainable.sort_by(|a, b| a.0.cmp(&b.0));
        ModelTensors {
            trainable,
            buffers: Vec::new(),
            frozen: Vec::new(),
            aliases: Vec::new(),
        }
    }

    /// A TorchScript module's tensors, checked: trainable parameters must
    /// be float32, buffers of a dtype that travels as f32.
    pub fn of_script(m: &Module) -> Result<ModelTensors, String> {
        let params = m.parameters().map_err(|e| first_line(&e.to_string()))?;
        let buffers = m.buffers().map_err(|e| first_line(&e.to_string()))?;
        let mut out = ModelTensors {
            trainable: Vec::new(),
            buffers: Vec::new(),
            frozen: Vec::new(),
            aliases: Vec::new(),
        };
        // Tied parameters are one tensor under two names: the first name
        // in the module's order is trained, the others are aliases.
        let mut seen: Vec<(usize, Vec<i64>, Vec<i64>, String)> = Vec::new();
        for (name, t) in params {
            let key = (t.data_ptr() as usize, t.size(), t.stride());
            if t.numel() > 0 {
                if let Some((.., first)) = seen
                    .iter()
                    .find(|(p, s, st, _)| (*p, s, st) == (key.0, &key.1, &key.2))
                {
                    out.aliases.push((name, first.clone()));
                    continue;
                }
                seen.push((key.0, key.1, key.2, name.clone()));
            }
            if dtype_name(t.kind()) == "unsupported" {
                return Err(format!(
                    "parameter {name:?} has dtype {:?}, which Trainyard cannot keep",
                    t.kind()
                ));
            }
            if !t.requires_grad() {
                out.frozen.push((name, t));
            } else if t.kind() != Kind::Float {
                return Err(format!(
                    "parameter {name:?} is {}; Trainyard trains float32 parameters \
                     (call .float() on the module before torch.jit.script)",
                    dtype_name(t.kind())
                ));
            } else {
                out.trainable.push((name, t));
            }
        }
        for (name, t) in buffers {
            if dtype_name(t.kind()) == "unsupported" {
                return Err(format!(
                    "buffer {name:?} has dtype {:?}, which Trainyard cannot keep",
                    t.kind()
                ));
            }
            out.buffers.push((name, t));
        }
        for v in [&mut out.trainable, &mut out.buffers, &mut out.frozen] {
            v.sort_by(|a, b| a.0.cmp(&b.0));
        }
        out.aliases.sort();
        Ok(out)
    }

    /// Elements of the trainable parameters.
    pub fn trainable_len(&self) -> usize {
        self.trainable.iter().map(|(_, t)| t.numel()).sum()
    }

    /// Elements of the buffers.
    pub fn buffer_len(&self) -> usize {
        self.buffers.iter().map(|(_, t)| t.numel()).sum()
    }

    /// `(name, offset, len)` of every tensor of the flat vector: the
    /// trainable parameters, then the buffers.
    pub fn layout(&self) -> Vec<(String, usize, usize)> {
        let mut at = 0;
        self.trainable
            .iter()
            .chain(&self.buffers)
            .map(|(k, v)| {
                let n = v.numel();
                at += n;
                (k.clone(), at - n, n)
            })
            .collect()
    }

    /// What inspection reports and the scheduler shards: parameters, then
    /// buffers, then frozen parameters (tied names once, under the first).
    pub fn infos(&self) -> Vec<ParamInfo> {
        let info = |kind: TensorKind| {
            move |(name, t): &(String, Tensor)| {
                ParamInfo::new(name.clone(), &shape_of(t)).with(kind, dtype_name(t.kind()))
            }
        };
        self.trainable
            .iter()
            .map(info(TensorKind::Parameter))
            .chain(self.buffers.iter().map(info(TensorKind::Buffer)))
            .chain(self.frozen.iter().map(info(TensorKind::Frozen)))
            .collect()
    }

    /// The buffers as f32, flat, in layout order (empty without buffers).
    pub fn read_buffers(&self, device: tch::Device) -> Tensor {
        if self.buffers.is_empty() {
            return Tensor::zeros([0], (Kind::Float, device));
        }
        tch::no_grad(|| {
            Tensor::cat(
                &self
                    .buffers
                    .iter()
                    .map(|(_, t)| t.to_kind(Kind::Float).reshape([-1]).to_device(device))
                    .collect::<Vec<_>>(),
                0,
            )
        })
    }

    /// Sets every buffer, in its own dtype, from the flat f32 `src`.
    pub fn write_buffers(&self, src: &Tensor) {
        let mut at = 0i64;
        tch::no_grad(|| {
            for (_, b) in &self.buffers {
                let n = b.numel() as i64;
                let piece = src.narrow(0, at, n).view(b.size().as_slice());
                // Integers travel as f32 values: round, not truncate, so a
                // value that picked up an ulp comes back whole.
                let piece = if b.is_floating_point() {
                    piece
                } else {
                    piece.round()
                };
                b.shallow_clone().copy_(&piece);
                at += n;
            }
        });
    }

    /// Every tensor of `state_dict()` by its name (aliases included), in
    /// its own dtype, on the CPU.
    pub fn state_dict(&self) -> Vec<(String, Tensor)> {
        let cpu = |t: &Tensor| t.detach().to_device(tch::Device::Cpu).contiguous();
        let mut out: Vec<(String, Tensor)> = self
            .trainable
            .iter()
            .chain(&self.buffers)
            .chain(&self.frozen)
            .map(|(k, t)| (k.clone(), cpu(t)))
            .collect();
        for (alias, name) in &self.aliases {
            if let Some((_, t)) = out.iter().find(|(k, _)| k == name) {
                let t = t.copy();
                out.push((alias.clone(), t));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// The first line of a libtorch message (the rest is its C++ context);
/// for an error inside a TorchScript module's code, the line that names
/// it (`RuntimeError: …`, after the module's traceback).
pub fn first_line(s: &str) -> String {
    let first = s.lines().next().unwrap_or("libtorch error").trim();
    if s.contains("TorchScript interpreter") {
        let named = s.lines().rev().map(str::trim).find(|l| {
            l.split_once(": ")
                .is_some_and(|(k, _)| k.ends_with("Error") || k.ends_with("Exception"))
        });
        if let Some(line) = named {
            return line.to_owned();
        }
    }
    first.to_owned()
}
