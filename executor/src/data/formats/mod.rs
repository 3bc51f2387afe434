//! Dataset file formats: what a shard's metadata says, read with range
//! requests alone (its units, values per sample and bytes), and how one
//! unit decodes into tensors. One file per format: [`npz`] (npz and
//! safetensors, the files NumPy and safetensors write), [`parquet`],
//! [`images`] (one JPEG or PNG, for image folders) and [`webdataset`]
//! (tar shards of images and classes). The
//! dataset's column names ([`Columns`]) say which arrays or columns to
//! look at; each format checks them against its own schema, for the
//! listing and for the reader alike, so both refuse a column the same way.

pub mod images;
pub mod npz;
pub mod parquet;
pub mod webdataset;

use super::samples::DataError;

use trainyard_common::spec::FileData;

/// Largest file header (safetensors JSON, Parquet footer) read.
pub(crate) const MAX_HEADER_BYTES: u64 = 64 << 20;

/// The column names of a dataset.
#[derive(Debug, Clone)]
pub struct Columns {
    /// Features.
    pub x: Vec<String>,
    /// Label.
    pub y: String,
    /// Sample ids, if the shards carry them.
    pub id: Option<String>,
    /// `x` names several inputs (`dataset.inputs`), stacked along
    /// dimension 1 (`stack_inputs`), rather than one input's columns.
    pub stacked: bool,
}

impl Columns {
    pub(crate) fn of(f: &FileData) -> Columns {
        Columns {
            x: f.inputs
                .clone()
                .or_else(|| f.x_columns.clone())
                .unwrap_or_else(|| vec!["x".into()]),
            y: f.y_column.clone().unwrap_or_else(|| "y".into()),
            id: f.id_column.clone(),
            stacked: f.inputs.is_some(),
        }
    }
}

/// A multi-input model's inputs of one unit, `[n, inputs, …]`: each of
/// the same shape, all as float32 when one is floating-point, else as
/// booleans when all are, else as int64 (see
/// [`trainyard_confined::torchscript::Module::forward_packed`], which hands them
/// to the forward one by one).
pub(crate) fn stack_inputs(
    url: &str,
    names: &[String],
    parts: Vec<tch::Tensor>,
) -> Result<tch::Tensor, DataError> {
    use tch::Kind;
    let shape = parts.first().map(tch::Tensor::size).unwrap_or_default();
    for (p, name) in parts.iter().zip(names).skip(1) {
        if p.size() != shape {
            return Err(DataError::Shape(format!(
                "{url}: input {name:?} has shape {:?}, input {:?} {shape:?}; the inputs of a sample need one shape",
                p.size(),
                names[0]
            )));
        }
    }
    let kind = if parts.iter().any(tch::Tensor::is_floating_point) {
        Kind::Float
    } else if parts.iter().all(|p| p.kind() == Kind::Bool) {
        Kind::Bool
    } else {
        Kind::Int64
    };
    let parts: Vec<tch::Tensor> = parts.iter().map(|p| p.to_kind(kind)).collect();
    Ok(tch::Tensor::stack(&parts, 1))
}

/// A shard that cannot be read, and why.
pub(crate) fn unreadable(url: &str, reason: impl ToString) -> DataError {
    DataError::Unreadable {
        url: url.to_owned(),
        reason: reason.to_string(),
    }
}

pub(crate) fn le_u16(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from(u16::from_le_bytes(
        b.get(at..at + 2)?.try_into().ok()?,
    )))
}

pub(crate) fn le_u32(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from(u32::from_le_bytes(
        b.get(at..at + 4)?.try_into().ok()?,
    )))
}

pub(crate) fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
pub(crate) mod tests;
