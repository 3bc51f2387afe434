//! The Slurm provisioner: executors as Slurm batch jobs, one executor per
//! allocation.
//!
//! Each start is one `sbatch --parsable` with a generated script on its
//! standard input that `exec`s `trainyard-executor` (so the executor is the
//! batch step itself and receives Slurm's signals). The job's name is the
//! executor's name and its comment the provisioner's identity, so `squeue`
//! tells Trainyard's jobs apart from everyone else's; partition, account,
//! QoS, time limit, GRES, CPUs and memory come from [`SlurmConfig`], and
//! `--signal=B:USR1@N` asks Slurm to warn the executor `N` seconds before
//! the time limit (the executor drains with a checkpoint on SIGUSR1, as on
//! SIGTERM). The join token reaches the job through the environment
//! (`--export` names the variables; values never appear on a command line).
//!
//! The fleet treats a submitted job as pending capacity until its executor
//! registers, so a job waiting in Slurm's queue is never submitted twice.
//! Releasing is `scancel --full --signal=TERM` (the executor drains and
//! leaves, and the Slurm job ends with it); killing is a plain `scancel`.
//! Which jobs ended is read with `squeue --states=all` and a fixed
//! `--format` (never Slurm's human-formatted output), at most once every
//! [`POLL_EVERY`]; a job Slurm no longer lists, or lists in a final state
//! (`COMPLETED`, `CANCELLED`, `NODE_FAIL`, `TIMEOUT`, …), is reported with
//! that state. A requeued job stays pending and its executor registers
//! again under the same name. After a restart the fleet adopts a recorded
//! job only when `squeue` still lists it, unfinished, with the recorded
//! name and this provisioner's comment.

use crate::fleet::Provisioner;
use crate::plan::DeviceSlot;
use crate::provision::Template;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use trainyard_common::spec::Device;

/// How often `squeue` is asked which jobs ended.
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// Settings of the Slurm provisioner.
#[derive(Debug, Clone)]
pub struct SlurmConfig {
    /// The `trainyard-executor` binary, as the nodes see it.
    pub executor_bin: PathBuf,
    /// Base URL of the API, as the nodes reach it.
    pub api_url: String,
    /// The cluster join token.
    pub join_token: String,
    /// Folder for the executors' logs and caches (on a file system the
    /// nodes share with this machine, to read the logs here).
    pub dir: PathBuf,
    /// `--partition`.
    pub partition: Option<String>,
    /// `--account`.
    pub account: Option<String>,
    /// `--qos`.
    pub qos: Option<String>,
    /// `--time` (Slurm's syntax: `minutes`, `HH:MM:SS`, `D-HH`, …).
    pub time_limit: Option<String>,
    /// `--gres` (`gpu:2`); its GPU count is what each executor offers.
    pub gres: Option<String>,
    /// `--cpus-per-task`, also the executor's libtorch threads.
    pub cpus: u32,
    /// `--mem`, in MiB, also the RAM the executor offers.
    pub memory_mb: u64,
    /// Memory each GPU offers, in MiB (libtorch does not report it).
    pub gpu_memory_mb: u64,
    /// Seconds before the time limit that Slurm sends SIGUSR1.
    pub signal_secs: u32,
    /// The executor's data-plane listen address; with an unspecified IP
    /// (`0.0.0.0:0`) the executor advertises the node's host name.
    pub data_listen: String,
    /// The comment every job carries: this provisioner's identity.
    pub comment: String,
    /// More `sbatch` arguments, verbatim.
    pub extra_args: Vec<String>,
    /// Variables the executors get, besides the join token.
    pub env: Vec<(String, String)>,
    /// Variables of this process passed through to the executors when set.
    pub pass_env: Vec<String>,
}

impl SlurmConfig {
    /// GPUs per executor: the count of a `gpu[:type]:N` GRES (1 without a
    /// count), 0 without one.
    pub fn gpus(&self) -> u32 {
        let Some(gres) = &self.gres else { return 0 };
        gres.split(',')
            .filter(|g| g.starts_with("gpu"))
            .map(|g| {
                let parts: Vec<&str> = g.split(':').collect();
                match parts.as_slice() {
                    [_] => 1,
                    [.., last] => last.parse().unwrap_or(1),
                    [] => 0,
                }
            })
            .sum()
    }

