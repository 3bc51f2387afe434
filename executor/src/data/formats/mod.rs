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
}

impl Columns {
    pub(crate) fn of(f: &FileData) -> Columns {
        Columns {
            x: f.x_columns.clone().unwrap_or_else(|| vec!["x".into()]),
            y: f.y_column.clone().unwrap_or_else(|| "y".into()),
            id: f.id_column.clone(),
        }
    }
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
