//! The local provisioner: executors as `trainyard-executor` processes on
//! this machine, within a CPU and memory budget.
//!
//! Each executor it starts gets `executor_cpus` (its libtorch threads,
//! rounded down, at least one) and `executor_memory_mb` of RAM to offer,
//! the API's address and join token (the token through the environment,
//! never the command line), a `host` label, the label
//! `trainyard.provisioner=local`, a cache folder and a log file of its own
//! under `<dir>`. Processes run in their own process group, so a Ctrl-C in
//! the terminal reaches the server, which then releases them in order
//! (drain, leave) while it still answers. Releasing is SIGTERM (the
//! executor drains: its roles move, a checkpoint is written); the fleet
//! kills with SIGKILL what does not exit within its stop timeout.
//!
//! A process found again after a restart of the server is adopted only
//! when `/proc/<pid>/cmdline` is a `trainyard-executor` with the recorded
//! `--name`, so a recycled pid is never signalled.

use crate::fleet::Provisioner;
use crate::plan::DeviceSlot;
use crate::provision::Template;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use trainyard_common::spec::Device;

/// Settings of the local provisioner.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The `trainyard-executor` binary.
    pub executor_bin: PathBuf,
    /// Base URL of the API the executors register with.
    pub api_url: String,
    /// The cluster join token.
    pub join_token: String,
    /// Folder for the executors' logs and caches.
    pub dir: PathBuf,
    /// CPU cores each executor gets.
    pub executor_cpus: f64,
    /// RAM each executor offers, in MiB.
    pub executor_memory_mb: u64,
    /// The `host` label of the executors.
    pub host_label: String,
    /// Extra environment of the executors (object-store options).
    pub env: Vec<(String, String)>,
}

impl LocalConfig {
    /// libtorch threads per executor.
    pub fn torch_threads(&self) -> u32 {
        (self.executor_cpus.floor() as u32).max(1)
    }

    /// How many executors a budget of `cpus` cores and `memory_mb` MiB
    /// holds.
    pub fn fits(&self, cpus: f64, memory_mb: u64) -> u32 {
        let by_cpu = if self.executor_cpus > 0.0 {
            (cpus / self.executor_cpus + 1e-9).floor() as u32
        } else {
            0
        };
        let by_memory = memory_mb
            .checked_div(self.executor_memory_mb)
            .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX));
        by_cpu.min(by_memory)
    }
}

enum Handle {
    Child(Child),
    Adopted(u32),
}

/// Starts and stops executor processes on this machine.
pub struct LocalProvisioner {
    config: LocalConfig,
    running: BTreeMap<String, Handle>,
}

impl LocalProvisioner {
    /// A provisioner with `config`.
    pub fn new(config: LocalConfig) -> LocalProvisioner {
        LocalProvisioner {
            config,
            running: BTreeMap::new(),
        }
    }

    fn pid_of(&self, name: &str) -> Option<u32> {
        match self.running.get(name)? {
            Handle::Child(c) => Some(c.id()),
            Handle::Adopted(pid) => Some(*pid),
        }
    }

    fn signal(&self, name: &str, signal: Signal) -> std::io::Result<()> {
        let pid = self
            .pid_of(name)
            .ok_or_else(|| std::io::Error::other(format!("{name} is not running here")))?;
        let pid = i32::try_from(pid).map_err(std::io::Error::other)?;
        kill(Pid::from_raw(pid), signal).map_err(std::io::Error::from)
    }

    fn cache_dir(&self, name: &str) -> PathBuf {
        self.config.dir.join(format!("{name}.cache"))
    }
}

impl Provisioner for LocalProvisioner {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn template(&self) -> Template {
        let ram = self.config.executor_memory_mb << 20;
        Template {
            host: Some(self.config.host_label.clone()),
            ram_bytes: ram,
            devices: vec![DeviceSlot {
                kind: Device::Cpu,
                index: 0,
                memory_bytes: ram,
            }],
        }
    }