    /// The `sbatch` arguments that start executor `name`.
    pub fn sbatch_args(&self, name: &str) -> Vec<String> {
        let mut a = vec![
            "--parsable".to_owned(),
            format!("--job-name={name}"),
            format!("--comment={}", self.comment),
            format!("--output={}", self.log_path(name).display()),
            "--open-mode=append".to_owned(),
            "--nodes=1".to_owned(),
            "--ntasks=1".to_owned(),
            format!("--cpus-per-task={}", self.cpus.max(1)),
            format!("--mem={}M", self.memory_mb),
            format!("--signal=B:USR1@{}", self.signal_secs),
            format!("--export={}", self.exported().join(",")),
        ];
        for (flag, v) in [
            ("--partition", &self.partition),
            ("--account", &self.account),
            ("--qos", &self.qos),
            ("--time", &self.time_limit),
            ("--gres", &self.gres),
        ] {
            if let Some(v) = v {
                a.push(format!("{flag}={v}"));
            }
        }
        a.extend(self.extra_args.iter().cloned());
        a
    }

    /// The batch script that runs executor `name`.
    pub fn script(&self, name: &str) -> String {
        let advertise =
            if self.data_listen.starts_with("0.0.0.0:") || self.data_listen.starts_with("[::]:") {
                " --advertise-host \"$(hostname)\""
            } else {
                ""
            };
        format!(
            "#!/bin/sh\n# A Trainyard executor started by the Slurm provisioner.\nexec {} --api {} --name {} --data-listen {}{advertise} --ram-mb {} --torch-threads {} --label \"host=${{SLURMD_NODENAME:-slurm}}\" --label trainyard.provisioner=slurm --label \"slurm.job=${{SLURM_JOB_ID:-}}\" --cache-dir {}\n",
            quote(&self.executor_bin.display().to_string()),
            quote(&self.api_url),
            quote(name),
            quote(&self.data_listen),
            self.memory_mb,
            self.cpus.max(1),
            quote(&self.dir.join(format!("{name}.cache")).display().to_string()),
        )
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    /// The names `--export` lists: the join token, the configured
    /// variables and those of [`SlurmConfig::pass_env`] that are set.
    fn exported(&self) -> Vec<String> {
        let mut names = vec!["TRAINYARD_JOIN_TOKEN".to_owned()];
        names.extend(self.env.iter().map(|(k, _)| k.clone()));
        names.extend(
            self.pass_env
                .iter()
                .filter(|k| std::env::var_os(k).is_some())
                .cloned(),
        );
        names.dedup();
        names
    }
}

/// `s` as one word of a POSIX shell.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// One line of `squeue --format=%i|%T|%j|%r|%k`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct QueueRow {
    id: u32,
    state: String,
    name: String,
    reason: String,
    comment: String,
}

const FORMAT: &str = "%i|%T|%j|%r|%k";

fn parse_rows(out: &str) -> Vec<QueueRow> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.splitn(5, '|');
            Some(QueueRow {
                id: f.next()?.trim().parse().ok()?,
                state: f.next()?.trim().to_owned(),
                name: f.next()?.trim().to_owned(),
                reason: f.next()?.trim().to_owned(),
                comment: f.next()?.trim().to_owned(),
            })
        })
        .collect()
}

/// Whether a Slurm job state is final (the job's processes are gone or
/// going for good; a requeue shows as `PENDING` again).
fn finished(state: &str) -> bool {
    matches!(
        state,
        "COMPLETED"
            | "CANCELLED"
            | "FAILED"
            | "TIMEOUT"
            | "NODE_FAIL"
            | "PREEMPTED"
            | "OUT_OF_MEMORY"
            | "BOOT_FAIL"
            | "DEADLINE"
            | "REVOKED"
    )
}

/// Starts executors as Slurm batch jobs.
pub struct SlurmProvisioner {
    config: SlurmConfig,
    jobs: BTreeMap<String, u32>,
    /// Jobs the last `squeue` showed pending (queued, or requeued).
    pending: std::collections::BTreeSet<String>,
    polled: Option<Instant>,
}

impl SlurmProvisioner {
    /// A provisioner with `config`.
    pub fn new(config: SlurmConfig) -> SlurmProvisioner {
        SlurmProvisioner {
            config,
            jobs: BTreeMap::new(),
            pending: Default::default(),
            polled: None,
        }
    }

