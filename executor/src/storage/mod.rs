//! Object storage from the executor's side: the store a job's checkpoints
//! and weights go to, the files (datasets, TorchScript models) roles read
//! from object-store URLs, and checkpoints ([`checkpoint`]).
//!
//! * [`Storage`] — one opened store with the executor's local cache tier,
//!   usable from training threads (it blocks on the agent's runtime).
//! * [`Fetcher`] — how this executor reaches any store (options, cache,
//!   runtime); [`Fetcher::materialize`] turns a URL into a local file.
//! * [`write_weights`] — a job's final weights as safetensors.
//! * [`checkpoint`] — when to checkpoint, the background uploader, loading.

pub mod checkpoint;

use bytes::Bytes;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use trainyard_store::cache::Cache;
use trainyard_store::{shard, Store, StoreError};
use uuid::Uuid;

/// Why object storage failed a role.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The store said no (or could not be reached).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A local file (the cache tier, a temporary file) failed.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A URL this executor cannot read.
    #[error("{url}: {reason}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        reason: &'static str,
    },
    /// A checkpoint that is not what its manifest says, or not this model's.
    #[error("{0}")]
    Checkpoint(String),
    /// libtorch could not write the weights.
    #[error("cannot write {path}: {reason}")]
    Encode {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// A job's store as roles receive it: opened once per executor and shared,
/// or why it could not be opened (the roles go on without checkpoints).
pub type OpenedStorage = Result<Arc<Storage>, Arc<StorageError>>;

/// No store at all: roles run without checkpoints or final weights (unit
/// tests, benchmarks).
pub fn no_storage() -> OpenedStorage {
    Err(Arc::new(StorageError::Url {
        url: String::new(),
        reason: "no object store in this process",
    }))
}

/// The object store and the local cache tier, usable from training threads.
pub struct Storage {
    /// The store.
    pub store: Store,
    /// The local cache tier.
    pub cache: Arc<Cache>,
    rt: tokio::runtime::Handle,
}

impl Storage {
    /// Opens the store at `url`.
    pub fn open(
        url: &str,
        options: &[(String, String)],
        cache: Arc<Cache>,
        rt: tokio::runtime::Handle,
    ) -> Result<Storage, StorageError> {
        let store = Store::open(url, options)?;
        Ok(Storage { store, cache, rt })
    }

    /// Writes `bytes` at `key` in the store (not through the cache).
    pub fn put(&self, key: &str, bytes: Bytes) -> Result<(), StorageError> {
        Ok(self.rt.block_on(self.store.put(key, bytes))?)
    }

    /// Reads `key` through the local cache (checked against `sha256`).
    pub fn read(&self, key: &str, sha256: Option<&str>) -> Result<Bytes, StorageError> {
        Ok(self
            .rt
            .block_on(self.cache.read_through(&self.store, key, sha256))?)
    }

    /// Reads `key` from the store itself.
    pub fn read_remote(&self, key: &str) -> Result<Bytes, StorageError> {
        Ok(self.rt.block_on(self.store.get(key))?)
    }
}

/// How this executor reaches object storage: the options of its stores
/// (`aws_endpoint=…`), its local cache tier, and the runtime their I/O
/// runs on. `None` parts mean a process without object-store access (unit
/// tests, benchmarks): only `file://` URLs are read.
#[derive(Clone)]
pub struct Fetcher {
    remote: Option<Remote>,
}

#[derive(Clone)]
struct Remote {
    options: Vec<(String, String)>,
    cache: Arc<Cache>,
    rt: tokio::runtime::Handle,
}

impl Fetcher {
    /// Reaches stores with `options` through `cache`, doing I/O on `rt`.
    pub fn new(
        options: Vec<(String, String)>,
        cache: Arc<Cache>,
        rt: tokio::runtime::Handle,
    ) -> Fetcher {
        Fetcher {
            remote: Some(Remote { options, cache, rt }),
        }
    }

    /// Reads local files only.
    pub fn local_only() -> Fetcher {
        Fetcher { remote: None }
    }

    /// Opens the store at `url` through this executor's cache.
    pub fn open(&self, url: &str) -> Result<Storage, StorageError> {
        let r = self.remote.as_ref().ok_or(StorageError::Url {
            url: url.to_owned(),
            reason: "no object store configured",
        })?;
        Storage::open(url, &r.options, r.cache.clone(), r.rt.clone())
    }

    /// A local file holding the object at `url` (a dataset or a TorchScript
    /// model at an object-store URL): the file itself for `file://`, else
    /// the object fetched through the local cache tier (read from disk when
    /// it is already there).
    pub fn materialize(&self, url: &str) -> Result<PathBuf, StorageError> {
        if let Some(p) = url.strip_prefix("file://") {
            return Ok(PathBuf::from(p));
        }
        let r = self.remote.as_ref().ok_or(StorageError::Url {
            url: url.to_owned(),
            reason: "this process has no object-store access",
        })?;
        if let Some(p) = r.cache.path_of(url) {
            r.cache.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(p);
        }
        let (parent, name) = url.rsplit_once('/').ok_or(StorageError::Url {
            url: url.to_owned(),
            reason: "not an object URL",
        })?;
        let store = Store::open(parent, &r.options)?;
        let bytes = r.rt.block_on(store.get(name))?;
        r.cache.misses.fetch_add(1, Ordering::Relaxed);
        match r.cache.put(url, &bytes) {
            Ok(Some(p)) => Ok(p),
            // Larger than the whole cache: a private temporary file.
            _ => {
                let p = std::env::temp_dir().join(format!(
                    "trainyard-{}-{}",
                    std::process::id(),
                    shard::sha256(url.as_bytes())
                ));
                std::fs::write(&p, &bytes).map_err(|source| StorageError::File {
                    path: p.clone(),
                    source,
                })?;
                Ok(p)
            }
        }
    }
}

/// Writes the final weights to `{store}/{job}/final/model.safetensors`
/// (through a local file: libtorch writes safetensors to paths); returns
/// their URL.
pub fn write_weights(
    storage: &Storage,
    job: Uuid,
    weights: &[(String, tch::Tensor)],
) -> Result<String, StorageError> {
    let tmp = storage.cache.dir().join(format!(
        "final-{job}-{}.safetensors.tmp",
        std::process::id()
    ));
    tch::Tensor::write_safetensors(weights, &tmp).map_err(|e| StorageError::Encode {
        path: tmp.clone(),
        reason: e.to_string(),
    })?;
    let bytes = std::fs::read(&tmp).map_err(|source| StorageError::File {
        path: tmp.clone(),
        source,
    });
    let _ = std::fs::remove_file(&tmp);
    let key = trainyard_common::checkpoint::model_key(job);
    storage.put(&key, bytes?.into())?;
    Ok(storage.store.url_of(&key))
}
