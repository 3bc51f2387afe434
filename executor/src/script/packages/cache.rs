//! The environments' cache: each environment in `envs/KEY` with its
//! `.trainyard-ready` marker (whose time is its last use), the count of
//! ranks using each, eviction of the least recently used past the budget,
//! and the report each heartbeat carries.

use super::{Config, Env, CONFIG};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use trainyard_common::cluster::EnvironmentCache;

/// This executor's environment cache as its heartbeat lists it: `None`
/// until [`configure`]d. The folder is walked at most every
/// [`REPORT_EVERY`] (and after each install or eviction), not on each beat.
pub fn cache_report() -> Option<EnvironmentCache> {
    let config = CONFIG.get()?;
    static LAST: Mutex<Option<(Instant, EnvironmentCache)>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    let stale = STALE.swap(false, std::sync::atomic::Ordering::Relaxed);
    if let Some((at, report)) = *last {
        if !stale && at.elapsed() < REPORT_EVERY {
            return Some(report);
        }
    }
    let report = config.report();
    *last = Some((Instant::now(), report));
    Some(report)
}

/// How often [`cache_report`] walks the environments' folder.
const REPORT_EVERY: Duration = Duration::from_secs(30);
/// Set when the cache changed: the next report walks the folder.
static STALE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

pub(super) fn cache_changed() {
    STALE.store(true, std::sync::atomic::Ordering::Relaxed);
}

pub(super) fn in_use() -> &'static Mutex<BTreeMap<String, usize>> {
    static IN_USE: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
    &IN_USE
}

impl Config {
    /// The cached environment `key`, marked used now.
    pub(super) fn cached(&self, key: &str) -> Option<Env> {
        let dir = self.envs().join(key);
        let ready = dir.join(".trainyard-ready");
        let text = std::fs::read_to_string(&ready).ok()?;
        // Its use time is the marker's.
        let _ = std::fs::File::options()
            .append(true)
            .open(&ready)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        if let Ok(mut u) = in_use().lock() {
            *u.entry(key.to_owned()).or_default() += 1;
        }
        cache_changed();
        Some(Env {
            python: dir.join("bin/python"),
            cached: true,
            packages: text.lines().count(),
            key: key.to_owned(),
        })
    }

    /// Removes the least recently used environments not in use (never
    /// `keep`) until the cache is within its budget.
    pub(super) fn evict(&self, keep: &str) {
        let mut envs: Vec<(std::time::SystemTime, u64, PathBuf, String)> = Vec::new();
        for e in std::fs::read_dir(self.envs())
            .into_iter()
            .flatten()
            .flatten()
        {
            let key = e.file_name().to_string_lossy().into_owned();
            let used = std::fs::metadata(e.path().join(".trainyard-ready"))
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            envs.push((used, bytes_in(&e.path()), e.path(), key));
        }
        let mut total: u64 = envs.iter().map(|e| e.1).sum();
        envs.sort();
        for (_, bytes, path, key) in envs {
            if total <= self.budget {
                break;
            }
            let busy = key == keep
                || in_use()
                    .lock()
                    .map(|u| u.contains_key(&key))
                    .unwrap_or(true);
            if busy {
                continue;
            }
            if std::fs::remove_dir_all(&path).is_ok() {
                tracing::info!(env = %key, bytes, "evicted a python environment");
                total = total.saturating_sub(bytes);
            }
        }
    }

    /// The bytes the cached environments take.
    pub fn size(&self) -> u64 {
        bytes_in(&self.envs())
    }

    /// The environments kept (those made completely), the bytes of the
    /// folder and the budget.
    pub fn report(&self) -> EnvironmentCache {
        let environments = std::fs::read_dir(self.envs())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().join(".trainyard-ready").is_file())
            .count();
        let in_use = in_use().lock().map(|u| u.len()).unwrap_or(0);
        EnvironmentCache {
            environments: u32::try_from(environments).unwrap_or(u32::MAX),
            in_use: u32::try_from(in_use).unwrap_or(u32::MAX),
            bytes: self.size(),
            budget_bytes: self.budget,
        }
    }
}

fn bytes_in(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}
