//! The collectives that pass data along the ring as a chain: the broadcast
//! from one rank (how a new member receives weights and optimizer state)
//! and the all-gather of a few numbers per rank.

use super::split::Split;
use super::wire::{expect, read_header, read_payload, write_frame};
use super::{Ring, RingError};
use crate::frame::{Patient, Tag};
use std::sync::atomic::Ordering;
use std::time::Instant;
use trainyard_shutdown::Shutdown;

impl Ring {
    /// Copies `data` of rank `root` into `data` of every rank.
    pub fn broadcast(
        &mut self,
        data: &mut [f32],
        root: u32,
        stop: &Shutdown,
    ) -> Result<(), RingError> {
        let root = root % self.world;
        self.collective(|ring| ring.broadcast_inner(data, root, stop))
    }

    fn broadcast_inner(
        &mut self,
        data: &mut [f32],
        root: u32,
        stop: &Shutdown,
    ) -> Result<(), RingError> {
        self.collective = self.collective.wrapping_add(1);
        let coll = self.collective;
        let ops = data.len().div_ceil(self.segment).max(1);
        let parts = Split::new(data.len(), ops);
        let forwards = (self.rank + 1) % self.world != root;
        let deadline = Instant::now() + self.timeout;
        let (rank, timeout, stats) = (self.rank, self.timeout, self.stats.clone());
        let links = self
            .links
            .as_mut()
            .ok_or_else(|| RingError::Broken("not connected".into()))?;
        // A chain from the root: nobody writes before it has read, so plain
        // blocking writes cannot deadlock.
        for op in 0..ops {
            let (o, l) = parts.part(op);
            if rank != root {
                let mut reader = Patient {
                    stream: &mut links.left,
                    stop,
                    deadline: Some(deadline),
                };
                let h = read_header(&mut reader, timeout)?;
                expect(&h, Tag::Broadcast, coll, op, l * 4)?;
                read_payload(
                    &mut reader,
                    bytemuck::cast_slice_mut(&mut data[o..o + l]),
                    timeout,
                )?;
            }
            if rank == root || forwards {
                let bytes = write_frame(
                    &mut links.right,
                    Tag::Broadcast,
                    coll,
                    op,
                    bytemuck::cast_slice(&data[o..o + l]),
                )?;
                stats.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Every rank's `mine` (all of the same length, a few values), by rank.
    pub fn allgather_u64(
        &mut self,
        mine: &[u64],
        stop: &Shutdown,
    ) -> Result<Vec<Vec<u64>>, RingError> {
        let n = self.world as usize;
        let mut all = vec![Vec::new(); n];
        all[self.rank as usize] = mine.to_vec();
        self.collective(|ring| ring.allgather_inner(&mut all, mine.len(), stop))?;
        Ok(all)
    }

    fn allgather_inner(
        &mut self,
        all: &mut [Vec<u64>],
        len: usize,
        stop: &Shutdown,
    ) -> Result<(), RingError> {
        let n = self.world as usize;
        let r = self.rank as usize;
        self.collective = self.collective.wrapping_add(1);
        let coll = self.collective;
        let deadline = Instant::now() + self.timeout;
        let timeout = self.timeout;
        let links = self
            .links
            .as_mut()
            .ok_or_else(|| RingError::Broken("not connected".into()))?;
        for s in 0..n - 1 {
            // A few bytes: they fit the socket's buffer, so writing before
            // reading cannot deadlock.
            let out: Vec<u8> = all[(r + n - s) % n]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            write_frame(&mut links.right, Tag::Gather, coll, s, &out)?;
            let mut reader = Patient {
                stream: &mut links.left,
                stop,
                deadline: Some(deadline),
            };
            let h = read_header(&mut reader, timeout)?;
            expect(&h, Tag::Gather, coll, s, len * 8)?;
            let mut bytes = vec![0u8; len * 8];
            read_payload(&mut reader, &mut bytes, timeout)?;
            all[(r + n - s - 1) % n] = bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
        }
        Ok(())
    }
}
