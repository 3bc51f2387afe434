//! An executor's local cache tier: objects (checkpoint shards it wrote or
//! read, dataset files) kept on local disk within a size bound, the least
//! recently used leaving first.
//!
//! Files are named by the SHA-256 of the object's URL and written to a
//! temporary name then renamed, so a process killed mid-write leaves no
//! half file under a real name. The index is rebuilt from the folder when
//! the cache is opened (oldest modification first), which is what makes a
//! restarted executor on the same machine read warm data. Readers that know
//! an object's checksum (a manifest lists each shard's) check it, so a file
//! damaged on disk is fetched again instead of being trusted.

use crate::store::{Store, StoreError};
use bytes::Bytes;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A bounded on-disk cache of objects.
#[derive(Debug)]
pub struct Cache {
    dir: PathBuf,
    capacity: u64,
    lru: Mutex<Lru>,
    /// Reads answered from disk.
    pub hits: AtomicU64,
    /// Reads that went to the store.
    pub misses: AtomicU64,
}

#[derive(Debug, Default)]
struct Lru {
    /// File name → (bytes, last use).
    entries: HashMap<String, (u64, u64)>,
    total: u64,
    tick: u64,
}

fn file_name(url: &str) -> String {
    crate::shard::sha256(url.as_bytes())[..40].to_owned()
}

impl Cache {
    /// Opens (creating) the cache in `dir`, holding at most `capacity` bytes.
    pub fn open(dir: &Path, capacity: u64) -> std::io::Result<Cache> {
        std::fs::create_dir_all(dir)?;
        let mut files = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let meta = e.metadata()?;
            if name.ends_with(".tmp") || !meta.is_file() {
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            let at = meta.modified().ok();
            files.push((at, name, meta.len()));
        }
        files.sort();
        let mut lru = Lru::default();
        for (_, name, len) in files {
            lru.tick += 1;
            lru.total += len;
            lru.entries.insert(name, (len, lru.tick));
        }
        let cache = Cache {
            dir: dir.to_owned(),
            capacity,
            lru: Mutex::new(lru),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        };
        cache.evict(None);
        Ok(cache)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes held now.
    pub fn size(&self) -> u64 {
        self.lru.lock().map(|l| l.total).unwrap_or(0)
    }

    /// Keeps `bytes` as the object at `url`; returns its file. An object
    /// larger than the whole cache is not kept.
    pub fn put(&self, url: &str, bytes: &[u8]) -> std::io::Result<Option<PathBuf>> {
        if bytes.len() as u64 > self.capacity {
            return Ok(None);
        }
        let name = file_name(url);
        let path = self.dir.join(&name);
        // A name of this write's own: two threads of one process (a
        // loader and its prefetcher) may put the same object at once, and
        // with a shared temporary name one would truncate the file the
        // other has just renamed into place and is reading.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!("{name}.{}-{n}.tmp", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)?;
        if let Ok(mut l) = self.lru.lock() {
            l.tick += 1;
            let tick = l.tick;
            if let Some((old, _)) = l.entries.insert(name.clone(), (bytes.len() as u64, tick)) {
                l.total -= old;
            }
            l.total += bytes.len() as u64;
        }
        self.evict(Some(&name));
        Ok(Some(path))
    }

    /// The file of the object at `url` if it is on disk (it counts as used).
    pub fn path_of(&self, url: &str) -> Option<PathBuf> {
        let name = file_name(url);
        let mut l = self.lru.lock().ok()?;
        l.tick += 1;
        let tick = l.tick;
        let e = l.entries.get_mut(&name)?;
        e.1 = tick;
        let path = self.dir.join(&name);
        path.is_file().then_some(path)
    }

    /// The object at `url` if it is on disk (and, when `sha256` is given,
    /// intact).
    pub fn get(&self, url: &str, sha256: Option<&str>) -> Option<Vec<u8>> {
        let name = file_name(url);
        let known = self.lru.lock().ok()?.entries.contains_key(&name);
        if !known {
            return None;
        }
        let path = self.dir.join(&name);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(_) => {
                self.forget(&name);
                return None;
            }
        };
        if sha256.is_some_and(|want| crate::shard::sha256(&bytes) != want) {
            let _ = std::fs::remove_file(&path);
            self.forget(&name);
            return None;
        }
        if let Ok(mut l) = self.lru.lock() {
            l.tick += 1;
            let tick = l.tick;
            if let Some(e) = l.entries.get_mut(&name) {
                e.1 = tick;
            }
        }
        Some(bytes)
    }

