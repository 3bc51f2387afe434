//! The roles an executor runs, started and stopped as assignments change.
//!
//! A role is keyed by job, kind and index and stamped with the generation it
//! was started for; a new generation restarts it (its peers may have
//! changed), and a role no longer assigned is stopped. Each role runs as a
//! task with its own stop signal.
//!
//! What a role does is the training runtime's business (PS shard server, PS
//! worker, ring worker). That runtime is not built yet: a role task today
//! holds its assignment, logs its peers, and waits to be stopped — enough
//! for the scheduler to see it acknowledged, and nothing that pretends to
//! train.

use std::collections::BTreeMap;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use trainyard_common::cluster::{Assignment, RoleKey, RoleKind};
use uuid::Uuid;

struct Running {
    key: RoleKey,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// The set of running roles.
#[derive(Default)]
pub struct Roles {
    running: BTreeMap<(Uuid, RoleKind, u32), Running>,
}

impl Roles {
    /// The roles running now, as reported in heartbeats.
    pub fn running(&self) -> Vec<RoleKey> {
        self.running.values().map(|r| r.key).collect()
    }

    /// Whether no role runs.
    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Makes the running set equal to `assignments`.
    pub fn apply(&mut self, assignments: &[Assignment]) {
        let wanted: BTreeMap<(Uuid, RoleKind, u32), &Assignment> = assignments
            .iter()
            .map(|a| ((a.key.job_id, a.key.role, a.key.index), a))
            .collect();
        let stale: Vec<_> = self
            .running
            .iter()
            .filter(|(k, r)| {
                wanted
                    .get(*k)
                    .is_none_or(|a| a.key.generation != r.key.generation)
            })
            .map(|(k, _)| *k)
            .collect();
        for k in stale {
            if let Some(r) = self.running.remove(&k) {
                let _ = r.stop.send(true);
                r.task.abort();
                tracing::info!(job = %r.key.job_id, role = ?r.key.role, index = r.key.index, generation = r.key.generation, "role stopped");
            }
        }
        for (k, a) in wanted {
            if self.running.contains_key(&k) {
                continue;
            }
            let (stop, stopped) = watch::channel(false);
            let task = tokio::spawn(hold(a.clone(), stopped));
            self.running.insert(
                k,
                Running {
                    key: a.key,
                    stop,
                    task,
                },
            );
        }
    }
}

async fn hold(a: Assignment, mut stopped: watch::Receiver<bool>) {
    tracing::info!(
        job = %a.key.job_id,
        role = ?a.key.role,
        index = a.key.index,
        generation = a.key.generation,
        strategy = ?a.strategy,
        workers = a.workers.len(),
        parameter_servers = a.parameter_servers.len(),
        "role started (the training runtime is not built yet: holding the assignment)"
    );
    while !*stopped.borrow() {
        if stopped.changed().await.is_err() {
            break;
        }
    }
}
