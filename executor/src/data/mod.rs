//! Training data: generated sets, whole files in memory, and sharded
//! datasets (many objects — a `*` glob or a `.json` manifest of npz,
//! safetensors, Parquet or WebDataset shards, or an image folder) streamed
//! through the executor's cache tier within a memory budget, each worker
//! reading only the shards its share of the epoch needs. The replica
//! ([`crate::replica`]) takes its batches from here; nothing here knows
//! about models beyond the check that data fits one.
//!
//! **In memory.** [`Dataset`] loads a generated set or a whole file,
//! splits it by the seed and streams seeded, sharded batches from a
//! background thread ([`dataset`]).
//!
//! **Listing.** [`ShardSet::open`] lists the shards (sorted by URL, so
//! every worker sees the same list) and learns each one's sample count and
//! units — Parquet row groups, runs of 256 samples of a WebDataset tar, or
//! the whole file for npz and safetensors — from its metadata alone: a
//! Parquet footer, the zip directory and `.npy` headers of an npz, the JSON
//! header of a safetensors file, each read with range requests, or a tar's
//! headers. A manifest may give the counts itself. An image folder is a
//! shard of one sample per image. Every shard URL goes through the job's data policy.
//!
//! **Order.** An epoch's *stream* is the training shards in a seeded order
//! of that epoch, each shard's samples in file order. The stream is cut
//! into `lanes` contiguous parts (the job's largest worker count), each
//! lane into shuffle windows of `shuffle_buffer` samples permuted by the
//! seed, and each lane into blocks of `batch_size`; the epoch's *order* is
//! the blocks taken round-robin over the lanes ([`Plan`]). The global data
//! cursor `(epoch, offset)` counts positions of that order, and a step
//! takes the next `world × batch` of them, rank `r` the `r`-th run, exactly
//! as for a dataset in memory ([`slice()`]): every sample of an
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
//!
//! **Files.** `rng` is the seeded generator; `pixels` what a batch's
//! features go through as it is assembled (random image transforms,
//! conversion to floats); `samples` is what both kinds serve (data,
//! cursor, batch, the split of a step, the check against the model); `formats` reads each file format's metadata and units (one
//! file per format); `listing` lists the shards with them; `order` is the
//! epoch's arithmetic; `sharded` is the sharded dataset (split, memory
//! budget, accounting), `decode` one of its units in memory and the
//! held-out evaluation, `loader` the stream of batches; `dataset` is what
//! the replica holds, whole or sharded. Each uses only files before it in
//! this list.

pub mod dataset;
mod decode;
pub mod formats;
mod listing;
mod loader;
mod order;
pub mod pixels;
pub mod rng;
pub mod samples;
mod sharded;

#[cfg(test)]
mod loader_tests;
#[cfg(test)]
mod tests;

pub use dataset::{
    epoch_order, generated_text, steps_before, steps_left_in_epoch, Dataset, PREFETCH,
};
pub use decode::EvalFn;
pub use formats::Columns;
pub use listing::{Shard, ShardSet, MAX_SHARDS};
pub use loader::PREFETCH_WINDOWS;
pub use order::{id_mix, shard_order, stream_position, window_perm, Plan};
pub use samples::{slice, Batch, Cursor, Data, DataError};
pub use sharded::{
    DataStats, Sharded, DEFAULT_MEMORY_MB, DEFAULT_SHUFFLE_BUFFER, PREFETCH_BATCHES,
};
