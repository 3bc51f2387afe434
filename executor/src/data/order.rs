//! The arithmetic of an epoch's order (see the module documentation):
//! the lanes and round-robin blocks of a [`Plan`], the seeded shard order
//! and shuffle windows, the stream position of an order position, and the
//! order-independent id hash. Pure functions of the seed, shared by the
//! loader and the property tests that check every sample is used once.

use crate::data::rng::Rng;

/// An epoch's order: lanes of the stream, and blocks of `batch` taken
/// round-robin over them (see the module documentation).
#[derive(Debug, Clone)]
pub struct Plan {
    /// Each lane's first stream position and length.
    pub lanes: Vec<(u64, u64)>,
    /// Each block's lane and lane-local start.
    blocks: Vec<(u32, u64)>,
    /// Each block's first order position (ascending), then the total.
    starts: Vec<u64>,
}

impl Plan {
    /// The order of a stream of `n` samples over `lanes` lanes in blocks
    /// of `batch`.
    pub fn new(n: u64, lanes: u32, batch: u64) -> Plan {
        let (l, batch) = (u64::from(lanes.max(1)).min(n.max(1)), batch.max(1));
        let (q, r) = (n / l, n % l);
        let mut lane_list = Vec::with_capacity(l as usize);
        let mut at = 0;
        for i in 0..l {
            let len = q + u64::from(i < r);
            lane_list.push((at, len));
            at += len;
        }
        let rounds = lane_list
            .iter()
            .map(|&(_, len)| len.div_ceil(batch))
            .max()
            .unwrap_or(0);
        let mut blocks = Vec::new();
        let mut starts = Vec::new();
        let mut pos = 0;
        for j in 0..rounds {
            for (i, &(_, len)) in lane_list.iter().enumerate() {
                let from = j * batch;
                if from < len {
                    blocks.push((i as u32, from));
                    starts.push(pos);
                    pos += batch.min(len - from);
                }
            }
        }
        starts.push(pos);
        Plan {
            lanes: lane_list,
            blocks,
            starts,
        }
    }

    /// Samples of the epoch.
    pub fn len(&self) -> u64 {
        *self.starts.last().unwrap_or(&0)
    }

    /// Whether the epoch is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The lane and lane-local position of order position `o`.
    pub fn locate(&self, o: u64) -> (u32, u64) {
        let b = self.starts.partition_point(|&s| s <= o) - 1;
        let (lane, from) = self.blocks[b];
        (lane, from + (o - self.starts[b]))
    }
}

/// Shuffle window `k` of lane `lane` in `epoch`: a seeded permutation of
/// its `len` positions.
pub fn window_perm(seed: u64, epoch: u64, lane: u32, k: u64, len: u64) -> Vec<i64> {
    let stream = epoch
        .wrapping_mul(0x2545_F491_4F6C_DD1D)
        .wrapping_add(u64::from(lane).wrapping_mul(0x9E37_79B9))
        .wrapping_add(k)
        ^ 0x5AFF_1E00;
    Rng::new(seed, stream).permutation(len as usize)
}

/// The seeded order of the training shards in `epoch`.
pub fn shard_order(seed: u64, epoch: u64, shards: usize) -> Vec<usize> {
    Rng::new(seed, 0x5A4D_0000 + epoch)
        .permutation(shards)
        .into_iter()
        .map(|i| i as usize)
        .collect()
}

/// The stream position of order position `o` (a window-shuffled lane
/// position).
pub fn stream_position(plan: &Plan, seed: u64, epoch: u64, window: u64, o: u64) -> u64 {
    let (lane, u) = plan.locate(o);
    let (start, len) = plan.lanes[lane as usize];
    let k = u / window;
    let wlen = window.min(len - k * window);
    let perm = window_perm(seed, epoch, lane, k, wlen);
    start + k * window + perm[(u % window) as usize] as u64
}

/// The order-independent hash of one sample id: SplitMix64's finaliser,
/// summed (wrapping) over a set of ids.
pub fn id_mix(id: u64) -> u64 {
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
