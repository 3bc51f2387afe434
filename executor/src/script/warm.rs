//! Warm interpreters for script ranks: why a script job restarts faster
//! than under torchrun.
//!
//! Most of a rank's restart is its interpreter starting and importing
//! PyTorch. So while a rank runs, the executor keeps one spare for the
//! next generation of the same job on the same device: a process confined
//! exactly as the next rank will be (same folders, runtime, limits,
//! identity), started from the Python runtime with a small launcher
//! (`trainyard_confined::protocol::spare::LAUNCHER`) that imports `torch`, `torch.distributed` and what
//! DistributedDataParallel's constructor imports, says it is
//! ready on its stdout and waits on its stdin. When the next generation
//! starts a rank there, the executor takes the spare and writes one line:
//! the rank's whole environment (torchrun's variables for the new world),
//! its argument vector and folder. The launcher replaces its environment,
//! argument vector and module path with those and runs the entrypoint as
//! `__main__` (`runpy`), as `python train.py ARGS` would.
//!
//! A spare is used only when everything that shapes a process at its
//! start matches ([`fingerprint`]: the interpreter, the entrypoint and
//! arguments, the folder, every environment variable but the ones that
//! change per generation, the limits and the confinement); otherwise the
//! rank starts cold, as it would without spares. Spares are started by
//! one thread that lives as long as the executor (a sandboxed child dies
//! with the thread that started it), a moment after the rank they follow
//! started, so that they do not slow its start; a job that leaves the
//! executor takes its spares with it ([`Spares::forget`]), and the
//! executor drops them all when it stops ([`Spares::clear`]).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use trainyard_common::spec::script::TORCHRUN_ENV;
use trainyard_confined::protocol::spare::{LAUNCHER, READY};
use trainyard_sandbox::spawn::{Child, Spec};
use uuid::Uuid;

/// Whether environment variable `name` may change from one generation to
/// the next (and is read only once the script runs), so that a spare
/// started with the last generation's value is still a match: torchrun's
/// variables (the rest of them are the same at every generation anyway),
/// the report file and gloo's interface.
pub fn per_generation(name: &str) -> bool {
    TORCHRUN_ENV.contains(&name) || name == "TRAINYARD_REPORT_FILE" || name == "GLOO_SOCKET_IFNAME"
}

/// How long a rank waits for a spare that is still importing before it
/// starts cold instead.
pub const READY_WAIT: Duration = Duration::from_secs(30);
/// How long after a rank starts its spare is started.
pub const SPARE_DELAY: Duration = Duration::from_millis(1500);

/// Where a spare serves: a job's rank slot (device index) here.
pub type Slot = (Uuid, u32);

/// A hash of everything that shapes a rank's process at its start but
/// the per-generation variables: `parts` are the rank's interpreter,
/// arguments, folder, limits and confinement (as text), `env` its whole
/// environment.
pub fn fingerprint(parts: &[String], env: &[(String, String)]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parts.hash(&mut h);
    for (k, v) in env {
        if !per_generation(k) {
            (k, v).hash(&mut h);
        }
    }
    h.finish()
}

/// A spare process.
struct Spare {
    child: Child,
    stdin: std::process::ChildStdin,
    fingerprint: u64,
}

/// A spare to start: the sandboxed child's spec and its envelope line.
struct Request {
    slot: Slot,
    fingerprint: u64,
    spec: Spec,
    line: String,
    not_before: Instant,
    serial: u64,
}

/// The executor's spares, one per script rank slot at most.
#[derive(Clone)]
pub struct Spares {
    held: Arc<Mutex<HashMap<Slot, Spare>>>,
    /// The newest request per slot (an older one still queued is skipped).
    wanted: Arc<Mutex<HashMap<Slot, u64>>>,
    tx: Arc<Mutex<mpsc::Sender<Request>>>,
    serial: Arc<std::sync::atomic::AtomicU64>,
}

/// The executor's spares (one set per process: the thread that starts them
/// lives as long as the process).
pub fn spares() -> &'static Spares {
    static SPARES: std::sync::OnceLock<Spares> = std::sync::OnceLock::new();
    SPARES.get_or_init(Spares::new)
}

impl std::fmt::Debug for Spares {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Spares({} held)", self.held())
    }
}

impl Default for Spares {
    fn default() -> Spares {
        Spares::new()
    }
}