    fn start(&mut self, name: &str) -> std::io::Result<Option<u32>> {
        std::fs::create_dir_all(&self.config.dir)?;
        let log = std::fs::File::create(self.config.dir.join(format!("{name}.log")))?;
        let mut cmd = Command::new(&self.config.executor_bin);
        cmd.arg("--api")
            .arg(&self.config.api_url)
            .arg("--name")
            .arg(name)
            .arg("--data-listen")
            .arg("127.0.0.1:0")
            .arg("--ram-mb")
            .arg(self.config.executor_memory_mb.to_string())
            .arg("--torch-threads")
            .arg(self.config.torch_threads().to_string())
            .arg("--label")
            .arg(format!("host={}", self.config.host_label))
            .arg("--label")
            .arg("trainyard.provisioner=local")
            .arg("--cache-dir")
            .arg(self.cache_dir(name))
            // An executor needs no database: the API's URL (its password)
            // stays with the API.
            .env_remove("DATABASE_URL")
            .env("TRAINYARD_JOIN_TOKEN", &self.config.join_token)
            .envs(self.config.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        let child = cmd.spawn().map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("{}: {e}", self.config.executor_bin.display()),
            )
        })?;
        let pid = child.id();
        self.running.insert(name.to_owned(), Handle::Child(child));
        Ok(Some(pid))
    }

    fn stop(&mut self, name: &str) -> std::io::Result<()> {
        self.signal(name, Signal::SIGTERM)
    }

    fn kill(&mut self, name: &str) -> std::io::Result<()> {
        self.signal(name, Signal::SIGKILL)
    }

    fn exited(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (name, handle) in &mut self.running {
            let how = match handle {
                Handle::Child(c) => match c.try_wait() {
                    Ok(Some(status)) => Some(match (status.code(), status.signal()) {
                        (Some(code), _) => format!("exit status {code}"),
                        (None, Some(sig)) => format!("signal {sig}"),
                        _ => status.to_string(),
                    }),
                    Ok(None) => None,
                    Err(e) => Some(format!("cannot wait for it: {e}")),
                },
                Handle::Adopted(pid) => {
                    (!alive(*pid)).then(|| "exit status unknown (adopted process)".to_owned())
                }
            };
            if let Some(how) = how {
                out.push((name.clone(), how));
            }
        }
        for (name, _) in &out {
            self.running.remove(name);
            let _ = std::fs::remove_dir_all(self.cache_dir(name));
        }
        out
    }

    fn adopt(&mut self, name: &str, pid: Option<u32>) -> bool {
        let Some(pid) = pid else { return false };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            return false;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_executor = args
            .first()
            .is_some_and(|a| a.ends_with(b"trainyard-executor"));
        let has_name = args
            .windows(2)
            .any(|w| w[0] == b"--name" && w[1] == name.as_bytes());
        if is_executor && has_name {
            self.running.insert(name.to_owned(), Handle::Adopted(pid));
            true
        } else {
            false
        }
    }

    fn log_of(&self, name: &str) -> String {
        self.config
            .dir
            .join(format!("{name}.log"))
            .display()
            .to_string()
    }
}

/// Whether `pid` runs: it exists and is not a zombie (an adopted process
/// is not this process's child, so its exit is reaped elsewhere, if at
/// all).
fn alive(pid: u32) -> bool {
    let exists = i32::try_from(pid)
        .ok()
        .is_some_and(|p| kill(Pid::from_raw(p), None).is_ok());
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        // The state follows the parenthesised command name.
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    });
    exists && !zombie
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(cpus: f64, mb: u64) -> LocalConfig {
        LocalConfig {
            executor_bin: PathBuf::from("/bin/true"),
            api_url: "http://127.0.0.1:1".into(),
            join_token: "t".into(),
            dir: std::env::temp_dir(),
            executor_cpus: cpus,
            executor_memory_mb: mb,
            host_label: "local".into(),
            env: Vec::new(),
        }
    }

    #[test]
    fn the_budget_bounds_the_executor_count() {
        assert_eq!(config(1.0, 1024).fits(2.0, 8192), 2);
        assert_eq!(config(0.5, 1024).fits(2.0, 8192), 4);
        assert_eq!(config(0.5, 2048).fits(2.0, 5000), 2);
        assert_eq!(config(4.0, 1024).fits(2.0, 8192), 0);
        assert_eq!(config(0.5, 1024).torch_threads(), 1);
        assert_eq!(config(3.7, 1024).torch_threads(), 3);
    }

    #[test]
    fn a_process_that_is_not_an_executor_is_never_adopted() {
        let mut p = LocalProvisioner::new(config(1.0, 1024));
        // This test process is not `trainyard-executor --name x`.
        assert!(!p.adopt("x", Some(std::process::id())));
        assert!(!p.adopt("x", None));
        assert!(p.running.is_empty());
    }

    #[test]
    fn a_started_process_is_reaped_with_its_status() {
        let mut c = config(1.0, 1024);
        c.executor_bin = PathBuf::from("/bin/false");
        c.dir = std::env::temp_dir().join(format!("ty-local-{}", std::process::id()));
        let mut p = LocalProvisioner::new(c.clone());
        assert!(p.start("e1").unwrap().is_some());
        let mut exits = Vec::new();
        for _ in 0..100 {
            exits = p.exited();
            if !exits.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(exits, vec![("e1".to_string(), "exit status 1".to_string())]);
        assert!(p.stop("e1").is_err(), "a reaped executor is not signalled");
        let _ = std::fs::remove_dir_all(&c.dir);
    }
}
