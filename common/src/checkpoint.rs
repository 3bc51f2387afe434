//! Checkpoints as every process sees them: the object layout, the manifest
//! that commits a checkpoint, what a role reports when it has uploaded its
//! shard, and the pure re-sharding arithmetic that lets a checkpoint written
//! by one cluster shape be loaded by another.
//!
//! Layout under the store's prefix: `{job}/step-{step}/shard-{i}.safetensors`
//! (one per writer: a ring rank or a PS shard server) and
//! `{job}/step-{step}/manifest.json`, written last by the API once every
//! shard has been reported; the Postgres `checkpoints` row follows the
//! manifest. A shard holds pieces of the model's tensors (each a [`Range`]
//! of one flattened tensor), concatenated in order, once for the weights and
//! once per optimizer state tensor.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A slice of one tensor owned by a PS shard: elements `[start, end)` of
/// the flattened tensor `param`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Range {
    /// Tensor name.
    pub param: String,
    /// First element (inclusive) in the flattened tensor.
    pub start: u64,
    /// Last element (exclusive).
    pub end: u64,
    /// The tensor is a buffer (model state no optimizer changes): a PS
    /// shard keeps its buffer ranges after its parameter ranges and takes
    /// rank 0's values for them instead of applying a gradient.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub buffer: bool,
}
use uuid::Uuid;

/// Manifest format version.
pub const MANIFEST_FORMAT: u32 = 1;

/// The folder of one checkpoint, relative to the store's prefix.
pub fn step_dir(job: Uuid, step: u64) -> String {
    format!("{job}/step-{step}")
}

/// A shard's object key, relative to the store's prefix.
pub fn shard_key(job: Uuid, step: u64, shard: u32) -> String {
    format!("{}/shard-{shard}.safetensors", step_dir(job, step))
}

/// The manifest's object key, relative to the store's prefix.
pub fn manifest_key(job: Uuid, step: u64) -> String {
    format!("{}/manifest.json", step_dir(job, step))
}

/// The final weights' object key, relative to the store's prefix.
pub fn model_key(job: Uuid) -> String {
    format!("{job}/final/model.safetensors")
}

/// The trained TorchScript module's object key (TorchScript jobs only),
/// beside [`model_key`].
pub fn torchscript_key(job: Uuid) -> String {
    format!("{job}/final/model.pt")
}

/// The folder of a script job's committed checkpoints (what its rank 0
/// wrote to `TRAINYARD_CHECKPOINT_DIR`), one numbered folder each.
pub fn script_checkpoints_prefix(job: Uuid) -> String {
    format!("{job}/script-checkpoints/")
}

/// The folder of a script job's checkpoint `seq`: its files under
/// `files/`, then `manifest.json`, written last.
pub fn script_checkpoint_dir(job: Uuid, seq: u64) -> String {
    format!("{}{seq:010}/", script_checkpoints_prefix(job))
}

/// One committed script checkpoint's manifest (`manifest.json`, written
/// last into its folder): what the executor stored and the API lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptManifest {
    /// Its number (the job's commits, in order).
    pub seq: u64,
    /// The generation whose rank 0 wrote it.
    pub generation: u64,
    /// The step the script last reported (`trainyard.report()`) before
    /// the commit, if it reports.
    #[serde(default)]
    pub step: Option<u64>,
    /// When it was committed.
    #[serde(default)]
    pub committed_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Its files.
    pub files: Vec<ScriptManifestFile>,
}

/// One file of a script checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptManifestFile {
    /// Path in the folder.
    pub path: String,
    /// Bytes.
    pub size: u64,
    /// SHA-256, hex.
    pub sha256: String,
}

/// The folder of a script job's outputs (rank 0's
/// `TRAINYARD_OUTPUT_DIR`), relative to the store's prefix.
pub fn outputs_prefix(job: Uuid) -> String {
    format!("{job}/outputs/")
}

/// An output file's object key: `path` is relative to the outputs folder.
pub fn output_key(job: Uuid, path: &str) -> String {
    format!("{}{path}", outputs_prefix(job))
}

/// Parses the step out of a `step-{n}` folder name.
pub fn parse_step_dir(name: &str) -> Option<u64> {
    name.strip_prefix("step-")?.parse().ok()
}

/// Where training stood in the data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CursorState {
    /// Epoch, from 0.
    pub epoch: u64,
    /// Samples of the epoch consumed (all workers together).
    pub offset: u64,
}

