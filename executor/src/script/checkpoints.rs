//! A script job's checkpoints through object storage. A script saves its
//! state into `TRAINYARD_CHECKPOINT_DIR` as it would on a shared disk
//! (torchrun's convention: rank 0 saves, every rank loads). Rank 0's
//! executor commits that folder to the job's store while the script runs:
//! when its files changed and then stayed the same for one look
//! ([`POLL`]), each file goes to `{job}/script-checkpoints/{seq}/files/`
//! and `manifest.json` (paths, sizes, SHA-256) last, so a checkpoint is
//! there once its manifest is. Before any rank starts, at every generation,
//! its folder is made exactly the latest committed checkpoint (or, with
//! none yet, the `resume_from` job's; else emptied): every rank of a world
//! starts from the same state, wherever it ran before.

use crate::storage::{Storage, StorageError};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use trainyard_common::checkpoint::{script_checkpoint_dir, script_checkpoints_prefix};
use uuid::Uuid;

/// How often rank 0's folder is looked at.
pub const POLL: Duration = Duration::from_millis(250);
/// How long no file of the folder may have been written before it is
/// committed (a file being written keeps its time recent; one that
/// changes while it is read is caught by the second look at the folder).
/// Short, so that a script that saves every second is still committed.
pub const QUIET: Duration = Duration::from_millis(50);
/// Most files and bytes one checkpoint may hold.
pub const MAX_FILES: usize = 1000;
/// Most bytes of one checkpoint.
pub const MAX_BYTES: u64 = 8 << 30;
/// Largest file of a checkpoint: the executor holds one file in memory at
/// a time while it commits or restores it.
pub const MAX_FILE: u64 = 1 << 30;

pub use trainyard_common::checkpoint::{
    ScriptManifest as Manifest, ScriptManifestFile as ManifestFile,
};

/// What a folder holds: each regular file's size and modification time.
pub type Snapshot = BTreeMap<String, (u64, SystemTime)>;

/// The regular files under `dir` (links and special files left out).
pub fn scan(dir: &Path) -> Snapshot {
    let mut out = Snapshot::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                if let Some(rel) = path.strip_prefix(dir).ok().and_then(|r| r.to_str()) {
                    let at = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    out.insert(rel.to_owned(), (meta.len(), at));
                }
            }
        }
    }
    out
}

fn sha256_of(path: &Path) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut f = std::fs::File::open(path)?;
    std::io::copy(&mut f, &mut h)?;
    Ok(hex::encode(h.finalize()))
}

/// Why a script's checkpoint was not committed, found or restored.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The store could not list the job's checkpoints.
    #[error("listing the job's checkpoints: {0}")]
    List(StorageError),
    /// A stored object could not be read.
    #[error("reading {key}: {source}")]
    Read {
        /// Its key (or the checkpoint file's path).
        key: String,
        /// Why.
        source: StorageError,
    },
    /// A manifest that does not parse.
    #[error("{key} does not read as a manifest: {source}")]
    Manifest {
        /// Its key.
        key: String,
        /// Why.
        source: serde_json::Error,
    },
    /// A manifest naming a path outside the folder.
    #[error("a checkpoint file's path {path:?} {why}")]
    Path {
        /// The path.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The rank's folder could not be written.
    #[error("restoring the checkpoint folder: {0}")]
    Folder(std::io::Error),
    /// A folder over a bound ([`MAX_FILES`], [`MAX_BYTES`], [`MAX_FILE`]).
    #[error("{0}")]
    TooLarge(String),
    /// An object could not be stored.
    #[error("storing {what}: {source}")]
    Put {
        /// What.
        what: String,
        /// Why.
        source: StorageError,
    },
    /// The generation ended while the folder was being committed.
    #[error("the generation ended during the commit")]
    Stopped,
}

