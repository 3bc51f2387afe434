//! The sandbox of the processes that run users' code.
//!
//! A user's TorchScript module runs its own operators, and some of them
//! read, write or map files. So the executor never loads a user's model in
//! its own process: it starts a child ([`spawn`]) and the child confines
//! itself ([`enter`]) before it reads a byte of the user's. This crate is
//! that boundary, kept apart from libtorch so that each layer is tested on
//! its own with a small probe (`trainyard-sandbox-probe`):
//!
//! * **identity** ([`spawn`]): a scrubbed environment, a process group of
//!   its own, an unprivileged uid/gid when one is given; a child left as
//!   root drops every capability ([`enter`]);
//! * **resources** ([`spawn::Cgroup`], [`enter`]): memory and process count
//!   in a cgroup of the child's own (v1 `memory` and `pids` controllers),
//!   open files and file size as rlimits, no core dumps; an ending is
//!   named by the limit that caused it ([`Ending`]);
//! * **filesystem** ([`landlock`]): read-only the runtime (the executable,
//!   the libraries it loaded, the dynamic loader's cache) and the role's
//!   own inputs, read-write its scratch folder, nothing else;
//! * **network** ([`landlock`]): TCP connect and bind only to the ports a
//!   role's pattern needs (Landlock ABI ≥ 4), no abstract Unix sockets and
//!   no signals outside the sandbox (ABI ≥ 6); a script rank, whose
//!   collectives pick their own ports, instead runs in a network
//!   namespace with no way out but a relay to its own job's ranks
//!   ([`netns`]);
//! * **system calls** ([`seccomp`]): `no_new_privs` and a filter that
//!   refuses ptrace, mount, bpf, kexec, module loading, namespace creation,
//!   keyctl, perf_event_open and their kin.
//!
//! [`Status`] says which layers this kernel offers; an executor fails
//! closed on it (see the executor's `--sandbox`).

pub mod landlock;
pub mod netns;
pub mod seccomp;
pub mod spawn;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// What a confined process may use.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Confinement {
    /// Folders and files it may read (its inputs); the runtime is added by
    /// [`enter`] itself.
    pub read_only: Vec<PathBuf>,
    /// Folders it may read and write (its scratch folder).
    pub read_write: Vec<PathBuf>,
    /// TCP ports it may connect to; `None`: network not confined.
    pub connect_tcp: Option<Vec<u16>>,
    /// TCP ports it may bind; `None`: not confined.
    pub bind_tcp: Option<Vec<u16>>,
    /// Resource limits.
    pub limits: Limits,
}

/// Resource limits of one confined process (and its children).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Limits {
    /// Memory in MiB (resident, through the memory cgroup).
    pub memory_mb: u64,
    /// Processes and threads.
    pub processes: u64,
    /// Open files.
    pub open_files: u64,
    /// Largest file it may write, in MiB.
    pub file_mb: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            memory_mb: 2048,
            processes: 256,
            open_files: 1024,
            file_mb: 4096,
        }
    }
}

/// Why a confined process ended, as the executor tells the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// It exited with this code.
    Exited(i32),
    /// It went past its memory limit (the cgroup's OOM killer, or an
    /// allocation refused at the limit).
    Memory {
        /// The limit, MiB.
        limit_mb: u64,
    },
    /// It wrote a file past its size limit (SIGXFSZ).
    FileSize {
        /// The limit, MiB.
        limit_mb: u64,
    },
    /// A signal ended it.
    Signal(String),
    /// It ran past its time and was killed.
    TimedOut(std::time::Duration),
    /// The executor killed it (cancel, a new generation, a drain).
    Killed,
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ending::Exited(c) => write!(f, "exited with code {c}"),
            Ending::Memory { limit_mb } => write!(f, "exceeded its {limit_mb} MiB memory"),
            Ending::FileSize { limit_mb } => {
                write!(f, "wrote a file past its {limit_mb} MiB file-size limit")
            }
            Ending::Signal(s) => write!(f, "was killed by {s}"),
            Ending::TimedOut(d) => write!(f, "did not finish within {} s", d.as_secs()),
            Ending::Killed => write!(f, "was stopped by the executor"),
        }
    }
}

/// Which layers this kernel and this process offer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Status {
    /// Landlock's ABI version (0: none).
    pub landlock_abi: u32,
    /// Whether seccomp filters can be installed.
    pub seccomp: bool,
    /// Whether a memory cgroup of the child's own can be made.
    pub memory_cgroup: bool,
    /// Whether a pids cgroup of the child's own can be made.
    pub pids_cgroup: bool,
    /// Why a script rank's network namespace cannot be made here (`None`:
    /// it can, [`netns::probe`]).
    #[serde(default)]
    pub netns_missing: Option<String>,
}

