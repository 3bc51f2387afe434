//! Free capacity while a round places roles: RAM per executor, devices
//! and their free memory, kept in ordered indexes so that each placement
//! is a logarithmic lookup rather than a scan. Every phase of a round takes
//! from one [`Capacity`]; what a job took is a list of [`Taken`], so that a
//! job whose minimum set does not fit gives back exactly what it held.

use super::ExecutorView;
use std::collections::{BTreeSet, HashMap};
use trainyard_common::spec::Device;
use uuid::Uuid;

/// Free capacity, changed as roles are placed, with ordered indexes so
/// that each placement is a logarithmic lookup rather than a scan.
pub(super) struct Capacity {
    ram: HashMap<Uuid, u64>,
    /// (executor, kind, index) → GPU memory free and whether a worker holds it.
    devices: HashMap<(Uuid, u8, u32), (u64, bool)>,
    /// Each executor's `cpu` device indexes (their memory is its RAM).
    cpu_devices: HashMap<Uuid, Vec<u32>>,
    /// Unused devices by kind, ordered by the memory a worker there may use.
    free: [BTreeSet<(u64, Uuid, u32)>; 2],
    /// Executors ordered by free RAM (largest last), ties by smaller id last.
    by_ram: BTreeSet<(u64, std::cmp::Reverse<Uuid>)>,
    /// Smallest memory of an eligible device, per kind (for `auto`).
    smallest: [Option<u64>; 2],
    /// Each executor's `host` label, for ring order.
    pub(super) hosts: HashMap<Uuid, Option<String>>,
}

pub(super) fn kind_key(d: Device) -> u8 {
    match d {
        Device::Cpu => 0,
        Device::Cuda => 1,
    }
}

#[derive(Clone, Copy)]
pub(super) enum Taken {
    Worker {
        executor: Uuid,
        kind: u8,
        index: u32,
        bytes: u64,
    },
    Ps {
        executor: Uuid,
        bytes: u64,
    },
}

impl Capacity {
    pub(super) fn new(executors: &[ExecutorView]) -> Capacity {
        let mut c = Capacity {
            ram: HashMap::new(),
            devices: HashMap::new(),
            cpu_devices: HashMap::new(),
            free: [BTreeSet::new(), BTreeSet::new()],
            by_ram: BTreeSet::new(),
            smallest: [None, None],
            hosts: HashMap::new(),
        };
        for e in executors {
            c.ram.insert(e.id, e.ram_bytes);
            c.by_ram.insert((e.ram_bytes, std::cmp::Reverse(e.id)));
            c.hosts.insert(e.id, e.host.clone());
            for d in &e.devices {
                let k = kind_key(d.kind);
                if c.devices
                    .insert((e.id, k, d.index), (d.memory_bytes, false))
                    .is_some()
                {
                    continue; // A duplicate index counts once.
                }
                let usable = if d.kind == Device::Cpu {
                    c.cpu_devices.entry(e.id).or_default().push(d.index);
                    e.ram_bytes
                } else {
                    d.memory_bytes
                };
                c.free[k as usize].insert((usable, e.id, d.index));
                let s = &mut c.smallest[k as usize];
                *s = Some(s.map_or(usable, |m| m.min(usable)));
            }
        }
        c
    }

    /// Changes an executor's free RAM, keeping the indexes in step.
    fn set_ram(&mut self, executor: Uuid, new: u64) {
        let Some(old) = self.ram.insert(executor, new) else {
            return;
        };
        self.by_ram.remove(&(old, std::cmp::Reverse(executor)));
        self.by_ram.insert((new, std::cmp::Reverse(executor)));
        for &i in self.cpu_devices.get(&executor).into_iter().flatten() {
            if self.free[0].remove(&(old, executor, i)) {
                self.free[0].insert((new, executor, i));
            }
        }
    }

