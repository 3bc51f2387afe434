//! One unit of a shard in memory: fetched through the cache tier (and
//! checked against a manifest's SHA-256 when it came from the store),
//! decoded (npz and safetensors by libtorch, Parquet row groups, images
//! and WebDataset tars by [`super::formats`]), checked against the model and given its
//! sample ids. The held-out evaluation goes unit by unit, so it holds one
//! at a time.

use super::formats::parquet::read_parquet_unit;
use super::formats::{images, webdataset};
use super::formats::{unreadable, Columns};
use super::listing::Shard;
use super::pixels::Pixels;
use super::sharded::Sharded;
use crate::data::samples::{check, Data, DataError};
use crate::storage::Source;
use tch::{Kind, Tensor};
use trainyard_common::spec::FileFormat;

/// Row groups of one file below which its held-out rows are drawn row by
/// row ([`Sharded::small_set`]): with 10 the nearest whole number of
/// groups misses a fraction by at most 5 points.
pub const ROW_SPLIT_BELOW: usize = 10;

/// Held-out loss and accuracy of one batch (the replica's evaluation).
pub type EvalFn<'a> = dyn FnMut(&(Tensor, Tensor)) -> (f64, Option<f64>) + 'a;

/// Decoded rows of one unit.
pub(super) struct Unit {
    /// Features `[n, …]`; for images, a view of the first image per row
    /// (the images themselves are in `images`).
    pub(super) x: Tensor,
    /// Images (`[c, h, w]` uint8, sizes may differ until the batch's
    /// crops), or none.
    pub(super) images: Vec<Tensor>,
    pub(super) y: Tensor,
    pub(super) ids: Vec<u64>,
}