impl Status {
    /// Probes this kernel.
    pub fn probe() -> Status {
        Status {
            landlock_abi: landlock::abi(),
            seccomp: seccomp::available(),
            memory_cgroup: spawn::Cgroup::available("memory"),
            pids_cgroup: spawn::Cgroup::available("pids"),
            netns_missing: netns::probe().err(),
        }
    }

    /// Why users' code cannot be confined here, if it cannot: Landlock for
    /// files is the layer without which a job could read the host.
    pub fn missing(&self) -> Option<String> {
        if self.landlock_abi == 0 {
            return Some(
                "this kernel offers no Landlock (Linux ≥ 5.13 with `lsm=landlock`)".into(),
            );
        }
        if !self.seccomp {
            return Some("this kernel offers no seccomp filters".into());
        }
        None
    }

    /// Whether the network layer holds (Landlock ABI ≥ 4 rules on TCP).
    pub fn network(&self) -> bool {
        self.landlock_abi >= 4
    }

    /// Why script ranks cannot be confined here when models can: their
    /// network layer (a namespace of their own) cannot be made.
    pub fn scripts_missing(&self) -> Option<String> {
        self.missing().or_else(|| {
            self.netns_missing
                .as_ref()
                .map(|why| format!("no network namespace for script ranks: {why}"))
        })
    }
}

/// Confines the calling process for good, before it reads anything of a
/// user's: capabilities (when still root), rlimits, Landlock, then
/// `no_new_privs` and seccomp. Call it first thing in the child, while it
/// has one thread; what it cannot enforce is an error (fail closed).
pub fn enter(c: &Confinement) -> Result<(), Error> {
    // No PR_SET_PDEATHSIG: its "parent" is the thread that forked the
    // child, and a model process outlives the role thread that started it
    // (a survivor's replica is handed to the next generation's thread).
    // The child watches its parent process instead (the executor's
    // `exit_with_parent`).
    if nix::unistd::geteuid().is_root() {
        drop_capabilities()?;
    }
    rlimits(&c.limits)?;
    landlock::restrict(c)?;
    seccomp::install()?;
    Ok(())
}

/// What [`enter`] could not do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Landlock step failed or Landlock is missing.
    #[error("landlock: {0}")]
    Landlock(String),
    /// The seccomp filter could not be built or installed.
    #[error("seccomp: {0}")]
    Seccomp(String),
    /// An rlimit could not be set.
    #[error("rlimit {0}: {1}")]
    Rlimit(&'static str, nix::Error),
    /// Capabilities could not be dropped.
    #[error("capabilities: {0}")]
    Capabilities(String),
}

fn drop_capabilities() -> Result<(), Error> {
    use caps::{CapSet, Capability};
    let err = |e: caps::errors::CapsError| Error::Capabilities(e.to_string());
    // The bounding set first (that needs CAP_SETPCAP, still held): an exec
    // as root then gains nothing back.
    for cap in caps::all() {
        if cap != Capability::CAP_SETPCAP {
            caps::drop(None, CapSet::Bounding, cap).map_err(err)?;
        }
    }
    caps::drop(None, CapSet::Bounding, Capability::CAP_SETPCAP).map_err(err)?;
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(err)?;
    }
    Ok(())
}

fn rlimits(l: &Limits) -> Result<(), Error> {
    use nix::sys::resource::{setrlimit, Resource};
    let set = |r: Resource, name: &'static str, v: u64| {
        setrlimit(r, v, v).map_err(|e| Error::Rlimit(name, e))
    };
    set(Resource::RLIMIT_NOFILE, "open files", l.open_files)?;
    set(Resource::RLIMIT_FSIZE, "file size", l.file_mb << 20)?;
    set(Resource::RLIMIT_CORE, "core size", 0)?;
    // Without a memory cgroup (the parent could not make one), the data
    // segment is the bound: it counts malloc's heap and private mappings.
    if !spawn::Cgroup::joined("memory") {
        let v = (l.memory_mb << 20).saturating_add(512 << 20);
        set(Resource::RLIMIT_DATA, "data size", v)?;
    }
    Ok(())
}

/// The name of signal `n` ("SIGSEGV"), or its number.
pub fn signal_name(n: i32) -> String {
    nix::sys::signal::Signal::try_from(n)
        .map(|s| s.as_str().to_owned())
        .unwrap_or_else(|_| format!("signal {n}"))
}