    fn forget(&self, name: &str) {
        if let Ok(mut l) = self.lru.lock() {
            if let Some((len, _)) = l.entries.remove(name) {
                l.total -= len;
            }
        }
    }

    /// Removes the least recently used files until the cache fits,
    /// never `keep`.
    fn evict(&self, keep: Option<&str>) {
        let Ok(mut l) = self.lru.lock() else {
            return;
        };
        while l.total > self.capacity {
            let Some(victim) = l
                .entries
                .iter()
                .filter(|(n, _)| Some(n.as_str()) != keep)
                .min_by_key(|(_, (_, t))| *t)
                .map(|(n, _)| n.clone())
            else {
                break;
            };
            if let Some((len, _)) = l.entries.remove(&victim) {
                l.total -= len;
            }
            let _ = std::fs::remove_file(self.dir.join(&victim));
        }
    }

    /// Reads `key` of `store` through the cache: from disk when it is
    /// there and intact, else from the store (then kept).
    pub async fn read_through(
        &self,
        store: &Store,
        key: &str,
        sha256: Option<&str>,
    ) -> Result<Bytes, StoreError> {
        let url = store.url_of(key);
        if let Some(b) = self.get(&url, sha256) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Bytes::from(b));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let bytes = store.get(key).await?;
        if let Err(e) = self.put(&url, &bytes) {
            tracing::warn!(error = %e, %url, "could not keep an object in the local cache");
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ty-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn least_recently_used_leaves_first_and_the_index_survives_a_restart() {
        let d = dir("lru");
        let c = Cache::open(&d, 10).unwrap();
        c.put("a", b"1234").unwrap();
        c.put("b", b"1234").unwrap();
        assert!(c.get("a", None).is_some()); // a is now newer than b
        c.put("c", b"1234").unwrap(); // 12 > 10: b leaves
        assert!(c.get("b", None).is_none());
        assert!(c.get("a", None).is_some() && c.get("c", None).is_some());
        assert_eq!(c.size(), 8);
        // Too big to keep at all.
        assert!(c.put("huge", &[0; 11]).unwrap().is_none());
        drop(c);
        let c = Cache::open(&d, 10).unwrap();
        assert_eq!(c.get("a", None).as_deref(), Some(&b"1234"[..]));
        assert_eq!(c.size(), 8);
    }

    #[test]
    fn damaged_files_are_not_trusted() {
        let d = dir("sha");
        let c = Cache::open(&d, 100).unwrap();
        let p = c.put("x", b"hello").unwrap().unwrap();
        let good = crate::shard::sha256(b"hello");
        assert!(c.get("x", Some(&good)).is_some());
        std::fs::write(&p, b"HELLO").unwrap();
        assert!(c.get("x", Some(&good)).is_none());
        assert!(c.get("x", None).is_none(), "a damaged file is dropped");
    }

    #[tokio::test]
    async fn reads_go_through_the_cache() {
        let d = dir("through");
        let s = Store::open(&format!("file://{}/store", d.display()), &[]).unwrap();
        s.put("k", Bytes::from_static(b"data")).await.unwrap();
        let c = Cache::open(&d.join("cache"), 100).unwrap();
        assert_eq!(c.read_through(&s, "k", None).await.unwrap(), "data");
        s.delete_prefix("k").await.unwrap();
        // Gone from the store, still warm here.
        assert_eq!(c.read_through(&s, "k", None).await.unwrap(), "data");
        assert_eq!(c.hits.load(Ordering::Relaxed), 1);
        assert_eq!(c.misses.load(Ordering::Relaxed), 1);
    }
}
