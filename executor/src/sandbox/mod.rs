//! The executor's use of the sandbox: users' code runs in a child process
//! of this executor, confined by `trainyard-sandbox`.
//!
//! The executor is the trusted agent: it alone holds the join token, the
//! object store's keys and its cache. Whatever loads a user's model (or any
//! bytes libtorch deserializes for a user) runs in a child started here —
//! `trainyard-confined KIND`, the program of the crate of that name, found
//! beside the executor's binary — which reads one
//! task on stdin, confines itself ([`trainyard_sandbox::enter`]) before it
//! reads a byte of the user's, and answers one JSON line on stdout. Its
//! inputs are copied (or linked) by the executor into a [`Workspace`] of its
//! own: `inputs/` (read-only to it) and `scratch/` (read-write); it sees
//! nothing else of the host.
//!
//! `--sandbox on` (the default) fails closed: on a kernel without Landlock
//! or seccomp the executor refuses users' code with the reason
//! ([`Sandbox::refusal`]). `--sandbox off` is for trusted single-user
//! setups: users' code still runs in a child process (a crash still ends
//! only that process), but unconfined, and the executor says so loudly.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use trainyard_confined::protocol::{Envelope, Kind, ScriptTask};
use trainyard_sandbox::spawn::{run, Identity, Spec};
use trainyard_sandbox::{Confinement, Ending, Limits, Status};

mod error;
mod workspace;
pub use error::SandboxError;
pub use workspace::Workspace;

/// Whether users' code is confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Confined; refused where the kernel cannot confine it.
    On,
    /// Not confined (trusted single-user setups only).
    Off,
}

/// The program a confined child runs: the `trainyard-confined` crate's.
pub const CHILD_PROGRAM: &str = "trainyard-confined";

/// The confined child's program installed beside `executable` (the
/// executor's): an executor without it cannot confine users' code and does
/// not start.
pub fn child_program(executable: &Path) -> Result<PathBuf, SandboxError> {
    let program = executable.with_file_name(CHILD_PROGRAM);
    if program.is_file() {
        Ok(program)
    } else {
        Err(SandboxError::NoProgram {
            program,
            executable: executable.to_owned(),
        })
    }
}

/// Memory a role's process needs beyond what its job asks for: libtorch's
/// code and the executor's own, counted by the memory cgroup once touched.
pub const RUNTIME_MB: u64 = 1024;

/// Where a confined script (and its install) sees its own temporary
/// folder: its workspace's `scratch/tmp`, bound there.
pub const SCRIPT_TMP: &str = trainyard_sandbox::spawn::PRIVATE_TMP;

/// How users' code is run on this executor.
#[derive(Debug)]
pub struct Sandbox {
    mode: Mode,
    identity: Option<Identity>,
    status: Status,
    root: PathBuf,
    program: PathBuf,
    torch_threads: Option<i32>,
    /// The Python runtimes script jobs may name (`default` always).
    pythons: std::collections::BTreeMap<String, PathBuf>,
}

impl Sandbox {
    /// A sandbox in `mode`, running children as `user` (when given), with
    /// workspaces under `root`, started from `program` (`trainyard-confined`).
    pub fn new(
        mode: Mode,
        user: Option<&str>,
        root: PathBuf,
        program: PathBuf,
        torch_threads: Option<i32>,
    ) -> Result<Sandbox, SandboxError> {
        let identity = user
            .map(Identity::named)
            .transpose()
            .map_err(SandboxError::User)?;
        std::fs::create_dir_all(&root).map_err(SandboxError::io(format!(
            "sandbox folder {}",
            root.display()
        )))?;
        Ok(Sandbox {
            mode,
            identity,
            status: Status::probe(),
            root,
            program,
            torch_threads,
            pythons: [("default".to_owned(), default_python())].into(),
        })
    }

    /// The folder its workspaces are made in.
    pub fn folder(&self) -> &Path {
        &self.root
    }

    /// With the Python runtimes `named` (`NAME=PATH`, an admin's
    /// `--python`), beside (or replacing) `default`.
    pub fn with_pythons(mut self, named: impl IntoIterator<Item = (String, PathBuf)>) -> Sandbox {
        self.pythons.extend(named);
        self
    }

