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

/// The executor's copy of the module's tensors, from the child's
/// (untrusted) description: checked, bounded, frozen values from `bytes`.
pub(super) fn mirror(
    trainable: &[Meta],
    buffers: &[Meta],
    frozen: &[Meta],
    aliases: Vec<(String, String)>,
    bytes: &[u8],
) -> Result<ModelTensors, String> {
    if trainable.len() + buffers.len() + frozen.len() + aliases.len() > MAX_TENSORS {
        return Err("too many tensors".into());
    }
    let cpu = tch::Device::Cpu;
    let mut out = ModelTensors {
        trainable: Vec::new(),
        buffers: Vec::new(),
        frozen: Vec::new(),
        aliases,
    };
    for m in trainable {
        let (_, _, kind) = size_of(m)?;
        if kind != Kind::Float {
            return Err(format!("parameter {:?} is not float32", m.name));
        }
        // Bound to the shared flat vector by the replica: never touched.
        out.trainable.push((
            m.name.clone(),
            Tensor::f_empty(&m.shape, (kind, cpu)).map_err(|e| e.to_string())?,
        ));
    }
    for m in buffers {
        let (_, _, kind) = size_of(m)?;
        out.buffers.push((
            m.name.clone(),
            Tensor::f_zeros(&m.shape, (kind, cpu)).map_err(|e| e.to_string())?,
        ));
    }
    let mut at = 0usize;
    for m in frozen {
        let (_, n, kind) = size_of(m)?;
        let end = at
            .checked_add(n)
            .filter(|e| *e <= bytes.len())
            .ok_or("frozen values cut short")?;
        let t =
            Tensor::f_from_data_size(&bytes[at..end], &m.shape, kind).map_err(|e| e.to_string())?;
        out.frozen.push((m.name.clone(), t));
        at = end;
    }
    if at != bytes.len() {
        return Err("frozen values of the wrong length".into());
    }
    Ok(out)
}
