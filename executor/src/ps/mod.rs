//! The parameter-server pattern: shard servers, their hot standbys, and the
//! workers that use them.
//!
//! A **shard server** holds its ranges of the model's flat vector in fp32
//! — parameters with their optimizer state (the same update rules as a
//! ring replica's), then buffers, which take rank 0's pushed values as
//! they are (`shard.rs`) — and a version, and serves workers over the
//! data plane ([`trainyard_dataplane::ps`]'s typed messages), one thread
//! per worker connection. The job's consistency decides when a pushed gradient is
//! applied (`consistency.rs`). The shard's state outlives its generation on
//! the executor (as a ring replica does): the next generation's server
//! takes it over, drops the half-summed version of the old membership and
//! waits for the new worker count. A shard that starts empty is
//! initialised from the newest committed checkpoint, else by rank 0 with
//! the newest weights it pulled. A shard of a job that keeps replicas has a
//! **standby** on another executor (`standby.rs`); a version is published
//! only once the standby has it, so every version a worker has seen
//! survives the loss of the shard's executor. Not covered: in async and
//! bounded modes an update the standby applied whose acknowledgement died
//! with the primary is recomputed and applied again.
//!
//! One gradient's path, file by file:
//!
//! 1. `worker.rs`: the worker's [`crate::replica::Replica`] computes the
//!    gradient of its share of the batch; `links.rs` cuts it into one slice
//!    per shard and pushes every shard at once (`Message::Push`: the
//!    version it was computed at, samples, learning rate, data cursor, the
//!    checkpoint step rank 0 chose).
//! 2. `server.rs`: the shard's connection thread reads the push and hands
//!    it to `shard.rs`'s `Shard::take`, which asks `consistency::judge`
//!    and sums it into the version's round or applies it (the optimizer of
//!    [`crate::replica::optim`]).
//! 3. `standby.rs`: an applied update is queued; the shard's replicator
//!    thread sends it to the standby (`Message::Update`) without the
//!    shard's lock, and the standby applies it to the same bits. Its
//!    acknowledgement publishes the version.
//! 4. `server.rs` again: the push is answered (`Ack`, or `Rejected` when too
//!    stale) and the checkpoint it asked for goes to the uploader; the
//!    workers' next pulls get the new version (`Weights`), which
//!    `links.rs` loads into each worker's replica.

mod consistency;
mod links;
mod places;
mod ranges;
mod server;
mod shard;
mod stale;
mod standby;
mod step;
mod worker;

#[cfg(test)]
mod tests;

pub use consistency::STALENESS_BUCKETS;
pub use ranges::shard_len;
pub use server::serve_shard;
pub use shard::Shard;
pub use standby::{serve_standby, STANDBY_GIVE_UP, STANDBY_RETRY, STANDBY_TIMEOUT};
pub use step::LastStep;
pub use worker::{run_worker, work, KeptWorker, WorkerEnv};

use crate::data::Cursor;
use std::time::Duration;
use trainyard_common::cluster::{wire_index, RoleKind};
use trainyard_dataplane::ps::{self, DataCursor};

/// How long a worker waits for a shard's answer (a sync pull waits for the
/// slowest worker's push).
pub const PS_TIMEOUT: Duration = Duration::from_secs(60);

/// Reads the next message on a served connection. One of another
/// generation is answered `Stale` and ends the connection (`None`).
fn read_current(
    r: &mut impl std::io::Read,
    writer: &mut impl std::io::Write,
    generation: i64,
) -> Result<Option<ps::Received>, ps::WireError> {
    let m = ps::read_message(r)?;
    if m.generation != generation {
        ps::write_message(writer, generation, &ps::Message::Stale, &[])?;
        return Ok(None);
    }
    Ok(Some(m))
}

/// A data cursor as the wire carries it.
fn to_wire(c: Cursor) -> DataCursor {
    DataCursor {
        epoch: c.epoch,
        offset: c.offset,
    }
}

/// A data cursor off the wire.
fn from_wire(c: DataCursor) -> Cursor {
    Cursor {
        epoch: c.epoch,
        offset: c.offset,
    }
}

/// The data-plane endpoint of shard `shard`'s standby (a PS endpoint of
/// its own, numbered as the API numbers the standby's role).
fn standby_endpoint(shard: u32) -> u32 {
    wire_index(RoleKind::Standby, shard)
}