    /// The interpreter of the runtime `name` (`None`: `default`).
    pub fn python(&self, name: Option<&str>) -> Result<&Path, SandboxError> {
        let name = name.unwrap_or("default");
        self.pythons
            .get(name)
            .map(PathBuf::as_path)
            .ok_or_else(|| SandboxError::NoPython {
                name: name.to_owned(),
                have: self.pythons.keys().cloned().collect(),
            })
    }

    /// The number of threads each child's libtorch (or script) may use.
    pub fn torch_threads(&self) -> Option<i32> {
        self.torch_threads
    }

    /// A sandbox for tests: on, children started from the
    /// `trainyard-confined` built beside the test binary.
    pub fn for_tests() -> Sandbox {
        Sandbox::for_tests_in(Mode::On)
    }

    /// A sandbox for tests in `mode` (`Off`: the control that shows what
    /// the confinement stops).
    pub fn for_tests_in(mode: Mode) -> Sandbox {
        let exe = std::env::current_exe().expect("the test binary's path");
        let program = exe
            .ancestors()
            .skip(1)
            .map(|d| d.join(CHILD_PROGRAM))
            .find(|p| p.is_file())
            .unwrap_or_else(|| {
                panic!("no {CHILD_PROGRAM} built beside {}: run `cargo build --bins` first (`./scripts/test` does)", exe.display())
            });
        let root =
            std::env::temp_dir().join(format!("trainyard-sandbox-tests-{}", std::process::id()));
        Sandbox::new(mode, None, root, program, Some(1)).expect("a sandbox for tests")
    }

    /// The program its children run (`trainyard-confined`).
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// What this kernel offers.
    pub fn status(&self) -> &Status {
        &self.status
    }

    /// Why users' code may not run here (`--sandbox on` on a kernel that
    /// cannot confine it).
    pub fn refusal(&self) -> Option<String> {
        match self.mode {
            Mode::Off => None,
            Mode::On => self.status.missing().map(|why| {
                format!(
                    "this executor cannot confine users' code ({why}); an admin may start it with \
                     --sandbox off for a trusted single-user setup"
                )
            }),
        }
    }

    /// Why script jobs may not run here: what [`Sandbox::refusal`] says,
    /// or (`--sandbox on`) that their ranks' network namespace cannot be
    /// made on this host.
    pub fn script_refusal(&self) -> Option<String> {
        match self.mode {
            Mode::Off => None,
            Mode::On => self.status.scripts_missing().map(|why| {
                format!(
                    "this executor cannot confine script jobs ({why}); an admin may start it \
                     with --sandbox off for a trusted single-user setup"
                )
            }),
        }
    }

    /// One line for the log and the listing: the mode and the layers.
    pub fn summary(&self) -> String {
        let s = &self.status;
        match (self.mode, self.refusal()) {
            (Mode::Off, _) => {
                "off: users' code runs in child processes, unconfined; script ranks share the \
                 host's network"
                    .into()
            }
            (Mode::On, Some(why)) => format!("unavailable: {why}"),
            (Mode::On, None) => format!(
                "on: landlock ABI {}{}, seccomp, {}{}; {}",
                s.landlock_abi,
                if s.network() {
                    " (files and TCP)"
                } else {
                    " (files)"
                },
                match (s.memory_cgroup, s.pids_cgroup) {
                    (true, true) => "memory and pids cgroups",
                    (true, false) => "memory cgroup",
                    (false, true) => "pids cgroup, data-size rlimit",
                    (false, false) => "data-size rlimit",
                },
                match self.identity {
                    Some(id) => format!(", uid {}", id.uid),
                    None if nix::unistd::geteuid().is_root() => {
                        ", root without capabilities".into()
                    }
                    None => String::new(),
                },
                match &s.netns_missing {
                    None => "script ranks: a network namespace each, relayed to their job's ranks"
                        .to_owned(),
                    Some(why) => format!("script jobs refused: no network namespace ({why})"),
                }
            ),
        }
    }

