//! The executor's use of the sandbox: users' code runs in a child process
//! of this executor, confined by `trainyard-sandbox`.
//!
//! The executor is the trusted agent: it alone holds the join token, the
//! object store's keys and its cache. Whatever loads a user's model (or any
//! bytes libtorch deserializes for a user) runs in a child started here —
//! the executor's own binary with `--sandboxed KIND` — which reads one
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
use trainyard_sandbox::spawn::{run, Identity, Spec};
use trainyard_sandbox::{Confinement, Ending, Limits, Status};

/// Whether users' code is confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Confined; refused where the kernel cannot confine it.
    On,
    /// Not confined (trusted single-user setups only).
    Off,
}

/// Memory a role's process needs beyond what its job asks for: libtorch's
/// code and the executor's own, counted by the memory cgroup once touched.
pub const RUNTIME_MB: u64 = 1024;

/// How users' code is run on this executor.
#[derive(Debug)]
pub struct Sandbox {
    mode: Mode,
    identity: Option<Identity>,
    status: Status,
    root: PathBuf,
    program: PathBuf,
    torch_threads: Option<i32>,
}

/// The task line a sandboxed child reads on stdin.
#[derive(Serialize, Deserialize)]
pub struct Envelope<T> {
    /// What it confines itself to (`None`: `--sandbox off`).
    pub confinement: Option<Confinement>,
    /// Threads libtorch may use.
    pub torch_threads: Option<i32>,
    /// The executor's pid: the child ends itself once its parent is
    /// another (the executor died and it was re-parented).
    #[serde(default)]
    pub parent: Option<u32>,
    /// The task.
    pub task: T,
}

impl Sandbox {
    /// A sandbox in `mode`, running children as `user` (when given), with
    /// workspaces under `root`, started from `program` (this executable).
    pub fn new(
        mode: Mode,
        user: Option<&str>,
        root: PathBuf,
        program: PathBuf,
        torch_threads: Option<i32>,
    ) -> Result<Sandbox, String> {
        let identity = user.map(Identity::named).transpose()?;
        std::fs::create_dir_all(&root)
            .map_err(|e| format!("sandbox folder {}: {e}", root.display()))?;
        Ok(Sandbox {
            mode,
            identity,
            status: Status::probe(),
            root,
            program,
            torch_threads,
        })
    }

