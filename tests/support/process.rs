//! Processes of the end-to-end tests: find the built binaries, start them
//! on free loopback ports with their output collected, wait for them,
//! signal them, and poll for a condition.
//!
//! The binaries come from the workspace's target folder (`cargo build
//! --workspace --bins` first; `scripts/test` does that), or from
//! `TRAINYARD_BIN_DIR` when set: the end-to-end benchmarks (`bench/`) use
//! these helpers with the release binaries.

use anyhow::{bail, Context};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Path of a built binary of the workspace: in `TRAINYARD_BIN_DIR` when
/// set, else in the target folder's `debug/`.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("TRAINYARD_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => target_dir().join("debug"),
    };
    let path = dir.join(name);
    if !path.exists() {
        bail!(
            "{} is missing: run `cargo build --workspace --bins` first",
            path.display()
        );
    }
    Ok(path)
}

/// The workspace's target folder (`CARGO_TARGET_DIR` when set).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// A free port on 127.0.0.1.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A child process whose output is collected, killed when dropped.
pub struct Proc {
    child: Child,
    output: Arc<Mutex<String>>,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr captured.
    pub fn spawn(mut cmd: Command) -> anyhow::Result<Proc> {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning")?;
        let output = Arc::new(Mutex::new(String::new()));
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let out = output.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Ok(mut o) = out.lock() {
                        o.push_str(&line);
                        o.push('\n');
                    }
                }
            });
        }
        Ok(Proc { child, output })
    }

    /// Everything printed so far.
    pub fn output(&self) -> String {
        self.output.lock().map(|o| o.clone()).unwrap_or_default()
    }

    /// Sends SIGTERM (graceful shutdown).
    pub fn terminate(&self) -> anyhow::Result<()> {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?
            .success();
        if !ok {
            bail!("kill -TERM failed");
        }
        Ok(())
    }

    /// Waits up to `limit` for the process to exit and returns its code.
    pub fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<Option<i32>> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.code());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("still running after {limit:?}; output:\n{}", self.output())
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILLs it (if it still runs) and reaps it.
    pub fn kill(&mut self) {
        if self.running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `url` — an API's `/readyz` or `/healthz` — through the typed
/// client until it answers with success, or `limit` passes (or `proc`
/// exits).
pub fn wait_ready(url: &str, proc: &mut Proc, limit: Duration) -> anyhow::Result<()> {
    let (base, probe) = if let Some(base) = url.strip_suffix("/readyz") {
        (base, Probe::Ready)
    } else if let Some(base) = url.strip_suffix("/healthz") {
        (base, Probe::Health)
    } else {
        bail!("{url} is neither an API's /readyz nor its /healthz");
    };
    let client = trainyard_client::Client::builder(base)
        .timeout(Duration::from_secs(2))
        .build()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let start = Instant::now();
    while start.elapsed() < limit {
        if !proc.running() {
            bail!(
                "process exited before becoming ready; output:\n{}",
                proc.output()
            );
        }
        let answer = match probe {
            Probe::Ready => rt.block_on(client.readyz()),
            Probe::Health => rt.block_on(client.healthz()),
        };
        if answer.is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!(
        "{url} not ready after {limit:?}; output:\n{}",
        proc.output()
    )
}

/// Which health endpoint [`wait_ready`] polls.
#[derive(Clone, Copy)]
enum Probe {
    Ready,
    Health,
}

/// Sends SIGKILL to a process id.
pub fn kill9(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

/// Polls `check` every 100 ms until it returns `Some` or `limit` passes.
pub fn eventually<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(v) = check() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// Starts `trainyard-executor` against the API at `api` with `ram_mb` of
/// RAM, one libtorch thread (several executors share this machine's cores,
/// and idle OpenMP threads spin) and the environment `env`. Its local cache
/// tier is a folder of this test process named after the executor (unless
/// `env` sets `TRAINYARD_CACHE_DIR`), so an executor restarted under the
/// same name finds its cache warm.
pub fn start_executor(
    api: &str,
    join: &str,
    name: &str,
    ram_mb: u32,
    env: &[(&str, &str)],
) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(binary("trainyard-executor")?);
    cmd.args([
        "--api",
        api,
        "--join-token",
        join,
        "--name",
        name,
        "--ram-mb",
        &ram_mb.to_string(),
        "--torch-threads",
        "1",
    ]);
    cmd.env(
        "TRAINYARD_CACHE_DIR",
        std::env::temp_dir().join(format!("ty-e2e-cache-{}-{name}", std::process::id())),
    );
    for (k, v) in env {
        cmd.env(k, v);
    }
    Proc::spawn(cmd)
}

/// Runs `tests/python/<name>` with `arg` in the venv's Python
/// (`TRAINYARD_PYTHON`, else `python3`, first on PATH in `scripts/test`);
/// panics, with its stderr, unless it succeeded.
pub fn python_script(name: &str, arg: &std::path::Path) -> std::process::Output {
    let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    run_ok(
        Command::new(python)
            .arg(repo_root().join("tests/python").join(name))
            .arg(arg),
        name,
    )
}

/// Runs `cmd` to its end and returns its output; panics, with its stderr,
/// unless it succeeded (`what` names it in the message).
pub fn run_ok(cmd: &mut Command, what: &str) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The last `n` lines of `text` (for failure messages).
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The confined children (`trainyard-confined KIND`: `model`,
/// `inspection`) that the processes `parents` run now.
pub fn sandboxed_children(parents: &[u32], kind: &str) -> Vec<u32> {
    children_where(parents, |args| {
        args.len() >= 2 && args[0].ends_with(b"/trainyard-confined") && args[1] == kind.as_bytes()
    })
}

/// The children of the processes `parents` whose command line (its
/// arguments) `keep` accepts, found by walking `/proc`.
pub fn children_where(parents: &[u32], keep: impl Fn(&[&[u8]]) -> bool) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The parent is the fourth field, after the command in parentheses.
            let ppid: u32 = stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            (parents.contains(&ppid) && keep(&args)).then_some(pid)
        })
        .collect()
}
