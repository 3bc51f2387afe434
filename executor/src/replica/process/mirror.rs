//! The executor's copy of a module's tensors, made from the child's
//! description of them, which is untrusted: the count of tensors is
//! bounded, each size is checked ([`super::frames`]), trainable tensors
//! must be float32 (the replica binds them to its flat vector), and the
//! frozen values must fill their payload exactly.

use tch::{Kind, Tensor};
use trainyard_confined::protocol::frames::{size_of, Meta};
use trainyard_confined::tensors::ModelTensors;

/// Tensors a model may have (names, and so the header, stay bounded).
const MAX_TENSORS: usize = 100_000;

/// What is wrong with the child's description of its tensors.
#[derive(Debug, thiserror::Error)]
pub(super) enum MirrorError {
    /// More than [`MAX_TENSORS`].
    #[error("too many tensors")]
    TooMany,
    /// A tensor's dtype, shape or name is unreadable.
    #[error("{0}")]
    Described(String),
    /// A trainable tensor that is not float32.
    #[error("parameter {0:?} is not float32")]
    NotFloat(String),
    /// libtorch refused a tensor of that shape.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    /// The frozen values end before their tensors do.
    #[error("frozen values cut short")]
    CutShort,
    /// Frozen bytes left over.
    #[error("frozen values of the wrong length")]
    WrongLength,
}

/// The executor's copy of the module's tensors, from the child's
/// (untrusted) description: checked, bounded, frozen values from `bytes`.
pub(super) fn mirror(
    trainable: &[Meta],
    buffers: &[Meta],
    frozen: &[Meta],
    aliases: Vec<(String, String)>,
    bytes: &[u8],
) -> Result<ModelTensors, MirrorError> {
    if trainable.len() + buffers.len() + frozen.len() + aliases.len() > MAX_TENSORS {
        return Err(MirrorError::TooMany);
    }
    let cpu = tch::Device::Cpu;
    let mut out = ModelTensors {
        trainable: Vec::new(),
        buffers: Vec::new(),
        frozen: Vec::new(),
        aliases,
    };
    for m in trainable {
        let (_, _, kind) = size_of(m).map_err(MirrorError::Described)?;
        if kind != Kind::Float {
            return Err(MirrorError::NotFloat(m.name.clone()));
        }
        // Bound to the shared flat vector by the replica: never touched.
        out.trainable
            .push((m.name.clone(), Tensor::f_empty(&m.shape, (kind, cpu))?));
    }
    for m in buffers {
        let (_, _, kind) = size_of(m).map_err(MirrorError::Described)?;
        out.buffers
            .push((m.name.clone(), Tensor::f_zeros(&m.shape, (kind, cpu))?));
    }
    let mut at = 0usize;
    for m in frozen {
        let (_, n, kind) = size_of(m).map_err(MirrorError::Described)?;
        let end = at
            .checked_add(n)
            .filter(|e| *e <= bytes.len())
            .ok_or(MirrorError::CutShort)?;
        let t = Tensor::f_from_data_size(&bytes[at..end], &m.shape, kind)?;
        out.frozen.push((m.name.clone(), t));
        at = end;
    }
    if at != bytes.len() {
        return Err(MirrorError::WrongLength);
    }
    Ok(out)
}