    /// The Slurm job id of executor `name`.
    pub fn job_of(&self, name: &str) -> Option<u32> {
        self.jobs.get(name).copied()
    }

    fn job(&self, name: &str) -> std::io::Result<u32> {
        self.job_of(name)
            .ok_or_else(|| std::io::Error::other(format!("{name} is no Slurm job of this server")))
    }

    fn scancel(&self, args: &[&str], id: u32) -> std::io::Result<()> {
        let out = Command::new("scancel")
            .args(args)
            .arg(id.to_string())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| std::io::Error::new(e.kind(), format!("running scancel: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "scancel {} {id}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// `squeue` rows of the jobs named `names`, finished ones included.
    fn squeue(&self, names: &[&str]) -> std::io::Result<Vec<QueueRow>> {
        let out = Command::new("squeue")
            .arg("--noheader")
            .arg("--states=all")
            .arg(format!("--format={FORMAT}"))
            .arg(format!("--name={}", names.join(",")))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| std::io::Error::new(e.kind(), format!("running squeue: {e}")))?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "squeue: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(parse_rows(&String::from_utf8_lossy(&out.stdout)))
    }
}

impl Provisioner for SlurmProvisioner {
    fn kind(&self) -> &'static str {
        "slurm"
    }

    fn template(&self) -> Template {
        let ram = self.config.memory_mb << 20;
        let mut devices = vec![DeviceSlot {
            kind: Device::Cpu,
            index: 0,
            memory_bytes: ram,
        }];
        for i in 0..self.config.gpus() {
            devices.push(DeviceSlot {
                kind: Device::Cuda,
                index: i,
                memory_bytes: self.config.gpu_memory_mb << 20,
            });
        }
        // The node is Slurm's choice: no host is promised.
        Template {
            host: None,
            ram_bytes: ram,
            devices,
        }
    }

    fn start(&mut self, name: &str) -> std::io::Result<Option<u32>> {
        std::fs::create_dir_all(&self.config.dir)?;
        let mut child = Command::new("sbatch")
            .args(self.config.sbatch_args(name))
            .env("TRAINYARD_JOIN_TOKEN", &self.config.join_token)
            .envs(self.config.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| std::io::Error::new(e.kind(), format!("running sbatch: {e}")))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(self.config.script(name).as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "sbatch refused the job ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        // `--parsable` prints `id` or `id;cluster`.
        let stdout = String::from_utf8_lossy(&out.stdout);
        let id: u32 = stdout
            .trim()
            .split(';')
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                std::io::Error::other(format!("sbatch printed no job id: {:?}", stdout.trim()))
            })?;
        tracing::info!(executor = name, slurm_job = id, "slurm: submitted");
        self.jobs.insert(name.to_owned(), id);
        Ok(Some(id))
    }

    fn stop(&mut self, name: &str) -> std::io::Result<()> {
        // `--full` reaches the batch step, which is the executor itself.
        let id = self.job(name)?;
        self.scancel(&["--full", "--signal=TERM"], id)
    }

    fn kill(&mut self, name: &str) -> std::io::Result<()> {
        let id = self.job(name)?;
        self.scancel(&[], id)
    }

