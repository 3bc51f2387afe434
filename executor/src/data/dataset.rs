//! Datasets: built-in generators and files, split into training and
//! evaluation sets, served in seeded, sharded batches by a background thread.
//!
//! Every worker computes the same seeded split and, each epoch, the same
//! seeded permutation of the training indices; a step consumes the next
//! `world × batch` samples of it, worker `rank` taking the `rank`-th run
//! (see [`slice()`]), so the shards are disjoint, cover the epoch, and are
//! re-split when the membership changes. Text is cut into windows of `context + 1` tokens (bytes) at
//! seeded random offsets. Batches are gathered on a background thread into a
//! bounded channel, so the training loop only waits when the data is slower
//! than the model.
//!
//! A glob, a manifest or a Parquet file is a sharded dataset instead,
//! streamed by [`super::Sharded`] with the same cursor and the same split of
//! each step among the ranks.

use super::pixels::Pixels;
use super::rng::Rng;
use super::samples::check;
use super::samples::{slice, Batch, Cursor, Data, DataError};
use super::sharded::{DataStats, Sharded};
use crate::storage::Fetcher;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use tch::{Kind, Tensor};
use trainyard_common::spec::{DatasetSpec, FileData, FileFormat, ModelSpec, UncheckedJobSpec};

/// Batches buffered ahead of the training loop.
pub const PREFETCH: usize = 4;

/// A loaded dataset with its split, or a sharded one.
pub struct Dataset {
    data: Data,
    train: Vec<i64>,
    eval: Vec<i64>,
    /// A sharded training set (then `data` and `train` are empty).
    sharded: Option<Arc<Sharded>>,
    /// Held-out shards (`eval_url`, or a sharded set's held-out part).
    eval_shards: Option<Arc<Sharded>>,
}

fn unreadable(url: &str, reason: impl ToString) -> DataError {
    DataError::Unreadable {
        url: url.to_owned(),
        reason: reason.to_string(),
    }
}

fn generated(spec: &UncheckedJobSpec) -> Result<Data, DataError> {
    let mut rng = Rng::new(spec.seed, 0xDA7A);
    Ok(match &spec.dataset() {
        DatasetSpec::Classification(c) => {
            let (n, f, k) = (c.samples as usize, c.features as usize, c.classes as usize);
            let centers: Vec<f32> = (0..k * f).map(|_| (rng.normal() * 1.5) as f32).collect();
            let mut x = Vec::with_capacity(n * f);
            let mut y = Vec::with_capacity(n);
            for _ in 0..n {
                let class = rng.below(k as u64) as usize;
                y.push(class as i64);
                x.extend((0..f).map(|j| centers[class * f + j] + rng.normal() as f32));
            }
            Data::Tensors {
                x: Tensor::from_slice(&x).reshape([n as i64, f as i64]),
                y: Tensor::from_slice(&y),
            }
        }
        DatasetSpec::Regression(r) => {
            let (n, f, t) = (r.samples as usize, r.features as usize, r.targets as usize);
            let w: Vec<f32> = (0..f * t)
                .map(|_| rng.normal() as f32 / (f as f32).sqrt())
                .collect();
            let mut x = Vec::with_capacity(n * f);
            let mut y = Vec::with_capacity(n * t);
            for _ in 0..n {
                let row: Vec<f32> = (0..f).map(|_| rng.normal() as f32).collect();
                for o in 0..t {
                    let v: f32 = (0..f).map(|j| row[j] * w[j * t + o]).sum();
                    y.push(v + 0.05 * rng.normal() as f32);
                }
                x.extend(row);
            }
            Data::Tensors {
                x: Tensor::from_slice(&x).reshape([n as i64, f as i64]),
                y: Tensor::from_slice(&y).reshape([n as i64, t as i64]),
            }
        }
        DatasetSpec::Text(t) => Data::Text(Tensor::from_slice(&generated_text(
            t.characters as usize,
            &mut rng,
        ))),
        DatasetSpec::File(f) => {
            return Err(unreadable(
                &f.url,
                "a file dataset is loaded, not generated",
            ))
        }
    })
}

/// Sentences from a small grammar: structured enough that a language model
/// beats the unigram entropy, varied enough that it must learn to.
pub fn generated_text(chars: usize, rng: &mut Rng) -> Vec<u8> {
    const SUBJECTS: [&str; 6] = [
        "the cat",
        "a dog",
        "the old man",
        "my sister",
        "the robot",
        "a bird",
    ];
    const VERBS: [&str; 6] = ["sees", "likes", "chases", "finds", "draws", "hears"];
    const OBJECTS: [&str; 6] = [
        "the moon",
        "a red ball",
        "the river",
        "an apple",
        "the tall tree",
        "a small boat",
    ];
    let mut out = Vec::with_capacity(chars + 64);
    while out.len() < chars {
        let s = format!(
            "{} {} {}. ",
            SUBJECTS[rng.below(6) as usize],
            VERBS[rng.below(6) as usize],
            OBJECTS[rng.below(6) as usize]
        );
        out.extend_from_slice(s.as_bytes());
    }
    out.truncate(chars);
    out
}