/// The latest committed checkpoint of `job`, if any.
pub fn latest(store: &Storage, job: Uuid) -> Result<Option<Manifest>, CheckpointError> {
    let listed = store
        .list(&script_checkpoints_prefix(job))
        .map_err(CheckpointError::List)?;
    let Some((key, _)) = listed
        .iter()
        .filter(|(k, _)| k.ends_with("/manifest.json"))
        .max_by(|a, b| a.0.cmp(&b.0))
    else {
        return Ok(None);
    };
    let bytes = store
        .read_remote(key)
        .map_err(|source| CheckpointError::Read {
            key: key.clone(),
            source,
        })?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| CheckpointError::Manifest {
            key: key.clone(),
            source,
        })
}

/// Checkpoint `n` of `job` (`None`: its latest), if committed.
pub fn numbered(
    store: &Storage,
    job: Uuid,
    n: Option<u64>,
) -> Result<Option<Manifest>, CheckpointError> {
    let Some(n) = n else {
        return latest(store, job);
    };
    let key = format!("{}manifest.json", script_checkpoint_dir(job, n));
    match store.read_remote(&key) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| CheckpointError::Manifest { key, source }),
        Err(StorageError::Store(trainyard_store::StoreError::NotFound(_))) => Ok(None),
        Err(source) => Err(CheckpointError::Read { key, source }),
    }
}

/// Makes `dir` hold exactly checkpoint `m` of `job` (`None`: nothing).
/// Files already there with the same content are kept. What it did.
pub fn restore(
    store: &Storage,
    job: Uuid,
    m: Option<&Manifest>,
    dir: &Path,
) -> Result<String, CheckpointError> {
    let io = CheckpointError::Folder;
    let wanted: BTreeMap<&str, &ManifestFile> = m
        .map(|m| m.files.iter().map(|f| (f.path.as_str(), f)).collect())
        .unwrap_or_default();
    // What is not in the checkpoint goes (a newer uncommitted save, a
    // file of another world): every rank starts from the same state.
    for (rel, _) in scan(dir) {
        if !wanted.contains_key(rel.as_str()) {
            std::fs::remove_file(dir.join(&rel)).map_err(io)?;
        }
    }
    let Some(m) = m else {
        return Ok("no checkpoint yet: the script starts from scratch".into());
    };
    let mut fetched = 0;
    for f in &m.files {
        let to = safe_join(dir, &f.path)?;
        if sha256_of(&to).ok().as_deref() == Some(f.sha256.as_str()) {
            continue;
        }
        let key = format!("{}files/{}", script_checkpoint_dir(job, m.seq), f.path);
        let bytes = store
            .read(&key, Some(&f.sha256))
            .map_err(|source| CheckpointError::Read {
                key: format!("checkpoint file {}", f.path),
                source,
            })?;
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let tmp = to.with_extension("trainyard-part");
        std::fs::write(&tmp, &bytes).map_err(io)?;
        std::fs::rename(&tmp, &to).map_err(io)?;
        fetched += 1;
    }
    Ok(format!(
        "restored checkpoint {} (generation {}, {} files, {fetched} fetched)",
        m.seq,
        m.generation,
        m.files.len()
    ))
}

fn safe_join(dir: &Path, rel: &str) -> Result<PathBuf, CheckpointError> {
    match trainyard_common::spec::script::relative_path_problem(rel) {
        Some(why) => Err(CheckpointError::Path {
            path: rel.to_owned(),
            why,
        }),
        None => Ok(dir.join(rel)),
    }
}

/// Rank 0's committer: remembers what it committed last.
pub struct Committer {
    job: Uuid,
    generation: u64,
    next: u64,
    keep: u32,
    committed: Snapshot,
    /// The step the script last reported (recorded in the manifest).
    pub step: Option<u64>,
}