    fn exited(&mut self) -> Vec<(String, String)> {
        if self.jobs.is_empty() || self.polled.is_some_and(|t| t.elapsed() < POLL_EVERY) {
            return Vec::new();
        }
        self.polled = Some(Instant::now());
        let names: Vec<&str> = self.jobs.keys().map(String::as_str).collect();
        let rows = match self.squeue(&names) {
            Ok(rows) => rows,
            Err(e) => {
                // The controller is unreachable: nothing is known to have
                // ended; ask again next time.
                tracing::warn!(error = %e, "slurm: cannot read the queue");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        self.pending.clear();
        for (name, id) in &self.jobs {
            if rows.iter().any(|r| r.id == *id && r.state == "PENDING") {
                self.pending.insert(name.clone());
            }
            match rows.iter().find(|r| r.id == *id) {
                Some(r) if finished(&r.state) => {
                    let reason = if r.reason.is_empty() || r.reason == "None" {
                        String::new()
                    } else {
                        format!(", {}", r.reason)
                    };
                    out.push((name.clone(), format!("Slurm job {id} {}{reason}", r.state)));
                }
                Some(_) => {}
                None => out.push((
                    name.clone(),
                    format!("Slurm job {id} is no longer listed by squeue"),
                )),
            }
        }
        for (name, _) in &out {
            self.jobs.remove(name);
            let _ = std::fs::remove_dir_all(self.config.dir.join(format!("{name}.cache")));
        }
        out
    }

    fn handle(&self, name: &str) -> Option<String> {
        self.job_of(name).map(|id| format!("Slurm job {id}"))
    }

    fn waiting(&self, name: &str) -> bool {
        self.pending.contains(name)
    }

    fn adopt(&mut self, name: &str, pid: Option<u32>) -> bool {
        let Some(id) = pid else { return false };
        let rows = match self.squeue(&[name]) {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, executor = name, "slurm: cannot read the queue to adopt");
                return false;
            }
        };
        let ours = rows.iter().any(|r| {
            r.id == id && r.name == name && r.comment == self.config.comment && !finished(&r.state)
        });
        if ours {
            self.jobs.insert(name.to_owned(), id);
        }
        ours
    }

    fn log_of(&self, name: &str) -> String {
        let log = self.config.log_path(name).display().to_string();
        match self.job_of(name) {
            Some(id) => format!("{log}, Slurm job {id}"),
            None => log,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> SlurmConfig {
        SlurmConfig {
            executor_bin: PathBuf::from("/opt/ty/trainyard-executor"),
            api_url: "http://10.0.0.1:8080".into(),
            join_token: "secret".into(),
            dir: PathBuf::from("/shared/ty"),
            partition: Some("gpu".into()),
            account: None,
            qos: Some("normal".into()),
            time_limit: Some("2:00:00".into()),
            gres: Some("gpu:a100:2".into()),
            cpus: 8,
            memory_mb: 32768,
            gpu_memory_mb: 40960,
            signal_secs: 300,
            data_listen: "0.0.0.0:0".into(),
            comment: "trainyard".into(),
            extra_args: vec!["--exclusive".into()],
            env: vec![("TRAINYARD_OBJECT_STORE_OPTIONS".into(), "a=b".into())],
            pass_env: vec!["TRAINYARD_TEST_SURELY_UNSET_VARIABLE".into()],
        }
    }

    #[test]
    fn the_job_carries_the_settings_and_never_the_token() {
        let c = config();
        let args = c.sbatch_args("slurm-1234abcd");
        for want in [
            "--parsable",
            "--job-name=slurm-1234abcd",
            "--comment=trainyard",
            "--cpus-per-task=8",
            "--mem=32768M",
            "--signal=B:USR1@300",
            "--partition=gpu",
            "--qos=normal",
            "--time=2:00:00",
            "--gres=gpu:a100:2",
            "--export=TRAINYARD_JOIN_TOKEN,TRAINYARD_OBJECT_STORE_OPTIONS",
            "--exclusive",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} missing: {args:?}");
        }
        assert!(!args.iter().any(|a| a.starts_with("--account")));
        let script = c.script("slurm-1234abcd");
        assert!(!args.iter().any(|a| a.contains("secret")) && !script.contains("secret"));
        assert!(script.contains("exec '/opt/ty/trainyard-executor' --api 'http://10.0.0.1:8080' --name 'slurm-1234abcd'"), "{script}");
        assert!(script.contains("--advertise-host"), "{script}");
        assert_eq!(c.gpus(), 2);
        let t = SlurmProvisioner::new(c).template();
        assert_eq!(t.devices.len(), 3);
        assert_eq!(t.ram_bytes, 32768 << 20);
    }

    #[test]
    fn a_quoted_word_survives_the_shell() {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s {}", quote("it's $HOME `x`")))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "it's $HOME `x`");
    }

    #[test]
    fn queue_rows_are_read_by_their_fixed_fields() {
        let rows = parse_rows(
            "12|RUNNING|slurm-a|None|trainyard\n13|NODE_FAIL|slurm-b|NodeDown|trainyard|x\ngarbage\n",
        );
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].comment, "trainyard|x");
        assert!(!finished(&rows[0].state) && finished(&rows[1].state));
        assert!(!finished("PENDING") && !finished("COMPLETING"));
    }
}
