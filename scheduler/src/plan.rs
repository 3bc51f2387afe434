//! The planning core: `plan(jobs, live executors, current assignments) →
//! new assignments`, a pure function with no I/O.
//!
//! Rules, in the order they are applied:
//!
//! 1. **Keep.** Roles of placed jobs stay where they are while their executor
//!    is live and still has room (stable placements, fewer generations).
//! 2. **Repair and admit (gang).** Jobs are visited placed-first, then by
//!    priority (high first) and submission order. Each must hold its minimum
//!    set — every PS shard (with its standby, for a job that keeps
//!    replicas and is not placed yet) and `workers.min` workers — or
//!    nothing: a job whose minimum set cannot be placed at once releases
//!    what it kept and waits with its reason. Since no partially placed job
//!    holds resources, two jobs can never deadlock each other. Later
//!    (lower-priority) jobs that fit may still start (backfill).
//!
//!    A shard whose primary could not be kept (its executor was lost or is
//!    draining) but whose standby was is **promoted**: the standby's
//!    executor becomes the shard's, so the shard stays where its state is.
//!    A placed job gets a new standby for each shard that lacks one when
//!    an executor other than the shard's has room, and runs without it
//!    meanwhile.
//! 3. **Grow.** Placed jobs, in the same order, add workers towards
//!    `workers.max` while capacity remains. Growth runs after every
//!    admission so that one job's growth never keeps another from starting.
//!
//! Sharing (see [`Sharing`] and [`crate::share`]): jobs of one priority
//! that wait are visited by their owner's recent usage, lowest first (fair
//! share), except that a job marked `starving` goes before every other
//! waiting job of its priority and, when it fits the cluster alone but not
//! now, stops later jobs of its priority or lower from starting and placed
//! ones from growing until it has started (so no job waits forever behind
//! a stream of smaller ones). An owner's [`Quota`] bounds the workers (per
//! device kind) and PS RAM its placed jobs hold together: a job beyond it
//! waits, a placed elastic job is trimmed towards `workers.min`. Caps
//! (shrunk elastic jobs) and held-back jobs (preempted ones) come from the
//! preemption pass.
//!
//! Placement: one worker per device of the job's kind (`cpu` devices are
//! the executor's host, whose memory is its RAM), best fit by free memory;
//! PS shards take only RAM — never a device — and go where the most memory
//! is, spread over executors; a standby takes as much RAM as its shard and
//! never shares its shard's executor. Nothing over-commits a device or an
//! executor's RAM. Ring ranks keep workers of one host (label `host`)
//! adjacent. The output is deterministic: it depends only on the inputs'
//! contents, not their order.

use crate::shard::{shard_ranges, Range};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use trainyard_common::model::{MemoryEstimate, ParamInfo};
use trainyard_common::spec::{Device, Strategy, MAX_PARAMETER_SERVERS};
use uuid::Uuid;

/// `strategy: auto` picks allreduce only when a replica uses at most this
/// share of the smallest eligible device, leaving room for activations.
pub const AUTO_HEADROOM: f64 = 0.8;

/// RAM a PS shard is charged beyond its tensors (I/O buffers, connections).
pub const PS_OVERHEAD_BYTES: u64 = 16 << 20;

/// A device an executor offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSlot {
    /// `cpu` or `cuda`.
    pub kind: Device,
    /// Index among the executor's devices of that kind.
    pub index: u32,
    /// Memory of a GPU; ignored for `cpu` (its memory is the executor's RAM).
    pub memory_bytes: u64,
}

/// A live executor as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorView {
    /// Executor id.
    pub id: Uuid,
    /// Value of its `host` label, if any.
    pub host: Option<String>,
    /// Host memory for PS shards and CPU workers.
    pub ram_bytes: u64,
    /// Its devices.
    pub devices: Vec<DeviceSlot>,
}

/// What a job asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    /// As submitted (`auto` is decided here).
    pub strategy: Strategy,
    /// Device kind of the workers.
    pub device: Device,
    /// Workers needed to run.
    pub min_workers: u32,
    /// Workers to grow to.
    pub max_workers: u32,
    /// PS shards asked for (PS and auto).
    pub parameter_servers: u32,
    /// Memory per worker (the job's `resources.memory_mb`).
    pub memory_bytes: u64,
    /// Memory each role needs, when the model's size is known.
    pub estimate: Option<MemoryEstimate>,
    /// The model's tensors, for the shard map.
    pub params: Option<Vec<ParamInfo>>,
}

