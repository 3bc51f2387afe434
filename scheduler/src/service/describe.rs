//! The sentence each placement event carries: what moved between two
//! placements of a job and why (a lost or draining executor named, a
//! standby promoted, workers added or removed).

use super::world::World;
use crate::plan::Placement;
use std::collections::BTreeSet;
use trainyard_common::cluster::ExecutorState;
use uuid::Uuid;

/// A sentence saying what changed between two placements and why.
pub(super) fn describe(
    world: &World,
    old: Option<&Placement>,
    new: Option<&Placement>,
    waiting: Option<&String>,
) -> String {
    let name = |id: &Uuid| world.executor_label(id);
    match (old, new) {
        (None, Some(n)) => format!(
            "placed {} PS shard(s){} and {} worker(s) on {} executor(s)",
            n.parameter_servers.len(),
            match n
                .parameter_servers
                .iter()
                .filter(|p| p.standby.is_some())
                .count()
            {
                0 => String::new(),
                k => format!(" with {k} standby(s)"),
            },
            n.workers.len(),
            n.workers
                .iter()
                .map(|w| w.executor)
                .chain(n.parameter_servers.iter().map(|p| p.executor))
                .chain(n.parameter_servers.iter().filter_map(|p| p.standby))
                .collect::<BTreeSet<_>>()
                .len()
        ),
        (Some(o), None) => {
            let why = waiting.map_or("no longer placeable", |w| w.as_str());
            // A placed job loses its minimum set when executors holding its
            // roles are gone: name them, so the release is explained.
            let gone: BTreeSet<String> = o
                .workers
                .iter()
                .map(|w| w.executor)
                .chain(o.parameter_servers.iter().map(|p| p.executor))
                .filter(|e| {
                    world
                        .executors
                        .get(e)
                        .is_none_or(|(_, s)| *s != ExecutorState::Live)
                })
                .map(|e| name(&e))
                .collect();
            if gone.is_empty() {
                format!("released every role: {why}")
            } else {
                format!(
                    "released every role: {why} (its roles on {} are gone)",
                    gone.into_iter().collect::<Vec<_>>().join(", ")
                )
            }
        }
        (None, None) => "nothing to place".into(),
        (Some(o), Some(n)) => {
            let mut parts = Vec::new();
            for ps in &o.parameter_servers {
                let now = n.parameter_servers.get(ps.shard as usize);
                let to = now.map(|p| p.executor);
                if let Some(t) = to.filter(|t| Some(*t) == ps.standby) {
                    let (was, why) = match world.executors.get(&ps.executor) {
                        Some((n, ExecutorState::Draining)) => (n.clone(), "draining"),
                        Some((n, _)) => (n.clone(), "lost"),
                        None => (ps.executor.to_string(), "lost"),
                    };
                    parts.push(format!(
                        "PS shard {} primary on {was} ({why}): standby on {} promoted",
                        ps.shard,
                        name(&t)
                    ));
                } else if to != Some(ps.executor) {
                    parts.push(format!(
                        "PS shard {} moved from {} to {}",
                        ps.shard,
                        name(&ps.executor),
                        to.map_or("nowhere".into(), |t| name(&t))
                    ));
                }
                let sb = now.and_then(|p| p.standby);
                if sb != ps.standby {
                    if let Some(e) = sb {
                        parts.push(format!(
                            "standby of PS shard {} placed on {}",
                            ps.shard,
                            name(&e)
                        ));
                    } else if to != ps.standby {
                        parts.push(format!(
                            "standby of PS shard {} on {} lost; none placed yet",
                            ps.shard,
                            ps.standby.map_or("?".into(), |e| name(&e))
                        ));
                    }
                }
            }
            let old_w: BTreeSet<(Uuid, u32)> =
                o.workers.iter().map(|w| (w.executor, w.device)).collect();
            let new_w: BTreeSet<(Uuid, u32)> =
                n.workers.iter().map(|w| (w.executor, w.device)).collect();
            for (e, _) in old_w.difference(&new_w) {
                parts.push(format!("worker removed from {}", name(e)));
            }
            for (e, _) in new_w.difference(&old_w) {
                parts.push(format!("worker added on {}", name(e)));
            }
            if parts.is_empty() {
                parts.push("ranks reordered".into());
            }
            format!("{} (now {} worker(s))", parts.join("; "), n.workers.len())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{PsRole, WorkerRole};
    use std::collections::HashMap;
    use trainyard_common::spec::Strategy;

    fn world(executors: &[(Uuid, &str, &str)]) -> World {
        World {
            jobs: Vec::new(),
            live: Vec::new(),
            meta: HashMap::new(),
            executors: executors
                .iter()
                .map(|(id, name, state)| {
                    let state = ExecutorState::parse(state).expect("an executor state");
                    (*id, ((*name).to_owned(), state))
                })
                .collect(),
        }
    }

    #[test]
    fn a_release_names_the_executors_whose_loss_caused_it() {
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let w = world(&[
            (a, "ex-a", "live"),
            (b, "ex-b", "lost"),
            (c, "ex-c", "left"),
        ]);
        let old = Placement {
            strategy: Strategy::ParameterServer,
            workers: vec![
                WorkerRole {
                    rank: 0,
                    executor: a,
                    device: 0,
                },
                WorkerRole {
                    rank: 1,
                    executor: b,
                    device: 0,
                },
            ],
            parameter_servers: vec![PsRole {
                shard: 0,
                executor: c,
                ranges: Vec::new(),
                standby: None,
            }],
        };
        let why = "needs 2 cpu worker device(s) with 384 MiB free, has 1".to_owned();
        assert_eq!(
            describe(&w, Some(&old), None, Some(&why)),
            format!("released every role: {why} (its roles on ex-b (lost), ex-c (left) are gone)")
        );
        // Nothing gone (a higher-priority job took the room): no names.
        let w = world(&[
            (a, "ex-a", "live"),
            (b, "ex-b", "live"),
            (c, "ex-c", "live"),
        ]);
        assert_eq!(
            describe(&w, Some(&old), None, Some(&why)),
            format!("released every role: {why}")
        );
    }
}
