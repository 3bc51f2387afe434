//! The protocol between the executor and a module's child. Frames, both
//! ways: a `u32` length and a JSON header, then a `u64` length and that
//! many payload bytes (tensors, raw, in the header's order). The child's
//! task ([`Load`]) goes in as the sandbox's JSON line; then the child
//! describes the module and each [`Request`] gets one [`Reply`]. A header
//! from the other side is untrusted: its length, its payload's and the
//! sizes of the tensors it describes are bounded and checked here, before
//! anything is allocated for them.

use crate::tensors::dtype_name;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::PathBuf;
use tch::{Kind, Tensor};
use trainyard_common::spec::UncheckedJobSpec;

/// The largest JSON header either side reads.
const MAX_HEADER: usize = 1 << 20;

/// The child's task: the module, where it runs and the job's spec.
#[derive(Serialize, Deserialize)]
pub struct Load {
    /// The module, in the child's read-only inputs.
    pub model: PathBuf,
    /// Its scratch folder (where the trained module is saved).
    pub scratch: PathBuf,
    /// `Some(i)`: CUDA device `i`; `None`: the CPU.
    pub cuda: Option<usize>,
    /// The job's spec (its loss, its seed).
    pub spec: UncheckedJobSpec,
}

/// A tensor's shape and dtype in a header; its bytes are in the payload.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Meta {
    /// Its name (model tensors) or empty.
    #[serde(default)]
    pub name: String,
    /// Its shape.
    pub shape: Vec<i64>,
    /// PyTorch's dtype name.
    pub dtype: String,
}

/// A call of the executor to the child.
#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Map the shared memory (fd 3), now sized to `bytes`: the flat
    /// vector, then the gradient.
    Map {
        /// Its size.
        bytes: u64,
    },
    /// A forward and backward on the batch in the payload (`x`, then
    /// `y`); the gradient goes into the shared memory, the buffers with it
    /// when `state` (rank 0).
    Step {
        /// The inputs.
        x: Meta,
        /// The targets.
        y: Meta,
        /// Rows of the batch.
        samples: u64,
        /// Whether the buffers ride with the gradient.
        state: bool,
    },
    /// A forward only (evaluation, or a training-mode forward).
    Forward {
        /// The inputs (the payload).
        x: Meta,
        /// Training mode.
        train: bool,
    },
    /// Save the trained module (TorchScript) into the scratch folder.
    Save,
}

/// The child's answer to a load or a call.
#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Reply {
    /// The module is loaded: its tensors, in `state_dict()` order.
    Loaded {
        /// Trainable parameters.
        trainable: Vec<Meta>,
        /// Buffers (running statistics).
        buffers: Vec<Meta>,
        /// Parameters that do not train.
        frozen: Vec<Meta>,
        /// Names that share a tensor with another (`alias`, `of`).
        aliases: Vec<(String, String)>,
    },
    /// The shared memory is mapped; the parameters are views of it.
    Mapped,
    /// The loss's bits: JSON has no NaN, and a diverged loss must arrive
    /// as one (the replica names it).
    Stepped {
        /// `f64::to_bits` of the summed loss.
        loss_bits: u64,
    },
    /// The forward's output (the payload).
    Output {
        /// Its shape and dtype.
        out: Meta,
    },
    /// The module is saved (TorchScript, in the scratch folder).
    Saved {
        /// Its size.
        bytes: u64,
    },
    /// The call failed (a libtorch error or panic): the child goes on.
    Failed {
        /// Why.
        reason: String,
    },
}

/// The tch kind of PyTorch's dtype name.
pub fn kind_of(dtype: &str) -> Option<Kind> {
    [
        Kind::Float,
        Kind::Double,
        Kind::Half,
        Kind::BFloat16,
        Kind::Int64,
        Kind::Int,
        Kind::Int16,
        Kind::Int8,
        Kind::Uint8,
        Kind::Bool,
    ]
    .into_iter()
    .find(|k| dtype_name(*k) == dtype)
}

/// The header entry of tensor `t`, named `name`.
pub fn meta(name: &str, t: &Tensor) -> Meta {
    Meta {
        name: name.to_owned(),
        shape: t.size(),
        dtype: dtype_name(t.kind()).to_owned(),
    }
}

/// Elements and bytes of `m`, checked (a header is untrusted).
pub fn size_of(m: &Meta) -> Result<(usize, usize, Kind), String> {
    let kind = kind_of(&m.dtype).ok_or_else(|| format!("unknown dtype {:?}", m.dtype))?;
    if m.shape.len() > 16 || m.name.len() > 4096 {
        return Err(format!("tensor {:?} has an unreadable shape", m.name));
    }
    let mut n: usize = 1;
    for &d in &m.shape {
        let d = usize::try_from(d).map_err(|_| format!("negative size in {:?}", m.shape))?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| format!("tensor {:?} is too large", m.name))?;
    }
    let bytes = n
        .checked_mul(kind.elt_size_in_bytes())
        .ok_or_else(|| format!("tensor {:?} is too large", m.name))?;
    Ok((n, bytes, kind))
}

/// A tensor's bytes, raw, for a payload.
pub fn tensor_bytes(t: &Tensor) -> Vec<u8> {
    let t = t.to_device(tch::Device::Cpu).contiguous();
    let n = t.numel() * t.kind().elt_size_in_bytes();
    let mut out = vec![0u8; n];
    t.copy_data_u8(&mut out, t.numel());
    out
}

/// The tensor `m` describes, from its payload bytes (checked).
pub fn tensor_of(m: &Meta, bytes: &[u8]) -> Result<Tensor, String> {
    let (_, n, kind) = size_of(m)?;
    if n != bytes.len() {
        return Err("a tensor of the wrong length".into());
    }
    Tensor::f_from_data_size(bytes, &m.shape, kind).map_err(|e| e.to_string())
}

/// Writes one frame: the header, then the payload parts in order.
pub fn write_frame<H: Serialize>(
    w: &mut dyn Write,
    header: &H,
    payload: &[&[u8]],
) -> std::io::Result<()> {
    let h = serde_json::to_vec(header)?;
    let total: usize = payload.iter().map(|p| p.len()).sum();
    w.write_all(&(h.len() as u32).to_le_bytes())?;
    w.write_all(&h)?;
    w.write_all(&(total as u64).to_le_bytes())?;
    for p in payload {
        w.write_all(p)?;
    }
    w.flush()
}

/// Reads one frame, refusing a header over [`MAX_HEADER`] or a payload
/// over `max_payload` before reading it.
pub fn read_frame<H: for<'de> Deserialize<'de>>(
    r: &mut dyn Read,
    max_payload: usize,
) -> std::io::Result<(H, Vec<u8>)> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_HEADER {
        return Err(std::io::Error::other("header too large"));
    }
    let mut h = vec![0u8; n];
    r.read_exact(&mut h)?;
    let mut plen = [0u8; 8];
    r.read_exact(&mut plen)?;
    let p = u64::from_le_bytes(plen);
    if p > max_payload as u64 {
        return Err(std::io::Error::other(format!(
            "payload of {p} bytes, more than the {max_payload} allowed"
        )));
    }
    let mut payload = vec![0u8; p as usize];
    r.read_exact(&mut payload)?;
    Ok((serde_json::from_slice(&h)?, payload))
}
