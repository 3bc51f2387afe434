//! The rows of one Parquet row group, read from a local file: the feature
//! columns (numbers, or one fixed-size list of them) as f32 `[rows,
//! features]`, the label column, the id column; only those columns are
//! read, and nulls or other types are refused with the column's name.

use super::meta::{parquet_columns, unreadable, Columns};
use crate::replica::samples::DataError;
use tch::{Kind, Tensor};

/// Reads row group `u` of a local Parquet file: features as f32
/// `[rows, features]`, labels, ids.
pub(super) fn read_parquet_unit(
    path: &std::path::Path,
    url: &str,
    u: usize,
    columns: &Columns,
) -> Result<(Tensor, Tensor, Option<Vec<i64>>), DataError> {
    use arrow_array::cast::AsArray;
    use arrow_array::{Array, ArrayRef};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ProjectionMask;
    let file = std::fs::File::open(path).map_err(|e| unreadable(url, e))?;
    let b = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| unreadable(url, e))?;
    let cols = parquet_columns(url, b.schema(), columns)?;
    let mut roots: Vec<usize> = cols.x.clone();
    roots.push(cols.y);
    roots.extend(cols.id);
    let mask = ProjectionMask::roots(b.parquet_schema(), roots.iter().copied());
    let rows = b
        .metadata()
        .row_groups()
        .get(u)
        .map_or(0, |g| g.num_rows().max(0) as usize);
    let reader = b
        .with_row_groups(vec![u])
        .with_projection(mask)
        .with_batch_size(rows.max(1))
        .build()
        .map_err(|e| unreadable(url, e))?;
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    let mut all_ids: Option<Vec<i64>> = cols.id.map(|_| Vec::with_capacity(rows));
    // After projection the columns keep their schema order.
    let mut sorted = roots.clone();
    sorted.sort_unstable();
    for r in reader {
        let one = r.map_err(|e| unreadable(url, e))?;
        let col = |root: usize| -> ArrayRef {
            one.column(sorted.iter().position(|&r| r == root).expect("projected"))
                .clone()
        };
        let n = one.num_rows() as i64;
        let x = if cols.x.len() == 1 {
            let a = col(cols.x[0]);
            let name = &columns.x[0];
            if let Some(list) = a.as_fixed_size_list_opt() {
                if list.null_count() > 0 {
                    return Err(DataError::Shape(format!(
                        "{url}: column {name:?} has nulls"
                    )));
                }
                let width = list.value_length() as usize;
                let values = list
                    .values()
                    .slice(list.offset() * width, list.len() * width);
                Tensor::from_slice(&floats(url, values.as_ref(), name)?).reshape([n, width as i64])
            } else {
                Tensor::from_slice(&floats(url, a.as_ref(), name)?).reshape([n, 1])
            }
        } else {
            let mut parts = Vec::with_capacity(cols.x.len());
            for (i, &root) in cols.x.iter().enumerate() {
                parts.push(Tensor::from_slice(&floats(
                    url,
                    col(root).as_ref(),
                    &columns.x[i],
                )?));
            }
            Tensor::stack(&parts, 1)
        };
        let ya = col(cols.y);
        let y = if ya.data_type().is_integer() {
            Tensor::from_slice(&ints(url, ya.as_ref(), &columns.y)?)
        } else {
            Tensor::from_slice(&floats(url, ya.as_ref(), &columns.y)?)
        };
        if let (Some(root), Some(name), Some(v)) = (cols.id, &columns.id, all_ids.as_mut()) {
            v.extend(ints(url, col(root).as_ref(), name)?);
        }
        xs.push(x);
        ys.push(y);
    }
    if xs.is_empty() {
        return Ok((
            Tensor::zeros([0, cols.features as i64], (Kind::Float, tch::Device::Cpu)),
            Tensor::zeros([0], (Kind::Int64, tch::Device::Cpu)),
            all_ids,
        ));
    }
    Ok((Tensor::cat(&xs, 0), Tensor::cat(&ys, 0), all_ids))
}

/// A numeric Arrow array's values as f32.
fn floats(url: &str, a: &dyn arrow_array::Array, name: &str) -> Result<Vec<f32>, DataError> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    if a.null_count() > 0 {
        return Err(DataError::Shape(format!(
            "{url}: column {name:?} has nulls"
        )));
    }
    macro_rules! conv {
        ($($t:ty),*) => {
            $(if let Some(p) = a.as_primitive_opt::<$t>() {
                return Ok(p.values().iter().map(|&v| v as f32).collect());
            })*
        };
    }
    conv!(
        Float32Type,
        Float64Type,
        Int8Type,
        Int16Type,
        Int32Type,
        Int64Type,
        UInt8Type,
        UInt16Type,
        UInt32Type,
        UInt64Type
    );
    Err(DataError::Shape(format!(
        "{url}: column {name:?} is {}, not numeric",
        a.data_type()
    )))
}

/// An integer Arrow array's values as i64.
fn ints(url: &str, a: &dyn arrow_array::Array, name: &str) -> Result<Vec<i64>, DataError> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    if a.null_count() > 0 {
        return Err(DataError::Shape(format!(
            "{url}: column {name:?} has nulls"
        )));
    }
    macro_rules! conv {
        ($($t:ty),*) => {
            $(if let Some(p) = a.as_primitive_opt::<$t>() {
                return Ok(p.values().iter().map(|&v| v as i64).collect());
            })*
        };
    }
    conv!(Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type);
    Err(DataError::Shape(format!(
        "{url}: column {name:?} is {}, not integers",
        a.data_type()
    )))
}
