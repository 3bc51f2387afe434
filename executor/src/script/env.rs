//! torchrun's environment contract, computed for one rank of a script job:
//! the variables torchrun's elastic agent gives each worker, with the
//! values it would give for the same world, plus the sandbox's own
//! (folders, threads) and the script's from its spec. Pure, so that the
//! contract is tested without starting anything.

use std::collections::BTreeMap;
use std::path::Path;
use trainyard_common::cluster::WorkerPeer;
use uuid::Uuid;

pub use trainyard_common::spec::script::{rendezvous_port, RENDEZVOUS_PORTS, RENDEZVOUS_PORT_BASE};

/// Where a rank's folders are, as the script sees them.
pub struct Folders<'a> {
    /// Its code (the working folder).
    pub code: &'a Path,
    /// Its inputs (read-only).
    pub inputs: &'a Path,
    /// Its checkpoints (read-write; kept across restarts).
    pub checkpoints: &'a Path,
    /// Its outputs (read-write; rank 0's are the job's outputs).
    pub outputs: &'a Path,
    /// Its scratch (home).
    pub scratch: &'a Path,
    /// Its temporary folder, as it sees it.
    pub tmp: &'a Path,
    /// The file `trainyard.report()` appends to.
    pub reports: &'a Path,
}

/// One rank's place in its job's world.
pub struct Place<'a> {
    /// The job.
    pub job: Uuid,
    /// Its generation (1 at the first start; each change of the world or
    /// restart after a failure adds one).
    pub generation: u64,
    /// The job's workers in rank order.
    pub peers: &'a [&'a WorkerPeer],
    /// This rank.
    pub rank: u32,
    /// Restarts the spec allows.
    pub max_restarts: u32,
    /// Restarts of the job's world before this generation.
    pub restarts: u32,
    /// Threads the rank may use.
    pub threads: Option<i32>,
    /// The network interface gloo binds: the rank interface of its
    /// namespace, or the one that carries this executor's data-plane
    /// address (`None`: not found; gloo picks).
    pub interface: Option<String>,
    /// Whether the rank runs in its slot's network namespace, where its
    /// job's ranks are addressed by rank ([`trainyard_sandbox::netns`]).
    pub relayed: bool,
}

/// The host part of a data-plane address (`host:port`, `[v6]:port`).
pub fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The network interface that carries address `host` on this machine, for
/// gloo to bind (`None` for a name or an address not found). A loopback
/// address is the loopback interface's: named, gloo does not look its
/// host's name up, which in the sandbox (no `/etc/hosts`) waits for a
/// resolver that is not there.
pub fn interface_of(host: &str) -> Option<String> {
    let ip: std::net::IpAddr = host.parse().ok()?;
    nix::ifaddrs::getifaddrs().ok()?.find_map(|i| {
        let addr = i.address?;
        let found = match ip {
            std::net::IpAddr::V4(v4) => addr
                .as_sockaddr_in()
                .map(|a| a.ip() == v4 || (v4.is_loopback() && a.ip().is_loopback())),
            std::net::IpAddr::V6(v6) => addr
                .as_sockaddr_in6()
                .map(|a| a.ip() == v6 || (v6.is_loopback() && a.ip().is_loopback())),
        };
        found.unwrap_or(false).then_some(i.interface_name)
    })
}

