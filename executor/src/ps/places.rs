//! Where each worker of an async or bounded job is in the data. Out of
//! sync each worker walks its own share from its own cursor, so shard 0
//! keeps each rank's place — the cursor after its last push the shard took
//! ([`Places`], a field of [`super::shard::Shard`]) — and a worker takes up
//! its rank's place when a generation starts ([`take_up_place`], over the
//! `Where`/`Place` messages): a replacement goes on where the lost worker
//! left off instead of walking the share again. The slowest place is the
//! shard's own cursor, which its standby and its checkpoints carry, so a
//! job resumed from them leaves no sample of any share untrained. A
//! generation with another number of workers deals the data in slices of
//! another width, where a rank's old place means nothing: every rank then
//! starts at the slowest place.

use super::step::PsStep;
use crate::data::Cursor;
use crate::error::RoleError;
use crate::replica::Replica;
use std::collections::BTreeMap;
use trainyard_shutdown::Shutdown;

/// Each rank's place in the data, as shard 0 keeps it.
#[derive(Debug, Default)]
pub(super) struct Places(BTreeMap<u32, Cursor>);

impl Places {
    /// Where rank `rank` resumes: its place, else the place its worker
    /// `kept` from an earlier generation, else the slowest place known
    /// (else `start`): a replacement whose rank has no record because
    /// shard 0 was lost or restored. The answer is the rank's place from
    /// now on.
    pub(super) fn take_up(&mut self, rank: u32, kept: Option<Cursor>, start: Cursor) -> Cursor {
        let floor = self.floor(start);
        *self.0.entry(rank).or_insert_with(|| kept.unwrap_or(floor))
    }

    /// Rank `rank`'s next step starts at `next`.
    pub(super) fn moved(&mut self, rank: u32, next: Cursor) {
        self.0.insert(rank, next);
    }

    /// The slowest rank's place (`start` where none is known).
    pub(super) fn floor(&self, start: Cursor) -> Cursor {
        self.0.values().min().copied().unwrap_or(start)
    }

    /// A generation of `workers` workers where there were others: every
    /// rank at the slowest place (`start` where none is known).
    pub(super) fn regroup(&mut self, workers: u32, start: Cursor) {
        let floor = self.floor(start);
        self.0 = (0..workers).map(|r| (r, floor)).collect();
    }

    /// Forgets every place (a shard restored from a checkpoint, whose
    /// cursor is the slowest place).
    pub(super) fn clear(&mut self) {
        self.0.clear();
    }
}

/// Out of sync, a worker takes up its rank's place in the data as shard 0
/// keeps it: a replacement goes on where the lost worker left off rather
/// than walking the whole share again, and a worker whose rank changed
/// walks its new rank's share. The place where it moved the replica there
/// (`None` where the replica already was).
pub(super) fn take_up_place(
    rep: &mut Replica,
    ps: &mut PsStep,
    world: u32,
    stop: &Shutdown,
) -> Result<Option<Cursor>, RoleError> {
    let kept = (rep.step > 0).then_some(rep.cursor);
    let at = ps.ask_place(kept, stop)?;
    if kept == Some(at) || (kept.is_none() && at == Cursor::default()) {
        return Ok(None);
    }
    rep.resume_at(at, world);
    Ok(Some(at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cursor() -> impl Strategy<Value = Cursor> {
        (0u64..5, 0u64..2000).prop_map(|(epoch, offset)| Cursor { epoch, offset })
    }

    proptest! {
        /// A rank's place is its last move, whatever the others do and
        /// whatever a worker says it kept; the floor is the least of them;
        /// after a regroup every rank is at the old floor.
        #[test]
        fn a_rank_keeps_its_last_place_and_a_regroup_starts_all_at_the_slowest(
            moves in proptest::collection::vec((0u32..4, cursor()), 1..40),
            kept in cursor(),
        ) {
            let mut p = Places::default();
            let mut last = BTreeMap::new();
            for &(r, c) in &moves {
                p.moved(r, c);
                last.insert(r, c);
            }
            for (&r, &c) in &last {
                prop_assert_eq!(p.take_up(r, Some(kept), Cursor::default()), c);
            }
            let floor = *last.values().min().unwrap();
            prop_assert_eq!(p.floor(Cursor::default()), floor);
            // A rank that never moved takes what it kept, else the floor.
            prop_assert_eq!(p.take_up(9, Some(kept), Cursor::default()), kept);
            prop_assert_eq!(p.take_up(10, None, Cursor::default()), floor.min(kept));
            let floor = p.floor(Cursor::default());
            p.regroup(3, Cursor::default());
            for r in 0..3 {
                prop_assert_eq!(p.take_up(r, Some(kept), Cursor::default()), floor);
            }
        }
    }
}