    /// What the executor tells the API at registration.
    pub fn report(&self) -> trainyard_common::cluster::SandboxReport {
        use trainyard_common::cluster::{SandboxReport, SandboxState, MAX_SANDBOX_DETAIL};
        let state = match (self.mode, self.refusal()) {
            (Mode::Off, _) => SandboxState::Unconfined,
            (Mode::On, Some(_)) => SandboxState::Unavailable,
            (Mode::On, None) => SandboxState::Confined,
        };
        let scripts = match (self.mode, self.script_refusal()) {
            (Mode::Off, _) => SandboxState::Unconfined,
            (Mode::On, Some(_)) => SandboxState::Unavailable,
            (Mode::On, None) => SandboxState::Confined,
        };
        SandboxReport {
            state,
            detail: self.summary().chars().take(MAX_SANDBOX_DETAIL).collect(),
            scripts: Some(scripts),
        }
    }

    /// A fresh workspace named after `name` (removed when dropped).
    pub fn workspace(&self, name: &str) -> Result<Workspace, SandboxError> {
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.root.join(format!("{name}-{n}"));
        let _ = std::fs::remove_dir_all(&dir);
        self.make_workspace(dir, false)
    }

    /// `dir` made a workspace: `inputs/` (the executor's) and `scratch/`
    /// (the sandbox user's); removed when dropped unless `keep`.
    fn make_workspace(&self, dir: PathBuf, keep: bool) -> Result<Workspace, SandboxError> {
        let made = (|| {
            std::fs::create_dir_all(dir.join("inputs"))?;
            std::fs::create_dir_all(dir.join("scratch"))?;
            if let Some(id) = self.identity {
                // Its scratch is its own; its inputs stay the executor's.
                std::os::unix::fs::chown(dir.join("scratch"), Some(id.uid), Some(id.gid))?;
            }
            Ok::<_, std::io::Error>(())
        })();
        made.map_err(SandboxError::io(format!(
            "sandbox workspace {}",
            dir.display()
        )))?;
        Ok(Workspace { dir, keep })
    }

    /// Folder `name` of job `job`'s own, kept across its generations on
    /// this executor (a script rank's checkpoints) and writable by the
    /// sandbox's user; removed by [`Sandbox::forget_job`].
    pub fn job_folder(&self, job: uuid::Uuid, name: &str) -> Result<PathBuf, SandboxError> {
        let dir = self.root.join("jobs").join(job.to_string()).join(name);
        std::fs::create_dir_all(&dir)
            .map_err(SandboxError::io(format!("job folder {}", dir.display())))?;
        self.give(&dir)?;
        Ok(dir)
    }

    /// Removes job `job`'s folders (it left this executor).
    pub fn forget_job(&self, job: uuid::Uuid) {
        let _ = std::fs::remove_dir_all(self.root.join("jobs").join(job.to_string()));
    }

    /// Job `job`'s workspace `name`, kept across its generations on this
    /// executor (a script rank slot's code, inputs and scratch, which a
    /// spare interpreter is confined to before its rank exists); removed
    /// by [`Sandbox::forget_job`].
    pub fn job_workspace(&self, job: uuid::Uuid, name: &str) -> Result<Workspace, SandboxError> {
        self.make_workspace(
            self.root.join("jobs").join(job.to_string()).join(name),
            true,
        )
    }

    /// Makes `dir` the sandbox user's (when children run as one).
    pub fn give(&self, dir: &Path) -> Result<(), SandboxError> {
        if let Some(id) = self.identity {
            std::os::unix::fs::chown(dir, Some(id.uid), Some(id.gid))
                .map_err(SandboxError::io(dir.display().to_string()))?;
        }
        Ok(())
    }

