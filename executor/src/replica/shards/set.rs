//! The shard set: the objects one URL names (a `*` glob, a `.json`
//! manifest or one file), sorted by URL so every worker sees the same
//! list, each with its format, units and sample count from its metadata
//! ([`super::meta`]) or from the manifest. The ids of samples without an
//! id column are positions in this list.

use super::meta::{npz_meta, parquet_meta, safetensors_meta, unreadable, Columns};
use crate::replica::samples::DataError;
use crate::storage::Fetcher;
use trainyard_common::spec::{file_format_from_url, is_glob, is_manifest, FileData, FileFormat};

/// Most shards of one dataset.
pub const MAX_SHARDS: usize = 100_000;
/// Largest manifest read.
const MAX_MANIFEST_BYTES: u64 = 64 << 20;

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
