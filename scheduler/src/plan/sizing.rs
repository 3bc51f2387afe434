//! The memory arithmetic behind placement: what a worker, a PS shard and
//! its standbys are charged, and how `strategy: auto` is decided from the
//! model's size and the smallest eligible device. Pure functions of a
//! job's [`Demand`]; the phases of a round charge capacity by them.

use super::{Demand, AUTO_HEADROOM, PS_OVERHEAD_BYTES};
use trainyard_common::spec::{Device, Strategy, MAX_PARAMETER_SERVERS};

/// Memory one worker is charged: the job's `resources.memory_mb` (with a
/// CPU script rank's spare interpreter, [`Demand::memory_bytes`]), or what
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
pub(super) fn decide(d: &Demand, smallest: Option<u64>) -> Result<(Strategy, u32, String), String> {
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

/// A device kind as specs spell it, for reasons to wait.
pub(super) fn kind_name(d: Device) -> &'static str {
    match d {
        Device::Cpu => "cpu",
        Device::Cuda => "cuda",
    }
}

/// Bytes as MiB, rounded up, for reasons to wait.
pub(super) fn mib(b: u64) -> u64 {
    b.div_ceil(1 << 20)
}
