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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use trainyard_common::artifact::DataPolicy;
use trainyard_common::spec::glob_matches;
use trainyard_store::cache::Cache;
use trainyard_store::{shard, Store, StoreError};
use uuid::Uuid;

/// Entries of a folder a glob may look through: a glob over a bigger
/// folder (or bucket) is refused rather than listed for minutes.
pub const MAX_LISTED: usize = 250_000;

/// Data memory budget of an executor (MiB) unless its flag or the spec
/// says: the default of the budget each [`Fetcher`] carries to the sharded
/// loader. It is defined here, and re-exported by `data`, so
/// that storage needs nothing of the replica.
pub const DEFAULT_MEMORY_MB: u64 = 256;

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
    /// The job may not read this URL (its data policy, from the API).
    #[error("{url}: refused: {reason}")]
    Refused {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// A glob's folder holds more entries than a glob looks through.
    #[error("{url}: the folder holds more than {limit} entries, more than a glob looks through: list the shards in a manifest (.json) instead")]
    TooManyToList {
        /// The glob.
        url: String,
        /// How many entries a glob looks through.
        limit: usize,
    },
    /// An artifact's bytes are not those the API recorded.
    #[error("{url}: the bytes read have SHA-256 {found}, the artifact recorded {expected}")]
    Corrupt {
        /// The URL.
        url: String,
        /// The recorded digest.
        expected: String,
        /// The digest of what was read.
        found: String,
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

    /// Keys and sizes under `prefix`, sorted.
    pub fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, StorageError> {
        Ok(self.rt.block_on(self.store.list(prefix))?)
    }

    /// A store in folder `dir` (`store/`, with its cache in `cache/`) for
    /// unit tests, with the runtime its I/O runs on (keep it alive).
    #[cfg(test)]
    pub(crate) fn for_tests(dir: &std::path::Path) -> (Storage, tokio::runtime::Runtime) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let cache = Arc::new(Cache::open(&dir.join("cache"), 1 << 20).expect("a cache"));
        let url = format!("file://{}", dir.join("store").display());
        let s = Storage::open(&url, &[], cache, rt.handle().clone()).expect("a file store");
        (s, rt)
    }

    /// Deletes every object under `prefix`; how many.
    pub fn delete_prefix(&self, prefix: &str) -> Result<usize, StorageError> {
        Ok(self.rt.block_on(self.store.delete_prefix(prefix))?)
    }
}