impl Committer {
    /// A committer for `job` at `generation`, numbering after `latest`, that
    /// keeps the `keep` newest checkpoints; `restored` is what the folder
    /// held when the rank started (it is not committed again).
    pub fn new(
        job: Uuid,
        generation: u64,
        latest: Option<&Manifest>,
        keep: u32,
        restored: Snapshot,
    ) -> Committer {
        Committer {
            job,
            generation,
            next: latest.map_or(1, |m| m.seq + 1),
            keep: keep.max(1),
            committed: restored,
            step: None,
        }
    }

    /// Looks at `dir`: commits it when it changed since the last commit and
    /// no file of it was written in the last [`QUIET`]; a folder that
    /// changes while it is read is left for the next look. The commit's
    /// log line, if one. A commit is abandoned (no manifest written) once
    /// `stopping` says so: the generation is over and the next one may be
    /// restoring.
    /// With `now`, the quiet time is not waited for (the script said its
    /// folder is complete: `trainyard.report(checkpoint=True)`).
    pub fn look(
        &mut self,
        store: &Storage,
        dir: &Path,
        stopping: &dyn Fn() -> bool,
        now_please: bool,
    ) -> Result<Option<String>, CheckpointError> {
        let now = scan(dir);
        if now.is_empty() || now == self.committed {
            return Ok(None);
        }
        let quiet_since = SystemTime::now() - QUIET;
        if !now_please && now.values().any(|(_, at)| *at > quiet_since) {
            return Ok(None);
        }
        let Some(line) = self.commit(store, dir, &now, stopping)? else {
            return Ok(None);
        };
        self.committed = now;
        Ok(Some(line))
    }