    pub(super) fn take_worker(
        &mut self,
        executor: Uuid,
        kind: Device,
        index: u32,
        bytes: u64,
    ) -> Option<Taken> {
        let k = kind_key(kind);
        let (mem, used) = *self.devices.get(&(executor, k, index))?;
        let ram = *self.ram.get(&executor)?;
        let usable = if kind == Device::Cpu { ram } else { mem };
        if used || usable < bytes {
            return None;
        }
        self.free[k as usize].remove(&(usable, executor, index));
        if kind == Device::Cpu {
            self.devices.insert((executor, k, index), (mem, true));
            self.set_ram(executor, ram - bytes);
        } else {
            self.devices
                .insert((executor, k, index), (mem - bytes, true));
        }
        Some(Taken::Worker {
            executor,
            kind: k,
            index,
            bytes,
        })
    }

    /// Marks a device as used without taking memory (a stopped role's
    /// process still runs there); nothing if it is used already.
    pub(super) fn hold(&mut self, executor: Uuid, kind: Device, index: u32) {
        let k = kind_key(kind);
        let Some(&(mem, used)) = self.devices.get(&(executor, k, index)) else {
            return;
        };
        if used {
            return;
        }
        let usable = if kind == Device::Cpu {
            self.ram.get(&executor).copied().unwrap_or(0)
        } else {
            mem
        };
        self.free[k as usize].remove(&(usable, executor, index));
        self.devices.insert((executor, k, index), (mem, true));
    }

    pub(super) fn take_ps(&mut self, executor: Uuid, bytes: u64) -> Option<Taken> {
        let free = *self.ram.get(&executor)?;
        if free < bytes {
            return None;
        }
        self.set_ram(executor, free - bytes);
        Some(Taken::Ps { executor, bytes })
    }

    pub(super) fn give_back(&mut self, t: Taken) {
        match t {
            Taken::Worker {
                executor,
                kind,
                index,
                bytes,
            } => {
                let Some(&(mem, _)) = self.devices.get(&(executor, kind, index)) else {
                    return;
                };
                let ram = self.ram.get(&executor).copied().unwrap_or(0);
                if kind == kind_key(Device::Cpu) {
                    self.devices.insert((executor, kind, index), (mem, false));
                    self.set_ram(executor, ram + bytes);
                    self.free[0].insert((ram + bytes, executor, index));
                } else {
                    self.devices
                        .insert((executor, kind, index), (mem + bytes, false));
                    self.free[kind as usize].insert((mem + bytes, executor, index));
                }
            }
            Taken::Ps { executor, bytes } => {
                let ram = self.ram.get(&executor).copied().unwrap_or(0);
                self.set_ram(executor, ram + bytes);
            }
        }
    }

    /// Best fit: the free device of `kind` with the least room that fits,
    /// on none of `excluded`; ties by executor id and index.
    pub(super) fn best_worker_slot(
        &self,
        kind: Device,
        bytes: u64,
        excluded: &BTreeSet<Uuid>,
    ) -> Option<(Uuid, u32)> {
        self.free[kind_key(kind) as usize]
            .range((bytes, Uuid::nil(), 0)..)
            .find(|(_, e, _)| !excluded.contains(e))
            .map(|&(_, e, i)| (e, i))
    }

    /// Where the most memory is, preferring executors that hold none of
    /// this job's shards yet, and never on `exclude` or `excluded`.
    pub(super) fn best_ps_executor(
        &self,
        bytes: u64,
        avoid: &BTreeSet<Uuid>,
        exclude: Option<Uuid>,
        excluded: &BTreeSet<Uuid>,
    ) -> Option<Uuid> {
        let mut fallback = None;
        for &(free, std::cmp::Reverse(id)) in self.by_ram.iter().rev() {
            if free < bytes {
                break;
            }
            if Some(id) == exclude || excluded.contains(&id) {
                continue;
            }
            if !avoid.contains(&id) {
                return Some(id);
            }
            fallback.get_or_insert(id);
        }
        fallback
    }

    /// Gives back worker `w` of a job from what it took.
    pub(super) fn drop_worker(&mut self, taken: &mut Vec<Taken>, w: (Uuid, u32), kind: Device) {
        let k = kind_key(kind);
        if let Some(i) = taken.iter().position(|t| {
            matches!(t, Taken::Worker { executor, kind, index, .. } if *executor == w.0 && *kind == k && *index == w.1)
        }) {
            self.give_back(taken.remove(i));
        }
    }

    pub(super) fn smallest_eligible(&self, kind: Device) -> Option<u64> {
        self.smallest[kind_key(kind) as usize]
    }
}