/// How this executor reaches object storage: the options of its stores
/// (`aws_endpoint=…`), its local cache tier, and the runtime their I/O
/// runs on. `None` parts mean a process without object-store access (unit
/// tests, benchmarks): only `file://` URLs are read.
///
/// A role's fetcher carries its job's [`DataPolicy`] ([`Fetcher::with_policy`]):
/// every URL is checked against it before anything is opened, a `file://`
/// path again once its links are resolved, and an artifact's bytes against
/// the SHA-256 the API recorded.
#[derive(Clone)]
pub struct Fetcher {
    remote: Option<Remote>,
    policy: Option<Arc<DataPolicy>>,
    /// MiB a sharded dataset's loaded data may use where its spec gives no
    /// `memory_mb` (the executor's `--data-memory-mb`).
    data_memory_mb: u64,
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
            policy: None,
            data_memory_mb: DEFAULT_MEMORY_MB,
        }
    }

    /// Reads local files only.
    pub fn local_only() -> Fetcher {
        Fetcher {
            remote: None,
            policy: None,
            data_memory_mb: DEFAULT_MEMORY_MB,
        }
    }

    /// This fetcher, reading only what `policy` allows. Its `file://`
    /// prefixes also count with their links resolved on this host, since
    /// the paths it opens are compared resolved.
    pub fn with_policy(&self, mut policy: DataPolicy) -> Fetcher {
        let resolved = |prefixes: &[String]| -> Vec<String> {
            prefixes
                .iter()
                .filter_map(|p| p.strip_prefix("file://"))
                .filter_map(|dir| std::fs::canonicalize(dir).ok())
                .map(|real| {
                    trainyard_common::artifact::normalize_prefix(&format!(
                        "file://{}",
                        real.display()
                    ))
                })
                .collect()
        };
        let (allowed, denied) = (
            resolved(&policy.allowed_prefixes),
            resolved(&policy.denied_prefixes),
        );
        for (list, extra) in [
            (&mut policy.allowed_prefixes, allowed),
            (&mut policy.denied_prefixes, denied),
        ] {
            for p in extra {
                if !list.contains(&p) {
                    list.push(p);
                }
            }
        }
        Fetcher {
            remote: self.remote.clone(),
            policy: Some(Arc::new(policy)),
            data_memory_mb: self.data_memory_mb,
        }
    }

    /// This fetcher with a data memory budget of `mb` MiB for sharded
    /// datasets whose spec gives none.
    pub fn with_data_memory_mb(mut self, mb: u64) -> Fetcher {
        self.data_memory_mb = mb.max(1);
        self
    }

    /// The data memory budget, in MiB, of sharded datasets whose spec
    /// gives none.
    pub fn data_memory_mb(&self) -> u64 {
        self.data_memory_mb
    }

    /// Why the job may not read `url`, if it may not.
    fn refused(&self, url: &str) -> Result<(), StorageError> {
        match self.policy.as_ref().and_then(|p| p.refusal(url)) {
            None => Ok(()),
            Some(reason) => Err(StorageError::Refused {
                url: url.to_owned(),
                reason,
            }),
        }
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
    /// An object larger than the whole cache is a private file that lives
    /// as long as the returned value.
    pub fn materialize(&self, url: &str) -> Result<Fetched, StorageError> {
        self.fetch(url)
    }

    /// The objects a glob names (`*` in its last segment only), sorted by
    /// URL; `artifact:` globs match the job's resolved artifacts by name.
    /// Each one is checked against the policy again when it is read.
    pub fn list_glob(&self, pattern: &str) -> Result<Vec<String>, StorageError> {
        self.list_glob_within(pattern, MAX_LISTED)
    }

    /// [`Fetcher::list_glob`], looking through at most `limit` entries.
    fn list_glob_within(&self, pattern: &str, limit: usize) -> Result<Vec<String>, StorageError> {
        let too_many = || StorageError::TooManyToList {
            url: pattern.to_owned(),
            limit,
        };
        let bad = |reason| StorageError::Url {
            url: pattern.to_owned(),
            reason,
        };
        if let Some(name) = trainyard_common::artifact::artifact_of(pattern) {
            let mut out: Vec<String> = self
                .policy
                .iter()
                .flat_map(|p| p.artifacts.iter())
                .filter(|a| glob_matches(name, &a.name))
                .map(|a| a.url.clone())
                .collect();
            out.sort();
            out.dedup();
            return Ok(out);
        }
        let (folder, name) = pattern.rsplit_once('/').ok_or(bad("not an object URL"))?;
        if folder.contains('*') {
            return Err(bad("only the last path segment may hold `*`"));
        }
        // The folder itself must be one the job may read.
        self.refused(&format!("{folder}/{}", name.replace('*', "x")))?;
        let mut out = Vec::new();
        if let Some(dir) = folder.strip_prefix("file://") {
            let entries = std::fs::read_dir(dir).map_err(|source| StorageError::File {
                path: PathBuf::from(dir),
                source,
            })?;
            for (seen, e) in entries.flatten().enumerate() {
                if seen >= limit {
                    return Err(too_many());
                }
                let n = e.file_name().to_string_lossy().into_owned();
                if glob_matches(name, &n) && e.path().is_file() {
                    out.push(format!("{folder}/{n}"));
                }
            }
        } else {
            let r = self
                .remote
                .as_ref()
                .ok_or(bad("this process has no object-store access"))?;
            let store = Store::open(folder, &r.options)?;
            let keys =
                r.rt.block_on(store.list_top(|k| glob_matches(name, k), limit))?
                    .ok_or_else(too_many)?;
            out.extend(keys.into_iter().map(|k| format!("{folder}/{k}")));
        }
        out.sort();
        Ok(out)
    }

    /// Every object under the folder `url` (ending in `/`), nested ones
    /// too, that `keep` accepts (given the path relative to the folder),
    /// sorted, looking through at most [`MAX_LISTED`] entries. Local
    /// folders are walked without following symbolic links, so a link
    /// cannot lead the listing out of the folder the policy allowed.
    pub fn list_tree(
        &self,
        url: &str,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, StorageError> {
        let folder = url.trim_end_matches('/');
        let too_many = || StorageError::TooManyToList {
            url: url.to_owned(),
            limit: MAX_LISTED,
        };
        self.refused(&format!("{folder}/x"))?;
        let mut out = Vec::new();
        if let Some(dir) = folder.strip_prefix("file://") {
            let mut stack = vec![(PathBuf::from(dir), String::new(), 0usize)];
            let mut seen = 0usize;
            while let Some((path, rel, depth)) = stack.pop() {
                let entries = std::fs::read_dir(&path).map_err(|source| StorageError::File {
                    path: path.clone(),
                    source,
                })?;
                for e in entries.flatten() {
                    seen += 1;
                    if seen > MAX_LISTED {
                        return Err(too_many());
                    }
                    let name = e.file_name().to_string_lossy().into_owned();
                    let r = if rel.is_empty() {
                        name
                    } else {
                        format!("{rel}/{name}")
                    };
                    let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                        continue;
                    };
                    if meta.is_dir() && depth < 16 {
                        stack.push((e.path(), r, depth + 1));
                    } else if meta.is_file() && keep(&r) {
                        out.push(format!("{folder}/{r}"));
                    }
                }
            }
        } else {
            let r = self.remote.as_ref().ok_or(StorageError::Url {
                url: url.to_owned(),
                reason: "this process has no object-store access",
            })?;
            let store = Store::open(folder, &r.options)?;
            let keys =
                r.rt.block_on(store.list_within(&keep, MAX_LISTED))?
                    .ok_or_else(too_many)?;
            out.extend(keys.into_iter().map(|k| format!("{folder}/{k}")));
        }
        out.sort();
        Ok(out)
    }

    /// Bytes `range` of the object at `url` (a header), without reading
    /// the rest, checked against the policy like [`Fetcher::materialize`].
    pub fn read_range(
        &self,
        url: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, StorageError> {
        if url.starts_with("file://") {
            let path = self.materialize(url)?;
            return read_file_range(&path, Some(range)).map(|(b, _)| b);
        }
        self.refused(url)?;
        let (store, name) = self.remote_parent(url)?;
        let r = self.remote.as_ref().expect("remote_parent checked");
        Ok(r.rt.block_on(store.get_range(name, range))?)
    }

    /// The last `n` bytes of the object at `url` (a footer) and its size.
    pub fn read_tail(&self, url: &str, n: u64) -> Result<(Bytes, u64), StorageError> {
        if url.starts_with("file://") {
            let path = self.materialize(url)?;
            return read_file_range(&path, None).and_then(|(_, size)| {
                let from = size.saturating_sub(n);
                read_file_range(&path, Some(from..size)).map(|(b, _)| (b, size))
            });
        }
        self.refused(url)?;
        let (store, name) = self.remote_parent(url)?;
        let r = self.remote.as_ref().expect("remote_parent checked");
        Ok(r.rt.block_on(store.get_tail(name, n))?)
    }

    fn remote_parent<'u>(&self, url: &'u str) -> Result<(Store, &'u str), StorageError> {
        let r = self.remote.as_ref().ok_or(StorageError::Url {
            url: url.to_owned(),
            reason: "this process has no object-store access",
        })?;
        let (parent, name) = url.rsplit_once('/').ok_or(StorageError::Url {
            url: url.to_owned(),
            reason: "not an object URL",
        })?;
        Ok((Store::open(parent, &r.options)?, name))
    }

    /// [`Fetcher::materialize`], saying where the bytes came from.
    pub fn fetch(&self, url: &str) -> Result<Fetched, StorageError> {
        let local = |path: PathBuf| {
            let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
            Fetched {
                path,
                source: Source::Local(bytes),
                _private: None,
            }
        };
        self.refused(url)?;
        let artifact = self.policy.as_ref().and_then(|p| p.artifact(url)).cloned();
        if let Some(p) = url.strip_prefix("file://") {
            let path = PathBuf::from(p);
            let Some(policy) = self.policy.as_ref().filter(|p| !p.unrestricted) else {
                return Ok(local(path));
            };
            if let Some(a) = &artifact {
                // An artifact in a local store: the bytes must be the
                // version's (the store folder is the platform's, but a
                // file there can still be changed behind its back).
                check_file_digest(url, &path, &a.sha256)?;
                return Ok(local(path));
            }
            // A link under an allowed folder may lead anywhere: the place
            // it resolves to must be allowed too, and that place is what
            // is opened (so the link cannot be swapped after the check).
            let real = std::fs::canonicalize(&path).map_err(|e| StorageError::File {
                path: path.clone(),
                source: e,
            })?;
            let real_url = format!("file://{}", real.display());
            if let Some(why) = policy.refusal(&real_url) {
                return Err(StorageError::Refused {
                    url: url.to_owned(),
                    reason: if real_url == url {
                        why
                    } else {
                        format!("it resolves to {real_url}, outside what this job may read: {why}")
                    },
                });
            }
            return Ok(local(real));
        }
        let r = self.remote.as_ref().ok_or(StorageError::Url {
            url: url.to_owned(),
            reason: "this process has no object-store access",
        })?;
        if let Some(p) = r.cache.path_of(url) {
            r.cache.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Fetched {
                path: p,
                source: Source::Cache,
                _private: None,
            });
        }
        let (parent, name) = url.rsplit_once('/').ok_or(StorageError::Url {
            url: url.to_owned(),
            reason: "not an object URL",
        })?;
        let store = Store::open(parent, &r.options)?;
        let bytes = r.rt.block_on(store.get(name))?;
        if let Some(a) = &artifact {
            let found = shard::sha256(&bytes);
            if found != a.sha256 {
                return Err(StorageError::Corrupt {
                    url: url.to_owned(),
                    expected: a.sha256.clone(),
                    found,
                });
            }
        }
        r.cache.misses.fetch_add(1, Ordering::Relaxed);
        let source = Source::Store(bytes.len() as u64);
        match r.cache.put(url, &bytes) {
            Ok(Some(p)) => Ok(Fetched {
                path: p,
                source,
                _private: None,
            }),
            // Larger than the whole cache: a private temporary file.
            _ => {
                // Its own name per fetch: another thread may be reading
                // the file an earlier fetch of the same URL wrote.
                static PRIVATE: AtomicU64 = AtomicU64::new(0);
                let p = std::env::temp_dir().join(format!(
                    "trainyard-{}-{}-{}",
                    std::process::id(),
                    PRIVATE.fetch_add(1, Ordering::Relaxed),
                    shard::sha256(url.as_bytes())
                ));
                // Removed when the last user drops it, also when the
                // write fails half way.
                let private = Arc::new(PrivateFile(p.clone()));
                std::fs::write(&p, &bytes).map_err(|source| StorageError::File {
                    path: p.clone(),
                    source,
                })?;
                Ok(Fetched {
                    path: p,
                    source,
                    _private: Some(private),
                })
            }
        }
    }
}

