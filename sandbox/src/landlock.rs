//! The filesystem and network layers: a Landlock ruleset the child puts on
//! itself.
//!
//! Read-only: the runtime — the executable, the folders of the shared
//! libraries it has loaded (libtorch and its kin, read from
//! `/proc/self/maps`), the system's library folders for what libtorch may
//! still `dlopen`, the dynamic loader's cache — a few devices (`/dev/null`,
//! `/dev/zero`, `/dev/urandom`), the CPU topology libtorch sizes its thread
//! pools from, the process's own `/proc/<pid>` (not another's), and the
//! inputs the caller names. Read-write: the scratch folders it names.
//! `/dev/null` may be written too. Everything else under `/` is refused,
//! `/etc`, `/home`, `/root`, `/tmp` and the executor's cache and token
//! files included.
//!
//! Network (ABI ≥ 4): TCP connect and bind only to the ports given. Scopes
//! (ABI ≥ 6): no abstract Unix sockets and no signals outside the sandbox
//! (a role cannot signal its executor).

use crate::{Confinement, Error};
use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The newest ABI this code was written and tested against.
const WANTED: ABI = ABI::V6;

/// The running kernel's Landlock ABI version (0 without Landlock).
pub fn abi() -> u32 {
    // The crate does not export the probe; ask the kernel as it does, by
    // creating (and dropping) a ruleset per version, newest first.
    for (abi, n) in [
        (ABI::V6, 6),
        (ABI::V5, 5),
        (ABI::V4, 4),
        (ABI::V3, 3),
        (ABI::V2, 2),
        (ABI::V1, 1),
    ] {
        let made = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_all(abi))
            .and_then(|r| r.create());
        if made.is_ok() {
            return n;
        }
    }
    0
}

/// The runtime this process needs to read: its executable, the folders of
/// the libraries it loaded, the loader's cache and the system libraries.
pub fn runtime() -> Vec<PathBuf> {
    let mut paths: BTreeSet<PathBuf> = BTreeSet::new();
    if let Ok(exe) = std::fs::read_link("/proc/self/exe") {
        paths.insert(exe);
    }
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        for line in maps.lines() {
            let Some(path) = line.split_whitespace().nth(5) else {
                continue;
            };
            if path.starts_with('/') && path.contains(".so") {
                if let Some(dir) = Path::new(path).parent() {
                    paths.insert(dir.to_owned());
                }
            }
        }
    }
    for p in [
        "/lib",
        "/lib64",
        "/usr/lib",
        "/usr/lib64",
        "/etc/ld.so.cache",
        "/dev/null",
        "/dev/zero",
        "/dev/urandom",
        "/proc/cpuinfo",
        "/proc/meminfo",
        "/sys/devices/system/cpu",
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup/cpuset",
    ] {
        paths.insert(PathBuf::from(p));
    }
    // Its own process folder only: not `/proc`, where other processes'
    // environments and memory maps are.
    paths.insert(PathBuf::from(format!("/proc/{}", std::process::id())));
    paths.into_iter().collect()
}

/// Puts the ruleset of `c` on this process (and its future children).
pub fn restrict(c: &Confinement) -> Result<(), Error> {
    let e = |e: landlock::RulesetError| Error::Landlock(e.to_string());
    let fs_all = AccessFs::from_all(WANTED);
    let read = AccessFs::from_read(WANTED);
    let mut ruleset = Ruleset::default().handle_access(fs_all).map_err(e)?;
    if c.connect_tcp.is_some() || c.bind_tcp.is_some() {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(WANTED))
            .map_err(e)?;
    }
    ruleset = ruleset
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(e)?;
    let mut created = ruleset.create().map_err(e)?;
    let mut ro = runtime();
    ro.extend(c.read_only.iter().cloned());
    created = created
        .add_rules(path_beneath_rules(&ro, read))
        .map_err(e)?;
    created = created
        .add_rules(path_beneath_rules(&c.read_write, fs_all))
        .map_err(e)?;
    // Writing to the null device is reading nothing: programs open it
    // read-write to discard output (`subprocess.DEVNULL`).
    created = created
        .add_rules(path_beneath_rules(
            ["/dev/null"],
            AccessFs::from_file(WANTED),
        ))
        .map_err(e)?;
    let net = |ports: &Option<Vec<u16>>, access: AccessNet| -> Vec<_> {
        ports
            .iter()
            .flatten()
            .map(|p| Ok::<_, landlock::RulesetError>(NetPort::new(*p, access)))
            .collect()
    };
    created = created
        .add_rules(net(&c.connect_tcp, AccessNet::ConnectTcp))
        .map_err(e)?;
    created = created
        .add_rules(net(&c.bind_tcp, AccessNet::BindTcp))
        .map_err(e)?;
    let status = created.restrict_self().map_err(e)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(Error::Landlock(
            "this kernel does not enforce Landlock: refusing to run users' code".into(),
        ));
    }
    if !status.no_new_privs {
        return Err(Error::Landlock("no_new_privs was not set".into()));
    }
    Ok(())
}
