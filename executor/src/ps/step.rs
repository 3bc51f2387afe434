//! The pieces of a PS worker's step that are not its loop (the loop is
//! [`super::worker`]'s, as `ring/train.rs` drives `ring/step.rs`): what a
//! sync worker keeps of its last step, and how it brings a shard that a
//! lost primary left a version behind back to the others ([`catch_up`],
//! when [`super::consistency::after_pull`] says so).

use super::links::{exchange_push, Exchange, Link, ShardMap};
use super::to_wire;
use crate::error::RoleError;
use crate::replica::progress;
use crate::replica::Replica;
use trainyard_common::cluster::{Assignment, LogLevel};
use trainyard_dataplane::ps::PushHeader;
use trainyard_shutdown::Shutdown;

/// A sync PS worker's last step, kept across generations on its device:
/// the gradient slice it pushed to each shard, computed at `version`, and
/// what the pushes carried. When a lost primary left its (promoted) shard
/// at `version` while the other shards moved on to `version + 1`, the
/// worker pushes the slice again to the shards that are behind (a sync
/// shard takes one push per worker and version, so nothing is applied
/// twice) before it pulls: the shards never end at different versions.
pub struct LastStep {
    pub(super) version: u64,
    pub(super) slices: Vec<Vec<f32>>,
    pub(super) push: PushHeader,
}

/// Sync: brings the shards that are a version behind the others (a lost
/// primary's promoted standby) to the others' version by pushing them
/// this worker's gradient of that version again — or, where this worker
/// has none (it joined since, or its last step was another version), a
/// zero gradient over no samples, which counts it as a contributor and
/// changes neither the sum nor the samples (rank 0's carries the buffers
/// it pulled from the shards, so the round leaves them as they are).
/// Returns the version all shards are to be pulled at. The shards are at
/// most one version apart.
#[allow(clippy::too_many_arguments)]
pub(super) fn catch_up(
    links: &mut [Link],
    ex: &Exchange,
    last_step: &Option<LastStep>,
    map: &ShardMap,
    a: &Assignment,
    rank: u32,
    rep: &Replica,
    stop: &Shutdown,
    log: &dyn Fn(LogLevel, String),
) -> Result<u64, RoleError> {
    let world = a.workers.len() as u32;
    let total = rep.total_steps(world);
    let lo = ex.versions.iter().copied().min().unwrap_or(0);
    let (ahead, hi) = ex
        .versions
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|(_, v)| *v)
        .unwrap_or((0, 0));
    let mine = last_step
        .as_ref()
        .filter(|l| l.version == lo && l.slices.len() == links.len())
        .filter(|l| {
            ex.versions
                .iter()
                .zip(&l.slices)
                .zip(&map.lens)
                .all(|((v, sl), n)| *v != lo || sl.len() == *n)
        });
    let zeros: Vec<Vec<f32>>;
    let (push, slices) = match mine {
        Some(l) => (l.push, &l.slices),
        None => {
            // A sync round replaces the shards' buffers with its sum's tail:
            // rank 0's holds the buffers as pulled, the others' zeros.
            let mut flat = vec![0.0; rep.numel()];
            if rank == 0 {
                let p = rep.trainable_len().min(flat.len());
                flat[p..].copy_from_slice(&rep.read_range(p, rep.numel() - p));
            }
            zeros = (0..links.len()).map(|s| map.gather(s, &flat)).collect();
            (
                PushHeader {
                    computed_at: lo,
                    samples: 0,
                    lr: progress::learning_rate(&a.spec, lo + 1, total),
                    next_cursor: to_wire(ex.cursors[ahead]),
                    checkpoint: None,
                },
                &zeros,
            )
        }
    };
    let behind: Vec<usize> = (0..links.len()).filter(|s| ex.versions[*s] == lo).collect();
    log(
        LogLevel::Warn,
        format!(
            "worker {rank}: PS shard(s) {behind:?} are at version {lo}, the others at {hi} (a lost primary's standby): {} them this worker's gradient of version {lo} again",
            if mine.is_some() { "pushing" } else { "it has none; pushing" }
        ),
    );
    let to: Vec<Option<u64>> = ex
        .versions
        .iter()
        .map(|v| (*v == lo).then_some(lo))
        .collect();
    let acks = exchange_push(links, &push, &to, slices, stop)?;
    for (s, r) in acks.iter().enumerate() {
        if let Some(r) = r.filter(|r| !r.accepted()) {
            return Err(RoleError::ps_fatal(format!(
                "PS shard {s} answered {r:?} to version {lo}'s gradient while the others are at {hi}"
            )));
        }
    }
    Ok(hi)
}
