//! Checkpoints from the executor's side: when to write one, writing it in
//! the background through the local cache tier, and loading one into any
//! cluster shape.
//!
//! * [`Policy`] — the job spec's `checkpoint` (every N steps and/or T
//!   seconds, at the end) plus a graceful drain and the scheduler's request
//!   before a preemption ([`CheckpointRequest`]). Steps are the same on every
//!   rank; the clock is not, so a time-due checkpoint is a *vote* that
//!   travels with the step's all-reduce (one more float) or, in the PS
//!   pattern, with rank 0's push: every writer checkpoints the same step.
//! * [`Uploader`] — a role's background writer. The training thread hands it
//!   a snapshot (its pieces of the weights and optimizer state, copied in
//!   memory) and goes on; the uploader encodes the shard (safetensors), writes
//!   it to the executor's local cache first, then to the object store
//!   (multipart when large), and reports it to the API, which commits the
//!   checkpoint once every shard is in. The hand-over is a rendezvous: while
//!   the previous upload runs, the next snapshot waits instead of piling up.
//! * [`load`] — reads a committed checkpoint's manifest and the shards that
//!   overlap the pieces a role needs (through the local cache: a recovery
//!   on the same machine reads warm data), checks each shard's SHA-256, and
//!   assembles the pieces: a checkpoint written by 4 ring ranks loads into 2,
//!   or into 3 PS shards.

use super::{Storage, StorageError};
use crate::reports::Item;
use crate::signals::{CheckpointRequest, Drain, PendingUploads};
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use trainyard_common::checkpoint::{
    plan_copies, shard_key, CheckpointRef, CursorState, Manifest, ShardUploaded, MANIFEST_FORMAT,
};
use trainyard_common::cluster::{LogLevel, Range};
use trainyard_common::spec::CheckpointPolicy;
use trainyard_store::shard;
use uuid::Uuid;

/// When a role checkpoints.
#[derive(Debug)]
pub struct Policy {
    spec: CheckpointPolicy,
    drain: Drain,
    since: Instant,
    last_step: Option<u64>,
    drained: bool,
    request: CheckpointRequest,
    /// The request last answered with a checkpoint.
    answered: Option<u64>,
}

impl Policy {
    /// The job's policy, its clock starting now; `drain` tells it when the
    /// executor drains.
    pub fn new(spec: CheckpointPolicy, drain: Drain) -> Policy {
        Policy {
            spec,
            drain,
            since: Instant::now(),
            last_step: None,
            drained: false,
            request: CheckpointRequest::default(),
            answered: None,
        }
    }

    /// The same policy, also voting once for each request the scheduler
    /// opens on `request`.
    pub fn asked_by(mut self, request: CheckpointRequest) -> Policy {
        self.request = request;
        self
    }

    /// Whether this writer's clock (or a drain) asks for a checkpoint at
    /// the coming step.
    pub fn vote(&self) -> bool {
        let timed = self
            .spec
            .every_seconds
            .is_some_and(|t| self.since.elapsed() >= Duration::from_secs(t));
        let asked = self
            .request
            .open()
            .is_some_and(|r| self.answered != Some(r));
        timed || asked || (self.drain.is_draining() && !self.drained)
    }

    /// Whether step `step` is checkpointed: every N steps, when any writer
    /// voted, or at the end.
    pub fn due(&self, step: u64, voted: bool, finished: bool) -> bool {
        if self.last_step == Some(step) || step == 0 {
            return false;
        }
        self.spec.every_steps.is_some_and(|n| step % n == 0)
            || voted
            || (finished && self.spec.at_end)
    }

    /// Notes that `step` was handed to the uploader.
    pub fn written(&mut self, step: u64) {
        self.last_step = Some(step);
        self.since = Instant::now();
        if self.drain.is_draining() {
            self.drained = true;
        }
        if let Some(r) = self.request.open() {
            self.answered = Some(r);
        }
    }

    /// The last step handed to the uploader.
    pub fn last_step(&self) -> Option<u64> {
        self.last_step
    }
}

