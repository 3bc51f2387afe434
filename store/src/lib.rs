//! Trainyard's object storage, shared by the API (which commits checkpoints
//! and serves models) and the executors (which write and read them). It has
//! no libtorch.
//!
//! * [`Store`] — an [`object_store`] opened from a URL (`file:///…`, the
//!   embedded default; `s3://bucket/prefix` with the endpoint, region and
//!   credentials from options or the standard `AWS_*` variables; `gs://`,
//!   `az://`, `http(s)://`, `memory://`), under the URL's prefix. Large
//!   objects go up as multipart uploads.
//! * [`shard`] — checkpoint shards as safetensors: the pieces a writer
//!   holds, concatenated, once for the weights and once per optimizer state
//!   tensor, with the pieces listed in the file's metadata.
//! * [`cache`] — an executor's local cache tier: shards are written to local
//!   disk first and flushed to the store in the background, and recently
//!   written or read objects (datasets, checkpoint shards) stay on disk
//!   within a size bound (least recently used out first), so a recovery on
//!   the same machine reads warm data.

pub mod cache;
pub mod shard;
mod store;

pub use store::{parse_options, Store, StoreError, Upload, MULTIPART_PART};