    /// Runs `task` as `kind` in a child confined to `ws` with `limits`,
    /// for at most `timeout` or until `stop` says so (the child's process
    /// group and cgroup are then killed); its answer, or why it has none
    /// (the limit or signal that ended it, with the last line it wrote).
    pub fn run<T: Serialize, R: DeserializeOwned>(
        &self,
        kind: Kind,
        ws: &Workspace,
        task: &T,
        limits: Limits,
        timeout: Duration,
        stop: &dyn Fn() -> bool,
    ) -> Result<R, SandboxError> {
        if let Some(why) = self.refusal() {
            return Err(SandboxError::Refused(why));
        }
        let (line, spec) = self.prepare(kind, ws, task, limits, None, tch::Device::Cpu)?;
        let (ending, out, err) = run(&spec, line.as_bytes(), Some(timeout), stop, 64 << 20)
            .map_err(SandboxError::start(format!(
                "cannot start the sandboxed {kind}"
            )))?;
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .to_owned();
        match ending {
            Ending::Exited(0) => serde_json::from_slice(&out)
                .map_err(|source| SandboxError::Unreadable { kind, source, last }),
            Ending::Memory { .. } => Err(SandboxError::Memory {
                kind,
                ending,
                asked_mb: limits.memory_mb.saturating_sub(RUNTIME_MB),
            }),
            ending => Err(SandboxError::Ended { kind, ending, last }),
        }
    }
}

impl Sandbox {
    /// Starts `kind` confined to `ws` with `limits` (and, for a CUDA
    /// `device`, the GPU's device files), `task` written to its stdin as
    /// the first line; the stdin stays open for the conversation that
    /// follows. `fd3` becomes the child's fd 3.
    pub fn start<T: Serialize>(
        &self,
        kind: Kind,
        ws: &Workspace,
        task: &T,
        limits: Limits,
        fd3: Option<std::os::fd::RawFd>,
        device: tch::Device,
    ) -> Result<(trainyard_sandbox::spawn::Child, std::process::ChildStdin), SandboxError> {
        use std::io::Write;
        if let Some(why) = self.refusal() {
            return Err(SandboxError::Refused(why));
        }
        let (line, spec) = self.prepare(kind, ws, task, limits, fd3, device)?;
        let mut child = trainyard_sandbox::spawn::Child::start(&spec).map_err(
            SandboxError::start(format!("cannot start the sandboxed {kind}")),
        )?;
        let Some(mut stdin) = child.stdin() else {
            child.kill();
            return Err(SandboxError::Start {
                what: format!("the sandboxed {kind}"),
                source: std::io::Error::other("it has no stdin"),
            });
        };
        if let Err(e) = stdin.write_all(line.as_bytes()) {
            child.kill();
            return Err(SandboxError::Start {
                what: format!("the sandboxed {kind} did not take its task"),
                source: e,
            });
        }
        Ok((child, stdin))
    }
}

impl Sandbox {
    /// Starts a user's script as `task` (the interpreter, its arguments,
    /// environment and folder) confined to `ws` plus `read_only` (the
    /// runtime's folders) and `read_write` (its checkpoint and output
    /// folders), with `limits`, in the network namespace `netns` (its
    /// slot's, `--sandbox on`). Unlike a model process its network is not
    /// confined by port (gloo and NCCL listen on ports they pick) but by
    /// the namespace, whose only way out is the relay to its job's ranks
    /// ([`crate::script::relay`]). Its stdin is closed after the task; its
    /// stdout and stderr are pipes.
    #[allow(clippy::too_many_arguments)]
    pub fn start_script(
        &self,
        ws: &Workspace,
        task: &ScriptTask,
        limits: Limits,
        read_only: Vec<PathBuf>,
        read_write: Vec<PathBuf>,
        device: tch::Device,
        netns: Option<PathBuf>,
    ) -> Result<trainyard_sandbox::spawn::Child, SandboxError> {
        let (line, spec) =
            self.script_launch(ws, task, limits, read_only, read_write, device, netns)?;
        let child = trainyard_sandbox::spawn::Child::spawn(&spec, line.as_bytes()).map_err(
            SandboxError::start("cannot start the sandboxed script".to_owned()),
        )?;
        Ok(child)
    }