/// One writer's part of a checkpoint, copied out of training.
pub struct Snapshot {
    /// Global step.
    pub step: u64,
    /// Generation of the writer.
    pub generation: i64,
    /// Shard index and count.
    pub shard: u32,
    /// How many shards the checkpoint has.
    pub shards: u32,
    /// The pieces.
    pub ranges: Vec<Range>,
    /// Weights, then optimizer state, each over the pieces.
    pub tensors: Vec<Vec<f32>>,
    /// Elements of the whole model.
    pub numel: u64,
    /// The optimizer's step counter.
    pub optimizer_t: u64,
    /// The data cursor after the step.
    pub cursor: CursorState,
}

/// How the `TRAINYARD_UPLOAD_DELAY_MS` hook holds checkpoint shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadDelay {
    /// How long each is held.
    pub hold: Duration,
    /// The first step whose shards are held.
    pub from_step: u64,
}

impl UploadDelay {
    /// Parses `ms` or `ms@step`.
    pub fn parse(v: &str) -> Option<UploadDelay> {
        let (t, from) = v.split_once('@').unwrap_or((v, "0"));
        Some(UploadDelay {
            hold: Duration::from_millis(t.parse().ok()?),
            from_step: from.parse().ok()?,
        })
    }

    /// How long the shard of `step` is held.
    pub fn of(self, step: u64) -> Option<Duration> {
        (step >= self.from_step).then_some(self.hold)
    }
}

/// A role's background checkpoint writer.
pub struct Uploader {
    tx: SyncSender<Snapshot>,
    busy: Arc<AtomicUsize>,
    pending: PendingUploads,
}

