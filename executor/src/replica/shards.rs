//! Sharded datasets: many objects (a `*` glob or a `.json` manifest; npz,
//! safetensors or Parquet), streamed through the executor's cache tier
//! within a memory budget, each worker reading only the shards its share of
//! the epoch needs.
//!
//! **Listing.** [`ShardSet::open`] lists the shards (sorted by URL, so
//! every worker sees the same list) and learns each one's sample count and
//! units — Parquet row groups, or the whole file for npz and safetensors —
//! from its metadata alone: a Parquet footer, the zip directory and `.npy`
//! headers of an npz, the JSON header of a safetensors file, each read with
//! range requests. A manifest may give the counts of npz and safetensors
//! shards itself. Every shard URL goes through the job's data policy.
//!
//! **Order.** An epoch's *stream* is the training shards in a seeded order
//! of that epoch, each shard's samples in file order. The stream is cut
//! into `lanes` contiguous parts (the job's largest worker count), each
//! lane into shuffle windows of `shuffle_buffer` samples permuted by the
//! seed, and each lane into blocks of `batch_size`; the epoch's *order* is
//! the blocks taken round-robin over the lanes ([`Plan`]). The global data
//! cursor `(epoch, offset)` counts positions of that order, and a step
//! takes the next `world × batch` of them, rank `r` the `r`-th run, exactly
//! as for a dataset in memory ([`super::data::slice`]): every sample of an
//! epoch is used once whatever the membership does, and the cursor in every
//! checkpoint and state hand-over is the same two numbers. With the job at
//! its largest size, rank `r` reads lane `r` alone: its own contiguous
//! `1/world` of the shards. With fewer workers the ranks take blocks of
//! several lanes in turn (still each sample once, with more shards read per
//! worker). [`Plan::locate`] turns a position into (shard, row), which the
//! cursor's `(epoch, shard, offset)` view is.
//!
//! **Memory.** A worker holds at most a few decoded shuffle windows and
//! decoded units, bounded by the budget (`dataset.memory_mb`, else the
//! executor's `--data-memory-mb`); a budget too small for one window and
//! the largest unit is an error that says so. A background thread fetches
//! the shards of the next windows into the local cache tier while the
//! current ones train; a shard is fetched once per executor while the
//! cache keeps it.
//!
//! **Accounting.** Every sample has an id (the `id_column`, else its
//! position in the sorted shard list); a batch carries the wrapping sum of
//! [`id_mix`] over its ids, which the ring sums exactly per epoch: an
//! order-independent hash of what was consumed.

use super::data::{check, slice, Batch, Cursor, Data, DataError};
use super::rng::Rng;
use crate::storage::{Fetcher, Source};
use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender};
use std::sync::Arc;
use tch::{Kind, Tensor};
use trainyard_common::spec::{
    file_format_from_url, is_glob, is_manifest, FileData, FileFormat, JobSpecInput,
};

/// Samples of the shuffle buffer unless the spec says.
pub const DEFAULT_SHUFFLE_BUFFER: u64 = 8192;
/// Data memory budget of an executor unless its flag or the spec says.
pub const DEFAULT_MEMORY_MB: u64 = 256;
/// Most shards of one dataset.
pub const MAX_SHARDS: usize = 100_000;
/// Largest manifest read.
const MAX_MANIFEST_BYTES: u64 = 64 << 20;
/// Largest file header (safetensors JSON, Parquet footer) read.
const MAX_HEADER_BYTES: u64 = 64 << 20;
/// Batches the loader keeps ready ahead of the training loop.
pub const PREFETCH_BATCHES: usize = 4;
/// Shuffle windows ahead of the loader whose shards are fetched in the
/// background.
pub const PREFETCH_WINDOWS: u64 = 2;

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
    fn of(f: &FileData) -> Columns {
        Columns {
            x: f.x_columns.clone().unwrap_or_else(|| vec!["x".into()]),
            y: f.y_column.clone().unwrap_or_else(|| "y".into()),
            id: f.id_column.clone(),
        }
    }
}

/// One object of a dataset.
#[derive(Debug, Clone)]
pub struct Shard {
    /// Its URL.
    pub url: String,
    /// Its format.
    pub format: FileFormat,
    /// Rows of each unit (Parquet row groups; one unit otherwise).
    pub units: Vec<u64>,
    /// Samples (the sum of `units`).
    pub samples: u64,
    /// Its SHA-256, when a manifest gives one.
    pub sha256: Option<String>,
    /// Values per sample of `x`, when the metadata says.
    pub features: Option<u64>,
    /// Id of its first sample when the shards carry no ids.
    pub base: u64,
    /// Bytes of the object, when known.
    pub bytes: u64,
}

/// The shards one URL (glob, manifest or file) names, in URL order.
#[derive(Debug, Clone, Default)]
pub struct ShardSet {
    /// The shards.
    pub shards: Vec<Shard>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    shards: Vec<ManifestShard>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestShard {
    url: String,
    #[serde(default)]
    samples: Option<u64>,
    #[serde(default)]
    sha256: Option<String>,
}

fn unreadable(url: &str, reason: impl ToString) -> DataError {
    DataError::Unreadable {
        url: url.to_owned(),
        reason: reason.to_string(),
    }
}

impl ShardSet {
    /// Lists the shards `url` names and reads their metadata.
    pub fn open(
        url: &str,
        f: &FileData,
        fetcher: &Fetcher,
        columns: &Columns,
    ) -> Result<ShardSet, DataError> {
        let mut listed: Vec<(String, Option<u64>, Option<String>)> = Vec::new();
        if is_manifest(url) {
            let path = fetcher.materialize(url).map_err(|e| unreadable(url, e))?;
            let len = std::fs::metadata(&path).map_or(0, |m| m.len());
            if len > MAX_MANIFEST_BYTES {
                return Err(unreadable(url, "a manifest is at most 64 MiB"));
            }
            let text = std::fs::read(&path).map_err(|e| unreadable(url, e))?;
            let m: Manifest = serde_json::from_slice(&text).map_err(|e| {
                unreadable(
                    url,
                    format!("not a manifest ({{\"shards\": [{{\"url\", \"samples\", \"sha256\"}}]}}): {e}"),
                )
            })?;
            let folder = url.rsplit_once('/').map_or("", |(f, _)| f);
            for s in m.shards {
                let full = if s.url.contains("://") || s.url.starts_with("artifact:") {
                    s.url
                } else {
                    format!("{folder}/{}", s.url.trim_start_matches("./"))
                };
                listed.push((full, s.samples, s.sha256));
            }
        } else if is_glob(url) {
            for u in fetcher.list_glob(url).map_err(|e| unreadable(url, e))? {
                listed.push((u, None, None));
            }
            if listed.is_empty() {
                return Err(unreadable(url, "the glob matches no object"));
            }
        } else {
            listed.push((url.to_owned(), None, None));
        }
        if listed.is_empty() {
            return Err(unreadable(url, "the manifest lists no shard"));
        }
        if listed.len() > MAX_SHARDS {
            return Err(unreadable(
                url,
                format!("{} shards: at most {MAX_SHARDS}", listed.len()),
            ));
        }
        let mut shards = Vec::with_capacity(listed.len());
        let mut base = 0u64;
        for (u, samples, sha256) in listed {
            let format = f
                .format
                .or_else(|| file_format_from_url(&u))
                .ok_or_else(|| {
                    unreadable(
                        &u,
                        "cannot tell the shard's format from its extension; give dataset.format",
                    )
                })?;
            let (units, features, bytes) = match (format, samples) {
                (FileFormat::Text, _) => {
                    return Err(unreadable(
                        &u,
                        "text cannot be sharded: use npz, safetensors or parquet",
                    ))
                }
                (FileFormat::Parquet, _) => parquet_meta(&u, fetcher, columns)?,
                (_, Some(n)) => (vec![n], None, 0),
                (FileFormat::Npz, None) => npz_meta(&u, fetcher, columns)?,
                (FileFormat::Safetensors, None) => safetensors_meta(&u, fetcher, columns)?,
            };
            let n: u64 = units.iter().sum();
            shards.push(Shard {
                url: u,
                format,
                units,
                samples: n,
                sha256,
                features,
                base,
                bytes,
            });
            base += n;
        }
        Ok(ShardSet { shards })
    }

