//! A sharded dataset ([`Sharded`]): its training and held-out entries
//! (a seeded split of the shards, or of one shard's units), the memory
//! budget that sizes the loader's caches, and the accounting of what was
//! read ([`DataStats`]). Decoding a unit and evaluating are in
//! [`super::decode`], streaming batches in [`super::loader`]; both are
//! further `impl Sharded` blocks over the fields kept here.

use super::formats::images::ImageRecipe;
use super::formats::Columns;
use super::listing::ShardSet;
use crate::data::rng::Rng;
use crate::data::samples::DataError;
use crate::storage::{Fetcher, Source};
use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use trainyard_common::spec::{FileData, UncheckedJobSpec};

/// Samples of the shuffle buffer unless the spec says.
pub const DEFAULT_SHUFFLE_BUFFER: u64 = 8192;
/// Data memory budget of an executor unless its flag or the spec says
/// (kept by the storage layer's [`Fetcher`], which carries the budget).
pub use crate::storage::DEFAULT_MEMORY_MB;
/// Batches the loader keeps ready ahead of the training loop.
pub const PREFETCH_BATCHES: usize = 4;

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
pub(super) struct Entry {
    pub(super) shard: usize,
    pub(super) units: Vec<usize>,
    pub(super) samples: u64,
}

/// A sharded dataset, ready to stream.
pub struct Sharded {
    pub(super) spec: UncheckedJobSpec,
    pub(super) fetcher: Fetcher,
    pub(super) columns: Columns,
    /// The held-out set's columns: those of `columns`, without the sample
    /// ids when it is a set of its own (`eval_url`: no sample of it is
    /// trained on, so none needs an id).
    pub(super) eval_columns: Columns,
    /// How images are decoded (image datasets).
    pub(super) images: ImageRecipe,
    pub(super) set: ShardSet,
    pub(super) eval_set: ShardSet,
    pub(super) train: Vec<Entry>,
    pub(super) eval: Vec<Entry>,
    pub(super) window: u64,
    pub(super) lanes: u32,
    pub(super) max_windows: usize,
    pub(super) unit_budget: u64,
    /// What the loaders did.
    pub stats: Arc<DataStats>,
    /// Why a loader stopped, for the job's failure.
    pub(super) failure: std::sync::Mutex<Option<String>>,
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
        all_entries(set)
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
        spec: &UncheckedJobSpec,
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
        let batches = PREFETCH_BATCHES as u64 * u64::from(spec.batch_size()) * row_bytes;
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
            images: ImageRecipe::of(f),
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

    /// Counts a fetch of a shard in the stats: reads by the loader as hits
    /// or misses, bytes from the store whoever fetched them.
    pub(super) fn count(&self, source: Source, by_loader: bool) {
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
}
