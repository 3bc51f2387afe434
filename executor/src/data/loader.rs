//! The streaming loader: a background thread per rank that turns order
//! positions into batches, through an LRU of decoded shuffle windows and
//! one of decoded units within the budget, while a second thread fetches
//! the shards of the next windows into the cache tier. [`Sharded::locate`]
//! uses the same epoch order to name the (shard, row) of a cursor.

use super::decode::Unit;
use super::listing::Shard;
use super::order::{id_mix, shard_order, stream_position, window_perm, Plan};
use super::pixels::Pixels;
use super::sharded::{Sharded, PREFETCH_BATCHES};
use crate::data::samples::{slice, Batch, Cursor, DataError};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender};
use std::sync::Arc;
use tch::Tensor;

/// Shuffle windows ahead of the loader whose shards are fetched in the
/// background.
pub const PREFETCH_WINDOWS: u64 = 2;

impl Sharded {
    /// The shard and row of order position `o` of `epoch` (the cursor's
    /// `(epoch, shard, offset)` view), and the shard's index in the sorted
    /// list.
    pub fn locate(&self, epoch: u64, o: u64) -> (usize, u64) {
        let e = EpochOrder::new(self, epoch);
        let p = stream_position(&e.plan, self.spec.seed, epoch, self.window, o);
        let (entry, row) = e.entry_of(p);
        let ent = &self.train[entry];
        let (unit, r) = unit_of(&self.set.shards[ent.shard], &ent.units, row);
        let before: u64 = self.set.shards[ent.shard].units[..unit].iter().sum();
        (ent.shard, before + r)
    }