/// A local file holding an object, and where its bytes came from. The
/// file stays while this value (or a clone) lives: a private copy of an
/// object too large for the cache tier is deleted with its last clone, so
/// such fetches never pile up in the temporary folder.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The file.
    pub path: PathBuf,
    /// Where the bytes came from.
    pub source: Source,
    _private: Option<Arc<PrivateFile>>,
}

impl std::ops::Deref for Fetched {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl AsRef<std::path::Path> for Fetched {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}

/// A temporary file of this process's own, removed on drop.
#[derive(Debug)]
struct PrivateFile(PathBuf);

impl Drop for PrivateFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Where a fetched object's bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A `file://` URL: read in place (its size).
    Local(u64),
    /// The local cache tier already held it.
    Cache,
    /// Fetched from the store now (its size).
    Store(u64),
}

/// Bytes `range` of a local file (all of it for `None`) and its size.
fn read_file_range(
    path: &std::path::Path,
    range: Option<std::ops::Range<u64>>,
) -> Result<(Bytes, u64), StorageError> {
    use std::io::{Read, Seek, SeekFrom};
    let err = |source| StorageError::File {
        path: path.to_owned(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(err)?;
    let size = f.metadata().map_err(err)?.len();
    let Some(range) = range else {
        return Ok((Bytes::new(), size));
    };
    let (from, to) = (range.start.min(size), range.end.min(size));
    f.seek(SeekFrom::Start(from)).map_err(err)?;
    let mut buf = vec![0u8; (to - from) as usize];
    f.read_exact(&mut buf).map_err(err)?;
    Ok((buf.into(), size))
}

/// Checks that the file at `path` (the object of `url`) has SHA-256
/// `expected`, reading it in pieces.
fn check_file_digest(
    url: &str,
    path: &std::path::Path,
    expected: &str,
) -> Result<(), StorageError> {
    use sha2::{Digest, Sha256};
    let file_error = |source| StorageError::File {
        path: path.to_owned(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(file_error)?;
    let mut hash = Sha256::new();
    std::io::copy(&mut f, &mut hash).map_err(file_error)?;
    let found = hex::encode(hash.finalize());
    if found != expected {
        return Err(StorageError::Corrupt {
            url: url.to_owned(),
            expected: expected.to_owned(),
            found,
        });
    }
    Ok(())
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use trainyard_common::artifact::ResolvedArtifact;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ty-fetch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn policy(allowed: &std::path::Path) -> DataPolicy {
        DataPolicy {
            unrestricted: false,
            allowed_prefixes: vec![format!("file://{}/", allowed.display())],
            denied_prefixes: vec!["s3://trainyard/objects/".into()],
            artifacts: vec![ResolvedArtifact {
                field: "model.url".into(),
                name: "m.pt".into(),
                url: "s3://trainyard/objects/artifacts/alice/v1/m.pt".into(),
                sha256: "00".into(),
                size: 1,
            }],
        }
    }

    fn refused(r: Result<Fetched, StorageError>) -> String {
        match r {
            Err(e @ StorageError::Refused { .. }) => e.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// A URL outside the policy is refused before anything is opened: the
    /// refusal names the policy even where the file does not exist (a read
    /// would have said "no such file").
    #[test]
    fn a_url_outside_the_policy_is_refused_before_it_is_opened() {
        let d = scratch("policy");
        let f = Fetcher::local_only().with_policy(policy(&d));
        for url in [
            "file:///nonexistent/secret.npz".to_owned(),
            format!("file://{}/../x.npz", d.display()),
            "s3://trainyard/objects/0190-job/final/model.safetensors".into(),
            "s3://trainyard/objects/artifacts/bob/v9/m.pt".into(),
            "s3://elsewhere/x.npz".into(),
        ] {
            let why = refused(f.materialize(&url));
            assert!(why.contains(&url), "{why}");
        }
        std::fs::write(d.join("ok.npz"), b"x").unwrap();
        let ok = format!("file://{}/ok.npz", d.display());
        assert_eq!(
            f.materialize(&ok).unwrap().path,
            std::fs::canonicalize(d.join("ok.npz")).unwrap()
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A link inside an allowed folder that leads out of it is refused.
    #[test]
    fn a_link_out_of_an_allowed_folder_is_refused() {
        let d = scratch("link");
        let allowed = d.join("allowed");
        std::fs::create_dir_all(&allowed).unwrap();
        std::fs::write(d.join("secret.txt"), b"the join token").unwrap();
        std::os::unix::fs::symlink(d.join("secret.txt"), allowed.join("data.txt")).unwrap();
        let f = Fetcher::local_only().with_policy(policy(&allowed));
        let why = refused(f.materialize(&format!("file://{}/data.txt", allowed.display())));
        assert!(why.contains("resolves to"), "{why}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A local artifact is read only with the bytes its version recorded.
    #[test]
    fn a_local_artifact_with_other_bytes_is_refused() {
        let d = scratch("digest");
        let file = d.join("m.pt");
        std::fs::write(&file, b"the version").unwrap();
        let url = format!("file://{}", file.display());
        let mut p = policy(&d);
        p.allowed_prefixes.clear();
        p.artifacts[0].url = url.clone();
        p.artifacts[0].sha256 = trainyard_store::shard::sha256(b"the version");
        let f = Fetcher::local_only().with_policy(p);
        assert_eq!(f.materialize(&url).unwrap().path, file);
        std::fs::write(&file, b"changed behind the store's back").unwrap();
        match f.materialize(&url) {
            Err(StorageError::Corrupt { .. }) => {}
            other => panic!("expected a digest mismatch, got {other:?}"),
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A local folder with more entries than a glob may look through is
    /// refused with a reason that names the way out.
    #[test]
    fn a_glob_over_a_folder_too_big_to_list_is_refused() {
        let d = scratch("many");
        for i in 0..10 {
            std::fs::File::create(d.join(format!("other-{i}"))).unwrap();
        }
        std::fs::write(d.join("part-0.npz"), b"x").unwrap();
        let glob = format!("file://{}/part-*.npz", d.display());
        let f = Fetcher::local_only();
        assert_eq!(
            f.list_glob_within(&glob, 11).unwrap(),
            [format!("file://{}/part-0.npz", d.display())]
        );
        let err = f.list_glob_within(&glob, 10).unwrap_err().to_string();
        assert!(
            err.contains("more than 10 entries") && err.contains("manifest"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// An object larger than the whole cache tier is read into a private
    /// file, which is gone once the last user of the fetch drops it (each
    /// such fetch used to leave its copy in the temporary folder). Needs
    /// the test S3 server `scripts/test` starts.
    #[test]
    fn an_object_larger_than_the_cache_is_a_private_file_removed_after_use() {
        let (options, prefix) = test_s3("unit");
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = Store::open(&prefix, &options).unwrap();
        let body = Bytes::from(vec![7u8; 64 << 10]);
        rt.block_on(store.put("big.bin", body.clone())).unwrap();
        rt.block_on(store.put("small.bin", Bytes::from_static(b"small")))
            .unwrap();
        let d = scratch("private");
        let cache = Arc::new(Cache::open(&d.join("cache"), 1 << 10).unwrap());
        let f = Fetcher::new(options, cache, rt.handle().clone());
        let small = f.fetch(&format!("{prefix}/small.bin")).unwrap();
        assert!(small.path.starts_with(d.join("cache")), "{small:?}");
        let big = f.fetch(&format!("{prefix}/big.bin")).unwrap();
        assert_eq!(big.source, Source::Store(64 << 10));
        assert!(!big.path.starts_with(d.join("cache")), "{big:?}");
        assert_eq!(std::fs::read(&big).unwrap(), body.as_ref());
        let (path, held) = (big.path.clone(), big.clone());
        drop(big);
        assert!(path.is_file(), "a clone still holds the file");
        drop(held);
        assert!(!path.exists(), "{} was left behind", path.display());
        assert!(small.path.is_file(), "the cache tier keeps its own files");
        rt.block_on(store.delete_prefix("")).unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Without a policy (unit tests, benchmarks) and with an admin's,
    /// anything local is read.
    #[test]
    fn an_unrestricted_policy_reads_anything() {
        let f = Fetcher::local_only().with_policy(DataPolicy::unrestricted());
        assert!(f.materialize("file:///etc/hostname").is_ok());
        assert!(Fetcher::local_only()
            .materialize("file:///etc/hostname")
            .is_ok());
    }

    /// The test S3 server's options (`scripts/test` starts Garage and sets
    /// `TRAINYARD_TEST_S3_*`) and a fresh prefix in its bucket named after
    /// `what`.
    pub(crate) fn test_s3(what: &str) -> (Vec<(String, String)>, String) {
        let var = |k: &str| {
            std::env::var(k).unwrap_or_else(|_| {
                panic!("{k} is not set: run ./scripts/test, which starts a Garage S3 server")
            })
        };
        let options: Vec<(String, String)> = [
            ("aws_endpoint", "TRAINYARD_TEST_S3_ENDPOINT"),
            ("aws_region", "TRAINYARD_TEST_S3_REGION"),
            ("aws_access_key_id", "TRAINYARD_TEST_S3_ACCESS_KEY_ID"),
            (
                "aws_secret_access_key",
                "TRAINYARD_TEST_S3_SECRET_ACCESS_KEY",
            ),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), var(v)))
        .chain([("aws_allow_http".to_owned(), "true".to_owned())])
        .collect();
        let prefix = format!(
            "{}/{what}-{}",
            var("TRAINYARD_TEST_S3_URL"),
            Uuid::new_v4().simple()
        );
        (options, prefix)
    }
}