    /// A sandbox for tests: on, children started from the executor binary
    /// built beside the test binary.
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
            .map(|d| d.join("trainyard-executor"))
            .find(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("trainyard-executor"));
        let root =
            std::env::temp_dir().join(format!("trainyard-sandbox-tests-{}", std::process::id()));
        Sandbox::new(mode, None, root, program, Some(1)).expect("a sandbox for tests")
    }

    /// The program its children run (this executor's binary).
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

    /// One line for the log and the listing: the mode and the layers.
    pub fn summary(&self) -> String {
        let s = &self.status;
        match (self.mode, self.refusal()) {
            (Mode::Off, _) => "off: users' code runs in child processes, unconfined".into(),
            (Mode::On, Some(why)) => format!("unavailable: {why}"),
            (Mode::On, None) => format!(
                "on: landlock ABI {}{}, seccomp, {}{}",
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
        SandboxReport {
            state,
            detail: self.summary().chars().take(MAX_SANDBOX_DETAIL).collect(),
        }
    }

    /// A fresh workspace named after `name` (removed when dropped).
    pub fn workspace(&self, name: &str) -> Result<Workspace, String> {
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.root.join(format!("{name}-{n}"));
        let _ = std::fs::remove_dir_all(&dir);
        let made = (|| {
            std::fs::create_dir_all(dir.join("inputs"))?;
            std::fs::create_dir_all(dir.join("scratch"))?;
            if let Some(id) = self.identity {
                // Its scratch is its own; its inputs stay the executor's.
                std::os::unix::fs::chown(dir.join("scratch"), Some(id.uid), Some(id.gid))?;
            }
            Ok::<_, std::io::Error>(())
        })();
        made.map_err(|e| format!("sandbox workspace {}: {e}", dir.display()))?;
        Ok(Workspace { dir })
    }

    /// Runs `task` as `kind` in a child confined to `ws` with `limits`,
    /// for at most `timeout` or until `stop` says so (the child's process
    /// group and cgroup are then killed); its answer, or why it has none
    /// (the limit or signal that ended it, with the last line it wrote).
    pub fn run<T: Serialize, R: DeserializeOwned>(
        &self,
        kind: &str,
        ws: &Workspace,
        task: &T,
        limits: Limits,
        timeout: Duration,
        stop: &dyn Fn() -> bool,
    ) -> Result<R, String> {
        if let Some(why) = self.refusal() {
            return Err(why);
        }
        let (line, spec) = self.prepare(kind, ws, task, limits, None, tch::Device::Cpu)?;
        let (ending, out, err) = run(&spec, line.as_bytes(), Some(timeout), stop, 64 << 20)
            .map_err(|e| format!("cannot start the sandboxed {kind}: {e}"))?;
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        match ending {
            Ending::Exited(0) => serde_json::from_slice(&out).map_err(|e| {
                format!("the sandboxed {kind} answered nothing readable ({e}): {last}")
            }),
            Ending::Memory { .. } => Err(format!(
                "the {kind} {ending} ({} MiB asked by resources.memory_mb, {RUNTIME_MB} MiB for the runtime)",
                limits.memory_mb.saturating_sub(RUNTIME_MB)
            )),
            other => Err(format!(
                "the {kind} {other}{}",
                if last.is_empty() {
                    String::new()
                } else {
                    format!(": {last}")
                }
            )),
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
        kind: &str,
        ws: &Workspace,
        task: &T,
        limits: Limits,
        fd3: Option<std::os::fd::RawFd>,
        device: tch::Device,
    ) -> Result<(trainyard_sandbox::spawn::Child, std::process::ChildStdin), String> {
        use std::io::Write;
        if let Some(why) = self.refusal() {
            return Err(why);
        }
        let (line, spec) = self.prepare(kind, ws, task, limits, fd3, device)?;
        let mut child = trainyard_sandbox::spawn::Child::start(&spec)
            .map_err(|e| format!("cannot start the sandboxed {kind}: {e}"))?;
        let Some(mut stdin) = child.stdin() else {
            child.kill();
            return Err(format!("the sandboxed {kind} has no stdin"));
        };
        if let Err(e) = stdin.write_all(line.as_bytes()) {
            child.kill();
            return Err(format!("the sandboxed {kind} did not take its task: {e}"));
        }
        Ok((child, stdin))
    }
}

impl Sandbox {
    /// A child's task line (its confinement to `ws`, and for a CUDA
    /// `device` the GPU's device files, its limits, this executor's pid)
    /// and what to start.
    fn prepare<T: Serialize>(
        &self,
        kind: &str,
        ws: &Workspace,
        task: &T,
        limits: Limits,
        fd3: Option<std::os::fd::RawFd>,
        device: tch::Device,
    ) -> Result<(String, Spec), String> {
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
        let line = serde_json::to_string(&envelope).map_err(|e| e.to_string())? + "\n";
        let spec = Spec {
            program: self.program.clone(),
            args: vec!["--sandboxed".into(), kind.into()],
            env: child_env(),
            identity: self.identity,
            limits,
            name: kind.into(),
            fd3,
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

/// One child's folders: `inputs/` (read-only to it) and `scratch/`.
pub struct Workspace {
    dir: PathBuf,
}

impl Workspace {
    /// Its inputs folder.
    pub fn inputs(&self) -> PathBuf {
        self.dir.join("inputs")
    }

    /// Its scratch folder.
    pub fn scratch(&self) -> PathBuf {
        self.dir.join("scratch")
    }

    /// Puts a copy of `src` (a hard link where the file system allows)
    /// into its inputs as `name`; the path the child reads it at.
    pub fn input(&self, name: &str, src: &Path) -> Result<PathBuf, String> {
        let dst = self.inputs().join(name);
        if std::fs::hard_link(src, &dst).is_err() {
            std::fs::copy(src, &dst)
                .map_err(|e| format!("copying {} into the sandbox: {e}", src.display()))?;
        }
        Ok(dst)
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The child's side: reads the envelope on stdin, confines itself, runs
/// `work` on the task and prints its answer. Returns the exit code.
pub fn child<T: DeserializeOwned, R: Serialize>(work: impl FnOnce(T) -> R) -> i32 {
    use std::io::{BufRead, Write};
    let mut line = String::new();
    if let Err(e) = std::io::stdin().lock().read_line(&mut line) {
        eprintln!("reading the task: {e}");
        return 2;
    }
    let envelope: Envelope<T> = match serde_json::from_str(&line) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("reading the task: {e}");
            return 2;
        }
    };
    if let Some(c) = &envelope.confinement {
        if let Err(e) = trainyard_sandbox::enter(c) {
            eprintln!("cannot confine this process: {e}");
            return 3;
        }
    }
    exit_with_parent(envelope.parent);
    if let Some(n) = envelope.torch_threads {
        tch::set_num_threads(n);
    }
    let answer = work(envelope.task);
    let mut out = std::io::stdout().lock();
    match serde_json::to_writer(&mut out, &answer) {
        Ok(()) => {
            let _ = out.write_all(b"\n");
            let _ = out.flush();
            0
        }
        Err(e) => {
            eprintln!("writing the answer: {e}");
            4
        }
    }
}

/// The child's side of a conversation: reads the envelope's line on
/// stdin, confines itself, then hands the task, the rest of stdin and
/// stdout to `work`. Returns the exit code.
pub fn session<T: DeserializeOwned>(
    work: impl FnOnce(T, &mut dyn std::io::BufRead, &mut dyn std::io::Write) -> i32,
) -> i32 {
    use std::io::BufRead;
    let mut input = std::io::BufReader::new(std::io::stdin());
    let mut line = String::new();
    if let Err(e) = input.read_line(&mut line) {
        eprintln!("reading the task: {e}");
        return 2;
    }
    let envelope: Envelope<T> = match serde_json::from_str(&line) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("reading the task: {e}");
            return 2;
        }
    };
    if let Some(c) = &envelope.confinement {
        if let Err(e) = trainyard_sandbox::enter(c) {
            eprintln!("cannot confine this process: {e}");
            return 3;
        }
    }
    exit_with_parent(envelope.parent);
    if let Some(n) = envelope.torch_threads {
        tch::set_num_threads(n);
    }
    let mut output = std::io::BufWriter::new(std::io::stdout().lock());
    work(envelope.task, &mut input, &mut output)
}

/// Ends this child when its executor is gone. Its stdin's end would tell
/// it, but only once it reads again: a module busy in a forward (or one
/// that never returns) would outlive the executor. The thread starts after
/// the confinement, which it inherits.
fn exit_with_parent(expected: Option<u32>) {
    // Expected, not read: the executor may already be gone by now.
    let parent = expected.unwrap_or_else(std::os::unix::process::parent_id);
    let _ = std::thread::Builder::new()
        .name("parent-watch".into())
        .spawn(move || loop {
            if std::os::unix::process::parent_id() != parent {
                eprintln!("the executor is gone");
                // Not exit(): libtorch's static destructors can wait on
                // the very thread that is busy.
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(500));
        });
}

/// A shared handle.
pub type Shared = Arc<Sandbox>;

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_common::cluster::SandboxState;

    fn on_a_kernel(status: Status, mode: Mode) -> Sandbox {
        let mut s = Sandbox::for_tests();
        s.status = status;
        s.mode = mode;
        s
    }

    fn bare() -> Status {
        Status {
            landlock_abi: 0,
            seccomp: true,
            memory_cgroup: false,
            pids_cgroup: false,
        }
    }

    #[test]
    fn without_landlock_users_code_is_refused_unless_the_admin_says_off() {
        let s = on_a_kernel(bare(), Mode::On);
        let why = s.refusal().expect("refused");
        assert!(
            why.contains("no Landlock") && why.contains("--sandbox off"),
            "{why}"
        );
        assert_eq!(s.report().state, SandboxState::Unavailable);
        // Nothing is started: the refusal is the answer.
        let ws = s.workspace("refused").unwrap();
        let r: Result<serde_json::Value, String> = s.run(
            "inspection",
            &ws,
            &0,
            Limits::default(),
            Duration::from_secs(5),
            &|| false,
        );
        assert_eq!(r.unwrap_err(), why);

        let off = on_a_kernel(bare(), Mode::Off);
        assert_eq!(off.refusal(), None);
        assert_eq!(off.report().state, SandboxState::Unconfined);
        assert!(off.report().detail.contains("unconfined"));
    }

    #[test]
    fn this_kernel_confines_and_says_how() {
        let s = Sandbox::for_tests();
        assert_eq!(s.refusal(), None, "{:?}", s.status());
        let r = s.report();
        assert_eq!(r.state, SandboxState::Confined);
        assert!(r.detail.starts_with("on: landlock ABI"), "{}", r.detail);
    }
}
