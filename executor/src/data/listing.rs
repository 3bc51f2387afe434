//! The shard set: the objects one URL names (a `*` glob, a `.json`
//! manifest or one file), sorted by URL so every worker sees the same
//! list, each with its format, units and sample count from its metadata
//! ([`super::formats`]) or from the manifest; or the images of an image
//! folder, one shard each. The ids of samples without an
//! id column are positions in this list.

use super::formats::images::{is_image_name, ImageRecipe};
use super::formats::npz::{npz_meta, safetensors_meta};
use super::formats::parquet::parquet_meta;
use super::formats::webdataset;
use super::formats::{unreadable, Columns};
use crate::data::samples::DataError;
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
    /// The class of an image folder's image (its subfolder's place among
    /// the sorted subfolders).
    pub label: Option<i64>,
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
        let format = f.format.or_else(|| file_format_from_url(url));
        if format == Some(FileFormat::ImageFolder) {
            return ShardSet::image_folder(url, f, fetcher);
        }
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
            let (units, features, bytes) =
                match (format, samples) {
                    (FileFormat::Text, _) => {
                        return Err(unreadable(
                            &u,
                            "text cannot be sharded: use npz, safetensors or parquet",
                        ))
                    }
                    (FileFormat::Parquet, _) => parquet_meta(&u, fetcher, columns)?,
                    (FileFormat::ImageFolder, _) => return Err(unreadable(
                        &u,
                        "an image folder is one URL ending in /, not a shard of a glob or manifest",
                    )),
                    (FileFormat::Webdataset, n) => {
                        let n = match n {
                            Some(n) => n,
                            None => {
                                let local = fetcher.fetch(&u).map_err(|e| unreadable(&u, e))?;
                                webdataset::count(&local.path, &u)?
                            }
                        };
                        let features =
                            ImageRecipe::of(f).features(f.transforms.as_deref().unwrap_or(&[]));
                        (webdataset::units_of(n), features, 0)
                    }
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
                label: None,
            });
            base += n;
        }
        Ok(ShardSet { shards })
    }

    /// An image folder: every JPEG and PNG file in a subfolder of `url`
    /// (nested ones too), a shard of one sample each, its class the
    /// subfolder's place among the sorted subfolder names (as torchvision's
    /// `ImageFolder` numbers them).
    fn image_folder(url: &str, f: &FileData, fetcher: &Fetcher) -> Result<ShardSet, DataError> {
        if !url.ends_with('/') {
            return Err(unreadable(
                url,
                "an image folder's URL ends in / (one subfolder per class inside)",
            ));
        }
        let files = fetcher
            .list_tree(url, |rel| rel.contains('/') && is_image_name(rel))
            .map_err(|e| unreadable(url, e))?;
        if files.is_empty() {
            return Err(unreadable(
                url,
                "no .jpg, .jpeg or .png file in a class subfolder (the layout is <url>/<class>/<image>)",
            ));
        }
        if files.len() > MAX_SHARDS {
            return Err(unreadable(
                url,
                format!(
                    "{} images: an image folder holds at most {MAX_SHARDS}; pack larger sets into WebDataset tar shards",
                    files.len()
                ),
            ));
        }
        let class_of = |u: &str| -> String {
            u[url.len()..]
                .split('/')
                .next()
                .unwrap_or_default()
                .to_owned()
        };
        let classes: std::collections::BTreeSet<String> =
            files.iter().map(|u| class_of(u)).collect();
        let index: std::collections::HashMap<&String, i64> = classes
            .iter()
            .enumerate()
            .map(|(i, c)| (c, i as i64))
            .collect();
        let features = ImageRecipe::of(f).features(f.transforms.as_deref().unwrap_or(&[]));
        let shards = files
            .iter()
            .enumerate()
            .map(|(i, u)| Shard {
                label: Some(index[&class_of(u)]),
                url: u.clone(),
                format: FileFormat::ImageFolder,
                units: vec![1],
                samples: 1,
                sha256: None,
                features,
                base: i as u64,
                bytes: 0,
            })
            .collect();
        Ok(ShardSet { shards })
    }

    /// Samples of every shard.
    pub fn samples(&self) -> u64 {
        self.shards.iter().map(|s| s.samples).sum()
    }
}