fn load_file(f: &FileData, format: FileFormat, fetcher: &Fetcher) -> Result<Data, DataError> {
    let url = f.url.as_str();
    let path = fetcher.materialize(url).map_err(|e| unreadable(url, e))?;
    if !path.is_file() {
        return Err(unreadable(url, "no such file"));
    }
    let named = match format {
        FileFormat::Text => {
            let bytes = std::fs::read(&path).map_err(|e| unreadable(url, e))?;
            return Ok(Data::Text(Tensor::from_slice(&bytes)));
        }
        FileFormat::Npz => Tensor::read_npz(&path).map_err(|e| unreadable(url, e))?,
        FileFormat::Safetensors => {
            Tensor::read_safetensors(&path).map_err(|e| unreadable(url, e))?
        }
        // These are always streamed (see `Dataset::load`).
        FileFormat::Parquet | FileFormat::ImageFolder | FileFormat::Webdataset => {
            return Err(unreadable(url, "this format is read shard by shard"))
        }
    };
    let get = |name: &str| {
        named
            .iter()
            .find(|(n, _)| n == name || n.trim_end_matches(".npy") == name)
            .map(|(_, t)| t.shallow_clone())
            .ok_or_else(|| {
                DataError::Shape(format!(
                    "{url} has no tensor named {name:?} (found {:?})",
                    named.iter().map(|(n, _)| n).collect::<Vec<_>>()
                ))
            })
    };
    let x = match &f.inputs {
        Some(names) => {
            let parts = names
                .iter()
                .map(|n| get(n))
                .collect::<Result<Vec<_>, _>>()?;
            super::formats::stack_inputs(url, names, parts)?
        }
        None => get("x")?,
    };
    Ok(Data::Tensors { x, y: get("y")? })
}

impl Dataset {
    /// Loads (or generates) the dataset of `spec` (a file through
    /// `fetcher`), checks it against the model and the loss, and splits it.
    pub fn load(spec: &UncheckedJobSpec, fetcher: &Fetcher) -> Result<Dataset, DataError> {
        if let DatasetSpec::File(f) = &spec.dataset() {
            let mb = fetcher.data_memory_mb();
            let eval_only = |url: &str| -> Result<Arc<Sharded>, DataError> {
                let mut e = f.clone();
                e.url = url.to_owned();
                e.eval_url = None;
                let mut s = spec.clone();
                s.eval_fraction = 0.0;
                Ok(Arc::new(Sharded::open(&s, &e, fetcher, mb)?.into_eval()))
            };
            if f.is_sharded() {
                let s = Sharded::open(spec, f, fetcher, mb)?;
                if f.eval_url.is_none() && spec.eval_fraction > 0.0 {
                    // A few units (a Parquet file of one or a few row
                    // groups, as polars and pyarrow write a table smaller
                    // than their row group size) hold out a whole unit or
                    // none, far from the fraction asked for: a small set's
                    // rows are split in memory instead, as a whole file's
                    // are.
                    if let Some((x, y)) = s.small_set()? {
                        return Dataset::split_rows(
                            spec,
                            check(spec, Data::Tensors { x, y })?,
                            true,
                        );
                    }
                }
                let s = Arc::new(s);
                return Ok(Dataset {
                    data: Data::Text(Tensor::new()),
                    train: Vec::new(),
                    eval: Vec::new(),
                    eval_shards: (s.eval_len() > 0).then(|| s.clone()),
                    sharded: Some(s),
                });
            }
            if let Some(u) = &f.eval_url {
                let eval = eval_only(u)?;
                let mut d = Dataset::load_whole(spec, fetcher, false)?;
                d.eval_shards = Some(eval);
                return Ok(d);
            }
        }
        Dataset::load_whole(spec, fetcher, true)
    }

    /// Why the data loader stopped: a sharded set's reason, or a generic one.
    pub fn loader_failure(&self) -> String {
        self.sharded.as_ref().and_then(|s| s.failure()).map_or_else(
            || "the data loader stopped".into(),
            |e| format!("data: {e}"),
        )
    }

    /// A sharded training set's loader figures (`None` in memory).
    pub fn stats(&self) -> Option<Arc<DataStats>> {
        self.sharded.as_ref().map(|s| s.stats.clone())
    }