    /// Samples of every shard.
    pub fn samples(&self) -> u64 {
        self.shards.iter().map(|s| s.samples).sum()
    }
}

// ---------------------------------------------------------------- metadata

fn le_u16(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from(u16::from_le_bytes(
        b.get(at..at + 2)?.try_into().ok()?,
    )))
}

fn le_u32(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from(u32::from_le_bytes(
        b.get(at..at + 4)?.try_into().ok()?,
    )))
}

fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Rows per unit, values per sample, bytes: of an npz, from its zip
/// directory and the `.npy` headers of `x` and `y`.
fn npz_meta(
    url: &str,
    fetcher: &Fetcher,
    columns: &Columns,
) -> Result<(Vec<u64>, Option<u64>, u64), DataError> {
    let bad = |why: &str| unreadable(url, format!("not a readable npz: {why}"));
    let tail_len = 65_557 + 20;
    let (tail, size) = fetcher
        .read_tail(url, tail_len)
        .map_err(|e| unreadable(url, e))?;
    let eocd = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&i| tail[i..i + 4] == *b"PK\x05\x06")
        .ok_or_else(|| bad("no zip directory"))?;
    let mut cd_size = le_u32(&tail, eocd + 12).ok_or_else(|| bad("short"))?;
    let mut cd_off = le_u32(&tail, eocd + 16).ok_or_else(|| bad("short"))?;
    if cd_off == 0xFFFF_FFFF || cd_size == 0xFFFF_FFFF {
        // Zip64: the locator sits just before the end record.
        let loc = eocd
            .checked_sub(20)
            .ok_or_else(|| bad("zip64 without a locator"))?;
        if tail[loc..loc + 4] != *b"PK\x06\x07" {
            return Err(bad("zip64 without a locator"));
        }
        let rec = le_u64(&tail, loc + 8).ok_or_else(|| bad("short"))?;
        let r = fetcher
            .read_range(url, rec..rec + 56)
            .map_err(|e| unreadable(url, e))?;
        if r.len() < 56 || r[..4] != *b"PK\x06\x06" {
            return Err(bad("broken zip64 record"));
        }
        cd_size = le_u64(&r, 40).ok_or_else(|| bad("short"))?;
        cd_off = le_u64(&r, 48).ok_or_else(|| bad("short"))?;
    }
    if cd_size > MAX_HEADER_BYTES || cd_off + cd_size > size {
        return Err(bad("zip directory out of bounds"));
    }
    let cd = fetcher
        .read_range(url, cd_off..cd_off + cd_size)
        .map_err(|e| unreadable(url, e))?;
    // name → (method, local header offset)
    let mut entries: HashMap<String, (u64, u64)> = HashMap::new();
    let mut at = 0usize;
    while at + 46 <= cd.len() && cd[at..at + 4] == *b"PK\x01\x02" {
        let method = le_u16(&cd, at + 10).unwrap_or(0);
        let name_len = le_u16(&cd, at + 28).unwrap_or(0) as usize;
        let extra_len = le_u16(&cd, at + 30).unwrap_or(0) as usize;
        let comment_len = le_u16(&cd, at + 32).unwrap_or(0) as usize;
        let (usize32, csize32) = (le_u32(&cd, at + 24), le_u32(&cd, at + 20));
        let mut local = le_u32(&cd, at + 42).unwrap_or(0);
        let name = String::from_utf8_lossy(cd.get(at + 46..at + 46 + name_len).unwrap_or(&[]))
            .into_owned();
        if local == 0xFFFF_FFFF {
            // The zip64 extra field lists, in order, the sizes and offset
            // that did not fit their 32-bit fields.
            let extra = cd
                .get(at + 46 + name_len..at + 46 + name_len + extra_len)
                .unwrap_or(&[]);
            let mut e = 0;
            while e + 4 <= extra.len() {
                let (id, len) = (
                    le_u16(extra, e).unwrap_or(0),
                    le_u16(extra, e + 2).unwrap_or(0),
                );
                if id == 1 {
                    let mut f = e + 4;
                    if usize32 == Some(0xFFFF_FFFF) {
                        f += 8;
                    }
                    if csize32 == Some(0xFFFF_FFFF) {
                        f += 8;
                    }
                    local = le_u64(extra, f).unwrap_or(u64::MAX);
                }
                e += 4 + len as usize;
            }
        }
        entries.insert(name, (method, local));
        at += 46 + name_len + extra_len + comment_len;
    }
    let shape_of = |name: &str| -> Result<Vec<u64>, DataError> {
        let (method, local) = entries
            .get(&format!("{name}.npy"))
            .or_else(|| entries.get(name))
            .copied()
            .ok_or_else(|| {
                DataError::Shape(format!(
                    "{url} has no array named {name:?} (found {:?})",
                    entries.keys().collect::<Vec<_>>()
                ))
            })?;
        let h = fetcher
            .read_range(url, local..local + 30)
            .map_err(|e| unreadable(url, e))?;
        if h.len() < 30 || h[..4] != *b"PK\x03\x04" {
            return Err(bad("broken local header"));
        }
        let start = local + 30 + le_u16(&h, 26).unwrap_or(0) + le_u16(&h, 28).unwrap_or(0);
        let raw = fetcher
            .read_range(url, start..(start + 4096).min(size))
            .map_err(|e| unreadable(url, e))?;
        let head = match method {
            0 => raw.to_vec(),
            8 => {
                let mut out = vec![0u8; 4096];
                let mut d = flate2::Decompress::new(false);
                let _ = d.decompress(&raw, &mut out, flate2::FlushDecompress::None);
                out.truncate(d.total_out() as usize);
                out
            }
            m => {
                return Err(bad(&format!(
                    "compression method {m} (stored or deflate only)"
                )))
            }
        };
        npy_shape(&head).ok_or_else(|| bad(&format!("{name}.npy has no readable header")))
    };
    let y = shape_of(&columns.y)?;
    let x = shape_of(columns.x.first().map_or("x", String::as_str))?;
    let rows = *y.first().ok_or_else(|| bad("y is a scalar"))?;
    if x.first() != Some(&rows) {
        return Err(DataError::Shape(format!(
            "{url}: x has shape {x:?} and y {y:?}: they need the same number of samples"
        )));
    }
    Ok((vec![rows], Some(x[1..].iter().product()), size))
}