impl Spares {
    /// No spares yet, and the thread that starts them.
    pub fn new() -> Spares {
        let (tx, rx) = mpsc::channel::<Request>();
        let me = Spares {
            held: Arc::default(),
            wanted: Arc::default(),
            tx: Arc::new(Mutex::new(tx)),
            serial: Arc::default(),
        };
        let (held, wanted) = (me.held.clone(), me.wanted.clone());
        let started = std::thread::Builder::new()
            .name("script-spares".into())
            .spawn(move || {
                for r in rx {
                    let now = Instant::now();
                    if r.not_before > now {
                        std::thread::sleep(r.not_before - now);
                    }
                    let current = |w: &HashMap<Slot, u64>| w.get(&r.slot) == Some(&r.serial);
                    if !wanted.lock().is_ok_and(|w| current(&w)) {
                        continue;
                    }
                    let mut child = match Child::start(&r.spec) {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot start a spare script interpreter");
                            continue;
                        }
                    };
                    let Some(mut stdin) = child.stdin() else {
                        continue;
                    };
                    if stdin.write_all(r.line.as_bytes()).is_err() {
                        continue;
                    }
                    let spare = Spare {
                        child,
                        stdin,
                        fingerprint: r.fingerprint,
                    };
                    // Still wanted (not forgotten or replaced while it
                    // started)? Checked and stored under the `wanted` lock,
                    // which `forget` and `want` take first too.
                    let Ok(w) = wanted.lock() else { continue };
                    if current(&w) {
                        if let Ok(mut h) = held.lock() {
                            h.insert(r.slot, spare);
                        }
                    }
                    drop(w);
                }
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "no spare script interpreters: cannot start their thread");
        }
        me
    }

    /// Asks for a spare for `slot`'s next rank, started from `spec` with
    /// `line` (its envelope) after [`SPARE_DELAY`]; replaces the one held.
    pub fn want(&self, slot: Slot, fingerprint: u64, spec: Spec, line: String) {
        let serial = self
            .serial
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        if let Ok(mut w) = self.wanted.lock() {
            w.insert(slot, serial);
        }
        let old = self.held.lock().ok().and_then(|mut h| h.remove(&slot));
        drop(old);
        if let Ok(tx) = self.tx.lock() {
            let _ = tx.send(Request {
                slot,
                fingerprint,
                spec,
                line,
                not_before: Instant::now() + SPARE_DELAY,
                serial,
            });
        }
    }

    /// The spare of `slot` if it matches `fingerprint` and becomes ready
    /// within [`READY_WAIT`], told to run as `go` (its go line): the
    /// rank's process. `None`: start cold. A wait that `stop` ends (the
    /// generation is over) gives `None` too.
    pub fn take(
        &self,
        slot: Slot,
        fingerprint: u64,
        go: &str,
        stop: &dyn Fn() -> bool,
    ) -> Option<Child> {
        let mut spare = self.held.lock().ok()?.remove(&slot)?;
        if spare.fingerprint != fingerprint {
            return None;
        }
        if !ready(&mut spare.child, READY_WAIT, stop) {
            return None;
        }
        spare.stdin.write_all(go.as_bytes()).ok()?;
        // End of its stdin, as a cold rank's.
        drop(spare.stdin);
        Some(spare.child)
    }

    /// Drops `job`'s spares (it left this executor).
    pub fn forget(&self, job: Uuid) {
        if let Ok(mut w) = self.wanted.lock() {
            w.retain(|s, _| s.0 != job);
        }
        let gone: Vec<Spare> = self
            .held
            .lock()
            .map(|mut h| {
                let keys: Vec<Slot> = h.keys().filter(|s| s.0 == job).copied().collect();
                keys.into_iter().filter_map(|k| h.remove(&k)).collect()
            })
            .unwrap_or_default();
        drop(gone);
    }

    /// Drops every spare (the executor is stopping).
    pub fn clear(&self) {
        if let Ok(mut w) = self.wanted.lock() {
            w.clear();
        }
        let gone: Vec<Spare> = self
            .held
            .lock()
            .map(|mut h| h.drain().map(|(_, s)| s).collect())
            .unwrap_or_default();
        drop(gone);
    }

    /// How many spares are held (for tests and the log).
    pub fn held(&self) -> usize {
        self.held.lock().map(|h| h.len()).unwrap_or(0)
    }
}

