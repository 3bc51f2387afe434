//! Apache Parquet: the footer (row groups are the units, the schema is
//! checked against the dataset's columns) and the rows of one row group,
//! read from a local file. Only the named columns are read; nulls or
//! other types are refused with the column's name.

use super::{le_u32, unreadable, Columns, MAX_HEADER_BYTES};
use crate::data::samples::DataError;
use crate::storage::Fetcher;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type, UInt8Type};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use tch::{Kind, Tensor};

/// Rows per row group, values per sample, bytes of a Parquet file, from
/// its footer; the columns are checked against its schema.
pub(crate) fn parquet_meta(
    url: &str,
    fetcher: &Fetcher,
    columns: &Columns,
) -> Result<(Vec<u64>, Option<u64>, u64), DataError> {
    let bad = |why: String| unreadable(url, format!("not a readable Parquet file: {why}"));
    let (mut tail, size) = fetcher
        .read_tail(url, 64 << 10)
        .map_err(|e| unreadable(url, e))?;
    if tail.len() < 12 || tail[tail.len() - 4..] != *b"PAR1" {
        return Err(bad("no PAR1 footer".into()));
    }
    let footer = le_u32(&tail, tail.len() - 8).unwrap_or(0);
    if footer > MAX_HEADER_BYTES || footer + 8 > size {
        return Err(bad("footer out of bounds".into()));
    }
    if footer + 8 > tail.len() as u64 {
        tail = fetcher
            .read_tail(url, footer + 8)
            .map_err(|e| unreadable(url, e))?
            .0;
    }
    let end = tail.len() - 8;
    let meta = parquet::file::metadata::ParquetMetaDataReader::decode_metadata(
        &tail[end - footer as usize..end],
    )
    .map_err(|e| bad(e.to_string()))?;
    let schema = parquet::arrow::parquet_to_arrow_schema(
        meta.file_metadata().schema_descr(),
        meta.file_metadata().key_value_metadata(),
    )
    .map_err(|e| bad(e.to_string()))?;
    let features = parquet_columns(url, &schema, columns)?.features;
    codecs_supported(url, &meta, columns)?;
    let units = meta
        .row_groups()
        .iter()
        .map(|g| g.num_rows().max(0) as u64)
        .collect();
    Ok((units, Some(features.max(1)), size))
}