/// A job the planner considers (not terminal).
#[derive(Debug, Clone, PartialEq)]
pub struct JobView {
    /// Job id.
    pub id: Uuid,
    /// Higher runs first.
    pub priority: i32,
    /// Submission order (smaller first).
    pub seq: i64,
    /// What it needs.
    pub demand: Demand,
    /// Its current placement, if it has one.
    pub current: Option<Placement>,
    /// Who submitted it: quotas and fair share are per owner.
    pub owner: String,
    /// It has waited longer than the scheduler allows (fair share's bound
    /// on waiting): it goes first among waiting jobs of its priority.
    pub starving: bool,
    /// Executors this job must not use (its watchdog left them out: a
    /// stuck or straggling role); other jobs still may.
    pub excluded: BTreeSet<Uuid>,
}

/// An owner's limits on what its placed jobs hold at once; `None` is
/// unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Workers on `cuda` devices.
    pub cuda_devices: Option<u32>,
    /// Workers on `cpu` devices.
    pub cpu_workers: Option<u32>,
    /// RAM of PS shards and their standbys.
    pub ps_ram_bytes: Option<u64>,
}

/// What one owner's placed jobs hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holding {
    /// Workers on `cuda` devices.
    pub cuda_devices: u32,
    /// Workers on `cpu` devices.
    pub cpu_workers: u32,
    /// RAM of PS shards and standbys.
    pub ps_ram_bytes: u64,
}

impl Holding {
    fn workers(&self, d: Device) -> u32 {
        match d {
            Device::Cpu => self.cpu_workers,
            Device::Cuda => self.cuda_devices,
        }
    }

    fn add(&mut self, d: Device, workers: u32, ps_ram: u64) {
        match d {
            Device::Cpu => self.cpu_workers += workers,
            Device::Cuda => self.cuda_devices += workers,
        }
        self.ps_ram_bytes += ps_ram;
    }
}

impl Quota {
    /// Most workers of kind `d` the owner may hold.
    pub fn workers(&self, d: Device) -> Option<u32> {
        match d {
            Device::Cpu => self.cpu_workers,
            Device::Cuda => self.cuda_devices,
        }
    }
}

/// What sharing the cluster adds to a plan: quotas and recent usage per
/// owner, and this round's preemption decisions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sharing {
    /// Owners with limits (absent: unlimited).
    pub quotas: BTreeMap<String, Quota>,
    /// Each owner's decayed usage (device-seconds, see [`crate::share`]);
    /// absent is 0.
    pub usage: BTreeMap<String, f64>,
    /// Most workers a shrunk elastic job keeps this round.
    pub caps: BTreeMap<Uuid, u32>,
    /// Jobs released this round (preempted), with why they wait.
    pub held_back: BTreeMap<Uuid, String>,
}

/// One worker of a placed job.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WorkerRole {
    /// Rank (ring position, or worker index in the PS pattern).
    pub rank: u32,
    /// Executor it runs on.
    pub executor: Uuid,
    /// Device index (of the job's device kind) on that executor.
    pub device: u32,
}

/// One PS shard of a placed job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsRole {
    /// Shard number.
    pub shard: u32,
    /// Executor holding it.
    pub executor: Uuid,
    /// The tensor ranges it owns.
    pub ranges: Vec<Range>,
    /// Executor holding its hot standby (jobs that keep replicas), never
    /// the shard's own.
    pub standby: Option<Uuid>,
}

/// A job's roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// `parameter_server` or `allreduce` (never `auto`).
    pub strategy: Strategy,
    /// Workers in rank order.
    pub workers: Vec<WorkerRole>,
    /// PS shards in shard order (empty for allreduce).
    pub parameter_servers: Vec<PsRole>,
}