    /// What [`Sandbox::start_script`] starts: the envelope line and the
    /// child's spec (a spare interpreter is started from the same).
    #[allow(clippy::too_many_arguments)]
    pub fn script_launch(
        &self,
        ws: &Workspace,
        task: &ScriptTask,
        limits: Limits,
        read_only: Vec<PathBuf>,
        read_write: Vec<PathBuf>,
        device: tch::Device,
        netns: Option<PathBuf>,
    ) -> Result<(String, Spec), SandboxError> {
        if let Some(why) = self.script_refusal() {
            return Err(SandboxError::Refused(why));
        }
        if self.mode == Mode::On && netns.is_none() {
            return Err(SandboxError::NoNetns);
        }
        let (line, mut spec) = self.prepare(Kind::Script, ws, task, limits, None, device)?;
        if self.mode == Mode::On {
            spec.netns = netns;
            // DataLoader workers' queues and shared tensors: a `/dev/shm`
            // of the rank's own, as large as its memory, which it counts in.
            spec.private_shm_mb = Some(limits.memory_mb);
            // Its temporary folder is its scratch's `tmp/`, seen at a short
            // path: `multiprocessing`'s Unix sockets need one under 108
            // bytes, which a workspace's folders are not.
            let tmp = ws.scratch().join("tmp");
            std::fs::create_dir_all(&tmp).map_err(SandboxError::io(tmp.display().to_string()))?;
            self.give(&tmp)?;
            spec.private_tmp = Some(tmp);
        }
        let line = match self.mode {
            Mode::Off => line,
            Mode::On => {
                let mut envelope: Envelope<serde_json::Value> = serde_json::from_str(&line)?;
                if let Some(c) = envelope.confinement.as_mut() {
                    c.read_only.extend(read_only);
                    c.read_write.extend(read_write);
                    // Its private tmpfs and `/tmp` (the spec above), not the
                    // host's.
                    c.read_write.push(PathBuf::from("/dev/shm"));
                    c.read_write.push(PathBuf::from(SCRIPT_TMP));
                    c.connect_tcp = None;
                    c.bind_tcp = None;
                }
                serde_json::to_string(&envelope)? + "\n"
            }
        };
        Ok((line, spec))
    }
}

/// The default Python runtime: `TRAINYARD_PYTHON` when set, else
/// `python3` from the executor's `PATH`.
fn default_python() -> PathBuf {
    if let Some(p) = std::env::var_os("TRAINYARD_PYTHON") {
        return PathBuf::from(p);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("/usr/bin/python3"))
}

impl Sandbox {
    /// A child's task line (its confinement to `ws`, and for a CUDA
    /// `device` the GPU's device files, its limits, this executor's pid)
    /// and what to start.
    fn prepare<T: Serialize>(
        &self,
        kind: Kind,
        ws: &Workspace,
        task: &T,
        limits: Limits,
        fd3: Option<std::os::fd::RawFd>,
        device: tch::Device,
    ) -> Result<(String, Spec), SandboxError> {
        let confinement = (self.mode == Mode::On).then(|| {
            let mut read_write = vec![ws.scratch()];
            if device.is_cuda() {
                read_write.extend(gpu_files());
            }
            Confinement {
                read_only: vec![ws.inputs()],
                read_write,
                connect_tcp: Some(vec![]),
                bind_tcp: Some(vec![]),
                limits,
            }
        });
        let envelope = Envelope {
            confinement,
            torch_threads: self.torch_threads,
            parent: Some(std::process::id()),
            task,
        };
        let line = serde_json::to_string(&envelope)? + "\n";
        let spec = Spec {
            program: self.program.clone(),
            args: vec![kind.name().into()],
            env: child_env(),
            identity: self.identity,
            limits,
            name: kind.name().into(),
            fd3,
            netns: None,
            private_shm_mb: None,
            private_tmp: None,
        };
        Ok((line, spec))
    }
}

/// The device files a CUDA process opens (read-write to a role on a GPU).
fn gpu_files() -> Vec<PathBuf> {
    std::fs::read_dir("/dev")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("nvidia"))
        })
        .chain(["/dev/dri".into(), "/proc/driver/nvidia".into()])
        .filter(|p| p.exists())
        .collect()
}

/// The whole environment of a child: where libtorch is, nothing else (no
/// join token, no store keys, no proxies).
fn child_env() -> Vec<(String, String)> {
    ["LD_LIBRARY_PATH"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .chain([("PATH".to_owned(), "/usr/bin:/bin".to_owned())])
        .collect()
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Its workspaces are gone by now; an empty folder is not left
        // behind (one still in use by another sandbox stays).
        let _ = std::fs::remove_dir(&self.root);
    }
}

/// A shared handle.
pub type Shared = Arc<Sandbox>;

#[cfg(test)]
mod tests;