/// The shape in a `.npy` header.
fn npy_shape(head: &[u8]) -> Option<Vec<u64>> {
    if head.len() < 10 || head[..6] != *b"\x93NUMPY" {
        return None;
    }
    let (len, from) = if head[6] == 1 {
        (le_u16(head, 8)? as usize, 10)
    } else {
        (le_u32(head, 8)? as usize, 12)
    };
    let text = std::str::from_utf8(head.get(from..from + len)?).ok()?;
    let shape = text.split("'shape':").nth(1)?;
    let inner = shape.split_once('(')?.1.split_once(')')?.0;
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse().ok())
        .collect()
}

/// Rows, values per sample, bytes of a safetensors file, from its header.
fn safetensors_meta(
    url: &str,
    fetcher: &Fetcher,
    columns: &Columns,
) -> Result<(Vec<u64>, Option<u64>, u64), DataError> {
    let len = fetcher
        .read_range(url, 0..8)
        .map_err(|e| unreadable(url, e))?;
    let n = le_u64(&len, 0).ok_or_else(|| unreadable(url, "not safetensors"))?;
    if n > MAX_HEADER_BYTES {
        return Err(unreadable(url, "not safetensors (header too long)"));
    }
    let head = fetcher
        .read_range(url, 8..8 + n)
        .map_err(|e| unreadable(url, e))?;
    let v: serde_json::Value = serde_json::from_slice(&head)
        .map_err(|e| unreadable(url, format!("not safetensors: {e}")))?;
    let shape = |name: &str| -> Result<Vec<u64>, DataError> {
        v.get(name)
            .and_then(|t| t.get("shape"))
            .and_then(|s| s.as_array())
            .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
            .ok_or_else(|| DataError::Shape(format!("{url} has no tensor named {name:?}")))
    };
    let y = shape(&columns.y)?;
    let x = shape(columns.x.first().map_or("x", String::as_str))?;
    let rows = *y
        .first()
        .ok_or_else(|| DataError::Shape(format!("{url}: y is a scalar")))?;
    if x.first() != Some(&rows) {
        return Err(DataError::Shape(format!(
            "{url}: x has shape {x:?} and y {y:?}: they need the same number of samples"
        )));
    }
    Ok((vec![rows], Some(x[1..].iter().product()), 8 + n))
}

/// Rows per row group, values per sample, bytes of a Parquet file, from
/// its footer; the columns are checked against its schema.
fn parquet_meta(
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
    let units = meta
        .row_groups()
        .iter()
        .map(|g| g.num_rows().max(0) as u64)
        .collect();
    Ok((units, Some(features), size))
}

/// Where the columns are in a Parquet schema.
struct ParquetColumns {
    x: Vec<usize>,
    y: usize,
    id: Option<usize>,
    features: u64,
}

fn numeric(t: &arrow_schema::DataType) -> bool {
    t.is_integer() || t.is_floating()
}

