//! Peer failures seen on the data plane, reported to the API at once.
//!
//! A role whose connection to a peer resets, closes or times out sends a
//! [`PeerCheck`] (it cannot always tell which peer is at fault: a ring
//! rank's collective fails whichever neighbour died, and a neighbour that
//! merely dropped its broken ring looks the same). This task probes the
//! data-plane address of every peer of that job and generation (a TCP
//! connect, closed at once; [`PEER_PROBE_TIMEOUT`]) and reports each one
//! that refuses or stays silent to `POST /v1/executors/{id}/suspects`,
//! once per job, generation and suspect; a look that finds every peer
//! answering is repeated after 100 and 300 ms more (a peer that just died
//! may still be closing its listener). Healthy peers answer their
//! probe, so the cascade of broken connections one death causes reports
//! the dead executor alone.
//!
//! The API does not take the report's word for it: the scheduler probes
//! the suspect itself and weighs its heartbeat
//! ([`trainyard_scheduler::service::suspect`]). A report that fails (the
//! API is down) is not retried: the heartbeat timeout still applies.

use crate::signals::PeerCheck;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;
use trainyard_client::Client;
use trainyard_common::cluster::{SuspectReport, SuspectVerdict};
use uuid::Uuid;

/// How long a peer's data plane has to accept the probe's connection.
pub const PEER_PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// Least time between two probe rounds for one job and generation (a
/// broken ring makes every rank ask at once).
pub const RECHECK_AFTER: Duration = Duration::from_millis(200);

/// When each look at a check's peers starts, after the previous one.
const PROBE_AGAIN: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_millis(100),
    Duration::from_millis(300),
];

/// Whether `address` refused or ignored a connection (`None`: it answered).
async fn unreachable(address: &str) -> Option<String> {
    let start = Instant::now();
    match tokio::time::timeout(PEER_PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(format!(
            "{e} at {address} after {:.1} ms",
            start.elapsed().as_secs_f64() * 1e3
        )),
        Err(_) => Some(format!(
            "no answer at {address} within {} ms",
            PEER_PROBE_TIMEOUT.as_millis()
        )),
    }
}

/// Runs until every sender is gone: probes the peers of each check and
/// reports the unreachable ones as executor `id` (its current id) through
/// `client`.
pub async fn run(client: Client, id: Arc<RwLock<Uuid>>, mut checks: UnboundedReceiver<PeerCheck>) {
    let mut reported: HashSet<(Uuid, i64, Uuid)> = HashSet::new();
    let mut last: HashMap<(Uuid, i64), Instant> = HashMap::new();
    while let Some(check) = checks.recv().await {
        let key = (check.job_id, check.generation);
        if last.get(&key).is_some_and(|t| t.elapsed() < RECHECK_AFTER) {
            tracing::debug!(job = %check.job_id, "peer check skipped: one ran just before");
            continue;
        }
        tracing::debug!(job = %check.job_id, generation = check.generation, peers = check.peers.len(), "checking peers: {}", check.reason);
        last.insert(key, Instant::now());
        // Old generations' entries are of no more use.
        last.retain(|_, t| t.elapsed() < Duration::from_secs(60));
        let me = id.read().map(|g| *g).unwrap_or_default();
        // A peer that just died may still be closing its listener when the
        // broken connection is seen: a look that finds everyone answering
        // is repeated, a little later, twice.
        let mut found = Vec::new();
        for delay in PROBE_AGAIN {
            tokio::time::sleep(delay).await;
            let mut probes = tokio::task::JoinSet::new();
            for (peer, address) in check.peers.iter().cloned() {
                if peer == me || reported.contains(&(check.job_id, check.generation, peer)) {
                    continue;
                }
                probes.spawn(async move { (peer, unreachable(&address).await) });
            }
            while let Some(done) = probes.join_next().await {
                match done {
                    Ok((peer, Some(seen))) => found.push((peer, seen)),
                    other => tracing::debug!(?other, "peer answered its probe"),
                }
            }
            if !found.is_empty() {
                break;
            }
        }
        for (peer, seen) in found {
            if reported.len() >= 10_000 {
                reported.clear();
            }
            reported.insert((check.job_id, check.generation, peer));
            let report = SuspectReport {
                job_id: check.job_id,
                generation: check.generation,
                suspect: peer,
                reason: format!("{}; probe: {seen}", check.reason)
                    .chars()
                    .take(trainyard_common::cluster::MAX_SUSPECT_REASON_CHARS)
                    .collect(),
            };
            let client = client.clone();
            tokio::spawn(async move {
                match client.report_suspect(me, &report).await {
                    Ok(a) if a.verdict == SuspectVerdict::Confirmed => {
                        tracing::warn!(suspect = %peer, "peer reported and confirmed lost: {}", a.evidence);
                    }
                    Ok(a) => {
                        tracing::info!(suspect = %peer, verdict = ?a.verdict, "peer reported: {}", a.evidence);
                    }
                    Err(e) => {
                        tracing::warn!(suspect = %peer, error = %e, "reporting a peer failed; the heartbeat timeout applies");
                    }
                }
            });
        }
    }
}