    fn commit(
        &mut self,
        store: &Storage,
        dir: &Path,
        snapshot: &Snapshot,
        stopping: &dyn Fn() -> bool,
    ) -> Result<Option<String>, CheckpointError> {
        if snapshot.len() > MAX_FILES {
            return Err(CheckpointError::TooLarge(format!(
                "the checkpoint folder holds more than {MAX_FILES} files"
            )));
        }
        let total: u64 = snapshot.values().map(|(s, _)| s).sum();
        if total > MAX_BYTES {
            return Err(CheckpointError::TooLarge(format!(
                "the checkpoint folder holds more than {} GiB",
                MAX_BYTES >> 30
            )));
        }
        if let Some((rel, (size, _))) = snapshot.iter().find(|(_, (s, _))| *s > MAX_FILE) {
            return Err(CheckpointError::TooLarge(format!(
                "checkpoint file {rel} holds {size} bytes, more than {} MiB",
                MAX_FILE >> 20
            )));
        }
        // One file in memory at a time; a folder that changed meanwhile
        // (a save during the upload) is not committed: no manifest.
        let seq = self.next;
        let at = script_checkpoint_dir(self.job, seq);
        let mut files = Vec::new();
        for rel in snapshot.keys() {
            let path = safe_join(dir, rel)?;
            let Ok(bytes) = std::fs::read(&path) else {
                // Replaced meanwhile (a save renamed over it): next look.
                return Ok(None);
            };
            let sha256 = hex::encode(Sha256::digest(&bytes));
            let size = bytes.len() as u64;
            store
                .put(&format!("{at}files/{rel}"), bytes.into())
                .map_err(|source| CheckpointError::Put {
                    what: format!("checkpoint file {rel}"),
                    source,
                })?;
            files.push(ManifestFile {
                path: rel.clone(),
                size,
                sha256,
            });
        }
        if scan(dir) != *snapshot {
            return Ok(None);
        }
        let m = Manifest {
            seq,
            generation: self.generation,
            step: self.step,
            committed_at: Some(chrono::Utc::now()),
            files,
        };
        if stopping() {
            return Err(CheckpointError::Stopped);
        }
        let body = serde_json::to_vec(&m).map_err(|source| CheckpointError::Manifest {
            key: format!("{at}manifest.json"),
            source,
        })?;
        store
            .put(&format!("{at}manifest.json"), body.into())
            .map_err(|source| CheckpointError::Put {
                what: "the checkpoint's manifest".into(),
                source,
            })?;
        self.next = seq + 1;
        // The one that falls out of the newest `keep` goes.
        if seq > u64::from(self.keep) {
            let gone = seq - u64::from(self.keep);
            let _ = store.delete_prefix(&script_checkpoint_dir(self.job, gone));
        }
        Ok(Some(format!(
            "checkpoint {seq} committed ({} files, {total} bytes)",
            m.files.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, rel: &str, body: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }

    fn quiet() {
        std::thread::sleep(QUIET + Duration::from_millis(50));
    }

    #[test]
    fn a_stable_folder_is_committed_once_and_every_rank_restores_exactly_it() {
        let root = std::env::temp_dir().join(format!("ty-script-ckpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (store, _rt) = Storage::for_tests(&root);
        let job = Uuid::now_v7();
        let never = || false;
        let (r0, r1) = (root.join("rank0"), root.join("rank1"));
        std::fs::create_dir_all(&r0).unwrap();
        std::fs::create_dir_all(&r1).unwrap();
        assert_eq!(latest(&store, job).unwrap(), None);

        let mut c = Committer::new(job, 1, None, 2, scan(&r0));
        write(&r0, "last.pt", "epoch 0");
        // Just written: not yet (it may be mid-write).
        assert_eq!(c.look(&store, &r0, &never, false).unwrap(), None);
        quiet();
        let line = c
            .look(&store, &r0, &never, false)
            .unwrap()
            .expect("a commit");
        assert!(
            line.starts_with("checkpoint 1 committed (1 files"),
            "{line}"
        );
        // Unchanged: nothing more.
        assert_eq!(c.look(&store, &r0, &never, false).unwrap(), None);
        write(&r0, "sub/opt.pt", "moments");
        write(&r0, "last.pt", "epoch 1");
        quiet();
        c.look(&store, &r0, &never, false)
            .unwrap()
            .expect("a second commit");
        let m = latest(&store, job).unwrap().unwrap();
        assert_eq!((m.seq, m.files.len()), (2, 2));

        // Another rank (another executor) gets exactly that; a stale file of
        // its own goes.
        write(&r1, "stale.pt", "another world");
        let said = restore(&store, job, Some(&m), &r1).unwrap();
        assert!(said.contains("restored checkpoint 2"), "{said}");
        assert_eq!(
            std::fs::read_to_string(r1.join("last.pt")).unwrap(),
            "epoch 1"
        );
        assert_eq!(
            std::fs::read_to_string(r1.join("sub/opt.pt")).unwrap(),
            "moments"
        );
        assert!(!r1.join("stale.pt").exists());
        // Rank 0's newer save that was never committed is rolled back too.
        write(&r0, "last.pt", "epoch 2, uncommitted");
        restore(&store, job, Some(&m), &r0).unwrap();
        assert_eq!(
            std::fs::read_to_string(r0.join("last.pt")).unwrap(),
            "epoch 1"
        );

        // Only the newest `keep` stay; a commit of an ended generation is
        // abandoned before its manifest.
        write(&r0, "last.pt", "epoch 3");
        quiet();
        c.look(&store, &r0, &never, false)
            .unwrap()
            .expect("a third commit");
        let seqs: Vec<String> = store
            .list(&script_checkpoints_prefix(job))
            .unwrap()
            .into_iter()
            .filter(|(k, _)| k.ends_with("manifest.json"))
            .map(|(k, _)| k)
            .collect();
        assert_eq!(seqs.len(), 2, "{seqs:?}");
        write(&r0, "last.pt", "epoch 4");
        quiet();
        let e = c.look(&store, &r0, &|| true, false).unwrap_err();
        assert!(matches!(e, CheckpointError::Stopped), "{e}");
        assert_eq!(latest(&store, job).unwrap().unwrap().seq, 3);
        // No checkpoint: the folder is emptied.
        restore(&store, Uuid::now_v7(), None, &r1).unwrap();
        assert!(scan(&r1).is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }
}