/// What a role reports once its shard of a checkpoint is in the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShardUploaded {
    /// Global step of the checkpoint.
    pub step: u64,
    /// Generation whose cluster wrote it.
    pub generation: i64,
    /// This shard's index.
    pub shard: u32,
    /// How many shards make the checkpoint.
    pub shards: u32,
    /// Object key relative to the store's prefix.
    pub key: String,
    /// Bytes of the object.
    pub bytes: u64,
    /// SHA-256 of the object (hex).
    pub sha256: String,
    /// The tensor pieces it holds, in order.
    pub ranges: Vec<Range>,
    /// Elements of the whole model.
    pub numel: u64,
    /// Optimizer state tensors stored after the weights (0 for SGD).
    pub state_tensors: u32,
    /// The optimizer's step counter.
    pub optimizer_t: u64,
    /// The data cursor after the step.
    pub cursor: CursorState,
}

/// One shard in a manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ManifestShard {
    /// Index.
    pub shard: u32,
    /// Object key relative to the store's prefix.
    pub key: String,
    /// Bytes.
    pub bytes: u64,
    /// SHA-256 (hex).
    pub sha256: String,
    /// The tensor pieces it holds, in order.
    pub ranges: Vec<Range>,
    /// The optimizer's step counter in this shard.
    pub optimizer_t: u64,
}

/// `manifest.json`: the commit point of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Manifest {
    /// Format version ([`MANIFEST_FORMAT`]).
    pub format: u32,
    /// The job that wrote it.
    pub job_id: Uuid,
    /// Global step.
    pub step: u64,
    /// Generation whose cluster wrote it.
    pub generation: i64,
    /// Elements of the whole model.
    pub numel: u64,
    /// Optimizer state tensors per shard after the weights.
    pub state_tensors: u32,
    /// The data cursor after the step.
    pub cursor: CursorState,
    /// The shards, in index order.
    pub shards: Vec<ManifestShard>,
    /// Bytes of all shards.
    pub bytes: u64,
}

impl Manifest {
    /// Builds the manifest of a complete set of shard reports (one per index
    /// `0..shards`, all of one step); `None` when the set is incomplete or
    /// inconsistent.
    pub fn from_reports(job_id: Uuid, reports: &[ShardUploaded]) -> Option<Manifest> {
        let first = reports.first()?;
        let n = first.shards as usize;
        if reports.len() != n {
            return None;
        }
        let mut shards: Vec<&ShardUploaded> = reports.iter().collect();
        shards.sort_by_key(|r| r.shard);
        let consistent = shards.iter().enumerate().all(|(i, r)| {
            r.shard as usize == i
                && r.shards == first.shards
                && r.step == first.step
                && r.numel == first.numel
                && r.state_tensors == first.state_tensors
        });
        if !consistent {
            return None;
        }
        let covered: u64 = shards
            .iter()
            .flat_map(|r| &r.ranges)
            .map(|r| r.end - r.start)
            .sum();
        if covered != first.numel {
            return None;
        }
        Some(Manifest {
            format: MANIFEST_FORMAT,
            job_id,
            step: first.step,
            generation: shards.iter().map(|r| r.generation).max().unwrap_or(0),
            numel: first.numel,
            state_tensors: first.state_tensors,
            cursor: shards[0].cursor,
            bytes: shards.iter().map(|r| r.bytes).sum(),
            shards: shards
                .iter()
                .map(|r| ManifestShard {
                    shard: r.shard,
                    key: r.key.clone(),
                    bytes: r.bytes,
                    sha256: r.sha256.clone(),
                    ranges: r.ranges.clone(),
                    optimizer_t: r.optimizer_t,
                })
                .collect(),
        })
    }
}

/// A committed checkpoint a role starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointRef {
    /// The job that wrote it.
    pub job_id: Uuid,
    /// Its step.
    pub step: u64,
    /// Manifest key relative to the store's prefix.
    pub manifest: String,
}

/// One piece to copy when loading: `len` elements from offset `src` of a
/// source shard's concatenated values to offset `dst` of the target's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PieceCopy {
    /// Source shard (index into the manifest's shards).
    pub shard: usize,
    /// Offset in the source's concatenated values.
    pub src: u64,
    /// Offset in the target's concatenated values.
    pub dst: u64,
    /// Elements.
    pub len: u64,
}

/// How to fill `target` (pieces concatenated in order) from shards holding
/// `sources[i]`: the copies, or the first target element no source holds.
pub fn plan_copies(sources: &[Vec<Range>], target: &[Range]) -> Result<Vec<PieceCopy>, String> {
    let mut copies = Vec::new();
    let mut dst = 0u64;
    for t in target {
        let mut covered = 0u64;
        for (si, pieces) in sources.iter().enumerate() {
            let mut src = 0u64;
            for p in pieces {
                if p.param == t.param {
                    let (a, b) = (p.start.max(t.start), p.end.min(t.end));
                    if a < b {
                        copies.push(PieceCopy {
                            shard: si,
                            src: src + (a - p.start),
                            dst: dst + (a - t.start),
                            len: b - a,
                        });
                        covered += b - a;
                    }
                }
                src += p.end - p.start;
            }
        }
        if covered != t.end - t.start {
            return Err(format!(
                "the checkpoint does not hold all of {}[{}..{}]",
                t.param, t.start, t.end
            ));
        }
        dst += t.end - t.start;
    }
    Ok(copies)
}

