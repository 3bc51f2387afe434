//! Joining a (new) ring: every member ends with the same state.
//!
//! After the ring of a generation is connected, its members tell each
//! other whether they hold a replica and at which step; the most advanced
//! one broadcasts its weights, optimizer state, step and cursor to all
//! when anyone lacks them or lags. A whole fleet without state (a new job,
//! or one whose executors were all lost) loads the committed checkpoint
//! instead ([`Resume`]).

use crate::error::RoleError;
use crate::replica::process::Host;
use crate::replica::Replica;
use crate::storage::Fetcher;
use trainyard_common::spec::UncheckedJobSpec;
use trainyard_dataplane::Ring;
use trainyard_shutdown::Shutdown;

/// Loads a committed checkpoint into a new replica.
pub type Resume<'a> = &'a dyn Fn(&mut Replica) -> Result<(), RoleError>;

/// What a member needs to make a replica of its own: the job's spec, its
/// device, the executor's fetcher and model host, the role's stop signal,
/// and how to load the committed checkpoint (a job that resumes).
pub struct Joining<'a> {
    /// The job's spec.
    pub spec: &'a UncheckedJobSpec,
    /// Where the replica computes.
    pub device: tch::Device,
    /// Where the model and data come from.
    pub fetcher: &'a Fetcher,
    /// Where a user's module runs.
    pub host: &'a Host,
    /// The role's stop signal.
    pub stop: &'a Shutdown,
    /// Loads the committed checkpoint, for a job that resumes.
    pub resume: Option<Resume<'a>>,
}

/// Brings the members of a (new) ring to one state: the members share
/// whether they hold a replica and at which step, and the most advanced one
/// (the lowest rank among equals; rank 0 if nobody has one) broadcasts its
/// weights, optimizer state, step and cursor to all when any member lacks
/// them or lags. The replica is created in `slot` if it is empty and
/// stays there whatever happens; returns the rank that sent the state, if
/// one did.
pub fn join(
    ring: &mut Ring,
    slot: &mut Option<Replica>,
    with: Joining<'_>,
) -> Result<Option<u32>, RoleError> {
    let Joining {
        spec,
        device,
        fetcher,
        host,
        stop,
        resume,
    } = with;
    let have = slot.as_ref().map_or([0, 0], |r| [1, r.step]);
    let mut all = ring.allgather_u64(&have, stop)?;
    // Nobody holds the job's state (a new job, or its whole fleet was
    // lost): every rank loads the committed checkpoint itself; a rank whose
    // load failed then receives the state like a new member.
    if let Some(load) = resume.filter(|_| slot.is_none() && all.iter().all(|a| a[0] == 0)) {
        let mut r = Replica::new(spec, device, fetcher, host)?;
        if let Err(e) = load(&mut r) {
            tracing::warn!(error = %e, "could not load the checkpoint; taking the state from a peer");
            r = Replica::new(spec, device, fetcher, host)?;
        }
        let have = [u64::from(r.step > 0), r.step];
        *slot = Some(r);
        all = ring.allgather_u64(&have, stop)?;
    }
    let source = (0..all.len())
        .filter(|&i| all[i][0] == 1)
        .max_by_key(|&i| (all[i][1], std::cmp::Reverse(i)))
        .unwrap_or(0);
    let best = all[source][1];
    let needed = all.iter().any(|a| a[0] == 0 || a[1] != best);
    if slot.is_none() {
        *slot = Some(Replica::new(spec, device, fetcher, host)?);
    }
    let Some(replica) = slot.as_mut() else {
        return Err(RoleError::Assignment("no replica".into()));
    };
    if !needed {
        return Ok(None);
    }
    let source = source as u32;
    let mut state = if ring.rank() == source {
        replica.export()
    } else {
        vec![0f32; replica.state_len()]
    };
    ring.broadcast(&mut state, source, stop)?;
    if ring.rank() != source {
        replica.import(&state)?;
    }
    Ok(Some(source))
}