    /// Starts the background loader of worker `rank` of `world` from
    /// `cursor`; it stops when the receiver is dropped.
    pub fn stream(self: &Arc<Self>, rank: u32, world: u32, cursor: Cursor) -> Receiver<Batch> {
        let (tx, rx) = sync_channel(PREFETCH_BATCHES);
        let (ptx, prx) = channel::<String>();
        let me = self.clone();
        std::thread::spawn(move || {
            let mut loader = Loader::new(&me, ptx);
            let mut cursor = cursor;
            let batch = me.spec.batch_size() as usize;
            let len = me.train_len();
            loop {
                let (range, next) = slice(len, batch, rank, world, cursor);
                let b = match loader.batch(cursor.epoch, range) {
                    Ok((x, y, id_hash, samples)) => Batch {
                        x,
                        y,
                        samples,
                        next,
                        id_hash,
                    },
                    Err(e) => {
                        // The loop sees the channel close and asks why.
                        *me.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                        return;
                    }
                };
                if tx.send(b).is_err() {
                    return;
                }
                cursor = next;
            }
        });
        let me = self.clone();
        std::thread::spawn(move || {
            // Fetches shards into the local cache tier ahead of the loader.
            while let Ok(url) = prx.recv() {
                if let Ok(f) = me.fetcher.fetch(&url) {
                    me.count(f.source, false);
                    me.stats.ahead.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        rx
    }
}

/// Which unit of `units` (of `shard`) holds row `row` of their rows, and
/// its row there.
fn unit_of(shard: &Shard, units: &[usize], mut row: u64) -> (usize, u64) {
    for &u in units {
        if row < shard.units[u] {
            return (u, row);
        }
        row -= shard.units[u];
    }
    (*units.last().unwrap_or(&0), row)
}

/// Decoded rows of one shuffle window, in stream order, and its
/// permutation.
struct Window {
    x: Tensor,
    /// The window's images, when the dataset's samples are images.
    images: Vec<Tensor>,
    y: Tensor,
    ids: Vec<u64>,
    perm: Vec<i64>,
}

/// An epoch's shard order and plan.
struct EpochOrder {
    order: Vec<usize>,
    /// Stream start of each entry in `order`, then the total.
    starts: Vec<u64>,
    plan: Plan,
}

impl EpochOrder {
    fn new(s: &Sharded, epoch: u64) -> EpochOrder {
        let order = shard_order(s.spec.seed, epoch, s.train.len());
        let mut starts = Vec::with_capacity(order.len() + 1);
        let mut at = 0;
        for &e in &order {
            starts.push(at);
            at += s.train[e].samples;
        }
        starts.push(at);
        let plan = Plan::new(at, s.lanes, u64::from(s.spec.batch_size()));
        EpochOrder {
            order,
            starts,
            plan,
        }
    }

    /// The training entry of stream position `p` and the row in it.
    fn entry_of(&self, p: u64) -> (usize, u64) {
        let i = self.starts.partition_point(|&s| s <= p) - 1;
        (self.order[i], p - self.starts[i])
    }
}

/// One rank's loader state: the epoch's order and the caches.
struct Loader<'a> {
    s: &'a Sharded,
    epoch: Option<(u64, EpochOrder)>,
    windows: HashMap<(u32, u64), Rc<Window>>,
    window_lru: VecDeque<(u32, u64)>,
    /// Decoded units and when each was last used.
    units: HashMap<(usize, usize), (Rc<Unit>, u64)>,
    /// The units by when they were last used.
    unit_lru: BTreeMap<u64, (usize, usize)>,
    tick: u64,
    unit_bytes: u64,
    prefetch: Sender<String>,
    prefetched: HashSet<String>,
    pixels: Pixels,
    /// The shape of a sample, and the shard it was first seen in.
    sample_shape: Option<(Vec<i64>, String)>,
}

impl<'a> Loader<'a> {
    fn new(s: &'a Sharded, prefetch: Sender<String>) -> Loader<'a> {
        Loader {
            s,
            epoch: None,
            windows: HashMap::new(),
            window_lru: VecDeque::new(),
            units: HashMap::new(),
            unit_lru: BTreeMap::new(),
            tick: 0,
            unit_bytes: 0,
            prefetch,
            prefetched: HashSet::new(),
            pixels: Pixels::of(&s.spec),
            sample_shape: None,
        }
    }

    /// The batch of order positions `range` of `epoch`: inputs, targets,
    /// the hash of its ids, its samples.
    fn batch(
        &mut self,
        epoch: u64,
        range: std::ops::Range<usize>,
    ) -> Result<(Tensor, Tensor, u64, usize), DataError> {
        if self.epoch.as_ref().map(|e| e.0) != Some(epoch) {
            self.epoch = Some((epoch, EpochOrder::new(self.s, epoch)));
            self.windows.clear();
            self.window_lru.clear();
            self.prefetched.clear();
        }
        if range.is_empty() {
            return Ok((Tensor::new(), Tensor::new(), 0, 0));
        }
        let window = self.s.window;
        // Positions grouped by window, in batch order.
        let mut picks: Vec<((u32, u64), i64)> = Vec::with_capacity(range.len());
        for o in range.clone() {
            let (lane, u) = self.epoch.as_ref().expect("set").1.plan.locate(o as u64);
            picks.push(((lane, u / window), (u % window) as i64));
        }
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        let mut ids = Vec::with_capacity(range.len());
        let mut pictures: Vec<Tensor> = Vec::new();
        let mut hash = 0u64;
        let mut i = 0;
        while i < picks.len() {
            let key = picks[i].0;
            let mut j = i;
            while j < picks.len() && picks[j].0 == key {
                j += 1;
            }
            let w = self.window(epoch, key)?;
            let local: Vec<i64> = picks[i..j]
                .iter()
                .map(|&(_, r)| w.perm[r as usize])
                .collect();
            for &r in &local {
                hash = hash.wrapping_add(id_mix(w.ids[r as usize]));
                ids.push(w.ids[r as usize]);
            }
            let idx = Tensor::from_slice(&local);
            if w.images.is_empty() {
                xs.push(w.x.index_select(0, &idx));
            } else {
                pictures.extend(local.iter().map(|&r| w.images[r as usize].shallow_clone()));
            }
            ys.push(w.y.index_select(0, &idx));
            i = j;
        }
        let y = if ys.len() == 1 {
            ys.pop().expect("one")
        } else {
            Tensor::cat(&ys, 0)
        };
        let x = if !pictures.is_empty() {
            self.pixels
                .finish_images(&pictures, &ids, epoch, true)
                .map_err(|e| DataError::Shape(e.to_string()))?
        } else if xs.len() == 1 {
            self.pixels.finish(xs.pop().expect("one"))
        } else {
            self.pixels.finish(Tensor::cat(&xs, 0))
        };
        Ok((x, y, hash, range.len()))
    }

    /// Window `(lane, k)` of the current epoch, decoded (cached).
    fn window(&mut self, epoch: u64, key: (u32, u64)) -> Result<Rc<Window>, DataError> {
        if let Some(w) = self.windows.get(&key) {
            let w = w.clone();
            self.window_lru.retain(|k| *k != key);
            self.window_lru.push_back(key);
            return Ok(w);
        }
        let (lane, k) = key;
        let window = self.s.window;
        let (start, len) = self.epoch.as_ref().expect("set").1.plan.lanes[lane as usize];
        let wlen = window.min(len - k * window);
        let from = start + k * window;
        // The shards of the next windows of this lane go to the cache tier
        // in the background.
        for ahead in 1..=PREFETCH_WINDOWS {
            let next = from + ahead * window;
            if next < start + len {
                let to = (next + window).min(start + len);
                for url in self.urls_of(next, to) {
                    if self.prefetched.insert(url.clone()) {
                        let _ = self.prefetch.send(url);
                    }
                }
            }
        }
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        let mut images = Vec::new();
        let mut ids = Vec::with_capacity(wlen as usize);
        let mut p = from;
        while p < from + wlen {
            let (entry, row) = self.epoch.as_ref().expect("set").1.entry_of(p);
            let ent = self.s.train[entry].clone();
            let shard = &self.s.set.shards[ent.shard];
            let (u, r) = unit_of(shard, &ent.units, row);
            let take = (shard.units[u] - r).min(from + wlen - p);
            let unit = self.unit(ent.shard, u)?;
            if unit.images.is_empty() {
                self.same_shape(&unit.x, &shard.url)?;
                xs.push(unit.x.narrow(0, r as i64, take as i64));
            } else {
                images.extend(
                    unit.images[r as usize..(r + take) as usize]
                        .iter()
                        .map(Tensor::shallow_clone),
                );
            }
            ys.push(unit.y.narrow(0, r as i64, take as i64));
            ids.extend_from_slice(&unit.ids[r as usize..(r + take) as usize]);
            p += take;
        }
        let w = Rc::new(Window {
            x: if xs.is_empty() {
                Tensor::new()
            } else {
                Tensor::cat(&xs, 0)
            },
            images,
            y: Tensor::cat(&ys, 0),
            ids,
            perm: window_perm(self.s.spec.seed, epoch, lane, k, wlen),
        });
        while self.window_lru.len() >= self.s.max_windows {
            if let Some(old) = self.window_lru.pop_front() {
                self.windows.remove(&old);
            }
        }
        self.windows.insert(key, w.clone());
        self.window_lru.push_back(key);
        Ok(w)
    }

    /// Refuses a unit whose samples have another shape than the ones
    /// before it (images of other sizes after the transforms), naming it.
    fn same_shape(&mut self, x: &Tensor, url: &str) -> Result<(), DataError> {
        let shape = x.size()[1..].to_vec();
        match &self.sample_shape {
            None => self.sample_shape = Some((shape, url.to_owned())),
            Some((want, first)) if *want != shape => {
                return Err(DataError::Shape(format!(
                    "{url} has samples of shape {shape:?}, {first} of {want:?}; every sample needs one shape (images: end the resize with a center_crop, e.g. [{{\"resize\": 36}}, {{\"center_crop\": 36}}, {{\"random_crop\": 32}}])"
                )))
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// The shard URLs stream positions `[from, to)` read.
    fn urls_of(&self, from: u64, to: u64) -> Vec<String> {
        let e = &self.epoch.as_ref().expect("set").1;
        let mut out = Vec::new();
        let mut p = from;
        while p < to {
            let i = e.starts.partition_point(|&s| s <= p) - 1;
            let ent = &self.s.train[e.order[i]];
            out.push(self.s.set.shards[ent.shard].url.clone());
            p = e.starts[i + 1];
        }
        out
    }

    /// Unit `u` of shard `shard`, decoded (cached within the budget,
    /// least recently used out first; an image folder has a unit per
    /// image, so each use costs a logarithm of the cache, not its length).
    fn unit(&mut self, shard: usize, u: usize) -> Result<Rc<Unit>, DataError> {
        let key = (shard, u);
        self.tick += 1;
        if let Some((x, used)) = self.units.get_mut(&key) {
            let x = x.clone();
            self.unit_lru.remove(used);
            *used = self.tick;
            self.unit_lru.insert(self.tick, key);
            return Ok(x);
        }
        let s = &self.s.set.shards[shard];
        if self.prefetched.contains(&s.url) {
            self.s.stats.ahead.fetch_sub(1, Ordering::Relaxed);
        }
        let unit = Rc::new(self.s.decode(s, u, true, &self.s.columns)?);
        let bytes = unit_bytes(&unit);
        while self.unit_bytes + bytes > self.s.unit_budget {
            let Some((_, old)) = self.unit_lru.pop_first() else {
                break;
            };
            if let Some((o, _)) = self.units.remove(&old) {
                self.unit_bytes -= unit_bytes(&o);
            }
        }
        self.unit_bytes += bytes;
        self.units.insert(key, (unit.clone(), self.tick));
        self.unit_lru.insert(self.tick, key);
        Ok(unit)
    }
}

fn unit_bytes(u: &Unit) -> u64 {
    let images: usize = u.images.iter().map(Tensor::numel).sum();
    let x = if u.images.is_empty() {
        u.x.numel() * 4
    } else {
        images
    };
    (x + u.y.numel() * 8 + u.ids.len() * 8) as u64
}