/// Splits a model's flat layout (`(name, offset, numel)` in order) into the
/// pieces of flat elements `[start, end)`.
pub fn flat_to_ranges(layout: &[(String, usize, usize)], start: usize, end: usize) -> Vec<Range> {
    layout
        .iter()
        .filter_map(|(name, off, n)| {
            let (a, b) = (start.max(*off), end.min(off + n));
            (a < b).then(|| Range {
                param: name.clone(),
                start: (a - off) as u64,
                end: (b - off) as u64,
                buffer: false,
            })
        })
        .collect()
}

/// Rank `rank` of `world`'s share of `numel` flat elements (the ranks of a
/// ring write disjoint, nearly equal slices).
pub fn ring_slice(numel: usize, rank: u32, world: u32) -> (usize, usize) {
    let (r, w) = (rank as usize, world.max(1) as usize);
    (numel * r / w, numel * (r + 1) / w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layout(sizes: &[usize]) -> Vec<(String, usize, usize)> {
        let mut off = 0;
        sizes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let l = (format!("p{i}"), off, *n);
                off += n;
                l
            })
            .collect()
    }

    proptest! {
        /// Whatever the writers' and the readers' slicing, every element
        /// is copied exactly once, from where it was written.
        #[test]
        fn resharding_copies_each_element_once(
            sizes in proptest::collection::vec(1usize..50, 1..6),
            writers in 1u32..6,
            readers in 1u32..6,
        ) {
            let l = layout(&sizes);
            let numel: usize = sizes.iter().sum();
            let sources: Vec<Vec<Range>> = (0..writers)
                .map(|w| { let (a, b) = ring_slice(numel, w, writers); flat_to_ranges(&l, a, b) })
                .collect();
            // Values written: each shard holds its pieces' global flat index.
            let offset = |name: &str| l.iter().find(|x| x.0 == name).unwrap().1 as u64;
            let values: Vec<Vec<u64>> = sources
                .iter()
                .map(|pieces| pieces.iter().flat_map(|p| (p.start..p.end).map(move |i| i + offset(&p.param))).collect())
                .collect();
            for r in 0..readers {
                let (a, b) = ring_slice(numel, r, readers);
                let target = flat_to_ranges(&l, a, b);
                let copies = plan_copies(&sources, &target).unwrap();
                let mut got = vec![u64::MAX; b - a];
                for c in copies {
                    for k in 0..c.len {
                        prop_assert_eq!(got[(c.dst + k) as usize], u64::MAX);
                        got[(c.dst + k) as usize] = values[c.shard][(c.src + k) as usize];
                    }
                }
                prop_assert_eq!(got, (a as u64..b as u64).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn missing_pieces_are_named() {
        let src = vec![vec![Range {
            param: "w".into(),
            start: 0,
            end: 5,
            buffer: false,
        }]];
        let t = [Range {
            param: "w".into(),
            start: 3,
            end: 8,
            buffer: false,
        }];
        let e = plan_copies(&src, &t).unwrap_err();
        assert!(e.contains("w[3..8]"), "{e}");
    }

    #[test]
    fn manifests_need_every_shard_once() {
        let job = Uuid::nil();
        let rep = |shard: u32, start: u64, end: u64| ShardUploaded {
            step: 10,
            generation: 2,
            shard,
            shards: 2,
            key: shard_key(job, 10, shard),
            bytes: 100,
            sha256: "ab".into(),
            ranges: vec![Range {
                param: "w".into(),
                start,
                end,
                buffer: false,
            }],
            numel: 10,
            state_tensors: 1,
            optimizer_t: 10,
            cursor: CursorState::default(),
        };
        assert!(Manifest::from_reports(job, &[rep(0, 0, 5)]).is_none());
        assert!(Manifest::from_reports(job, &[rep(0, 0, 5), rep(0, 5, 10)]).is_none());
        assert!(Manifest::from_reports(job, &[rep(0, 0, 5), rep(1, 5, 9)]).is_none());
        let m = Manifest::from_reports(job, &[rep(1, 5, 10), rep(0, 0, 5)]).unwrap();
        assert_eq!(m.shards[0].shard, 0);
        assert_eq!(m.bytes, 200);
        assert_eq!(parse_step_dir("step-10"), Some(10));
        assert_eq!(
            manifest_key(job, 10),
            format!("{job}/step-10/manifest.json")
        );
    }
}