    /// Held-out loss and accuracy over held-out shards, unit by unit
    /// (`None` without them).
    pub fn evaluate_shards(
        &self,
        eval: &mut super::decode::EvalFn<'_>,
    ) -> Option<Result<(f64, Option<f64>), DataError>> {
        let s = self.eval_shards.as_ref()?;
        s.evaluate(eval).transpose()
    }

    fn load_whole(
        spec: &UncheckedJobSpec,
        fetcher: &Fetcher,
        hold_out: bool,
    ) -> Result<Dataset, DataError> {
        let data = match &spec.dataset() {
            DatasetSpec::File(f) => {
                let fmt = f
                    .format
                    .or_else(|| trainyard_common::spec::file_format_from_url(&f.url))
                    .unwrap_or(FileFormat::Npz);
                load_file(f, fmt, fetcher)?
            }
            _ => generated(spec)?,
        };
        Dataset::split_rows(spec, check(spec, data)?, hold_out)
    }

    /// `data` in memory, its held-out rows (`spec.eval_fraction` of them
    /// when `hold_out`) drawn by the seed.
    fn split_rows(
        spec: &UncheckedJobSpec,
        data: Data,
        hold_out: bool,
    ) -> Result<Dataset, DataError> {
        let n = match &data {
            Data::Tensors { x, .. } => x.size()[0] as usize,
            // Windows start anywhere a full window fits.
            Data::Text(t) => (t.size()[0] as usize).saturating_sub(context(spec) + 1),
        };
        if n < 2 {
            return Err(DataError::Shape(format!(
                "{n} sample(s): too few to train and evaluate"
            )));
        }
        let order = Rng::new(spec.seed, 0x5E1).permutation(n);
        let fraction = if hold_out { spec.eval_fraction } else { 0.0 };
        let n_eval = ((n as f64 * fraction).round() as usize).min(n - 1);
        Ok(Dataset {
            eval: order[..n_eval].to_vec(),
            train: order[n_eval..].to_vec(),
            data,
            sharded: None,
            eval_shards: None,
        })
    }

    /// The largest class label of a classification dataset (integer
    /// targets), or `None`.
    pub fn label_max(&self) -> Option<i64> {
        match &self.data {
            Data::Tensors { y, .. } if !y.is_floating_point() && y.numel() > 0 => {
                Some(y.max().int64_value(&[]))
            }
            _ => None,
        }
    }

    /// Training samples (all workers together).
    pub fn train_len(&self) -> usize {
        match &self.sharded {
            Some(s) => s.train_len(),
            None => self.train.len(),
        }
    }

    /// The evaluation set as one batch.
    pub fn eval_batch(&self, spec: &UncheckedJobSpec) -> Option<(Tensor, Tensor)> {
        if self.eval.is_empty() {
            return None;
        }
        // Bounded so evaluation of a large set stays cheap.
        let idx: Vec<i64> = self.eval.iter().copied().take(4096).collect();
        let (x, y) = gather(&self.data, &idx, spec);
        Some((Pixels::of(spec).finish(x), y))
    }

    /// Starts the background batcher of worker `rank` of `world` from
    /// `cursor`; it stops when the receiver is dropped. See [`slice()`].
    pub fn stream(
        &self,
        spec: &UncheckedJobSpec,
        rank: u32,
        world: u32,
        cursor: Cursor,
    ) -> Receiver<Batch> {
        if let Some(s) = &self.sharded {
            return s.stream(rank, world, cursor);
        }
        let (tx, rx) = sync_channel(PREFETCH);
        let spec = spec.clone();
        let batch = spec.batch_size() as usize;
        // Tensors are not `Sync`: the loader gets handles of its own that
        // share the storage.
        let data = match &self.data {
            Data::Tensors { x, y } => Data::Tensors {
                x: x.shallow_clone(),
                y: y.shallow_clone(),
            },
            Data::Text(t) => Data::Text(t.shallow_clone()),
        };
        let train = self.train.clone();
        let pixels = Pixels::of(&spec);
        std::thread::spawn(move || {
            let mut cursor = cursor;
            let len = train.len();
            let mut order = epoch_order(&train, spec.seed, cursor.epoch);
            loop {
                let (range, next) = slice(len, batch, rank, world, cursor);
                let mine = &order[range];
                let (x, y) = if mine.is_empty() {
                    (Tensor::new(), Tensor::new())
                } else {
                    let (x, y) = gather(&data, mine, &spec);
                    (pixels.finish(x), y)
                };
                let b = Batch {
                    x,
                    y,
                    samples: mine.len(),
                    next,
                    id_hash: mine
                        .iter()
                        .fold(0u64, |h, &i| h.wrapping_add(super::order::id_mix(i as u64))),
                };
                if tx.send(b).is_err() {
                    return;
                }
                if next.epoch != cursor.epoch {
                    order = epoch_order(&train, spec.seed, next.epoch);
                }
                cursor = next;
            }
        });
        rx
    }
}