/// Refuses a column chunk of the dataset's columns compressed with a codec
/// this reader lacks (LZO, or one a newer format version adds), naming
/// the column, the row group and the codec.
fn codecs_supported(
    url: &str,
    meta: &parquet::file::metadata::ParquetMetaData,
    columns: &Columns,
) -> Result<(), DataError> {
    use parquet::basic::Compression as C;
    let wanted = |path: &str| {
        let root = path.split('.').next().unwrap_or(path);
        columns.x.iter().any(|c| c == root)
            || columns.y == root
            || columns.id.as_deref() == Some(root)
    };
    for (g, group) in meta.row_groups().iter().enumerate() {
        for chunk in group.columns() {
            let path = chunk.column_path().string();
            match chunk.compression() {
                C::UNCOMPRESSED | C::SNAPPY | C::GZIP(_) | C::ZSTD(_) | C::LZ4 | C::LZ4_RAW | C::BROTLI(_) => {}
                other if wanted(&path) => {
                    return Err(unreadable(
                        url,
                        format!(
                            "column {path:?} of row group {g} is compressed with {other}; this reader takes uncompressed, snappy, gzip, zstd, lz4, lz4_raw and brotli pages (rewrite the file with one of them)"
                        ),
                    ))
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Where the columns are in a Parquet schema.
pub(crate) struct ParquetColumns {
    pub(crate) x: Vec<usize>,
    pub(crate) y: usize,
    pub(crate) id: Option<usize>,
    /// Values per sample (a variable-length list counts 0: known per row
    /// group only).
    pub(crate) features: u64,
}

/// Whether a column type holds numbers (or booleans) a tensor can take,
/// directly or through its dictionary.
fn numeric(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(_, v) => numeric(v),
        t => t.is_integer() || t.is_floating() || *t == DataType::Boolean,
    }
}

/// The element type of a list column, if it is one.
fn list_item(t: &DataType) -> Option<(&DataType, Option<i32>)> {
    match t {
        DataType::FixedSizeList(f, n) => Some((f.data_type(), Some(*n))),
        DataType::List(f) | DataType::LargeList(f) => Some((f.data_type(), None)),
        _ => None,
    }
}

pub(crate) fn parquet_columns(
    url: &str,
    schema: &arrow_schema::Schema,
    c: &Columns,
) -> Result<ParquetColumns, DataError> {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let find = |name: &str, what: &str| {
        schema.index_of(name).map_err(|_| {
            DataError::Shape(format!(
                "{url} has no {what} column {name:?} (its columns: {})",
                names.join(", ")
            ))
        })
    };
    let mut x = Vec::new();
    let mut features = 0u64;
    for name in &c.x {
        let i = find(name, "feature")?;
        let t = schema.field(i).data_type();
        match (t, list_item(t)) {
            (t, _) if numeric(t) => features += 1,
            (_, Some((inner, n))) if numeric(inner) && (c.x.len() == 1 || c.stacked) => {
                features += n.map_or(0, |n| n.max(0) as u64)
            }
            (other, _) => {
                return Err(DataError::Shape(format!(
                    "{url}: feature column {name:?} is {other}; it must hold numbers or booleans, or be the only feature column and a list of them (fixed-size, or of one length in every row)"
                )))
            }
        }
        x.push(i);
    }
    let y = find(&c.y, "label")?;
    if !numeric(schema.field(y).data_type()) {
        return Err(DataError::Shape(format!(
            "{url}: label column {:?} is {}; it must be numeric",
            c.y,
            schema.field(y).data_type()
        )));
    }
    let id = match &c.id {
        Some(name) => {
            let i = find(name, "id")?;
            if !schema.field(i).data_type().is_integer() {
                return Err(DataError::Shape(format!(
                    "{url}: id column {name:?} is {}; it must be integers",
                    schema.field(i).data_type()
                )));
            }
            Some(i)
        }
        None => None,
    };
    Ok(ParquetColumns { x, y, id, features })
}

/// The tensor dtype of a unit's features: booleans stay booleans, uint8
/// (pixels) stays uint8, other integers become int64, anything with a
/// floating-point column float32. The batch or the model's check converts
/// further ([`crate::data::samples`]).
fn feature_kind(types: &[&DataType]) -> Kind {
    let base = |t: &DataType| -> DataType {
        let t = list_item(t).map_or(t, |(i, _)| i);
        match t {
            DataType::Dictionary(_, v) => (**v).clone(),
            t => t.clone(),
        }
    };
    let ts: Vec<DataType> = types.iter().map(|t| base(t)).collect();
    if ts.iter().all(|t| *t == DataType::Boolean) {
        Kind::Bool
    } else if ts.iter().all(|t| *t == DataType::UInt8) {
        Kind::Uint8
    } else if ts.iter().all(|t| t.is_integer() || *t == DataType::Boolean) {
        Kind::Int64
    } else {
        Kind::Float
    }
}

/// A unit's column refused: its name, the row group and why.
fn refuse(url: &str, name: &str, group: usize, why: impl std::fmt::Display) -> DataError {
    unreadable(url, format!("column {name:?}, row group {group}: {why}"))
}

/// The values of a numeric (or boolean, or dictionary) array as `kind`,
/// flat.
fn values(
    a: &ArrayRef,
    kind: Kind,
    url: &str,
    name: &str,
    group: usize,
) -> Result<Tensor, DataError> {
    if a.null_count() > 0 {
        let row = (0..a.len()).find(|&i| a.is_null(i)).unwrap_or(0);
        return Err(refuse(
            url,
            name,
            group,
            format!("row {row} is null; a sample needs every value (fill or drop the nulls)"),
        ));
    }
    let cast = |to: &DataType| {
        arrow_cast::cast(a.as_ref(), to).map_err(|e| {
            refuse(
                url,
                name,
                group,
                format!("{} cannot become {to}: {e}", a.data_type()),
            )
        })
    };
    Ok(match kind {
        Kind::Bool => {
            let b = cast(&DataType::Boolean)?;
            let v: Vec<bool> = b.as_boolean().iter().map(|v| v.unwrap_or(false)).collect();
            Tensor::from_slice(&v)
        }
        Kind::Uint8 => {
            Tensor::from_slice(cast(&DataType::UInt8)?.as_primitive::<UInt8Type>().values())
        }
        Kind::Int64 => {
            Tensor::from_slice(cast(&DataType::Int64)?.as_primitive::<Int64Type>().values())
        }
        _ => Tensor::from_slice(
            cast(&DataType::Float32)?
                .as_primitive::<Float32Type>()
                .values(),
        ),
    })
}

/// A feature column of `rows` rows as `[rows, width]`.
fn feature(
    a: &ArrayRef,
    kind: Kind,
    url: &str,
    name: &str,
    group: usize,
) -> Result<Tensor, DataError> {
    let rows = a.len() as i64;
    let list = |nulls: usize, lens: &mut dyn Iterator<Item = usize>, inner: ArrayRef| {
        if nulls > 0 {
            let row = (0..a.len()).find(|&i| a.is_null(i)).unwrap_or(0);
            return Err(refuse(
                url,
                name,
                group,
                format!("row {row} is null instead of a list"),
            ));
        }
        let mut width = None;
        for (row, n) in lens.enumerate() {
            match width {
                None => width = Some(n),
                Some(w) if w != n => {
                    return Err(refuse(
                        url,
                        name,
                        group,
                        format!("row {row} holds {n} values, the rows before it {w}; every sample needs the same number"),
                    ))
                }
                Some(_) => {}
            }
        }
        let v = values(&inner, kind, url, name, group)?;
        Ok(v.reshape([rows, width.unwrap_or(0) as i64]))
    };
    if let Some(l) = a.as_fixed_size_list_opt() {
        let w = l.value_length() as usize;
        let inner = l.values().slice(l.offset() * w, l.len() * w);
        list(l.null_count(), &mut std::iter::repeat_n(w, l.len()), inner)
    } else if let Some(l) = a.as_list_opt::<i32>() {
        let (lens, inner) = lengths(l);
        list(l.null_count(), &mut lens.into_iter(), inner)
    } else if let Some(l) = a.as_list_opt::<i64>() {
        let (lens, inner) = lengths(l);
        list(l.null_count(), &mut lens.into_iter(), inner)
    } else {
        Ok(values(a, kind, url, name, group)?.reshape([rows, 1]))
    }
}

/// Each row's length of a variable list, and the values its rows span.
fn lengths<O: arrow_array::OffsetSizeTrait>(
    l: &arrow_array::GenericListArray<O>,
) -> (Vec<usize>, ArrayRef) {
    let o = l.value_offsets();
    let at = |i: usize| o[i].as_usize();
    let lens = (0..l.len()).map(|i| at(i + 1) - at(i)).collect();
    (lens, l.values().slice(at(0), at(l.len()) - at(0)))
}

/// Reads row group `u` of a local Parquet file: features `[rows,
/// features]` (dtype by [`feature_kind`]), labels (int64 from integer
/// columns, float32 from floating ones), ids.
pub(crate) fn read_parquet_unit(
    path: &std::path::Path,
    url: &str,
    u: usize,
    columns: &Columns,
) -> Result<(Tensor, Tensor, Option<Vec<i64>>), DataError> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ProjectionMask;
    let file = std::fs::File::open(path).map_err(|e| unreadable(url, e))?;
    let b = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| unreadable(url, e))?;
    let cols = parquet_columns(url, b.schema(), columns)?;
    let schema = b.schema().clone();
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
        .map_err(|e| unreadable(url, format!("row group {u}: {e}")))?;
    let types: Vec<&DataType> = cols
        .x
        .iter()
        .map(|&i| schema.field(i).data_type())
        .collect();
    let kind = feature_kind(&types);
    let y_kind = if schema.field(cols.y).data_type().is_floating() {
        Kind::Float
    } else {
        Kind::Int64
    };
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    let mut all_ids: Option<Vec<i64>> = cols.id.map(|_| Vec::with_capacity(rows));
    // After projection the columns keep their schema order.
    let mut sorted = roots.clone();
    sorted.sort_unstable();
    for r in reader {
        let one = r.map_err(|e| unreadable(url, format!("row group {u}: {e}")))?;
        let col = |root: usize| -> ArrayRef {
            one.column(sorted.iter().position(|&r| r == root).expect("projected"))
                .clone()
        };
        let mut parts = Vec::with_capacity(cols.x.len());
        for (i, &root) in cols.x.iter().enumerate() {
            parts.push(feature(&col(root), kind, url, &columns.x[i], u)?);
        }
        xs.push(if columns.stacked {
            super::stack_inputs(url, &columns.x, parts)?
        } else if parts.len() == 1 {
            parts.pop().expect("one")
        } else {
            Tensor::cat(&parts, 1)
        });
        ys.push(values(&col(cols.y), y_kind, url, &columns.y, u)?);
        if let (Some(root), Some(name), Some(v)) = (cols.id, &columns.id, all_ids.as_mut()) {
            let t = values(&col(root), Kind::Int64, url, name, u)?;
            v.extend(Vec::<i64>::try_from(&t).map_err(|e| unreadable(url, e))?);
        }
    }
    if xs.is_empty() {
        return Ok((
            Tensor::zeros([0, cols.features.max(1) as i64], (kind, tch::Device::Cpu)),
            Tensor::zeros([0], (y_kind, tch::Device::Cpu)),
            all_ids,
        ));
    }
    let x = Tensor::cat(&xs, 0);
    if x.size()[1] == 0 {
        return Err(refuse(url, &columns.x[0], u, "its lists are empty"));
    }
    Ok((x, Tensor::cat(&ys, 0), all_ids))
}