/// Waits up to `limit` for `child` to write the ready line on its stdout
/// (read byte by byte: what follows is the script's own output).
fn ready(child: &mut Child, limit: Duration, stop: &dyn Fn() -> bool) -> bool {
    let until = Instant::now() + limit;
    let Some(out) = child.stdout_mut() else {
        return false;
    };
    let mut got = Vec::new();
    while got.len() < READY.len() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stop() {
            return false;
        }
        // A tenth of a second at most, so that `stop` is heard.
        let ms = u16::try_from(left.as_millis().min(100)).unwrap_or(100);
        let mut fds = [nix::poll::PollFd::new(
            out.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
        let mut b = [0u8; 1];
        match out.read(&mut b) {
            Ok(1) => got.push(b[0]),
            _ => return false,
        }
    }
    got == READY
}

/// The spare's interpreter arguments: the launcher, then the rank's own
/// (so its command line names the entrypoint, as a cold rank's does).
pub fn spare_args(args: &[String]) -> Vec<String> {
    ["-c".to_owned(), LAUNCHER.to_owned()]
        .into_iter()
        .chain(args.iter().cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn per_generation_variables_do_not_change_the_fingerprint_and_others_do() {
        let parts = vec!["python".to_owned(), "train.py".to_owned()];
        let a = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("HOME", "/w"),
            ("K", "1"),
        ]);
        let b = env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "3"),
            ("HOME", "/w"),
            ("K", "1"),
        ]);
        assert_eq!(fingerprint(&parts, &a), fingerprint(&parts, &b));
        let c = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("HOME", "/w"),
            ("K", "2"),
        ]);
        assert_ne!(fingerprint(&parts, &a), fingerprint(&parts, &c));
        let other = vec!["python".to_owned(), "eval.py".to_owned()];
        assert_ne!(fingerprint(&parts, &a), fingerprint(&other, &a));
    }

    /// A confined spare (`trainyard-confined` beside the test's, the
    /// default Python runtime) runs a script as `python train.py --x` would:
    /// the go line's environment (not the one it started with), its
    /// arguments, `__main__`, the script's folder first on the module path,
    /// and still confined. A spare for another fingerprint is not used.
    #[test]
    fn a_spare_becomes_the_rank_with_its_environment_arguments_and_folder() {
        use crate::sandbox::Sandbox;
        use trainyard_confined::protocol::{spare::go_line, ScriptTask};
        let sandbox = Sandbox::for_tests();
        let spares = Spares::new();
        let job = Uuid::new_v4();
        let ws = sandbox.job_workspace(job, "slot-0").unwrap();
        let code = ws.inputs().join("code");
        std::fs::create_dir_all(&code).unwrap();
        std::fs::write(
            code.join("train.py"),
            "import os, sys\n\
             here = os.path.dirname(os.path.abspath(__file__))\n\
             print(os.environ['RANK'], os.environ.get('OLD', '-'), sys.argv[1:], __name__, \
             os.getcwd() == here, sys.path[0] == here)\n\
             try:\n    open('/etc/passwd').read(); print('read')\n\
             except OSError:\n    print('denied')\n",
        )
        .unwrap();
        let python = sandbox.python(None).unwrap().to_owned();
        let runtime = super::super::runtime_folders(&python).unwrap();
        let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let task = ScriptTask {
            program: python,
            args: vec!["train.py".into(), "--x".into()],
            env: env(&[("RANK", "0"), ("OLD", "1"), ("PATH", "/usr/bin:/bin")]),
            cwd: code.clone(),
        };
        let spare = ScriptTask {
            args: spare_args(&task.args),
            ..task.clone()
        };
        // The spare lives in its slot's network namespace, as a rank would.
        let netns = trainyard_sandbox::netns::Netns::create("warm-test", None).unwrap();
        let start = |fp: u64| {
            let (line, spec) = sandbox
                .script_launch(
                    &ws,
                    &spare,
                    trainyard_sandbox::Limits::default(),
                    runtime.clone(),
                    Vec::new(),
                    tch::Device::Cpu,
                    Some(netns.path().to_owned()),
                )
                .unwrap();
            spares.want((job, 0), fp, spec, line);
            let until = Instant::now() + Duration::from_secs(30);
            while spares.held() == 0 && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
            assert_eq!(spares.held(), 1, "no spare started");
        };
        let go = go_line(
            &env(&[("RANK", "3"), ("PATH", "/usr/bin:/bin")]),
            &task.args,
            &code,
        );

        start(7);
        assert!(spares.take((job, 0), 8, &go, &|| false).is_none());
        assert_eq!(spares.held(), 0, "a spare that did not match is dropped");

        start(7);
        let mut child = spares.take((job, 0), 7, &go, &|| false).expect("the spare");
        let mut out = String::new();
        child.stdout().unwrap().read_to_string(&mut out).unwrap();
        let ending = child.wait(Some(Duration::from_secs(60)), &|| false);
        assert_eq!(ending, trainyard_sandbox::Ending::Exited(0), "{out}");
        assert_eq!(out, "3 - ['--x'] __main__ True True\ndenied\n");

        start(7);
        spares.forget(job);
        assert_eq!(spares.held(), 0);
        sandbox.forget_job(job);
    }
}