impl Sharded {
    /// Held-out loss and accuracy: `eval` on every held-out unit in turn,
    /// rows summed (so memory holds one unit at a time). `None` without a
    /// held-out set.
    pub fn evaluate(&self, eval: &mut EvalFn<'_>) -> Result<Option<(f64, Option<f64>)>, DataError> {
        if self.eval.is_empty() {
            return Ok(None);
        }
        let (mut loss, mut correct, mut rows, mut classify) = (0.0, 0.0, 0u64, true);
        let pixels = Pixels::of(&self.spec);
        for e in &self.eval {
            let shard = &self.eval_set.shards[e.shard];
            for &u in &e.units {
                let unit = self.decode(shard, u, true, &self.eval_columns)?;
                let n = unit.y.size()[0] as u64;
                if n == 0 {
                    continue;
                }
                let x = if unit.images.is_empty() {
                    pixels.finish(unit.x.shallow_clone())
                } else {
                    pixels
                        .finish_images(&unit.images, &unit.ids, 0, false)
                        .map_err(|e| DataError::Shape(format!("{}: {e}", shard.url)))?
                };
                let (l, a) = eval(&(x, unit.y.shallow_clone()));
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

    /// The whole set decoded (features, targets) when it is too coarse to
    /// hold rows out by units — one file of fewer than [`ROW_SPLIT_BELOW`]
    /// units (a Parquet file of a few row groups, as polars and pyarrow
    /// write a small table), where the nearest whole number of
    /// units misses `eval_fraction` by far (1 of 2 is half) — and small
    /// enough to hold in memory (its decoded units within the units'
    /// budget), without images. `None` otherwise: the units are held out
    /// as they are.
    pub(super) fn small_set(&self) -> Result<Option<(Tensor, Tensor)>, DataError> {
        // Several shards are held out whole, as a sharded set is meant to
        // stream: only one file's few row groups are this coarse.
        let [shard] = self.set.shards.as_slice() else {
            return Ok(None);
        };
        if shard.units.is_empty() || shard.units.len() >= ROW_SPLIT_BELOW {
            return Ok(None);
        }
        // Every unit is held at once: counted as decoded (a variable-length
        // list's width is known only then), and given up on — back to
        // holding out whole units — once they pass the units' budget. One
        // unit at a time was fit by the budget check, so no more than the
        // budget and one unit is ever held.
        let (mut xs, mut ys, mut held) = (Vec::new(), Vec::new(), 0u64);
        for u in 0..shard.units.len() {
            let unit = self.decode(shard, u, false, &self.columns)?;
            if !unit.images.is_empty() {
                return Ok(None);
            }
            held += [&unit.x, &unit.y]
                .iter()
                .map(|t| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64)
                .sum::<u64>();
            if held > self.unit_budget {
                return Ok(None);
            }
            xs.push(unit.x);
            ys.push(unit.y);
        }
        if xs.len() == 1 {
            return Ok(xs.pop().zip(ys.pop()));
        }
        let cat = |t: &[Tensor]| {
            Tensor::f_cat(t, 0).map_err(|e| {
                DataError::Shape(format!(
                    "the row groups of {} differ in shape: {e}",
                    shard.url
                ))
            })
        };
        Ok(Some((cat(&xs)?, cat(&ys)?)))
    }

    /// Unit `u` of `shard`, decoded and checked against the model.
    pub(super) fn decode(
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
        let mut pictures = Vec::new();
        let (x, y, ids) = match shard.format {
            FileFormat::Parquet => read_parquet_unit(&f.path, &shard.url, u, columns)?,
            FileFormat::Webdataset | FileFormat::ImageFolder => {
                let (x, y, images) = self.read_images(shard, &f.path, u)?;
                pictures = images;
                (x, y, None)
            }
            fmt => read_arrays(shard, fmt, &f.path, columns)?,
        };
        let rows = y.size().first().copied().unwrap_or(0) as u64;
        if rows != shard.units[u] {
            return Err(DataError::Shape(format!(
                "{} holds {rows} samples where its metadata (or the manifest) said {}",
                shard.url, shard.units[u]
            )));
        }
        let Data::Tensors { x, y } =
            check(&self.spec, Data::Tensors { x, y }).map_err(|e| match e {
                DataError::Shape(m) => DataError::Shape(format!("{}: {m}", shard.url)),
                e => e,
            })?
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
        Ok(Unit {
            x,
            images: pictures,
            y,
            ids,
        })
    }

    /// Unit `u` of an image shard (a WebDataset tar's samples, or one file
    /// of an image folder): the model check's view of the first image's
    /// shape for every row (no copy), the labels, and the images.
    fn read_images(
        &self,
        shard: &Shard,
        path: &std::path::Path,
        u: usize,
    ) -> Result<(Tensor, Tensor, Vec<Tensor>), DataError> {
        let mut pictures = Vec::new();
        let y = if shard.format == FileFormat::Webdataset {
            let (images, y) = webdataset::read_unit(path, &shard.url, u, &self.images)?;
            pictures = images;
            y
        } else {
            let bytes = std::fs::read(path).map_err(|e| unreadable(&shard.url, e))?;
            let name = shard.url.rsplit('/').next().unwrap_or_default();
            let d = images::decode(&shard.url, name, &bytes, &self.images)?;
            pictures.push(d.tensor(self.images.channels));
            Tensor::from_slice(&[shard.label.unwrap_or(0)])
        };
        let x = match pictures.first() {
            Some(p) => p.unsqueeze(0).expand(
                [pictures.len() as i64, p.size()[0], p.size()[1], p.size()[2]],
                false,
            ),
            None => Tensor::zeros([0, 1, 1, 1], (Kind::Uint8, tch::Device::Cpu)),
        };
        Ok((x, y, pictures))
    }
}

/// An npz or safetensors shard's arrays `columns` names: the inputs (one
/// array, or several stacked), the labels and the sample ids, if named.
fn read_arrays(
    shard: &Shard,
    fmt: FileFormat,
    path: &std::path::Path,
    columns: &Columns,
) -> Result<(Tensor, Tensor, Option<Vec<i64>>), DataError> {
    let named = match fmt {
        FileFormat::Npz => Tensor::read_npz(path),
        _ => Tensor::read_safetensors(path),
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
    let x = if columns.stacked {
        let mut parts = Vec::with_capacity(columns.x.len());
        for name in &columns.x {
            parts.push(get(name).ok_or_else(|| missing(name))?);
        }
        super::formats::stack_inputs(&shard.url, &columns.x, parts)?
    } else {
        let xname = columns.x.first().map_or("x", String::as_str);
        get(xname).ok_or_else(|| missing(xname))?
    };
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
    Ok((x, y, ids))
}
