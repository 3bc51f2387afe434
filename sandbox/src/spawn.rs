//! The parent's side: starting a confined child, bounding it, ending it,
//! and naming why it ended.
//!
//! The child gets a scrubbed environment (only what the caller lists), a
//! process group of its own, and, when a user is given, that uid and gid
//! (the standard library also clears supplementary groups when dropping
//! from root). Its memory and process count go into cgroups made for it
//! alone (v1 `memory` and `pids`, under the executor's own cgroup); the
//! child is moved in before it is sent its task on stdin, and it reads
//! nothing of a user's before that. Ending it kills its process group and
//! every process in its cgroup (a child that made a session of its own is
//! still in its cgroup), and the cgroups are removed.

use crate::{signal_name, Ending, Limits};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A user and group to run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

impl Identity {
    /// The user named `name` (and its primary group).
    pub fn named(name: &str) -> Result<Identity, String> {
        match nix::unistd::User::from_name(name) {
            Ok(Some(u)) => Ok(Identity {
                uid: u.uid.as_raw(),
                gid: u.gid.as_raw(),
            }),
            Ok(None) => Err(format!("no user named {name:?}")),
            Err(e) => Err(format!("looking up user {name:?}: {e}")),
        }
    }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The program (the executor's own binary, for a role).
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its whole environment.
    pub env: Vec<(String, String)>,
    /// Whom it runs as (`None`: as the parent).
    pub identity: Option<Identity>,
    /// Its limits (memory and processes are enforced here, the rest by
    /// the child's [`crate::enter`]).
    pub limits: Limits,
    /// A name for its cgroups and logs.
    pub name: String,
    /// A descriptor of the parent's the child gets as its fd 3 (shared
    /// memory, say); every other descriptor is closed on exec.
    pub fd3: Option<std::os::fd::RawFd>,
    /// The network namespace it joins before it executes anything
    /// ([`crate::netns::Netns::path`]; `None`: the parent's).
    pub netns: Option<PathBuf>,
    /// A private `/dev/shm` of this many MiB: the child gets mount and IPC
    /// namespaces of its own with a fresh tmpfs there, so POSIX semaphores
    /// and shared tensors work and no other job's are visible (`None`: the
    /// parent's mounts; the sandbox's Landlock rules still refuse the
    /// host's `/dev/shm`).
    pub private_shm_mb: Option<u64>,
    /// A folder of the parent's bound on [`PRIVATE_TMP`] in the child's
    /// own mount namespace: a short path for its temporary files, where
    /// the Unix sockets `multiprocessing` makes fit (108 bytes), however
    /// deep the folder is. `None`: nothing bound.
    pub private_tmp: Option<PathBuf>,
}

/// One cgroup (v1) made for one child.
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    /// The folder of this process's own cgroup of `controller`.
    fn own(controller: &str) -> Option<PathBuf> {
        let root = Path::new("/sys/fs/cgroup").join(controller);
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let rel = cgroups.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
            names
                .split(',')
                .any(|n| n == controller)
                .then(|| path.trim_start_matches('/').to_owned())
        })?;
        let dir = root.join(rel);
        dir.join("cgroup.procs").exists().then_some(dir)
    }

    /// Whether a child cgroup of `controller` can be made here.
    pub fn available(controller: &str) -> bool {
        match Cgroup::make(controller, &format!("probe-{}", std::process::id())) {
            Some(c) => {
                drop(c);
                true
            }
            None => false,
        }
    }

    /// Whether this process is in a cgroup of `controller` that a parent
    /// made for it.
    pub fn joined(controller: &str) -> bool {
        Cgroup::own(controller).is_some_and(|d| {
            d.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("trainyard-"))
        })
    }

    fn make(controller: &str, name: &str) -> Option<Cgroup> {
        let dir = Cgroup::own(controller)?.join(format!("trainyard-{name}"));
        std::fs::create_dir(&dir).ok()?;
        Some(Cgroup { dir })
    }

    fn set(&self, file: &str, value: &str) -> std::io::Result<()> {
        std::fs::write(self.dir.join(file), value)
    }

    fn get(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(file)).ok()
    }

    fn add(&self, pid: u32) -> std::io::Result<()> {
        self.set("cgroup.procs", &pid.to_string())
    }

    fn pids(&self) -> Vec<i32> {
        self.get("cgroup.procs")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// How many times the OOM killer acted in it (v1 `oom_control`).
    fn oom_kills(&self) -> u64 {
        self.get("memory.oom_control")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Peak memory, bytes.
    fn max_usage(&self) -> u64 {
        self.get("memory.max_usage_in_bytes")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            for pid in self.pids() {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::warn!(dir = %self.dir.display(), "a sandbox cgroup could not be removed");
    }
}

/// A running confined child.
pub struct Child {
    child: std::process::Child,
    memory: Option<Cgroup>,
    pids: Option<Cgroup>,
    limits: Limits,
    ended: Option<Ending>,
    killed: bool,
}

static SPAWNED: AtomicU64 = AtomicU64::new(0);

impl Child {
    /// Starts `spec`, moves it into its cgroups, then writes `task` to its
    /// stdin (and closes it). Its stdout and stderr are pipes
    /// ([`Child::stdout`], [`Child::stderr`]).
    pub fn spawn(spec: &Spec, task: &[u8]) -> std::io::Result<Child> {
        let mut me = Child::start(spec)?;
        if let Some(mut stdin) = me.child.stdin.take() {
            // A child that died at once has closed its end: that shows in
            // its ending, not here.
            let _ = stdin.write_all(task);
        }
        Ok(me)
    }

    /// Starts `spec` and moves it into its cgroups, leaving its stdin open
    /// for a conversation ([`Child::stdin`]).
    pub fn start(spec: &Spec) -> std::io::Result<Child> {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir("/")
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Joining or making a namespace needs the parent's privileges, so
        // a child that does drops to its identity itself, afterwards.
        let netns = match &spec.netns {
            Some(path) => Some(std::fs::File::open(path)?),
            None => None,
        };
        let mounts = Mounts::of(spec)?;
        if netns.is_some() || mounts.is_some() {
            enter_then_become(&mut cmd, netns.as_ref(), mounts, spec.identity);
        } else if let Some(id) = spec.identity {
            cmd.uid(id.uid).gid(id.gid);
        }
        if let Some(fd) = spec.fd3 {
            pass_as_fd3(&mut cmd, fd);
        }
        let n = SPAWNED.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}-{}-{n}", spec.name, std::process::id());
        let memory = Cgroup::make("memory", &tag);
        if let Some(m) = &memory {
            let bytes = (spec.limits.memory_mb << 20).to_string();
            m.set("memory.limit_in_bytes", &bytes)?;
            // Swap counts too, where the kernel accounts it.
            let _ = m.set("memory.memsw.limit_in_bytes", &bytes);
        }
        let pids = Cgroup::make("pids", &tag);
        if let Some(p) = &pids {
            p.set("pids.max", &spec.limits.processes.to_string())?;
        }
        let child = cmd.spawn()?;
        let mut joined = Ok(());
        for c in [&memory, &pids].into_iter().flatten() {
            joined = joined.and(c.add(child.id()));
        }
        let mut me = Child {
            child,
            memory,
            pids,
            limits: spec.limits,
            ended: None,
            killed: false,
        };
        if let Err(e) = joined {
            me.kill();
            return Err(e);
        }
        Ok(me)
    }

    /// Its stdin, once (after [`Child::start`]).
    pub fn stdin(&mut self) -> Option<std::process::ChildStdin> {
        self.child.stdin.take()
    }

    /// Its process id (and process group id).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its stdout, once.
    pub fn stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.stdout.take()
    }

    /// Its stdout, borrowed (a handshake before [`Child::stdout`] takes it).
    pub fn stdout_mut(&mut self) -> Option<&mut std::process::ChildStdout> {
        self.child.stdout.as_mut()
    }

    /// Its stderr, once.
    pub fn stderr(&mut self) -> Option<std::process::ChildStderr> {
        self.child.stderr.take()
    }

    /// Kills its process group and everything in its cgroups.
    pub fn kill(&mut self) {
        self.killed = true;
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        for c in [&self.memory, &self.pids].into_iter().flatten() {
            for pid in c.pids() {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }

    /// How it ended, once it has (`None` while it runs).
    pub fn try_ending(&mut self) -> Option<Ending> {
        if self.ended.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                // What it left behind in its group goes with it.
                let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
                self.ended = Some(self.verdict(status));
            }
        }
        self.ended.clone()
    }

    /// Waits until it ends, `timeout` passes (it is then killed) or `stop`
    /// says so (killed too).
    pub fn wait(&mut self, timeout: Option<Duration>, stop: &dyn Fn() -> bool) -> Ending {
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            if let Some(e) = self.try_ending() {
                return e;
            }
            if let Some(t) = timeout.filter(|t| started.elapsed() >= *t) {
                self.kill();
                let _ = self.child.wait();
                self.ended = Some(Ending::TimedOut(t));
                return Ending::TimedOut(t);
            }
            if stop() {
                self.kill();
                let _ = self.child.wait();
                self.ended = Some(Ending::Killed);
                return Ending::Killed;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Peak memory of the child and its descendants, bytes (0 without a
    /// memory cgroup).
    pub fn peak_memory(&self) -> u64 {
        self.memory.as_ref().map_or(0, Cgroup::max_usage)
    }

    fn verdict(&self, status: ExitStatus) -> Ending {
        let oom = self.memory.as_ref().is_some_and(|m| m.oom_kills() > 0);
        if oom {
            return Ending::Memory {
                limit_mb: self.limits.memory_mb,
            };
        }
        if self.killed {
            return Ending::Killed;
        }
        match (status.code(), status.signal()) {
            (Some(c), _) => Ending::Exited(c),
            (None, Some(s)) if s == libc::SIGXFSZ => Ending::FileSize {
                limit_mb: self.limits.file_mb,
            },
            (None, Some(s)) => Ending::Signal(signal_name(s)),
            (None, None) => Ending::Exited(-1),
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.ended.is_none() {
            self.kill();
            let _ = self.child.wait();
        }
        // The cgroups' own drop kills what is left and removes them.
    }
}

/// Runs `spec` with `task` on its stdin to its end (or `timeout`, or
/// until `stop` says so): its ending, its stdout (at most `max_out` bytes)
/// and the tail of its stderr (at most 4 KiB).
pub fn run(
    spec: &Spec,
    task: &[u8],
    timeout: Option<Duration>,
    stop: &dyn Fn() -> bool,
    max_out: usize,
) -> std::io::Result<(Ending, Vec<u8>, String)> {
    let mut child = Child::spawn(spec, task)?;
    let out = child.stdout().map(|s| {
        std::thread::spawn(move || {
            let mut s = s;
            let mut buf = Vec::new();
            let _ = (&mut s).take(max_out as u64).read_to_end(&mut buf);
            // The rest is dropped, read so that the child never blocks.
            let _ = std::io::copy(&mut s, &mut std::io::sink());
            buf
        })
    });
    let err = child
        .stderr()
        .map(|s| std::thread::spawn(move || tail(s, 4096)));
    let ending = child.wait(timeout, stop);
    drop(child);
    let out = out.and_then(|t| t.join().ok()).unwrap_or_default();
    let err = err.and_then(|t| t.join().ok()).unwrap_or_default();
    Ok((ending, out, err))
}

/// The last `n` bytes read from `r`, as text.
pub fn tail(mut r: impl Read, n: usize) -> String {
    let mut kept: Vec<u8> = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(k) = r.read(&mut buf) {
        if k == 0 {
            break;
        }
        kept.extend_from_slice(&buf[..k]);
        if kept.len() > 2 * n {
            kept.drain(..kept.len() - n);
        }
    }
    if kept.len() > n {
        kept.drain(..kept.len() - n);
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// Where a child sees [`Spec::private_tmp`]: an empty folder the parent
/// makes on the host (nothing of the host is hidden by the bind, unlike
/// `/tmp`, where the workspaces themselves may live).
pub const PRIVATE_TMP: &str = "/run/trainyard-tmp";

/// What a child's own mount namespace holds, made before the fork (no
/// allocation between fork and exec).
struct Mounts {
    /// The tmpfs options of a private `/dev/shm` (its pages are charged to
    /// the memory cgroup of the process that writes them: the child's).
    shm: Option<std::ffi::CString>,
    /// The folder bound on `/tmp`.
    tmp: Option<std::ffi::CString>,
}

impl Mounts {
    fn of(spec: &Spec) -> std::io::Result<Option<Mounts>> {
        use std::os::unix::ffi::OsStrExt;
        let bad = |e: std::ffi::NulError| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
        let shm = spec
            .private_shm_mb
            .map(|mb| format!("size={}m,mode=1777,nr_inodes=65536", mb.max(1)))
            .map(std::ffi::CString::new)
            .transpose()
            .map_err(bad)?;
        let tmp = spec
            .private_tmp
            .as_ref()
            .map(|p| std::ffi::CString::new(p.as_os_str().as_bytes()))
            .transpose()
            .map_err(bad)?;
        if tmp.is_some() {
            std::fs::create_dir_all(PRIVATE_TMP)?;
        }
        Ok((shm.is_some() || tmp.is_some()).then_some(Mounts { shm, tmp }))
    }
}

/// Makes the child join the network namespace `ns` and, given `mounts`,
/// enter mount and IPC namespaces of its own with a fresh tmpfs on
/// `/dev/shm` and its folder bound on [`PRIVATE_TMP`]; then (when given) become
/// `identity`, with no supplementary groups.
#[allow(unsafe_code)]
fn enter_then_become(
    cmd: &mut Command,
    ns: Option<&std::fs::File>,
    mounts: Option<Mounts>,
    identity: Option<Identity>,
) {
    use std::os::fd::AsRawFd;
    let fd = ns.map(|f| f.as_raw_fd());
    // SAFETY: between fork and exec only setns, unshare, mount, setgroups,
    // setgid and setuid run, all async-signal-safe system calls, on a
    // descriptor the parent keeps open until the child is started and on
    // strings made before the fork (moved into the closure).
    unsafe {
        cmd.pre_exec(move || {
            let fail = || Err(std::io::Error::last_os_error());
            if let Some(fd) = fd {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return fail();
                }
            }
            if let Some(m) = &mounts {
                if libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC) != 0 {
                    return fail();
                }
                // Nothing mounted here reaches the host's mount table.
                let root = c"/";
                if libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                {
                    return fail();
                }
                if let Some(options) = &m.shm {
                    let (tmpfs, target) = (c"tmpfs", c"/dev/shm");
                    if libc::mount(
                        tmpfs.as_ptr(),
                        target.as_ptr(),
                        tmpfs.as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        options.as_ptr().cast(),
                    ) != 0
                    {
                        return fail();
                    }
                }
                if let Some(folder) = &m.tmp {
                    let target = c"/run/trainyard-tmp";
                    if libc::mount(
                        folder.as_ptr(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    ) != 0
                    {
                        return fail();
                    }
                }
            }
            if let Some(id) = identity {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(id.gid) != 0
                    || libc::setuid(id.uid) != 0
                {
                    return fail();
                }
            }
            Ok(())
        });
    }
}

/// Makes the parent's `fd` the child's fd 3, open across exec. The parent's
/// own copy stays close-on-exec, so no other child inherits it.
#[allow(unsafe_code)]
fn pass_as_fd3(cmd: &mut Command, fd: std::os::fd::RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only dup2 and fcntl run, both
    // async-signal-safe, on descriptors that stay open in the parent.
    unsafe {
        cmd.pre_exec(move || {
            if fd == 3 {
                let flags = libc::fcntl(3, libc::F_GETFD);
                if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