/// The whole environment of one rank: the spec's variables, then torchrun's
/// and the sandbox's (which the spec may not set; the spec's check refuses
/// them, and they are written last here as well).
pub fn environment(
    place: &Place<'_>,
    folders: &Folders<'_>,
    spec_env: &BTreeMap<String, String>,
    library_path: Option<&str>,
) -> Vec<(String, String)> {
    let world = place.peers.len();
    let me = place.peers[place.rank as usize];
    let master = place.peers[0];
    // torchrun's "local" world is one agent's: here, the ranks on this
    // executor; its group rank is the executor's index among the job's
    // executors in rank order.
    let mut executors: Vec<Uuid> = Vec::new();
    for p in place.peers {
        if !executors.contains(&p.executor_id) {
            executors.push(p.executor_id);
        }
    }
    let local: Vec<&&WorkerPeer> = place
        .peers
        .iter()
        .filter(|p| p.executor_id == me.executor_id)
        .collect();
    let local_rank = local
        .iter()
        .position(|p| p.rank == me.rank)
        .unwrap_or_default();
    let group_rank = executors
        .iter()
        .position(|e| *e == me.executor_id)
        .unwrap_or_default();
    let threads = place.threads.unwrap_or(1).max(1).to_string();
    let dir = |p: &Path| p.display().to_string();
    let mut env: BTreeMap<String, String> = spec_env.clone();
    let ours = [
        ("RANK", place.rank.to_string()),
        ("LOCAL_RANK", local_rank.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("LOCAL_WORLD_SIZE", local.len().to_string()),
        ("GROUP_RANK", group_rank.to_string()),
        ("GROUP_WORLD_SIZE", executors.len().to_string()),
        ("ROLE_RANK", place.rank.to_string()),
        ("ROLE_WORLD_SIZE", world.to_string()),
        ("ROLE_NAME", "default".to_owned()),
        (
            "MASTER_ADDR",
            if place.relayed {
                trainyard_sandbox::netns::rank_address(place.generation, master.rank).to_string()
            } else {
                host_of(&master.address).to_owned()
            },
        ),
        (
            "MASTER_PORT",
            rendezvous_port(place.job, place.generation).to_string(),
        ),
        ("TORCHELASTIC_RESTART_COUNT", place.restarts.to_string()),
        ("TORCHELASTIC_MAX_RESTARTS", place.max_restarts.to_string()),
        ("TORCHELASTIC_RUN_ID", place.job.to_string()),
        ("TORCHELASTIC_USE_AGENT_STORE", "False".to_owned()),
        ("OMP_NUM_THREADS", threads.clone()),
        ("MKL_NUM_THREADS", threads),
        ("TRAINYARD_JOB_ID", place.job.to_string()),
        ("TRAINYARD_INPUT_DIR", dir(folders.inputs)),
        ("TRAINYARD_CHECKPOINT_DIR", dir(folders.checkpoints)),
        ("TRAINYARD_OUTPUT_DIR", dir(folders.outputs)),
        ("TRAINYARD_CODE_DIR", dir(folders.code)),
        ("TRAINYARD_REPORT_FILE", dir(folders.reports)),
        // What libraries expect of a home: caches and temporary files in
        // the rank's own scratch (kept across the job's restarts on this
        // executor, so a warm restart does not compile its kernels again),
        // never shared with another job.
        ("HOME", dir(folders.scratch)),
        ("TMPDIR", dir(folders.tmp)),
        ("XDG_CACHE_HOME", dir(&folders.scratch.join(".cache"))),
        ("HF_HOME", dir(&folders.scratch.join(".cache/huggingface"))),
        (
            "TORCHINDUCTOR_CACHE_DIR",
            dir(&folders.scratch.join(".cache/torchinductor")),
        ),
        (
            "TRITON_CACHE_DIR",
            dir(&folders.scratch.join(".cache/triton")),
        ),
        (
            "MPLCONFIGDIR",
            dir(&folders.scratch.join(".config/matplotlib")),
        ),
        ("USER", "trainyard".to_owned()),
        ("LOGNAME", "trainyard".to_owned()),
        ("PATH", "/usr/local/bin:/usr/bin:/bin".to_owned()),
        ("PYTHONUNBUFFERED", "1".to_owned()),
        ("PYTHONDONTWRITEBYTECODE", "1".to_owned()),
        ("PYTHONNOUSERSITE", "1".to_owned()),
    ];
    for (k, v) in ours {
        env.insert(k.to_owned(), v);
    }
    if let Some(i) = &place.interface {
        env.insert("GLOO_SOCKET_IFNAME".into(), i.clone());
        if place.relayed {
            env.insert("NCCL_SOCKET_IFNAME".into(), i.clone());
        }
    }
    if let Some(l) = library_path {
        env.insert("LD_LIBRARY_PATH".into(), l.to_owned());
    }
    env.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn peer(rank: u32, executor: u128, address: &str) -> WorkerPeer {
        WorkerPeer {
            rank,
            executor_id: Uuid::from_u128(executor),
            address: address.into(),
            device: 0,
        }
    }

    fn env_of(peers: &[WorkerPeer], rank: u32, generation: u64) -> BTreeMap<String, String> {
        let refs: Vec<&WorkerPeer> = peers.iter().collect();
        let p = Path::new("/w");
        let folders = Folders {
            code: p,
            inputs: p,
            checkpoints: p,
            outputs: p,
            scratch: p,
            tmp: p,
            reports: p,
        };
        let place = Place {
            job: Uuid::from_u128(7),
            generation,
            peers: &refs,
            rank,
            max_restarts: 3,
            restarts: generation.saturating_sub(1) as u32,
            threads: Some(2),
            interface: None,
            relayed: false,
        };
        let mine = [
            ("RANK".to_owned(), "99".to_owned()),
            ("SEED".into(), "1".into()),
        ]
        .into();
        environment(&place, &folders, &mine, None)
            .into_iter()
            .collect()
    }

    #[test]
    fn every_rank_gets_what_torchrun_would_give() {
        // Two executors: ranks 0 and 1 on the first, rank 2 on the second.
        let peers = [
            peer(0, 1, "10.0.0.1:7000"),
            peer(1, 1, "10.0.0.1:7000"),
            peer(2, 2, "10.0.0.2:7001"),
        ];
        let e = env_of(&peers, 2, 3);
        let get = |k: &str| e[k].as_str();
        assert_eq!(get("RANK"), "2", "the spec cannot set torchrun's variables");
        assert_eq!(get("WORLD_SIZE"), "3");
        assert_eq!(get("LOCAL_RANK"), "0");
        assert_eq!(get("LOCAL_WORLD_SIZE"), "1");
        assert_eq!(get("GROUP_RANK"), "1");
        assert_eq!(get("GROUP_WORLD_SIZE"), "2");
        assert_eq!(get("ROLE_RANK"), "2");
        assert_eq!(get("MASTER_ADDR"), "10.0.0.1");
        assert_eq!(get("TORCHELASTIC_RESTART_COUNT"), "2");
        assert_eq!(get("TORCHELASTIC_MAX_RESTARTS"), "3");
        assert_eq!(get("OMP_NUM_THREADS"), "2");
        assert_eq!(get("SEED"), "1");
        for k in [
            "HOME",
            "TMPDIR",
            "XDG_CACHE_HOME",
            "HF_HOME",
            "TORCHINDUCTOR_CACHE_DIR",
        ] {
            assert!(
                get(k).starts_with("/w"),
                "{k} in the rank's scratch: {}",
                get(k)
            );
        }
        let one = env_of(&peers, 1, 3);
        assert_eq!(one["LOCAL_RANK"], "1");
        assert_eq!(one["LOCAL_WORLD_SIZE"], "2");
        assert_eq!(one["GROUP_RANK"], "0");
        assert_eq!(one["MASTER_PORT"], e["MASTER_PORT"]);
        assert_eq!(host_of("[::1]:80"), "::1");
    }

    proptest! {
        #[test]
        fn the_rendezvous_port_is_in_its_range_and_moves_with_the_generation(job: u128, g in 1u64..1_000_000) {
            let p = rendezvous_port(Uuid::from_u128(job), g);
            prop_assert!((RENDEZVOUS_PORT_BASE..RENDEZVOUS_PORT_BASE + RENDEZVOUS_PORTS).contains(&p));
            prop_assert_ne!(p, rendezvous_port(Uuid::from_u128(job), g + 1));
        }
    }
}