impl Uploader {
    /// Starts the writer of job `job`'s shards; it reports through `report`
    /// and counts each shard in `pending` until the API acknowledged it
    /// (the report's delivery takes it off). An upload may be held after
    /// its local write (`delay`, the `TRAINYARD_UPLOAD_DELAY_MS` test hook).
    pub fn start(
        storage: Arc<Storage>,
        job: Uuid,
        report: UnboundedSender<Item>,
        pending: PendingUploads,
        delay: Option<UploadDelay>,
    ) -> Uploader {
        // Rendezvous: a snapshot is taken only when the writer is idle.
        let (tx, rx) = sync_channel::<Snapshot>(0);
        let busy = Arc::new(AtomicUsize::new(0));
        let in_flight = busy.clone();
        let given_up = pending.clone();
        let spawned = std::thread::Builder::new()
            .name("checkpoint-upload".into())
            .spawn(move || {
                for snap in rx {
                    let (step, shard) = (snap.step, snap.shard);
                    let started = Instant::now();
                    match upload(&storage, job, snap, delay) {
                        Ok(done) => {
                            let _ = report.send(Item::Log(
                                LogLevel::Info,
                                format!(
                                    "checkpoint of step {step}: shard {shard} of {} uploaded ({:.1} MiB in {:.2} s)",
                                    done.shards,
                                    done.bytes as f64 / (1 << 20) as f64,
                                    started.elapsed().as_secs_f64()
                                ),
                            ));
                            let _ = report.send(Item::Checkpoint(done));
                        }
                        Err(e) => {
                            given_up.done(1);
                            let _ = report.send(Item::Log(
                                LogLevel::Warn,
                                format!("checkpoint of step {step}: shard {shard} failed: {e}"),
                            ));
                        }
                    }
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the checkpoint writer");
        }
        Uploader { tx, busy, pending }
    }

    /// Hands `snap` over; blocks while the previous upload is running.
    pub fn submit(&self, snap: Snapshot) {
        self.pending.add();
        self.busy.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(snap).is_err() {
            self.pending.done(1);
            self.busy.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Waits up to `timeout` for the uploads handed over to finish.
    pub fn flush(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while self.busy.load(Ordering::Relaxed) > 0 {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }
}

fn upload(
    storage: &Storage,
    job: Uuid,
    snap: Snapshot,
    delay: Option<UploadDelay>,
) -> Result<ShardUploaded, StorageError> {
    let refs: Vec<&[f32]> = snap.tensors.iter().map(|t| t.as_slice()).collect();
    let bytes = shard::encode(&snap.ranges, &refs, snap.step).map_err(StorageError::Checkpoint)?;
    drop(refs);
    let sha256 = shard::sha256(&bytes);
    let key = shard_key(job, snap.step, snap.shard);
    // The local tier first: a recovery on this machine reads it back warm.
    if let Err(e) = storage.cache.put(&storage.store.url_of(&key), &bytes) {
        tracing::warn!(error = %e, "cannot keep a checkpoint shard in the local cache");
    }
    if let Some(d) = delay.and_then(|d| d.of(snap.step)) {
        std::thread::sleep(d);
    }
    let len = bytes.len() as u64;
    storage.put(&key, Bytes::from(bytes))?;
    Ok(ShardUploaded {
        step: snap.step,
        generation: snap.generation,
        shard: snap.shard,
        shards: snap.shards,
        key,
        bytes: len,
        sha256,
        ranges: snap.ranges,
        numel: snap.numel,
        state_tensors: snap.tensors.len() as u32 - 1,
        optimizer_t: snap.optimizer_t,
        cursor: snap.cursor,
    })
}

/// What a role takes from a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// Weights then optimizer state, over the pieces asked for; only the
    /// weights when the checkpoint's optimizer state does not fit.
    pub tensors: Vec<Vec<f32>>,
    /// Its step.
    pub step: u64,
    /// The data cursor.
    pub cursor: CursorState,
    /// The optimizer's step counter.
    pub optimizer_t: u64,
}

/// Loads the pieces `target` of a committed checkpoint for a model of
/// `numel` elements whose optimizer keeps `state_tensors` tensors.
pub fn load(
    storage: &Storage,
    at: &CheckpointRef,
    target: &[Range],
    numel: u64,
    state_tensors: usize,
) -> Result<Loaded, StorageError> {
    let bad = StorageError::Checkpoint;
    let raw = storage
        .read_remote(&at.manifest)
        .map_err(|e| bad(format!("checkpoint manifest: {e}")))?;
    let m: Manifest = serde_json::from_slice(&raw).map_err(|e| {
        bad(format!(
            "unreadable checkpoint manifest {}: {e}",
            at.manifest
        ))
    })?;
    if m.format != MANIFEST_FORMAT {
        return Err(bad(format!(
            "checkpoint manifest format {} is unknown",
            m.format
        )));
    }
    if m.numel != numel {
        return Err(bad(format!(
            "the checkpoint of step {} holds {} values, this model has {numel}: not the same model",
            m.step, m.numel
        )));
    }
    let sources: Vec<Vec<Range>> = m.shards.iter().map(|s| s.ranges.clone()).collect();
    let copies = plan_copies(&sources, target).map_err(bad)?;
    let keep = if m.state_tensors as usize == state_tensors {
        1 + state_tensors
    } else {
        1
    };
    let len: u64 = target.iter().map(|r| r.end - r.start).sum();
    let mut out = vec![vec![0f32; len as usize]; keep];
    let needed: std::collections::BTreeSet<usize> = copies.iter().map(|c| c.shard).collect();
    for si in needed {
        let s = &m.shards[si];
        let bytes = storage.read(&s.key, Some(&s.sha256))?;
        if shard::sha256(&bytes) != s.sha256 {
            return Err(bad(format!(
                "checkpoint shard {} does not match its checksum",
                s.key
            )));
        }
        let decoded = shard::decode(&bytes).map_err(|e| bad(format!("{}: {e}", s.key)))?;
        if decoded.ranges != s.ranges || decoded.tensors.len() < keep {
            return Err(bad(format!(
                "checkpoint shard {} does not match its manifest",
                s.key
            )));
        }
        for c in copies.iter().filter(|c| c.shard == si) {
            let (src, dst, n) = (c.src as usize, c.dst as usize, c.len as usize);
            for (o, t) in out.iter_mut().zip(&decoded.tensors) {
                o[dst..dst + n].copy_from_slice(&t[src..src + n]);
            }
        }
    }
    Ok(Loaded {
        tensors: out,
        step: m.step,
        cursor: m.cursor,
        optimizer_t: m.shards.first().map_or(0, |s| s.optimizer_t),
    })
}

/// A ring rank's checkpointing: its policy and writer.
pub struct Checkpointing {
    /// When.
    pub policy: Policy,
    /// The writer.
    pub uploader: Uploader,
    /// The rank's generation.
    pub generation: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_common::checkpoint::{flat_to_ranges, manifest_key, ring_slice};

    fn storage(name: &str) -> (Arc<Storage>, tokio::runtime::Runtime) {
        let dir = std::env::temp_dir().join(format!("ty-ckpt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (s, rt) = Storage::for_tests(&dir);
        (Arc::new(s), rt)
    }

    fn uploaded(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Item>) -> Vec<ShardUploaded> {
        let mut out = Vec::new();
        while let Ok(i) = rx.try_recv() {
            if let Item::Checkpoint(c) = i {
                out.push(c);
            }
        }
        out
    }

    #[test]
    fn the_policy_checkpoints_every_n_steps_on_a_vote_and_at_the_end_once_per_step() {
        let spec = |every_steps, at_end| CheckpointPolicy {
            every_steps,
            every_seconds: None,
            keep: 3,
            at_end,
        };
        let mut p = Policy::new(spec(Some(10), true), Drain::default());
        let due: Vec<u64> = (1..=25).filter(|&s| p.due(s, false, s == 25)).collect();
        assert_eq!(due, [10, 20, 25]);
        assert!(p.due(7, true, false), "a vote makes any step due");
        p.written(10);
        assert!(!p.due(10, true, true), "never twice the same step");
        let p = Policy::new(spec(None, false), Drain::default());
        assert!(!(1..100).any(|s| p.due(s, false, s == 99)));
        assert!(!p.vote());
        let timed = Policy::new(
            CheckpointPolicy {
                every_seconds: Some(1),
                ..spec(None, false)
            },
            Drain::default(),
        );
        assert!(!timed.vote());
        std::thread::sleep(Duration::from_millis(1100));
        assert!(timed.vote(), "a writer's clock votes once T has passed");
    }

    #[test]
    fn a_drain_votes_for_one_checkpoint() {
        let drain = Drain::default();
        let mut p = Policy::new(
            CheckpointPolicy {
                every_steps: None,
                every_seconds: None,
                keep: 3,
                at_end: false,
            },
            drain.clone(),
        );
        assert!(!p.vote());
        drain.start();
        assert!(p.vote(), "a draining executor asks for a checkpoint");
        p.written(4);
        assert!(!p.vote(), "once: the drain's checkpoint was written");
    }

    #[test]
    fn each_request_of_the_scheduler_gets_one_checkpoint() {
        let request = CheckpointRequest::default();
        let never = CheckpointPolicy {
            every_steps: None,
            every_seconds: None,
            keep: 3,
            at_end: false,
        };
        let mut p = Policy::new(never, Drain::default()).asked_by(request.clone());
        assert!(!p.vote());
        request.set(true);
        assert!(p.vote(), "an open request asks for a checkpoint");
        request.set(true);
        p.written(3);
        assert!(!p.vote(), "once per request, however often it is repeated");
        request.set(false);
        assert!(!p.vote());
        request.set(true);
        assert!(p.vote(), "a new request after one was called off");
        p.written(9);
        assert!(!p.vote());
    }

    #[test]
    fn the_upload_hold_parses_and_holds_from_its_step() {
        let every = UploadDelay::parse("40").unwrap();
        assert_eq!(every.of(0), Some(Duration::from_millis(40)));
        let later = UploadDelay::parse("40@100").unwrap();
        assert_eq!(later.of(50), None);
        assert_eq!(later.of(100), Some(Duration::from_millis(40)));
        assert_eq!(UploadDelay::parse("x@1"), None);
        assert_eq!(UploadDelay::parse("40@"), None);
    }

    #[test]
    fn a_snapshot_waits_for_the_previous_upload_instead_of_piling_up() {
        let (st, _rt) = storage("rendezvous");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let job = Uuid::nil();
        let u = Uploader::start(
            st,
            job,
            tx,
            PendingUploads::default(),
            Some(UploadDelay {
                hold: Duration::from_millis(300),
                from_step: 0,
            }),
        );
        let snap = |step| Snapshot {
            step,
            generation: 1,
            shard: 0,
            shards: 1,
            ranges: vec![Range {
                param: "w".into(),
                start: 0,
                end: 4,
                buffer: false,
            }],
            tensors: vec![vec![step as f32; 4]],
            numel: 4,
            optimizer_t: step,
            cursor: CursorState::default(),
        };
        u.submit(snap(1));
        u.submit(snap(2));
        // The second hand-over waited until the first upload was done: at
        // most one snapshot was ever waiting besides the one uploading.
        assert!(!uploaded(&mut rx).is_empty());
        u.submit(snap(3));
        assert!(u.flush(Duration::from_secs(10)));
        let mut done: Vec<u64> = uploaded(&mut rx).iter().map(|c| c.step).collect();
        done.sort_unstable();
        assert_eq!(done, [2, 3]);
    }

    #[test]
    fn a_checkpoint_written_by_three_ranks_loads_into_two_with_its_checksums_checked() {
        let (st, _rt) = storage("reshard");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let job = Uuid::new_v4();
        let layout = vec![("a".to_owned(), 0, 7), ("b".to_owned(), 7, 10)];
        let numel = 17usize;
        let value = |i: usize, k: usize| (i * 10 + k) as f32;
        let u = Uploader::start(st.clone(), job, tx, PendingUploads::default(), None);
        for rank in 0..3 {
            let (a, b) = ring_slice(numel, rank, 3);
            u.submit(Snapshot {
                step: 40,
                generation: 2,
                shard: rank,
                shards: 3,
                ranges: flat_to_ranges(&layout, a, b),
                tensors: (0..3)
                    .map(|k| (a..b).map(|i| value(i, k)).collect())
                    .collect(),
                numel: numel as u64,
                optimizer_t: 40,
                cursor: CursorState {
                    epoch: 1,
                    offset: 64,
                },
            });
        }
        assert!(u.flush(Duration::from_secs(10)));
        let reports = uploaded(&mut rx);
        let m = Manifest::from_reports(job, &reports).expect("a complete checkpoint");
        st.put(
            &manifest_key(job, 40),
            serde_json::to_vec(&m).unwrap().into(),
        )
        .unwrap();
        let at = CheckpointRef {
            job_id: job,
            step: 40,
            manifest: manifest_key(job, 40),
        };
        for rank in 0..2 {
            let (a, b) = ring_slice(numel, rank, 2);
            let l = load(&st, &at, &flat_to_ranges(&layout, a, b), numel as u64, 2).unwrap();
            assert_eq!((l.step, l.cursor.offset, l.optimizer_t), (40, 64, 40));
            for (k, t) in l.tensors.iter().enumerate() {
                assert_eq!(*t, (a..b).map(|i| value(i, k)).collect::<Vec<_>>());
            }
        }
        // Another optimizer: the weights only.
        let all = flat_to_ranges(&layout, 0, numel);
        assert_eq!(
            load(&st, &at, &all, numel as u64, 0).unwrap().tensors.len(),
            1
        );
        // Another model: refused by name.
        let e = load(&st, &at, &all, 99, 2).unwrap_err();
        assert!(e.to_string().contains("not the same model"), "{e}");
        // A damaged shard in the store (and none cached) is refused.
        let (st2, _rt2) = storage("reshard-cold");
        let key = &m.shards[0].key;
        let mut bytes = st.read_remote(key).unwrap().to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        st2.put(key, bytes.into()).unwrap();
        st2.put(&at.manifest, serde_json::to_vec(&m).unwrap().into())
            .unwrap();
        let e = load(&st2, &at, &all, numel as u64, 2).unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
    }
}
