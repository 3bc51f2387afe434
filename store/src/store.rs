//! An object store opened from a URL, addressed by keys under the URL's
//! prefix.

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::buffered::BufWriter;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

/// Objects larger than this go up as multipart uploads, in parts of this size.
pub const MULTIPART_PART: usize = 8 << 20;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL or an option is not usable.
    #[error("object store {url}: {reason}")]
    Config {
        /// The store's URL.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The key does not exist.
    #[error("{0}: no such object")]
    NotFound(String),
    /// The store refused or failed.
    #[error("{key}: {source}")]
    Io {
        /// The object's URL.
        key: String,
        /// The store's error.
        source: object_store::Error,
    },
}

/// Parses object-store options written `KEY=VALUE` (flags, or a
/// comma-separated variable); a malformed one is named.
pub fn parse_options(raw: &[String]) -> Result<Vec<(String, String)>, String> {
    raw.iter()
        .filter(|o| !o.trim().is_empty())
        .map(|o| match o.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
            _ => Err(format!("object-store option {o:?} is not KEY=VALUE")),
        })
        .collect()
}

/// A streaming write of one object ([`Store::upload`]).
pub struct Upload {
    w: BufWriter,
    url: String,
}

impl Upload {
    fn failed(&self, e: std::io::Error) -> StoreError {
        StoreError::Io {
            key: self.url.clone(),
            source: object_store::Error::Generic {
                store: "multipart",
                source: Box::new(e),
            },
        }
    }

    /// Appends `chunk`.
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), StoreError> {
        match self.w.write_all(chunk).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.failed(e)),
        }
    }

    /// Completes the object: it is visible at its key from here on.
    pub async fn finish(mut self) -> Result<(), StoreError> {
        match self.w.shutdown().await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.failed(e)),
        }
    }

    /// Gives the write up: no object appears, the parts sent are dropped.
    pub async fn abort(mut self) {
        let _ = self.w.abort().await;
    }
}

/// An object store under a URL's prefix.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    prefix: Path,
    url: String,
}