/// The training indices of `epoch` in their seeded order; every worker
/// computes the same.
pub fn epoch_order(train: &[i64], seed: u64, epoch: u64) -> Vec<i64> {
    Rng::new(seed, 0xE0C0 + epoch)
        .permutation(train.len())
        .iter()
        .map(|&i| train[i as usize])
        .collect()
}

/// Global steps an epoch takes from `offset` with `world` workers.
pub fn steps_left_in_epoch(len: usize, batch: usize, world: u32, offset: u64) -> u64 {
    let left = len.saturating_sub(offset as usize);
    left.div_ceil((world.max(1) as usize * batch).max(1)) as u64
}

/// Steps a worker of `world` took to reach `cursor` from the start of the
/// data, `len` samples an epoch in steps of `batch` a worker: the inverse
/// of walking [`super::samples::slice`] from the start (a step that
/// crosses an epoch's end ends it).
pub fn steps_before(len: usize, batch: usize, world: u32, cursor: super::Cursor) -> u64 {
    let per_epoch = steps_left_in_epoch(len, batch, world, 0);
    let into = steps_left_in_epoch(len, batch, world, 0)
        - steps_left_in_epoch(len, batch, world, cursor.offset);
    cursor.epoch.saturating_mul(per_epoch).saturating_add(into)
}

fn context(spec: &UncheckedJobSpec) -> usize {
    match &spec.model() {
        ModelSpec::Transformer(t) => t.context as usize,
        _ => 64,
    }
}

fn gather(data: &Data, idx: &[i64], spec: &UncheckedJobSpec) -> (Tensor, Tensor) {
    let index = Tensor::from_slice(idx);
    match data {
        Data::Tensors { x, y } => (x.index_select(0, &index), y.index_select(0, &index)),
        Data::Text(t) => {
            let c = context(spec) as i64;
            let windows: Vec<Tensor> = idx.iter().map(|&s| t.narrow(0, s, c + 1)).collect();
            let w = Tensor::stack(&windows, 0).to_kind(Kind::Int64);
            (w.narrow(1, 0, c), w.narrow(1, 1, c))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// However the membership changes between steps, every sample of an
        /// epoch is trained on exactly once.
        #[test]
        fn each_sample_of_an_epoch_once_whatever_the_worlds(len in 1usize..500, batch in 1usize..40, worlds in proptest::collection::vec(1u32..7, 1..40)) {
            let mut seen = vec![0u32; len];
            let mut cursor = Cursor::default();
            let mut i = 0;
            while cursor.epoch == 0 {
                let world = worlds[i % worlds.len()];
                i += 1;
                let mut next = None;
                for rank in 0..world {
                    let (r, n) = slice(len, batch, rank, world, cursor);
                    prop_assert!(r.len() <= batch);
                    for p in r { seen[p] += 1; }
                    prop_assert!(next.is_none_or(|m| m == n));
                    next = Some(n);
                }
                cursor = next.unwrap();
            }
            prop_assert!(seen.iter().all(|&c| c == 1), "{:?}", seen);
        }

        /// A worker that takes up another's place in the data counts the
        /// steps that place took: walking `k` steps from the start reaches
        /// a cursor `steps_before` gives `k` for, across epochs' ends.
        #[test]
        fn steps_before_a_cursor_are_the_steps_walked_to_it(len in 1usize..500, batch in 1usize..40, world in 1u32..7, k in 0u64..200) {
            let mut cursor = Cursor::default();
            for _ in 0..k {
                cursor = slice(len, batch, 0, world, cursor).1;
            }
            prop_assert_eq!(steps_before(len, batch, world, cursor), k);
        }
    }

    #[test]
    fn a_new_seeded_order_each_epoch() {
        let train: Vec<i64> = (100..1100).collect();
        let mut sorted = epoch_order(&train, 9, 0);
        assert_ne!(sorted, epoch_order(&train, 9, 1));
        assert_eq!(epoch_order(&train, 9, 3), epoch_order(&train, 9, 3));
        sorted.sort_unstable();
        assert_eq!(sorted, train);
        assert_eq!(steps_left_in_epoch(1000, 10, 4, 0), 25);
        assert_eq!(steps_left_in_epoch(1000, 10, 3, 990), 1);
    }
}
