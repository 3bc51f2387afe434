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
//!
//! Layout: each phase of a round is a method of one `Round` in its own file
//! (`keep`, `admit`, `grow`, then `ranks`, which sets ring ranks and shard
//! maps); they take from the free capacity of `capacity` by the memory
//! arithmetic of `sizing`, within the bounds of `quota`. [`plan_shared`]
//! runs them in order.

mod admit;
mod capacity;
mod grow;
mod keep;
mod quota;
mod ranks;
mod sizing;

pub use sizing::{ps_bytes, replicas, worker_bytes};

use crate::shard::Range;
use capacity::{Capacity, Taken};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use trainyard_common::model::{MemoryEstimate, ParamInfo};
use trainyard_common::spec::{Device, Strategy};
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
    /// Devices a stopped role of another job still holds (its model
    /// process has not exited): no job is placed on them this round.
    pub held: Vec<(Device, u32)>,
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
    /// Memory per worker: the job's `resources.memory_mb`, and a CPU
    /// script rank's spare interpreter
    /// ([`trainyard_common::spec::UncheckedJobSpec::worker_memory_mb`]).
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

/// What a placed job kept in the first phase.
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

/// What a job holds once admitted, until the ranks are set.
struct Held {
    /// `parameter_server` or `allreduce`.
    strategy: Strategy,
    /// Workers (executor, device), not yet in rank order.
    workers: Vec<(Uuid, u32)>,
    /// PS executors by shard.
    ps: Vec<Uuid>,
    /// Standby executors by shard.
    standbys: Vec<Option<Uuid>>,
    /// The capacity it took.
    taken: Vec<Taken>,
}

/// One planning round: the state the phases share, each phase a method in
/// its own file ([`keep`], [`admit`], [`grow`], [`ranks`]), run in that
/// order by [`plan_shared`].
struct Round<'a> {
    /// The live executors, sorted by id.
    executors: &'a [ExecutorView],
    sharing: &'a Sharing,
    /// Jobs in the order every phase visits them (see [`visit_order`]).
    order: &'a [&'a JobView],
    cap: Capacity,
    /// What each owner's placed jobs hold so far.
    owners: HashMap<&'a str, Holding>,
    /// Set when a starving job that fits the cluster alone could not start:
    /// its priority; later jobs of that priority or lower neither start nor
    /// grow.
    blocked: Option<(i32, Uuid)>,
    out: Plan,
    /// Jobs admitted so far, with what they hold.
    held: BTreeMap<Uuid, Held>,
    /// What placed jobs kept in the first phase, until the second takes it.
    kept: HashMap<Uuid, Kept>,
}

impl<'a> Round<'a> {
    fn new(executors: &'a [ExecutorView], order: &'a [&'a JobView], sharing: &'a Sharing) -> Self {
        Round {
            executors,
            sharing,
            order,
            cap: Capacity::new(executors),
            owners: HashMap::new(),
            blocked: None,
            out: Plan::default(),
            held: BTreeMap::new(),
            kept: HashMap::new(),
        }
    }
}

impl Round<'_> {
    /// Takes out the devices that stopped roles still hold, after the
    /// placed jobs kept theirs (a job placed there already keeps it).
    fn hold_exiting(&mut self) {
        for e in self.executors {
            for &(kind, index) in &e.held {
                self.cap.hold(e.id, kind, index);
            }
        }
    }
}

/// Plans every job over the live executors, with no quotas, usage or
/// preemption (what the provisioner's what-if plans use).
pub fn plan(jobs: &[JobView], executors: &[ExecutorView]) -> Plan {
    plan_shared(jobs, executors, &Sharing::default())
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
    let mut order: Vec<&JobView> = jobs.iter().collect();
    order.sort_by(|a, b| visit_order(a, b, sharing));
    let mut round = Round::new(&executors, &order, sharing);
    round.keep();
    round.hold_exiting();
    round.admit();
    round.grow();
    round.ranks()
}

#[cfg(test)]
pub(crate) mod tests;