impl Store {
    /// Opens the store at `url`; `options` are `object_store` settings
    /// (`aws_endpoint`, `aws_region`, `aws_access_key_id`, …) that win over
    /// the environment's `AWS_*` variables.
    pub fn open(url: &str, options: &[(String, String)]) -> Result<Store, StoreError> {
        let config = |reason: String| StoreError::Config {
            url: url.to_owned(),
            reason,
        };
        let url = url.trim_end_matches('/').to_owned();
        let parsed = url::Url::parse(&url).map_err(|e| config(e.to_string()))?;
        let (inner, prefix): (Arc<dyn ObjectStore>, Path) = match parsed.scheme() {
            "file" => {
                let dir = parsed
                    .to_file_path()
                    .map_err(|_| config("not an absolute file path".into()))?;
                std::fs::create_dir_all(&dir)
                    .map_err(|e| config(format!("cannot create {}: {e}", dir.display())))?;
                let fs = LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| config(e.to_string()))?
                    .with_automatic_cleanup(true);
                (Arc::new(fs), Path::default())
            }
            "s3" | "s3a" => {
                let mut b = AmazonS3Builder::from_env().with_url(url.clone());
                for (k, v) in options {
                    let key: AmazonS3ConfigKey = k
                        .parse()
                        .map_err(|_| config(format!("unknown S3 option {k}")))?;
                    b = b.with_config(key, v.clone());
                }
                // Endpoints given without a scheme's TLS (a local S3 server)
                // need plain HTTP allowed.
                let http = std::env::var("AWS_ENDPOINT_URL")
                    .or_else(|_| std::env::var("AWS_ENDPOINT"))
                    .ok()
                    .into_iter()
                    .chain(
                        options
                            .iter()
                            .filter(|(k, _)| k.contains("endpoint"))
                            .map(|(_, v)| v.clone()),
                    )
                    .any(|e| e.starts_with("http://"));
                if http {
                    b = b.with_allow_http(true);
                }
                let s3 = b.build().map_err(|e| config(e.to_string()))?;
                let prefix = Path::parse(parsed.path().trim_start_matches('/'))
                    .map_err(|e| config(e.to_string()))?;
                (Arc::new(s3), prefix)
            }
            _ => {
                let (s, p) = object_store::parse_url_opts(&parsed, options.iter().cloned())
                    .map_err(|e| config(e.to_string()))?;
                (Arc::from(s), p)
            }
        };
        Ok(Store { inner, prefix, url })
    }

    /// The store's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL of `key`.
    pub fn url_of(&self, key: &str) -> String {
        format!("{}/{}", self.url, key.trim_start_matches('/'))
    }

    /// The key of a URL inside this store, if it is one.
    pub fn key_of<'a>(&self, url: &'a str) -> Option<&'a str> {
        url.strip_prefix(&self.url)?.strip_prefix('/')
    }

    fn path(&self, key: &str) -> Path {
        let mut p = self.prefix.clone();
        for part in key.split('/').filter(|s| !s.is_empty()) {
            p = p.join(part);
        }
        p
    }

    fn io(&self, key: &str) -> impl Fn(object_store::Error) -> StoreError + '_ {
        let key = self.url_of(key);
        move |source| match source {
            object_store::Error::NotFound { .. } => StoreError::NotFound(key.clone()),
            source => StoreError::Io {
                key: key.clone(),
                source,
            },
        }
    }

    /// Writes `bytes` at `key`: one request up to [`MULTIPART_PART`],
    /// a multipart upload above it.
    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<(), StoreError> {
        let path = self.path(key);
        if bytes.len() <= MULTIPART_PART {
            self.inner
                .put(&path, bytes.into())
                .await
                .map_err(self.io(key))?;
            return Ok(());
        }
        let mut w = BufWriter::with_capacity(self.inner.clone(), path, MULTIPART_PART);
        for chunk in bytes.chunks(MULTIPART_PART) {
            if let Err(e) = w.write_all(chunk).await {
                let _ = w.abort().await;
                return Err(self.io(key)(object_store::Error::Generic {
                    store: "multipart",
                    source: Box::new(e),
                }));
            }
        }
        w.shutdown().await.map_err(|e| {
            self.io(key)(object_store::Error::Generic {
                store: "multipart",
                source: Box::new(e),
            })
        })?;
        Ok(())
    }

    /// A streaming write of the object at `key`: chunks go up as parts of
    /// [`MULTIPART_PART`] fill, so a large object is never held whole, and
    /// nothing is visible at `key` before [`Upload::finish`].
    pub fn upload(&self, key: &str) -> Upload {
        Upload {
            w: BufWriter::with_capacity(self.inner.clone(), self.path(key), MULTIPART_PART),
            url: self.url_of(key),
        }
    }

    /// Deletes the object at `key` (a missing one is no error).
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self.inner.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.io(key)(e)),
        }
    }

    /// Reads the object at `key`.
    pub async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let r = self
            .inner
            .get(&self.path(key))
            .await
            .map_err(self.io(key))?;
        r.bytes().await.map_err(self.io(key))
    }

    /// Bytes `range` of the object at `key` (fewer where the object ends
    /// first): a footer or header, read without the rest of the object.
    pub async fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, StoreError> {
        let opts = object_store::GetOptions::new().with_range(Some(range));
        let r = self
            .inner
            .get_opts(&self.path(key), opts)
            .await
            .map_err(self.io(key))?;
        r.bytes().await.map_err(self.io(key))
    }

    /// The last `n` bytes of the object at `key` (all of it when smaller),
    /// and the object's size.
    pub async fn get_tail(&self, key: &str, n: u64) -> Result<(Bytes, u64), StoreError> {
        let opts =
            object_store::GetOptions::new().with_range(Some(object_store::GetRange::Suffix(n)));
        let r = self
            .inner
            .get_opts(&self.path(key), opts)
            .await
            .map_err(self.io(key))?;
        let size = r.meta.size;
        Ok((r.bytes().await.map_err(self.io(key))?, size))
    }

    /// The object at `key` as a stream of chunks, with its size.
    pub async fn stream(
        &self,
        key: &str,
    ) -> Result<
        (
            u64,
            futures::stream::BoxStream<'static, Result<Bytes, object_store::Error>>,
        ),
        StoreError,
    > {
        let r = self
            .inner
            .get(&self.path(key))
            .await
            .map_err(self.io(key))?;
        Ok((r.meta.size, r.into_stream()))
    }

    /// Keys and sizes of the objects under `prefix` (relative keys).
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let p = self.path(prefix);
        let metas: Vec<_> = self
            .inner
            .list(Some(&p))
            .try_collect()
            .await
            .map_err(self.io(prefix))?;
        let strip = self.prefix.as_ref().len();
        let mut out: Vec<(String, u64)> = metas
            .into_iter()
            .map(|m| {
                let full = m.location.as_ref();
                let key = if strip == 0 {
                    full
                } else {
                    full.get(strip + 1..).unwrap_or(full)
                };
                (key.to_owned(), m.size)
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Every key under the store's prefix (nested ones too) that `keep`
    /// accepts, sorted, reading the listing page by page and giving up
    /// after `max_seen` objects: `None` when the store holds more.
    pub async fn list_within(
        &self,
        keep: impl Fn(&str) -> bool,
        max_seen: usize,
    ) -> Result<Option<Vec<String>>, StoreError> {
        let p = self.path("");
        let strip = self.prefix.as_ref().len();
        let mut listing = self.inner.list(Some(&p));
        let (mut seen, mut out) = (0usize, Vec::new());
        while let Some(m) = listing.try_next().await.map_err(self.io(""))? {
            seen += 1;
            if seen > max_seen {
                return Ok(None);
            }
            let full = m.location.as_ref();
            let key = if strip == 0 {
                full
            } else {
                full.get(strip + 1..).unwrap_or(full)
            };
            if keep(key) {
                out.push(key.to_owned());
            }
        }
        out.sort();
        Ok(Some(out))
    }

    /// The keys of the store's top level (no `/` in them) that `keep`
    /// accepts, sorted, reading the listing page by page and giving up
    /// after `max_seen` objects (nested ones count): `None` when the store
    /// holds more, so that a glob over a huge bucket is refused in bounded
    /// time and memory instead of listed whole.
    pub async fn list_top(
        &self,
        keep: impl Fn(&str) -> bool,
        max_seen: usize,
    ) -> Result<Option<Vec<String>>, StoreError> {
        self.list_within(|k| !k.contains('/') && keep(k), max_seen)
            .await
    }

    /// Deletes every object under `prefix`.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<usize, StoreError> {
        let keys = self.list(prefix).await?;
        for (k, _) in &keys {
            match self.inner.delete(&self.path(k)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.io(k)(e)),
            }
        }
        Ok(keys.len())
    }

    /// Whether `key` exists.
    pub async fn exists(&self, key: &str) -> Result<bool, StoreError> {
        match self.inner.head(&self.path(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.io(key)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ty-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// A glob's listing keeps the top-level keys that match and gives up,
    /// rather than listing on, past its bound (nested objects count).
    #[tokio::test]
    async fn the_top_level_listing_is_bounded() {
        let dir = tmp("top");
        let s = Store::open(&format!("file://{}", dir.display()), &[]).unwrap();
        for k in ["b.npz", "a.npz", "c.txt", "sub/d.npz", "sub/e.npz"] {
            s.put(k, Bytes::from_static(b"x")).await.unwrap();
        }
        let npz = |k: &str| k.ends_with(".npz");
        assert_eq!(
            s.list_top(npz, 5).await.unwrap(),
            Some(vec!["a.npz".to_owned(), "b.npz".to_owned()])
        );
        assert_eq!(s.list_top(npz, 4).await.unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn an_upload_appears_whole_on_finish_and_not_at_all_on_abort() {
        let dir = tmp("up");
        let s = Store::open(&format!("file://{}", dir.display()), &[]).unwrap();
        let body: Vec<u8> = (0..MULTIPART_PART * 2 + 17)
            .map(|i| (i % 251) as u8)
            .collect();
        let mut up = s.upload("a/big");
        for chunk in body.chunks(1 << 16) {
            up.write(chunk).await.unwrap();
        }
        assert!(!s.exists("a/big").await.unwrap());
        up.finish().await.unwrap();
        assert_eq!(s.get("a/big").await.unwrap().as_ref(), &body[..]);
        let mut up = s.upload("a/gone");
        up.write(&body[..1000]).await.unwrap();
        up.abort().await;
        assert!(!s.exists("a/gone").await.unwrap());
        s.delete("a/big").await.unwrap();
        s.delete("a/big").await.unwrap();
        assert!(!s.exists("a/big").await.unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn local_files_round_trip_and_list() {
        let dir = tmp("rt");
        let s = Store::open(&format!("file://{}", dir.display()), &[]).unwrap();
        s.put("j/step-1/a", Bytes::from_static(b"abc"))
            .await
            .unwrap();
        // Above the part size: a multipart upload.
        let big: Vec<u8> = (0..MULTIPART_PART * 2 + 5).map(|i| i as u8).collect();
        s.put("j/step-1/big", Bytes::from(big.clone()))
            .await
            .unwrap();
        assert_eq!(s.get("j/step-1/big").await.unwrap(), big);
        assert_eq!(
            s.list("j").await.unwrap(),
            vec![
                ("j/step-1/a".to_owned(), 3),
                ("j/step-1/big".to_owned(), big.len() as u64)
            ]
        );
        assert!(s.exists("j/step-1/a").await.unwrap());
        assert!(matches!(
            s.get("j/nope").await,
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(s.delete_prefix("j/step-1").await.unwrap(), 2);
        assert!(s.list("j").await.unwrap().is_empty());
        assert_eq!(s.url_of("x/y"), format!("file://{}/x/y", dir.display()));
        assert_eq!(s.key_of(&s.url_of("x/y")), Some("x/y"));
    }

    #[test]
    fn options_are_key_value_pairs() {
        let raw = ["aws_region=garage".to_owned(), " ".into(), "a=b=c".into()];
        assert_eq!(
            parse_options(&raw).unwrap(),
            [
                ("aws_region".into(), "garage".into()),
                ("a".into(), "b=c".into())
            ]
        );
        let e = parse_options(&["=x".to_owned()]).unwrap_err();
        assert!(e.contains("KEY=VALUE"), "{e}");
    }

    #[test]
    fn bad_urls_are_named() {
        let e = Store::open("nonsense", &[]).unwrap_err().to_string();
        assert!(e.contains("nonsense"), "{e}");
        let e = Store::open("s3://b/p", &[("aws_colour".to_owned(), "blue".to_owned())])
            .unwrap_err()
            .to_string();
        assert!(e.contains("aws_colour"), "{e}");
    }
}
