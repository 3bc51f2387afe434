//! The epoch's order under any joins, leaves and kills (each sample once;
//! at full size each rank in its own lane), the `.npy` header reader and
//! the order-independent id hash.

use super::formats::npz::npy_shape;
use super::order::{id_mix, shard_order, stream_position, Plan};
use crate::data::samples::{slice, Cursor};
use proptest::prelude::*;

/// What happens between two steps of the simulated job.
#[derive(Debug, Clone, Copy)]
enum Event {
    /// Nothing: the same workers step.
    Step,
    /// A worker joins at the next step.
    Join,
    /// A worker leaves cleanly after its step.
    Leave,
    /// A worker is killed mid-step: the step is lost on every rank (a
    /// ring rebuilds at the last completed step) and the world shrinks.
    Kill,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => Just(Event::Step),
        1 => Just(Event::Join),
        1 => Just(Event::Leave),
        1 => Just(Event::Kill),
    ]
}

proptest! {
    /// Whatever joins, leaves and kills happen, every sample of the
    /// epoch — every (shard, row) of the training shards — is consumed
    /// exactly once, through the lanes, the shuffle windows and the
    /// seeded shard order, and the order is a permutation.
    #[test]
    fn every_sample_once_under_joins_leaves_and_kills(
        shard_sizes in proptest::collection::vec(1u64..60, 1..12),
        batch in 1u64..17,
        lanes in 1u32..6,
        window in 1u64..40,
        seed in any::<u64>(),
        epoch in 0u64..3,
        start in 1u32..6,
        events in proptest::collection::vec(event(), 1..200),
    ) {
        let n: u64 = shard_sizes.iter().sum();
        let order = shard_order(seed, epoch, shard_sizes.len());
        let mut starts = vec![0u64];
        for &s in &order {
            starts.push(starts.last().unwrap() + shard_sizes[s]);
        }
        let plan = Plan::new(n, lanes, batch);
        prop_assert_eq!(plan.len(), n);
        let mut seen = vec![0u32; n as usize];
        let mut cursor = Cursor { epoch, offset: 0 };
        let mut world = start.min(lanes.max(1) + 2);
        let mut i = 0;
        while cursor.epoch == epoch {
            let ev = events[i % events.len()];
            i += 1;
            let mut consumed = Vec::new();
            let mut next = None;
            for rank in 0..world {
                let (r, nx) = slice(n as usize, batch as usize, rank, world, cursor);
                for o in r {
                    let p = stream_position(&plan, seed, epoch, window, o as u64);
                    let j = starts.partition_point(|&s| s <= p) - 1;
                    let (shard, row) = (order[j], p - starts[j]);
                    let id = shard_sizes[..shard].iter().sum::<u64>() + row;
                    consumed.push(id);
                }
                prop_assert!(next.is_none_or(|m| m == nx));
                next = Some(nx);
            }
            match ev {
                Event::Kill if world > 1 => {
                    // The step dies with the worker: nothing counted.
                    world -= 1;
                    continue;
                }
                Event::Join => world = (world + 1).min(8),
                Event::Leave if world > 1 => world -= 1,
                _ => {}
            }
            for id in consumed {
                seen[id as usize] += 1;
            }
            cursor = next.unwrap();
        }
        prop_assert!(seen.iter().all(|&c| c == 1), "{:?}", seen);
    }

    /// At the job's largest size each rank's blocks stay in its own
    /// lane: a worker reads only its contiguous share of the shards.
    #[test]
    fn at_full_size_each_rank_reads_its_own_lane(n in 1u64..2000, batch in 1u64..33, lanes in 1u32..6) {
        let plan = Plan::new(n, lanes, batch);
        let world = plan.lanes.len() as u32;
        let mut cursor = Cursor::default();
        let q = n / u64::from(world);
        // While every lane still has a full block, rank r is in lane r.
        while cursor.epoch == 0 && (cursor.offset / (u64::from(world) * batch) + 1) * batch <= q {
            for rank in 0..world {
                let (r, _) = slice(n as usize, batch as usize, rank, world, cursor);
                for o in r {
                    prop_assert_eq!(plan.locate(o as u64).0, rank);
                }
            }
            cursor = slice(n as usize, batch as usize, 0, world, cursor).1;
        }
    }
}

#[test]
fn npy_headers_give_shapes() {
    let mut h = b"\x93NUMPY\x01\x00".to_vec();
    let dict = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 64), }          \n";
    h.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    h.extend_from_slice(dict);
    assert_eq!(npy_shape(&h), Some(vec![1000, 64]));
    let one = b"{'descr': '<i8', 'fortran_order': False, 'shape': (7,), }";
    let mut h = b"\x93NUMPY\x01\x00".to_vec();
    h.extend_from_slice(&(one.len() as u16).to_le_bytes());
    h.extend_from_slice(one);
    assert_eq!(npy_shape(&h), Some(vec![7]));
    assert_eq!(npy_shape(b"not numpy"), None);
}

#[test]
fn ids_hash_independently_of_order() {
    let a: u64 = [3u64, 9, 27]
        .iter()
        .map(|&i| id_mix(i))
        .fold(0, u64::wrapping_add);
    let b: u64 = [27u64, 3, 9]
        .iter()
        .map(|&i| id_mix(i))
        .fold(0, u64::wrapping_add);
    assert_eq!(a, b);
    assert_ne!(id_mix(1), id_mix(2));
}