fn parquet_columns(
    url: &str,
    schema: &arrow_schema::Schema,
    c: &Columns,
) -> Result<ParquetColumns, DataError> {
    use arrow_schema::DataType;
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
        match t {
            t if numeric(t) => features += 1,
            DataType::FixedSizeList(inner, n) if numeric(inner.data_type()) && c.x.len() == 1 => {
                features += *n as u64
            }
            other => {
                return Err(DataError::Shape(format!(
                    "{url}: feature column {name:?} is {other}; it must be numeric, or the only feature column and a fixed-size list of numbers"
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

// ---------------------------------------------------------------- the order

/// An epoch's order: lanes of the stream, and blocks of `batch` taken
/// round-robin over them (see the module documentation).
#[derive(Debug, Clone)]
pub struct Plan {
    /// Each lane's first stream position and length.
    pub lanes: Vec<(u64, u64)>,
    /// Each block's lane and lane-local start.
    blocks: Vec<(u32, u64)>,
    /// Each block's first order position (ascending), then the total.
    starts: Vec<u64>,
}

impl Plan {
    /// The order of a stream of `n` samples over `lanes` lanes in blocks
    /// of `batch`.
    pub fn new(n: u64, lanes: u32, batch: u64) -> Plan {
        let (l, batch) = (u64::from(lanes.max(1)).min(n.max(1)), batch.max(1));
        let (q, r) = (n / l, n % l);
        let mut lane_list = Vec::with_capacity(l as usize);
        let mut at = 0;
        for i in 0..l {
            let len = q + u64::from(i < r);
            lane_list.push((at, len));
            at += len;
        }
        let rounds = lane_list
            .iter()
            .map(|&(_, len)| len.div_ceil(batch))
            .max()
            .unwrap_or(0);
        let mut blocks = Vec::new();
        let mut starts = Vec::new();
        let mut pos = 0;
        for j in 0..rounds {
            for (i, &(_, len)) in lane_list.iter().enumerate() {
                let from = j * batch;
                if from < len {
                    blocks.push((i as u32, from));
                    starts.push(pos);
                    pos += batch.min(len - from);
                }
            }
        }
        starts.push(pos);
        Plan {
            lanes: lane_list,
            blocks,
            starts,
        }
    }

    /// Samples of the epoch.
    pub fn len(&self) -> u64 {
        *self.starts.last().unwrap_or(&0)
    }

    /// Whether the epoch is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The lane and lane-local position of order position `o`.
    pub fn locate(&self, o: u64) -> (u32, u64) {
        let b = self.starts.partition_point(|&s| s <= o) - 1;
        let (lane, from) = self.blocks[b];
        (lane, from + (o - self.starts[b]))
    }
}

/// Shuffle window `k` of lane `lane` in `epoch`: a seeded permutation of
/// its `len` positions.
pub fn window_perm(seed: u64, epoch: u64, lane: u32, k: u64, len: u64) -> Vec<i64> {
    let stream = epoch
        .wrapping_mul(0x2545_F491_4F6C_DD1D)
        .wrapping_add(u64::from(lane).wrapping_mul(0x9E37_79B9))
        .wrapping_add(k)
        ^ 0x5AFF_1E00;
    Rng::new(seed, stream).permutation(len as usize)
}

/// The seeded order of the training shards in `epoch`.
pub fn shard_order(seed: u64, epoch: u64, shards: usize) -> Vec<usize> {
    Rng::new(seed, 0x5A4D_0000 + epoch)
        .permutation(shards)
        .into_iter()
        .map(|i| i as usize)
        .collect()
}

/// The stream position of order position `o` (a window-shuffled lane
/// position).
pub fn stream_position(plan: &Plan, seed: u64, epoch: u64, window: u64, o: u64) -> u64 {
    let (lane, u) = plan.locate(o);
    let (start, len) = plan.lanes[lane as usize];
    let k = u / window;
    let wlen = window.min(len - k * window);
    let perm = window_perm(seed, epoch, lane, k, wlen);
    start + k * window + perm[(u % window) as usize] as u64
}

/// The order-independent hash of one sample id: SplitMix64's finaliser,
/// summed (wrapping) over a set of ids.
pub fn id_mix(id: u64) -> u64 {
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------- the loader

/// Held-out loss and accuracy of one batch (the replica's evaluation).
pub type EvalFn<'a> = dyn FnMut(&(Tensor, Tensor)) -> (f64, Option<f64>) + 'a;

/// What a dataset's loader did, for the step metrics.
#[derive(Debug, Default)]
pub struct DataStats {
    /// Bytes read: fetched from the store, or read from local files.
    pub bytes_read: AtomicU64,
    /// Shard reads the local cache tier answered.
    pub hits: AtomicU64,
    /// Shard reads that went to the store.
    pub misses: AtomicU64,
    /// Shards fetched ahead and not yet used.
    pub ahead: AtomicI64,
}

/// One training entry: a shard (or, for a single shard, its units).
#[derive(Debug, Clone)]
struct Entry {
    shard: usize,
    units: Vec<usize>,
    samples: u64,
}

/// A sharded dataset, ready to stream.
pub struct Sharded {
    spec: JobSpecInput,
    fetcher: Fetcher,
    columns: Columns,
    /// The held-out set's columns: those of `columns`, without the sample
    /// ids when it is a set of its own (`eval_url`: no sample of it is
    /// trained on, so none needs an id).
    eval_columns: Columns,
    set: ShardSet,
    eval_set: ShardSet,
    train: Vec<Entry>,
    eval: Vec<Entry>,
    window: u64,
    lanes: u32,
    max_windows: usize,
    unit_budget: u64,
    /// What the loaders did.
    pub stats: Arc<DataStats>,
    /// Why a loader stopped, for the job's failure.
    failure: std::sync::Mutex<Option<String>>,
}

/// Splits a set's shards (or, for one shard, its units) into training
/// and held-out entries by the seed.
fn split(set: &ShardSet, fraction: f64, seed: u64) -> (Vec<Entry>, Vec<Entry>) {
    let mut entries: Vec<Entry> = if set.shards.len() == 1 {
        let s = &set.shards[0];
        (0..s.units.len())
            .map(|u| Entry {
                shard: 0,
                units: vec![u],
                samples: s.units[u],
            })
            .collect()
    } else {
        set.shards
            .iter()
            .enumerate()
            .map(|(i, s)| Entry {
                shard: i,
                units: (0..s.units.len()).collect(),
                samples: s.samples,
            })
            .collect()
    };
    if fraction <= 0.0 || entries.len() < 2 {
        return (entries, Vec::new());
    }
    let n = entries.len();
    let k = ((n as f64 * fraction).round() as usize).clamp(1, n - 1);
    let order = Rng::new(seed, 0x5E1).permutation(n);
    let held: HashSet<usize> = order[..k].iter().map(|&i| i as usize).collect();
    let mut eval = Vec::new();
    let mut i = 0;
    entries.retain(|e| {
        let keep = !held.contains(&i);
        if !keep {
            eval.push(e.clone());
        }
        i += 1;
        keep
    });
    (entries, eval)
}

fn all_entries(set: &ShardSet) -> Vec<Entry> {
    set.shards
        .iter()
        .enumerate()
        .map(|(i, s)| Entry {
            shard: i,
            units: (0..s.units.len()).collect(),
            samples: s.samples,
        })
        .collect()
}

impl Sharded {
    /// Lists the training (and held-out) shards of `f`, checks the budget.
    /// `memory_mb` is the executor's budget where the spec gives none.
    pub fn open(
        spec: &JobSpecInput,
        f: &FileData,
        fetcher: &Fetcher,
        memory_mb: u64,
    ) -> Result<Sharded, DataError> {
        let columns = Columns::of(f);
        let set = ShardSet::open(&f.url, f, fetcher, &columns)?;
        let mut eval_columns = columns.clone();
        let (train, eval, eval_set) = match &f.eval_url {
            Some(u) => {
                eval_columns.id = None;
                let es = ShardSet::open(u, f, fetcher, &eval_columns)?;
                (all_entries(&set), all_entries(&es), es)
            }
            None => {
                let (t, e) = split(&set, spec.eval_fraction, spec.seed);
                (t, e, set.clone())
            }
        };
        let features = set
            .shards
            .iter()
            .chain(&eval_set.shards)
            .filter_map(|s| s.features)
            .max()
            .unwrap_or(1);
        let row_bytes = features * 8 + 16;
        let window = f.shuffle_buffer.unwrap_or(DEFAULT_SHUFFLE_BUFFER).max(1);
        let budget = f.memory_mb.unwrap_or(memory_mb).max(1) << 20;
        let window_bytes = window * row_bytes;
        let largest_unit = set
            .shards
            .iter()
            .chain(&eval_set.shards)
            .flat_map(|s| s.units.iter())
            .max()
            .copied()
            .unwrap_or(0)
            * row_bytes;
        let batches = PREFETCH_BATCHES as u64 * u64::from(spec.batch_size) * row_bytes;
        let need = 2 * window_bytes + 2 * largest_unit + batches;
        if need > budget {
            return Err(DataError::Shape(format!(
                "the data memory budget ({} MiB) is too small: two shuffle windows of {window} samples take {} MiB, the largest shard or row group {} MiB decoded (twice while it is read), the prefetched batches {} MiB; raise dataset.memory_mb, lower dataset.shuffle_buffer or write smaller shards (Parquet: smaller row groups)",
                budget >> 20,
                (2 * window_bytes) >> 20,
                largest_unit >> 20,
                batches >> 20
            )));
        }
        let lanes = spec.workers.max.max(1);
        let spare = budget - need;
        let max_windows =
            (2 + spare / 2 / window_bytes.max(1)).min(2 * u64::from(lanes) + 2) as usize;
        let unit_budget = 2 * largest_unit + spare / 2;
        let s = Sharded {
            spec: spec.clone(),
            fetcher: fetcher.clone(),
            columns,
            eval_columns,
            set,
            eval_set,
            train,
            eval,
            window,
            lanes,
            max_windows,
            unit_budget,
            stats: Arc::new(DataStats::default()),
            failure: std::sync::Mutex::new(None),
        };
        if s.train_len() < 1 {
            return Err(DataError::Shape(
                "the training shards hold no sample".into(),
            ));
        }
        Ok(s)
    }

    /// This set as held-out data only: its training entries are evaluated.
    pub fn into_eval(mut self) -> Sharded {
        self.eval = std::mem::take(&mut self.train);
        self.eval_set = self.set.clone();
        self.eval_columns = self.columns.clone();
        self
    }

    /// Why a loader of this dataset stopped, if one failed.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Training samples (all workers together).
    pub fn train_len(&self) -> usize {
        self.train.iter().map(|e| e.samples).sum::<u64>() as usize
    }

    /// Held-out samples.
    pub fn eval_len(&self) -> u64 {
        self.eval.iter().map(|e| e.samples).sum()
    }

    /// The shard and row of order position `o` of `epoch` (the cursor's
    /// `(epoch, shard, offset)` view), and the shard's index in the sorted
    /// list.
    pub fn locate(&self, epoch: u64, o: u64) -> (usize, u64) {
        let e = EpochOrder::new(self, epoch);
        let p = stream_position(&e.plan, self.spec.seed, epoch, self.window, o);
        let (entry, row) = e.entry_of(p);
        let ent = &self.train[entry];
        let (unit, r) = unit_of(&self.set.shards[ent.shard], &ent.units, row);
        let before: u64 = self.set.shards[ent.shard].units[..unit].iter().sum();
        (ent.shard, before + r)
    }

    /// Starts the background loader of worker `rank` of `world` from
    /// `cursor`; it stops when the receiver is dropped.
    pub fn stream(self: &Arc<Self>, rank: u32, world: u32, cursor: Cursor) -> Receiver<Batch> {
        let (tx, rx) = sync_channel(PREFETCH_BATCHES);
        let (ptx, prx) = channel::<String>();
        let me = self.clone();
        std::thread::spawn(move || {
            let mut loader = Loader::new(&me, ptx);
            let mut cursor = cursor;
            let batch = me.spec.batch_size as usize;
            let len = me.train_len();
            loop {
                let (range, next) = slice(len, batch, rank, world, cursor);
                let b = match loader.batch(cursor.epoch, range) {
                    Ok((x, y, id_hash, samples)) => Batch {
                        x,
                        y,
                        samples,
                        next,
                        id_hash,
                    },
                    Err(e) => {
                        // The loop sees the channel close and asks why.
                        *me.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                        return;
                    }
                };
                if tx.send(b).is_err() {
                    return;
                }
                cursor = next;
            }
        });
        let me = self.clone();
        std::thread::spawn(move || {
            // Fetches shards into the local cache tier ahead of the loader.
            while let Ok(url) = prx.recv() {
                if let Ok(f) = me.fetcher.fetch(&url) {
                    me.count(f.source, false);
                    me.stats.ahead.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        rx
    }

    fn count(&self, source: Source, by_loader: bool) {
        let s = &self.stats;
        match source {
            Source::Local(n) => {
                if by_loader {
                    s.bytes_read.fetch_add(n, Ordering::Relaxed);
                }
            }
            Source::Cache => {
                if by_loader {
                    s.hits.fetch_add(1, Ordering::Relaxed);
                }
            }
            Source::Store(n) => {
                s.bytes_read.fetch_add(n, Ordering::Relaxed);
                if by_loader {
                    s.misses.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Held-out loss and accuracy: `eval` on every held-out unit in turn,
    /// rows summed (so memory holds one unit at a time). `None` without a
    /// held-out set.
    pub fn evaluate(&self, eval: &mut EvalFn<'_>) -> Result<Option<(f64, Option<f64>)>, DataError> {
        if self.eval.is_empty() {
            return Ok(None);
        }
        let (mut loss, mut correct, mut rows, mut classify) = (0.0, 0.0, 0u64, true);
        for e in &self.eval {
            let shard = &self.eval_set.shards[e.shard];
            for &u in &e.units {
                let unit = self.decode(shard, u, true, &self.eval_columns)?;
                let n = unit.y.size()[0] as u64;
                if n == 0 {
                    continue;
                }
                let (l, a) = eval(&(unit.x.shallow_clone(), unit.y.shallow_clone()));
                loss += l * n as f64;
                match a {
                    Some(a) => correct += a * n as f64,
                    None => classify = false,
                }
                rows += n;
            }
        }
        let rows = rows.max(1) as f64;
        Ok(Some((loss / rows, classify.then_some(correct / rows))))
    }

    /// Unit `u` of `shard`, decoded and checked against the model.
    fn decode(
        &self,
        shard: &Shard,
        u: usize,
        by_loader: bool,
        columns: &Columns,
    ) -> Result<Unit, DataError> {
        let f = self
            .fetcher
            .fetch(&shard.url)
            .map_err(|e| unreadable(&shard.url, e))?;
        self.count(f.source, by_loader);
        if let (Some(want), Source::Store(_)) = (&shard.sha256, f.source) {
            let bytes = std::fs::read(&f.path).map_err(|e| unreadable(&shard.url, e))?;
            let found = trainyard_store::shard::sha256(&bytes);
            if &found != want {
                return Err(unreadable(
                    &shard.url,
                    format!("its bytes have SHA-256 {found}, the manifest says {want}"),
                ));
            }
        }
        let (x, y, ids) = match shard.format {
            FileFormat::Parquet => read_parquet_unit(&f.path, &shard.url, u, columns)?,
            fmt => {
                let named = match fmt {
                    FileFormat::Npz => Tensor::read_npz(&f.path),
                    _ => Tensor::read_safetensors(&f.path),
                }
                .map_err(|e| unreadable(&shard.url, e))?;
                let get = |name: &str| {
                    named
                        .iter()
                        .find(|(n, _)| n == name || n.trim_end_matches(".npy") == name)
                        .map(|(_, t)| t.shallow_clone())
                };
                let missing = |name: &str| {
                    DataError::Shape(format!(
                        "{} has no array named {name:?} (found {:?})",
                        shard.url,
                        named.iter().map(|(n, _)| n).collect::<Vec<_>>()
                    ))
                };
                let xname = columns.x.first().map_or("x", String::as_str);
                let x = get(xname).ok_or_else(|| missing(xname))?;
                let y = get(&columns.y).ok_or_else(|| missing(&columns.y))?;
                let ids = match &columns.id {
                    Some(n) => {
                        let t = get(n).ok_or_else(|| missing(n))?;
                        if t.is_floating_point() {
                            return Err(DataError::Shape(format!(
                                "{}: the id array {n:?} must hold integers",
                                shard.url
                            )));
                        }
                        Some(
                            Vec::<i64>::try_from(t.to_kind(Kind::Int64).flatten(0, -1))
                                .map_err(|e| unreadable(&shard.url, e))?,
                        )
                    }
                    None => None,
                };
                (x, y, ids)
            }
        };
        let rows = y.size().first().copied().unwrap_or(0) as u64;
        if rows != shard.units[u] {
            return Err(DataError::Shape(format!(
                "{} holds {rows} samples where its metadata (or the manifest) said {}",
                shard.url, shard.units[u]
            )));
        }
        let Data::Tensors { x, y } = check(&self.spec, Data::Tensors { x, y })
            .map_err(|e| DataError::Shape(format!("{}: {e}", shard.url)))?
        else {
            return Err(DataError::Shape("text cannot be sharded".into()));
        };
        let first: u64 = shard.base + shard.units[..u].iter().sum::<u64>();
        let ids = match ids {
            Some(v) if v.len() as u64 == rows => v.into_iter().map(|i| i as u64).collect(),
            Some(_) => {
                return Err(DataError::Shape(format!(
                    "{}: the id array has another length than y",
                    shard.url
                )))
            }
            None => (first..first + rows).collect(),
        };
        Ok(Unit { x, y, ids })
    }
}

/// Which unit of `units` (of `shard`) holds row `row` of their rows, and
/// its row there.
fn unit_of(shard: &Shard, units: &[usize], mut row: u64) -> (usize, u64) {
    for &u in units {
        if row < shard.units[u] {
            return (u, row);
        }
        row -= shard.units[u];
    }
    (*units.last().unwrap_or(&0), row)
}

/// Reads row group `u` of a local Parquet file: features as f32
/// `[rows, features]`, labels, ids.
fn read_parquet_unit(
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

/// Decoded rows of one unit.
struct Unit {
    x: Tensor,
    y: Tensor,
    ids: Vec<u64>,
}

/// Decoded rows of one shuffle window, in stream order, and its
/// permutation.
struct Window {
    x: Tensor,
    y: Tensor,
    ids: Vec<u64>,
    perm: Vec<i64>,
}

/// An epoch's shard order and plan.
struct EpochOrder {
    order: Vec<usize>,
    /// Stream start of each entry in `order`, then the total.
    starts: Vec<u64>,
    plan: Plan,
}

impl EpochOrder {
    fn new(s: &Sharded, epoch: u64) -> EpochOrder {
        let order = shard_order(s.spec.seed, epoch, s.train.len());
        let mut starts = Vec::with_capacity(order.len() + 1);
        let mut at = 0;
        for &e in &order {
            starts.push(at);
            at += s.train[e].samples;
        }
        starts.push(at);
        let plan = Plan::new(at, s.lanes, u64::from(s.spec.batch_size));
        EpochOrder {
            order,
            starts,
            plan,
        }
    }

    /// The training entry of stream position `p` and the row in it.
    fn entry_of(&self, p: u64) -> (usize, u64) {
        let i = self.starts.partition_point(|&s| s <= p) - 1;
        (self.order[i], p - self.starts[i])
    }
}

/// One rank's loader state: the epoch's order and the caches.
struct Loader<'a> {
    s: &'a Sharded,
    epoch: Option<(u64, EpochOrder)>,
    windows: HashMap<(u32, u64), Rc<Window>>,
    window_lru: VecDeque<(u32, u64)>,
    units: HashMap<(usize, usize), Rc<Unit>>,
    unit_lru: VecDeque<(usize, usize)>,
    unit_bytes: u64,
    prefetch: Sender<String>,
    prefetched: HashSet<String>,
}

impl<'a> Loader<'a> {
    fn new(s: &'a Sharded, prefetch: Sender<String>) -> Loader<'a> {
        Loader {
            s,
            epoch: None,
            windows: HashMap::new(),
            window_lru: VecDeque::new(),
            units: HashMap::new(),
            unit_lru: VecDeque::new(),
            unit_bytes: 0,
            prefetch,
            prefetched: HashSet::new(),
        }
    }

    /// The batch of order positions `range` of `epoch`: inputs, targets,
    /// the hash of its ids, its samples.
    fn batch(
        &mut self,
        epoch: u64,
        range: std::ops::Range<usize>,
    ) -> Result<(Tensor, Tensor, u64, usize), DataError> {
        if self.epoch.as_ref().map(|e| e.0) != Some(epoch) {
            self.epoch = Some((epoch, EpochOrder::new(self.s, epoch)));
            self.windows.clear();
            self.window_lru.clear();
            self.prefetched.clear();
        }
        if range.is_empty() {
            return Ok((Tensor::new(), Tensor::new(), 0, 0));
        }
        let window = self.s.window;
        // Positions grouped by window, in batch order.
        let mut picks: Vec<((u32, u64), i64)> = Vec::with_capacity(range.len());
        for o in range.clone() {
            let (lane, u) = self.epoch.as_ref().expect("set").1.plan.locate(o as u64);
            picks.push(((lane, u / window), (u % window) as i64));
        }
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        let mut hash = 0u64;
        let mut i = 0;
        while i < picks.len() {
            let key = picks[i].0;
            let mut j = i;
            while j < picks.len() && picks[j].0 == key {
                j += 1;
            }
            let w = self.window(epoch, key)?;
            let local: Vec<i64> = picks[i..j]
                .iter()
                .map(|&(_, r)| w.perm[r as usize])
                .collect();
            for &r in &local {
                hash = hash.wrapping_add(id_mix(w.ids[r as usize]));
            }
            let idx = Tensor::from_slice(&local);
            xs.push(w.x.index_select(0, &idx));
            ys.push(w.y.index_select(0, &idx));
            i = j;
        }
        let (x, y) = if xs.len() == 1 {
            (xs.pop().expect("one"), ys.pop().expect("one"))
        } else {
            (Tensor::cat(&xs, 0), Tensor::cat(&ys, 0))
        };
        Ok((x, y, hash, range.len()))
    }

    /// Window `(lane, k)` of the current epoch, decoded (cached).
    fn window(&mut self, epoch: u64, key: (u32, u64)) -> Result<Rc<Window>, DataError> {
        if let Some(w) = self.windows.get(&key) {
            let w = w.clone();
            self.window_lru.retain(|k| *k != key);
            self.window_lru.push_back(key);
            return Ok(w);
        }
        let (lane, k) = key;
        let window = self.s.window;
        let (start, len) = self.epoch.as_ref().expect("set").1.plan.lanes[lane as usize];
        let wlen = window.min(len - k * window);
        let from = start + k * window;
        // The shards of the next windows of this lane go to the cache tier
        // in the background.
        for ahead in 1..=PREFETCH_WINDOWS {
            let next = from + ahead * window;
            if next < start + len {
                let to = (next + window).min(start + len);
                for url in self.urls_of(next, to) {
                    if self.prefetched.insert(url.clone()) {
                        let _ = self.prefetch.send(url);
                    }
                }
            }
        }
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        let mut ids = Vec::with_capacity(wlen as usize);
        let mut p = from;
        while p < from + wlen {
            let (entry, row) = self.epoch.as_ref().expect("set").1.entry_of(p);
            let ent = self.s.train[entry].clone();
            let shard = &self.s.set.shards[ent.shard];
            let (u, r) = unit_of(shard, &ent.units, row);
            let take = (shard.units[u] - r).min(from + wlen - p);
            let unit = self.unit(ent.shard, u)?;
            xs.push(unit.x.narrow(0, r as i64, take as i64));
            ys.push(unit.y.narrow(0, r as i64, take as i64));
            ids.extend_from_slice(&unit.ids[r as usize..(r + take) as usize]);
            p += take;
        }
        let w = Rc::new(Window {
            x: Tensor::cat(&xs, 0),
            y: Tensor::cat(&ys, 0),
            ids,
            perm: window_perm(self.s.spec.seed, epoch, lane, k, wlen),
        });
        while self.window_lru.len() >= self.s.max_windows {
            if let Some(old) = self.window_lru.pop_front() {
                self.windows.remove(&old);
            }
        }
        self.windows.insert(key, w.clone());
        self.window_lru.push_back(key);
        Ok(w)
    }

    /// The shard URLs stream positions `[from, to)` read.
    fn urls_of(&self, from: u64, to: u64) -> Vec<String> {
        let e = &self.epoch.as_ref().expect("set").1;
        let mut out = Vec::new();
        let mut p = from;
        while p < to {
            let i = e.starts.partition_point(|&s| s <= p) - 1;
            let ent = &self.s.train[e.order[i]];
            out.push(self.s.set.shards[ent.shard].url.clone());
            p = e.starts[i + 1];
        }
        out
    }

    /// Unit `u` of shard `shard`, decoded (cached within the budget).
    fn unit(&mut self, shard: usize, u: usize) -> Result<Rc<Unit>, DataError> {
        let key = (shard, u);
        if let Some(x) = self.units.get(&key) {
            let x = x.clone();
            self.unit_lru.retain(|k| *k != key);
            self.unit_lru.push_back(key);
            return Ok(x);
        }
        let s = &self.s.set.shards[shard];
        if self.prefetched.contains(&s.url) {
            self.s.stats.ahead.fetch_sub(1, Ordering::Relaxed);
        }
        let unit = Rc::new(self.s.decode(s, u, true, &self.s.columns)?);
        let bytes = unit_bytes(&unit);
        while self.unit_bytes + bytes > self.s.unit_budget {
            let Some(old) = self.unit_lru.pop_front() else {
                break;
            };
            if let Some(o) = self.units.remove(&old) {
                self.unit_bytes -= unit_bytes(&o);
            }
        }
        self.unit_bytes += bytes;
        self.units.insert(key, unit.clone());
        self.unit_lru.push_back(key);
        Ok(unit)
    }
}

fn unit_bytes(u: &Unit) -> u64 {
    (u.x.numel() * 4 + u.y.numel() * 8 + u.ids.len() * 8) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What happens between two steps of the simulated job.
    #[derive(Debug, Clone, Copy)]
    enum Event {
        /// Nothing: the same workers step.
        Step,
        /// A worker joins at the next step.
        Join,
        /// A worker leaves cleanly after its step.
        Leave,
        /// A worker is killed mid-step: the step is lost on every rank (a
        /// ring rebuilds at the last completed step) and the world shrinks.
        Kill,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            4 => Just(Event::Step),
            1 => Just(Event::Join),
            1 => Just(Event::Leave),
            1 => Just(Event::Kill),
        ]
    }

    proptest! {
        /// Whatever joins, leaves and kills happen, every sample of the
        /// epoch — every (shard, row) of the training shards — is consumed
        /// exactly once, through the lanes, the shuffle windows and the
        /// seeded shard order, and the order is a permutation.
        #[test]
        fn every_sample_once_under_joins_leaves_and_kills(
            shard_sizes in proptest::collection::vec(1u64..60, 1..12),
            batch in 1u64..17,
            lanes in 1u32..6,
            window in 1u64..40,
            seed in any::<u64>(),
            epoch in 0u64..3,
            start in 1u32..6,
            events in proptest::collection::vec(event(), 1..200),
        ) {
            let n: u64 = shard_sizes.iter().sum();
            let order = shard_order(seed, epoch, shard_sizes.len());
            let mut starts = vec![0u64];
            for &s in &order {
                starts.push(starts.last().unwrap() + shard_sizes[s]);
            }
            let plan = Plan::new(n, lanes, batch);
            prop_assert_eq!(plan.len(), n);
            let mut seen = vec![0u32; n as usize];
            let mut cursor = Cursor { epoch, offset: 0 };
            let mut world = start.min(lanes.max(1) + 2);
            let mut i = 0;
            while cursor.epoch == epoch {
                let ev = events[i % events.len()];
                i += 1;
                let mut consumed = Vec::new();
                let mut next = None;
                for rank in 0..world {
                    let (r, nx) = slice(n as usize, batch as usize, rank, world, cursor);
                    for o in r {
                        let p = stream_position(&plan, seed, epoch, window, o as u64);
                        let j = starts.partition_point(|&s| s <= p) - 1;
                        let (shard, row) = (order[j], p - starts[j]);
                        let id = shard_sizes[..shard].iter().sum::<u64>() + row;
                        consumed.push(id);
                    }
                    prop_assert!(next.is_none_or(|m| m == nx));
                    next = Some(nx);
                }
                match ev {
                    Event::Kill if world > 1 => {
                        // The step dies with the worker: nothing counted.
                        world -= 1;
                        continue;
                    }
                    Event::Join => world = (world + 1).min(8),
                    Event::Leave if world > 1 => world -= 1,
                    _ => {}
                }
                for id in consumed {
                    seen[id as usize] += 1;
                }
                cursor = next.unwrap();
            }
            prop_assert!(seen.iter().all(|&c| c == 1), "{:?}", seen);
        }

        /// At the job's largest size each rank's blocks stay in its own
        /// lane: a worker reads only its contiguous share of the shards.
        #[test]
        fn at_full_size_each_rank_reads_its_own_lane(n in 1u64..2000, batch in 1u64..33, lanes in 1u32..6) {
            let plan = Plan::new(n, lanes, batch);
            let world = plan.lanes.len() as u32;
            let mut cursor = Cursor::default();
            let q = n / u64::from(world);
            // While every lane still has a full block, rank r is in lane r.
            while cursor.epoch == 0 && (cursor.offset / (u64::from(world) * batch) + 1) * batch <= q {
                for rank in 0..world {
                    let (r, _) = slice(n as usize, batch as usize, rank, world, cursor);
                    for o in r {
                        prop_assert_eq!(plan.locate(o as u64).0, rank);
                    }
                }
                cursor = slice(n as usize, batch as usize, 0, world, cursor).1;
            }
        }
    }

    #[test]
    fn npy_headers_give_shapes() {
        let mut h = b"\x93NUMPY\x01\x00".to_vec();
        let dict = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 64), }          \n";
        h.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        h.extend_from_slice(dict);
        assert_eq!(npy_shape(&h), Some(vec![1000, 64]));
        let one = b"{'descr': '<i8', 'fortran_order': False, 'shape': (7,), }";
        let mut h = b"\x93NUMPY\x01\x00".to_vec();
        h.extend_from_slice(&(one.len() as u16).to_le_bytes());
        h.extend_from_slice(one);
        assert_eq!(npy_shape(&h), Some(vec![7]));
        assert_eq!(npy_shape(b"not numpy"), None);
    }

    #[test]
    fn ids_hash_independently_of_order() {
        let a: u64 = [3u64, 9, 27]
            .iter()
            .map(|&i| id_mix(i))
            .fold(0, u64::wrapping_add);
        let b: u64 = [27u64, 3, 9]
            .iter()
            .map(|&i| id_mix(i))
            .fold(0, u64::wrapping_add);
        assert_eq!(a, b);
        assert_ne!(id_mix(1), id_mix(2));
    }
}

#[cfg(test)]
mod loader_tests {
    //! The loader on real shards: npz written by libtorch, Parquet by the
    //! Arrow writer, read back through a glob and a manifest.
    use super::*;
    use crate::replica::data::Dataset;
    use serde_json::json;
    use std::path::PathBuf;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ty-shards-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Shard `i` of `sizes`: 4 features, a class in 0..3, ids 1000 + global row.
    fn rows(sizes: &[u64], i: usize) -> (Vec<f32>, Vec<i64>, Vec<i64>) {
        let base: u64 = sizes[..i].iter().sum();
        let n = sizes[i];
        let x = (0..n * 4).map(|v| (v % 7) as f32).collect();
        let y = (0..n).map(|r| ((base + r) % 3) as i64).collect();
        let id = (0..n).map(|r| (1000 + base + r) as i64).collect();
        (x, y, id)
    }

    fn write_npz(dir: &std::path::Path, sizes: &[u64]) {
        for i in 0..sizes.len() {
            let (x, y, id) = rows(sizes, i);
            let t = [
                ("x", Tensor::from_slice(&x).reshape([sizes[i] as i64, 4])),
                ("y", Tensor::from_slice(&y)),
                ("id", Tensor::from_slice(&id)),
            ];
            Tensor::write_npz(&t, dir.join(format!("part-{i:03}.npz"))).unwrap();
        }
    }

    fn write_parquet(dir: &std::path::Path, sizes: &[u64], group: usize) {
        use arrow_array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
        use arrow_schema::{DataType, Field, Schema};
        for i in 0..sizes.len() {
            let (x, y, id) = rows(sizes, i);
            let item = Arc::new(Field::new("item", DataType::Float32, false));
            let schema = Arc::new(Schema::new(vec![
                Field::new("pixels", DataType::FixedSizeList(item.clone(), 4), false),
                Field::new("label", DataType::Int64, false),
                Field::new("sample", DataType::Int64, false),
            ]));
            let xs = FixedSizeListArray::new(item, 4, Arc::new(Float32Array::from(x)), None);
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(xs),
                    Arc::new(Int64Array::from(y)),
                    Arc::new(Int64Array::from(id)),
                ],
            )
            .unwrap();
            let file = std::fs::File::create(dir.join(format!("part-{i:03}.parquet"))).unwrap();
            let props = parquet::file::properties::WriterProperties::builder()
                .set_max_row_group_row_count(Some(group))
                .build();
            let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, Some(props)).unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
        }
    }

    fn spec(dataset: serde_json::Value, max: u32) -> JobSpecInput {
        let s: trainyard_common::JobSpec = serde_json::from_value(json!({
            "name": "sharded",
            "model": {"kind": "mlp", "inputs": 4, "hidden": [8], "outputs": 3},
            "dataset": dataset, "loss": "cross_entropy",
            "optimizer": {"kind": "sgd", "lr": 0.1},
            "batch_size": 5, "epochs": 2, "seed": 3, "eval_fraction": 0.2,
            "workers": {"min": 1, "max": max}, "strategy": "allreduce"
        }))
        .unwrap();
        s.into()
    }

    /// One epoch from `worlds` (the world size at each step, the last one
    /// repeated): the id hash and count of everything the ranks got.
    fn epoch(d: &Dataset, spec: &JobSpecInput, worlds: &[u32]) -> (u64, u64) {
        let mut cursor = Cursor::default();
        let (mut hash, mut count, mut i) = (0u64, 0u64, 0);
        while cursor.epoch == 0 {
            let world = worlds[i.min(worlds.len() - 1)];
            i += 1;
            let mut next = None;
            for rank in 0..world {
                let b = d.stream(spec, rank, world, cursor).recv().unwrap();
                hash = hash.wrapping_add(b.id_hash);
                count += b.samples as u64;
                next = Some(b.next);
            }
            cursor = next.unwrap();
        }
        (hash, count)
    }

    fn expected(ids: impl Iterator<Item = u64>) -> (u64, u64) {
        ids.fold((0, 0), |(h, n), id| (h.wrapping_add(id_mix(id)), n + 1))
    }

    #[test]
    fn npz_shards_through_a_glob_each_training_sample_once() {
        let dir = scratch("npz");
        let sizes = [17u64, 9, 30, 4, 21];
        write_npz(&dir, &sizes);
        let url = format!("file://{}/part-*.npz", dir.display());
        let spec = spec(
            json!({"kind": "file", "url": url, "id_column": "id", "shuffle_buffer": 8}),
            3,
        );
        let d = Dataset::load(&spec, &Fetcher::local_only()).unwrap();
        let train = d.train_len() as u64;
        // One of five shards is held out (20 %): the training ids are the rest.
        let total: u64 = sizes.iter().sum();
        let (h, n) = epoch(&d, &spec, &[3, 3, 2, 1, 2, 3]);
        assert_eq!(n, train);
        let held = sizes.iter().find(|&&s| total - s == train).copied();
        assert!(held.is_some(), "one whole shard is held out");
        let mut all = Vec::new();
        let mut base = 0;
        for &s in &sizes {
            if total - s != train || all.len() as u64 + s > train + s {
                all.push((base, s));
            }
            base += s;
        }
        // The hash is one of the hashes of "all ids but one shard's".
        let options: Vec<(u64, u64)> = (0..sizes.len())
            .map(|skip| {
                let mut b = 0;
                let mut ids = Vec::new();
                for (i, &s) in sizes.iter().enumerate() {
                    if i != skip {
                        ids.extend(1000 + b..1000 + b + s);
                    }
                    b += s;
                }
                expected(ids.into_iter())
            })
            .collect();
        assert!(options.contains(&(h, n)), "{h:x} {n} not in {options:?}");
        // Held-out shards evaluate in bounded pieces.
        let mut rows = 0;
        let r = d.evaluate_shards(&mut |b| {
            rows += b.0.size()[0];
            (1.0, Some(0.5))
        });
        assert_eq!(r.unwrap().unwrap(), (1.0, Some(0.5)));
        assert_eq!(rows as u64, total - train);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn parquet_row_groups_through_a_manifest_and_an_eval_url() {
        let dir = scratch("parquet");
        let sizes = [23u64, 11, 40];
        write_parquet(&dir, &sizes, 7);
        let manifest = json!({"shards": [
            {"url": "part-000.parquet"}, {"url": "part-001.parquet", "samples": 11}
        ]});
        std::fs::write(dir.join("train.json"), manifest.to_string()).unwrap();
        let ds = json!({"kind": "file", "url": format!("file://{}/train.json", dir.display()),
            "format": "parquet", "eval_url": format!("file://{}/part-002.parquet", dir.display()),
            "x_columns": ["pixels"], "y_column": "label", "id_column": "sample", "shuffle_buffer": 6});
        let spec = spec(ds, 2);
        let d = Dataset::load(&spec, &Fetcher::local_only()).unwrap();
        assert_eq!(d.train_len(), 34);
        let want = expected(1000..1034);
        assert_eq!(epoch(&d, &spec, &[2]), want);
        assert_eq!(epoch(&d, &spec, &[1, 2, 2, 1]), want);
        let mut rows = 0;
        d.evaluate_shards(&mut |b| {
            rows += b.0.size()[0];
            (0.0, None)
        })
        .unwrap()
        .unwrap();
        assert_eq!(rows, 40);

        // A missing or mistyped column is named.
        let bad = json!({"kind": "file", "url": format!("file://{}/part-*.parquet", dir.display()),
            "x_columns": ["pixel"], "y_column": "label"});
        let e = Dataset::load(&self::spec(bad, 1), &Fetcher::local_only())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("no feature column \"pixel\"") && e.contains("pixels, label, sample"),
            "{e}"
        );
        let bad = json!({"kind": "file", "url": format!("file://{}/part-*.parquet", dir.display()),
            "x_columns": ["pixels", "label"], "y_column": "label"});
        let e = Dataset::load(&self::spec(bad, 1), &Fetcher::local_only())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("feature column \"pixels\" is FixedSizeList"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_budget_too_small_says_what_to_change() {
        let dir = scratch("budget");
        write_npz(&dir, &[50, 50]);
        let url = format!("file://{}/part-*.npz", dir.display());
        let spec = spec(
            json!({"kind": "file", "url": url, "shuffle_buffer": 16_000_000, "memory_mb": 16}),
            1,
        );
        let e = Dataset::load(&spec, &Fetcher::local_only())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("dataset.memory_mb") && e.contains("shuffle_buffer"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