/// What the planner decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Jobs that hold roles, with their roles.
    pub placements: BTreeMap<Uuid, Placement>,
    /// Jobs that hold nothing, with why.
    pub waiting: BTreeMap<Uuid, String>,
    /// How `auto` was decided, for jobs decided in this plan.
    pub decisions: BTreeMap<Uuid, String>,
    /// Waiting jobs that lack only capacity (not quota, not inspection):
    /// the ones preemption and the provisioner may help.
    pub capacity_waiting: BTreeSet<Uuid>,
    /// Waiting jobs held back by their owner's quota.
    pub over_quota: BTreeSet<Uuid>,
}

/// Free capacity, changed as roles are placed, with ordered indexes so
/// that each placement is a logarithmic lookup rather than a scan.
struct Capacity {
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
    hosts: HashMap<Uuid, Option<String>>,
}

fn kind_key(d: Device) -> u8 {
    match d {
        Device::Cpu => 0,
        Device::Cuda => 1,
    }
}

#[derive(Clone, Copy)]
enum Taken {
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
    fn new(executors: &[ExecutorView]) -> Capacity {
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

    fn take_worker(
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

    fn take_ps(&mut self, executor: Uuid, bytes: u64) -> Option<Taken> {
        let free = *self.ram.get(&executor)?;
        if free < bytes {
            return None;
        }
        self.set_ram(executor, free - bytes);
        Some(Taken::Ps { executor, bytes })
    }

    fn give_back(&mut self, t: Taken) {
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
    fn best_worker_slot(
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
    fn best_ps_executor(
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

    fn smallest_eligible(&self, kind: Device) -> Option<u64> {
        self.smallest[kind_key(kind) as usize]
    }
}

fn kind_name(d: Device) -> &'static str {
    match d {
        Device::Cpu => "cpu",
        Device::Cuda => "cuda",
    }
}

fn mib(b: u64) -> u64 {
    b.div_ceil(1 << 20)
}

/// Memory one worker is charged: the job's `resources.memory_mb`, or what
/// a replica needs under the resolved strategy when that is more (`auto`
/// may pick allreduce for a model larger than `memory_mb`).
pub fn worker_bytes(d: &Demand, strategy: Strategy) -> u64 {
    let need = match (d.estimate, strategy) {
        (Some(e), Strategy::Allreduce) => e.allreduce_worker_bytes,
        (Some(e), _) => e.ps_worker_bytes,
        (None, _) => 0,
    };
    d.memory_bytes.max(need)
}

/// RAM one of `shards` PS shards is charged: its share of the PS tier
/// (weights, optimizer state, sync accumulator) plus overhead, or the job's
/// memory per role when the model's size is unknown.
pub fn ps_bytes(d: &Demand, shards: u32) -> u64 {
    match d.estimate {
        Some(e) => e.ps_shard_bytes(shards).saturating_add(PS_OVERHEAD_BYTES),
        None => d.memory_bytes,
    }
}

/// Hot standbys the job keeps of each PS shard (its spec's `replicas`,
/// carried by its memory estimate).
pub fn replicas(d: &Demand) -> u32 {
    d.estimate.map_or(0, |e| e.ps_replicas)
}

/// Decides `auto` for a job by the memory arithmetic; `Err` is a reason to wait.
fn decide(d: &Demand, smallest: Option<u64>) -> Result<(Strategy, u32, String), String> {
    let shards = |d: &Demand, tier: u64| {
        let per = (d.memory_bytes as f64 * AUTO_HEADROOM).max(1.0);
        let need = (tier as f64 / per).ceil() as u32;
        need.max(d.parameter_servers)
            .clamp(1, MAX_PARAMETER_SERVERS)
    };
    match d.strategy {
        Strategy::Allreduce => Ok((Strategy::Allreduce, 0, String::new())),
        Strategy::ParameterServer => Ok((
            Strategy::ParameterServer,
            d.parameter_servers.max(1),
            String::new(),
        )),
        Strategy::Auto => {
            let Some(e) = d.estimate else {
                return Err("strategy auto needs the model's size; TorchScript models must be inspected first".into());
            };
            let Some(smallest) = smallest else {
                return Err(format!(
                    "strategy auto: no live executor offers a {} device yet",
                    kind_name(d.device)
                ));
            };
            let budget = (smallest as f64 * AUTO_HEADROOM) as u64;
            if e.allreduce_worker_bytes <= budget {
                Ok((
                    Strategy::Allreduce,
                    0,
                    format!(
                        "auto chose allreduce: a replica with gradients and optimizer state needs {} MiB, within {:.0}% of the smallest {} device ({} MiB)",
                        mib(e.allreduce_worker_bytes), AUTO_HEADROOM * 100.0, kind_name(d.device), mib(smallest)
                    ),
                ))
            } else {
                let n = shards(d, e.ps_tier_bytes);
                Ok((
                    Strategy::ParameterServer,
                    n,
                    format!(
                        "auto chose parameter_server with {n} shard(s): a replica needs {} MiB, more than {:.0}% of the smallest {} device ({} MiB); the PS tier holds {} MiB",
                        mib(e.allreduce_worker_bytes), AUTO_HEADROOM * 100.0, kind_name(d.device), mib(smallest), mib(e.ps_tier_bytes)
                    ),
                ))
            }
        }
    }
}

/// What a placed job kept in the first pass.
#[derive(Default)]
struct Kept {
    /// Workers (executor, device).
    workers: Vec<(Uuid, u32)>,
    /// PS executors by shard.
    ps: Vec<Option<Uuid>>,
    /// Standby executors by shard.
    standbys: Vec<Option<Uuid>>,
    /// The capacity it took.
    taken: Vec<Taken>,
}

/// Plans every job over the live executors, with no quotas, usage or
/// preemption (what the provisioner's what-if plans use).
pub fn plan(jobs: &[JobView], executors: &[ExecutorView]) -> Plan {
    plan_shared(jobs, executors, &Sharing::default())
}

/// Gives back worker `w` of a job from what it took.
fn drop_worker(cap: &mut Capacity, taken: &mut Vec<Taken>, w: (Uuid, u32), kind: Device) {
    let k = kind_key(kind);
    if let Some(i) = taken.iter().position(|t| {
        matches!(t, Taken::Worker { executor, kind, index, .. } if *executor == w.0 && *kind == k && *index == w.1)
    }) {
        cap.give_back(taken.remove(i));
    }
}

/// The order jobs are visited in: placed first, then by priority; waiting
/// jobs of one priority starving first (oldest first), then by their
/// owner's usage, lowest first; then submission order.
fn visit_order(a: &JobView, b: &JobView, sharing: &Sharing) -> std::cmp::Ordering {
    let usage = |o: &str| sharing.usage.get(o).copied().unwrap_or(0.0);
    (a.current.is_none(), std::cmp::Reverse(a.priority))
        .cmp(&(b.current.is_none(), std::cmp::Reverse(b.priority)))
        .then_with(|| {
            if a.current.is_some() || b.current.is_some() {
                return std::cmp::Ordering::Equal;
            }
            (!a.starving).cmp(&!b.starving).then_with(|| {
                if a.starving && b.starving {
                    std::cmp::Ordering::Equal
                } else {
                    usage(&a.owner).total_cmp(&usage(&b.owner))
                }
            })
        })
        .then((a.seq, a.id).cmp(&(b.seq, b.id)))
}

/// Plans every job over the live executors under `sharing`'s quotas, fair
/// share and this round's preemption decisions.
pub fn plan_shared(jobs: &[JobView], executors: &[ExecutorView], sharing: &Sharing) -> Plan {
    let mut executors = executors.to_vec();
    executors.sort_by_key(|e| e.id);
    let mut cap = Capacity::new(&executors);
    let mut order: Vec<&JobView> = jobs.iter().collect();
    order.sort_by(|a, b| visit_order(a, b, sharing));
    // What each owner's placed jobs hold so far.
    let mut owners: HashMap<&str, Holding> = HashMap::new();
    // Set when a starving job that fits the cluster alone could not start:
    // its priority; later jobs of that priority or lower neither start nor grow.
    let mut blocked: Option<(i32, Uuid)> = None;

    let mut out = Plan::default();
    // Per placed job: strategy, shard count, workers, PS executors by shard.
    struct Held {
        strategy: Strategy,
        workers: Vec<(Uuid, u32)>,
        ps: Vec<Uuid>,
        standbys: Vec<Option<Uuid>>,
        taken: Vec<Taken>,
    }
    let mut held: BTreeMap<Uuid, Held> = BTreeMap::new();
    let mut kept: HashMap<Uuid, Kept> = HashMap::new();

    // 1. Keep what can stay.
    for j in &order {
        let Some(cur) = &j.current else { continue };
        if sharing.held_back.contains_key(&j.id) {
            continue;
        }
        let d = &j.demand;
        let mut taken = Vec::new();
        let mut workers = Vec::new();
        let mut ps = vec![None; cur.parameter_servers.len()];
        let mut standbys = vec![None; cur.parameter_servers.len()];
        let wb = worker_bytes(d, cur.strategy);
        // Roles on executors the job now excludes are not kept.
        let ok = |e: &Uuid| !j.excluded.contains(e);
        for w in cur.workers.iter().filter(|w| ok(&w.executor)) {
            if let Some(t) = cap.take_worker(w.executor, d.device, w.device, wb) {
                taken.push(t);
                workers.push((w.executor, w.device));
            }
        }
        let ps_bytes = ps_bytes(d, cur.parameter_servers.len() as u32);
        for p in cur.parameter_servers.iter().filter(|p| ok(&p.executor)) {
            if let Some(t) = cap.take_ps(p.executor, ps_bytes) {
                taken.push(t);
                if let Some(slot) = ps.get_mut(p.shard as usize) {
                    *slot = Some(p.executor);
                }
            }
        }
        if replicas(d) > 0 {
            for p in &cur.parameter_servers {
                let Some(sb) = p.standby.filter(|&e| e != p.executor && ok(&e)) else {
                    continue;
                };
                if let Some(t) = cap.take_ps(sb, ps_bytes) {
                    taken.push(t);
                    if let Some(slot) = standbys.get_mut(p.shard as usize) {
                        *slot = Some(sb);
                    }
                }
            }
        }
        kept.insert(
            j.id,
            Kept {
                workers,
                ps,
                standbys,
                taken,
            },
        );
    }

    // 2. Repair placed jobs and admit waiting ones, all or nothing.
    for j in &order {
        let d = &j.demand;
        if let Some(why) = sharing.held_back.get(&j.id) {
            out.waiting.insert(j.id, why.clone());
            continue;
        }
        if let Some((p, first)) = blocked.filter(|(p, _)| j.current.is_none() && j.priority <= *p) {
            out.waiting.insert(
                j.id,
                format!("job {first} (priority {p}) has waited longest and starts first"),
            );
            continue;
        }
        let (strategy, shards) = match &j.current {
            Some(cur) => (cur.strategy, cur.parameter_servers.len() as u32),
            None => match decide(d, cap.smallest_eligible(d.device)) {
                Ok((s, n, why)) => {
                    if !why.is_empty() {
                        out.decisions.insert(j.id, why);
                    }
                    (s, n)
                }
                Err(why) => {
                    out.waiting.insert(j.id, why);
                    continue;
                }
            },
        };
        if strategy == Strategy::ParameterServer && d.params.is_none() {
            out.waiting.insert(j.id, "the parameter-server pattern needs the model's tensors; TorchScript models must be inspected first".into());
            continue;
        }
        let Kept {
            mut workers,
            mut ps,
            mut standbys,
            mut taken,
        } = kept.remove(&j.id).unwrap_or_default();
        ps.resize(shards as usize, None);
        standbys.resize(shards as usize, None);
        let replicated = strategy == Strategy::ParameterServer && replicas(d) > 0;
        // A shard whose primary is gone continues on its standby, where
        // its state already is.
        for (p, sb) in ps.iter_mut().zip(standbys.iter_mut()) {
            if p.is_none() {
                *p = sb.take();
            }
        }
        let mut failed = None;
        let wb = worker_bytes(d, strategy);
        // The owner's quota and this round's cap bound the workers; the
        // minimum set's PS RAM must fit the quota too.
        let quota = sharing.quotas.get(&j.owner).copied().unwrap_or_default();
        let holding = owners.get(j.owner.as_str()).copied().unwrap_or_default();
        let worker_room = quota
            .workers(d.device)
            .map_or(u32::MAX, |m| m.saturating_sub(holding.workers(d.device)));
        let allowed = worker_room.min(
            sharing
                .caps
                .get(&j.id)
                .copied()
                .unwrap_or(u32::MAX)
                .max(d.min_workers),
        );
        let shard_bytes = ps_bytes(d, shards);
        let min_ps_ram = shard_bytes
            .saturating_mul(u64::from(shards))
            .saturating_mul(if replicated && j.current.is_none() {
                2
            } else {
                1
            });
        let ps_room = quota
            .ps_ram_bytes
            .map_or(u64::MAX, |m| m.saturating_sub(holding.ps_ram_bytes));
        let mut over_quota = false;
        if d.min_workers > worker_room {
            over_quota = true;
            failed = Some(format!(
                "over its owner's quota: {} may hold {} {} worker(s) at once, its other jobs hold {}, this job needs {}",
                j.owner,
                quota.workers(d.device).unwrap_or(0),
                kind_name(d.device),
                holding.workers(d.device),
                d.min_workers
            ));
        } else if min_ps_ram > ps_room {
            over_quota = true;
            failed = Some(format!(
                "over its owner's quota: {} may hold {} MiB of PS RAM at once, its other jobs hold {} MiB, this job needs {} MiB",
                j.owner,
                mib(quota.ps_ram_bytes.unwrap_or(0)),
                mib(holding.ps_ram_bytes),
                mib(min_ps_ram)
            ));
        }
        while failed.is_none() && workers.len() as u32 > allowed {
            if let Some(w) = workers.pop() {
                drop_worker(&mut cap, &mut taken, w, d.device);
            }
        }
        while failed.is_none() && (workers.len() as u32) < d.min_workers {
            match cap.best_worker_slot(d.device, wb, &j.excluded) {
                Some((e, i)) => {
                    if let Some(t) = cap.take_worker(e, d.device, i, wb) {
                        taken.push(t);
                        workers.push((e, i));
                    }
                }
                None => {
                    failed = Some(format!(
                        "needs {} {} worker device(s) with {} MiB free, has {}",
                        d.min_workers,
                        kind_name(d.device),
                        mib(wb),
                        workers.len()
                    ))
                }
            }
        }
        for shard in 0..ps.len() {
            if failed.is_some() || ps[shard].is_some() {
                continue;
            }
            let mine: BTreeSet<Uuid> = ps.iter().chain(&standbys).flatten().copied().collect();
            match cap
                .best_ps_executor(shard_bytes, &mine, None, &j.excluded)
                .and_then(|e| cap.take_ps(e, shard_bytes).map(|t| (e, t)))
            {
                Some((e, t)) => {
                    taken.push(t);
                    ps[shard] = Some(e);
                }
                None => {
                    failed = Some(format!(
                        "needs {shards} PS shard(s) with {} MiB of RAM each, found room for {}",
                        mib(shard_bytes),
                        ps.iter().flatten().count()
                    ))
                }
            }
        }
        // Standbys: part of a new job's minimum set; a placed job gets
        // them as capacity (and its owner's PS RAM quota) allows.
        for shard in 0..ps.len() {
            if failed.is_some() || !replicated || standbys[shard].is_some() {
                continue;
            }
            let in_use = (ps.iter().flatten().count() + standbys.iter().flatten().count()) as u64;
            if j.current.is_some() && shard_bytes.saturating_mul(in_use + 1) > ps_room {
                continue;
            }
            let mine: BTreeSet<Uuid> = ps.iter().chain(&standbys).flatten().copied().collect();
            match cap
                .best_ps_executor(shard_bytes, &mine, ps[shard], &j.excluded)
                .and_then(|e| cap.take_ps(e, shard_bytes).map(|t| (e, t)))
            {
                Some((e, t)) => {
                    taken.push(t);
                    standbys[shard] = Some(e);
                }
                None if j.current.is_some() => {}
                None => {
                    failed = Some(format!(
                        "needs a standby for each of its {shards} PS shard(s) on an executor other than the shard's, with {} MiB of RAM, found room for {}",
                        mib(shard_bytes),
                        standbys.iter().flatten().count()
                    ))
                }
            }
        }
        // A placed job whose kept shards exceed a lowered quota waits too.
        let ps_ram = shard_bytes.saturating_mul(
            (ps.iter().flatten().count() + standbys.iter().flatten().count()) as u64,
        );
        if failed.is_none() && ps_ram > ps_room {
            over_quota = true;
            failed = Some(format!(
                "over its owner's quota: {} may hold {} MiB of PS RAM at once, its other jobs hold {} MiB, this job needs {} MiB",
                j.owner,
                mib(quota.ps_ram_bytes.unwrap_or(0)),
                mib(holding.ps_ram_bytes),
                mib(ps_ram)
            ));
        }
        if let Some(why) = failed {
            for t in taken.into_iter().rev() {
                cap.give_back(t);
            }
            if over_quota {
                out.over_quota.insert(j.id);
            } else if j.current.is_none() {
                out.capacity_waiting.insert(j.id);
                if j.starving && blocked.is_none() {
                    let alone = JobView {
                        current: None,
                        starving: false,
                        ..(*j).clone()
                    };
                    if plan(std::slice::from_ref(&alone), &executors)
                        .placements
                        .contains_key(&j.id)
                    {
                        blocked = Some((j.priority, j.id));
                    }
                }
            }
            out.waiting.insert(j.id, why);
            out.decisions.remove(&j.id);
            continue;
        }
        owners
            .entry(j.owner.as_str())
            .or_default()
            .add(d.device, workers.len() as u32, ps_ram);
        held.insert(
            j.id,
            Held {
                strategy,
                workers,
                ps: ps.into_iter().flatten().collect(),
                standbys,
                taken,
            },
        );
    }

    // 3. Grow towards the maximum.
    for j in &order {
        let Some(h) = held.get_mut(&j.id) else {
            continue;
        };
        let d = &j.demand;
        if blocked.is_some_and(|(p, _)| j.priority <= p) {
            continue;
        }
        let wb = worker_bytes(d, h.strategy);
        let most = d
            .max_workers
            .min(sharing.caps.get(&j.id).copied().unwrap_or(u32::MAX));
        let quota = sharing
            .quotas
            .get(&j.owner)
            .and_then(|q| q.workers(d.device));
        while (h.workers.len() as u32) < most {
            let holding = owners.entry(j.owner.as_str()).or_default();
            if quota.is_some_and(|m| holding.workers(d.device) >= m) {
                break;
            }
            let Some((e, i)) = cap.best_worker_slot(d.device, wb, &j.excluded) else {
                break;
            };
            let Some(t) = cap.take_worker(e, d.device, i, wb) else {
                break;
            };
            h.taken.push(t);
            h.workers.push((e, i));
            owners
                .entry(j.owner.as_str())
                .or_default()
                .add(d.device, 1, 0);
        }
    }

    // Ranks and shard maps.
    for j in &order {
        let Some(h) = held.remove(&j.id) else {
            continue;
        };
        let mut workers = h.workers;
        match h.strategy {
            Strategy::Allreduce => {
                // Same-host ranks adjacent: order by host label, then id.
                workers.sort_by(|a, b| {
                    (cap.hosts.get(&a.0), a.0, a.1).cmp(&(cap.hosts.get(&b.0), b.0, b.1))
                });
            }
            _ => {
                // Kept workers keep their relative order; new ones follow.
                let prev: HashMap<(Uuid, u32), u32> = j
                    .current
                    .iter()
                    .flat_map(|c| c.workers.iter().map(|w| ((w.executor, w.device), w.rank)))
                    .collect();
                workers.sort_by_key(|w| (prev.get(w).copied().unwrap_or(u32::MAX), w.0, w.1));
            }
        }
        let shards = h.ps.len() as u32;
        let params = j.demand.params.as_deref().unwrap_or(&[]);
        out.placements.insert(
            j.id,
            Placement {
                strategy: h.strategy,
                workers: workers
                    .into_iter()
                    .enumerate()
                    .map(|(r, (executor, device))| WorkerRole {
                        rank: r as u32,
                        executor,
                        device,
                    })
                    .collect(),
                parameter_servers: h
                    .ps
                    .into_iter()
                    .zip(h.standbys)
                    .enumerate()
                    .map(|(s, (executor, standby))| PsRole {
                        shard: s as u32,
                        executor,
                        ranges: shard_ranges(params, shards, s as u32),
                        standby,
                    })
                    .collect(),
            },
        );
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
