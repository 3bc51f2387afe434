//! `script-bench`: how long a script job loses when one of its ranks is
//! SIGKILLed, beside torchrun doing the same with the same script in the
//! same run.
//!
//! The script is `bench/restart_script.py`: plain PyTorch DDP over gloo,
//! two ranks, a checkpoint every 20 steps, one line per step with the
//! wall-clock time, the process id and `TORCHELASTIC_RESTART_COUNT`.
//! Each run waits until both ranks have made 30 steps, SIGKILLs rank 1's
//! process and measures the time from the kill to the first step line of
//! restart 1 (the clock is this machine's, for the benchmark and the
//! script alike, so log delivery does not count).
//!
//! * **Baseline:** `torchrun --nnodes 1 --nproc-per-node 2 --max-restarts 3
//!   --rdzv-backend c10d` (its monitor notices the dead rank, stops the
//!   other, meets at the next rendezvous round and starts both again).
//! * **Trainyard:** the release `trainyard serve` (production heartbeats)
//!   and two `trainyard-executor`s; the job is `{"script": {"code":
//!   "file://…/restart_script.py", "max_restarts": 3}, "workers": {"min":
//!   2, "max": 2}}`. The killed rank's executor reports the crash, the
//!   API starts the next generation and each executor starts its rank
//!   again in its sandbox, with the last checkpoint put back in place, in
//!   the spare interpreter it started beforehand (PyTorch imported; see
//!   `trainyard_executor::script::warm`).
//!
//! Each side runs 3 times (short) or 5 (full); the figure is the median,
//! held to ≤ 0.5× torchrun's. A torchrun run none of whose restarts makes
//! a step (torchrun 2.11 with c10d sometimes has every new worker's gloo
//! dial a peer address of the attempt before) is retried, up to 3× the
//! runs, and counted in the baseline's name.
//!
//! **Throughput with and without the network layer.** The same script
//! (`--sleep 0 --batch 128`, [`STEPS`] steps) as a 2- and a 3-rank job, on
//! three executors started with `--sandbox on` (each rank in its network
//! namespace, the job's hub between them on this host;
//! `trainyard_executor::script::relay`) and, as the baseline, on three
//! started with `--sandbox off` (the ranks on the host's network, no layer
//! at all), run in turn. samples/s is rank 0's steps from step [`WARMUP`]
//! to the last, times the batch and the world, by the script's own clock;
//! the figure is the median of the runs, held to ≥ 0.95× the baseline.
//!
//! `script-bench [--short]`; the executor needs libtorch on its library
//! path (`source scripts/common.sh && torch_env`) and `TRAINYARD_PYTHON`
//! names the torch venv's Python (torchrun is the one beside it).
//! `SCRIPT_BENCH_TRACE=1` prints each Trainyard run's timeline (the kill,
//! the crash report, each rank's start and its first steps).

use anyhow::{bail, Context};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};
use trainyard_bench::figure::{Better, Figure, Target};
use trainyard_bench::server::Server;
use trainyard_client::Client;
use trainyard_e2e::{free_port, kill9, repo_root, start_executor, Proc};
use uuid::Uuid;

const JOIN: &str = "script-bench-join";
/// Steps both ranks make before the kill (a checkpoint was written at 20).
const BEFORE_KILL: u64 = 30;
/// The target: Trainyard's restart ≤ half of torchrun's.
const TARGET: f64 = 0.5;
/// Steps of a throughput run.
const STEPS: u64 = 400;
/// Steps of a throughput run left out of its rate (start, first buckets).
const WARMUP: u64 = 100;
/// Samples per step of a throughput run.
const BATCH: u64 = 128;
/// The network layer's target: at least 0.95× the samples/s without it.
const THROUGHPUT_TARGET: f64 = 0.95;

/// One step line of the script.
#[derive(Debug, Clone, Copy)]
struct Step {
    step: u64,
    rank: u32,
    restart: u32,
    pid: u32,
    t: f64,
}

/// Every step line in `line` (two ranks writing to one pipe may share a
/// line).
/// Every step record in `line`: two ranks writing to one pipe (torchrun's)
/// can glue one's record to the other's before its newline
/// (`… t 1.5step 100 rank 1 …`), so each record ends where the next begins.
fn parse_all(line: &str) -> Vec<Step> {
    let starts: Vec<usize> = line.match_indices("step ").map(|(at, _)| at).collect();
    starts
        .iter()
        .enumerate()
        .filter_map(|(i, &at)| parse(&line[at..starts.get(i + 1).copied().unwrap_or(line.len())]))
        .collect()
}

fn parse(line: &str) -> Option<Step> {
    // `step N rank R restart C pid P t T`, possibly behind a `[rank R] `.
    let at = line.find("step ")?;
    let f: Vec<&str> = line[at..].split_whitespace().take(10).collect();
    if f.len() < 10 || f[2] != "rank" || f[4] != "restart" || f[6] != "pid" || f[8] != "t" {
        return None;
    }
    Some(Step {
        step: f[1].parse().ok()?,
        rank: f[3].parse().ok()?,
        restart: f[5].parse().ok()?,
        pid: f[7].parse().ok()?,
        t: f[9].parse().ok()?,
    })
}

/// Whether to print each run's timeline (`SCRIPT_BENCH_TRACE=1`).
fn trace() -> bool {
    std::env::var_os("SCRIPT_BENCH_TRACE").is_some()
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn script() -> PathBuf {
    repo_root().join("bench/restart_script.py")
}

fn python() -> String {
    std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Kills rank 1 once both ranks made [`BEFORE_KILL`] steps at restart 0
/// and returns kill → the first step of restart 1, reading steps with
/// `steps` (all seen so far) until `limit`.
fn kill_and_time(
    mut steps: impl FnMut() -> anyhow::Result<Vec<Step>>,
    limit: Duration,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let victim = loop {
        let s = steps()?;
        let at = |r: u32| {
            s.iter()
                .filter(|x| x.rank == r && x.restart == 0)
                .map(|x| x.step)
                .max()
                .unwrap_or(0)
        };
        if at(0) >= BEFORE_KILL && at(1) >= BEFORE_KILL {
            break s.iter().rev().find(|x| x.rank == 1).map(|x| x.pid);
        }
        if start.elapsed() > limit {
            bail!(
                "the ranks did not reach step {BEFORE_KILL}: {} lines",
                s.len()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    .context("no rank 1")?;
    let killed = now();
    kill9(victim);
    if trace() {
        eprintln!("killed rank 1 (pid {victim}) at {killed:.3}");
    }
    let start = Instant::now();
    loop {
        if let Some(first) = steps()?
            .iter()
            .filter(|x| x.restart >= 1)
            .map(|x| x.t)
            .min_by(f64::total_cmp)
        {
            return Ok(first - killed);
        }
        if start.elapsed() > limit {
            bail!("no step of a restarted generation {limit:?} after the kill");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A folder of its own under `work` and the venv's `torchrun` to run there.
fn torchrun_command(work: &Path) -> anyhow::Result<(PathBuf, Command)> {
    let dir = work.join(format!("torchrun-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    let torchrun = Path::new(&python())
        .parent()
        .context("no venv folder")?
        .join("torchrun");
    let mut cmd = Command::new(torchrun);
    cmd.current_dir(&dir)
        .env("OMP_NUM_THREADS", "1")
        .stdin(Stdio::null());
    Ok((dir, cmd))
}

/// torchrun's time, one run.
fn torchrun(work: &Path) -> anyhow::Result<f64> {
    let (dir, mut cmd) = torchrun_command(work)?;
    cmd.args([
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "3",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        &format!("127.0.0.1:{}", free_port()?),
    ])
    .arg(script());
    // Its output (the ranks' and its own) is collected by `Proc`.
    let mut run = Proc::spawn(cmd)?;
    let took = kill_and_time(
        || {
            let steps: Vec<Step> = run.output().lines().flat_map(parse_all).collect();
            if !steps.iter().any(|s| s.restart >= 1) && !run.running() {
                bail!("torchrun exited: none of its restarts made a step");
            }
            Ok(steps)
        },
        Duration::from_secs(90),
    );
    if let Err(e) = &took {
        let out = run.output();
        let tail: Vec<&str> = out
            .lines()
            .filter(|l| l.contains("Error") || l.contains("failed"))
            .take(6)
            .collect();
        eprintln!("torchrun did not recover ({e}):\n{}", tail.join("\n"));
    }
    let _ = run.terminate();
    let _ = run.wait_exit(Duration::from_secs(30));
    let _ = std::fs::remove_dir_all(&dir);
    took
}

struct Cluster {
    server: Server,
    client: Client,
    rt: tokio::runtime::Runtime,
    _executors: Vec<Proc>,
}

impl Cluster {
    fn start() -> anyhow::Result<Cluster> {
        Cluster::start_with(2, "on")
    }

    /// `count` executors started with `--sandbox sandbox`.
    fn start_with(count: usize, sandbox: &str) -> anyhow::Result<Cluster> {
        let server = Server::start(
            &format!("script-bench-{sandbox}"),
            JOIN,
            &[
                ("RUST_LOG", "warn"),
                ("TRAINYARD_HEARTBEAT_INTERVAL_MS", "1000"),
                ("TRAINYARD_HEARTBEAT_MISSES", "3"),
            ],
        )?;
        let client = Client::new(&server.url)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut executors = Vec::new();
        for i in 0..count {
            let name = format!("script-bench-{sandbox}-{i}");
            let cache = server.work.join(format!("cache-{name}"));
            executors.push(start_executor(
                &server.url,
                JOIN,
                &name,
                4096,
                &[
                    ("TRAINYARD_CACHE_DIR", cache.to_str().unwrap_or_default()),
                    ("TRAINYARD_TORCH_THREADS", "1"),
                    ("TRAINYARD_SANDBOX", sandbox),
                    ("RUST_LOG", "warn"),
                ],
            )?);
        }
        let c = Cluster {
            server,
            client,
            rt,
            _executors: executors,
        };
        let start = Instant::now();
        while c
            .rt
            .block_on(c.client.executors(Some("live")))?
            .executors
            .len()
            < count
        {
            if start.elapsed() > Duration::from_secs(120) {
                bail!("the executors did not register");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(c)
    }

    /// samples/s of one run of the script as a `world`-rank job.
    fn throughput(&self, world: u64, n: usize) -> anyhow::Result<f64> {
        let run = Run::plain();
        self.throughput_of(world, n, &run, None).map(|(t, _)| t)
    }

    /// samples/s of one `world`-rank job running the script with `run`'s
    /// arguments (and `requirements`), and its log's lines.
    fn throughput_of(
        &self,
        world: u64,
        n: usize,
        run: &Run,
        requirements: Option<serde_json::Value>,
    ) -> anyhow::Result<(f64, Vec<String>)> {
        let mut script = json!({
            "code": format!("file://{}", script().display()),
            "args": run.args(),
            "max_restarts": 0,
        });
        if let Some(r) = requirements {
            script["requirements"] = r;
        }
        let spec = json!({
            "name": format!("script-throughput-{world}-{n}"),
            "script": script,
            "workers": {"min": world, "max": world},
            "resources": {"memory_mb": 1024},
        });
        // A client of its own: the cluster's may hold a connection the
        // server closed while torchrun ran (its idle keep-alive timeout).
        let client = Client::new(&self.server.url)?;
        let id = self.rt.block_on(client.submit_job(&spec, None))?.id;
        let start = Instant::now();
        loop {
            let job = self.rt.block_on(client.job(id))?;
            if job.state.is_terminal() {
                if job.state != trainyard_common::JobState::Succeeded {
                    bail!("job {id} ended: {:?} {:?}", job.state, job.state_reason);
                }
                break;
            }
            if start.elapsed() > Duration::from_secs(900) {
                bail!("job {id} did not finish");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let mut after = None;
        let mut lines = Vec::new();
        loop {
            let page = self.rt.block_on(client.job_logs(id, after, Some(1000)))?;
            lines.extend(page.lines.iter().map(|l| l.message.clone()));
            match page.lines.last() {
                Some(last) if page.lines.len() == 1000 => after = Some(last.id),
                _ => break,
            }
        }
        let t = run
            .samples_per_second(&lines, world)
            .with_context(|| format!("job {id}"))?;
        Ok((t, lines))
    }

    /// Trainyard's time, one run.
    fn restart(&self, n: usize) -> anyhow::Result<f64> {
        let spec = json!({
            "name": format!("script-bench-{n}"),
            "script": {
                "code": format!("file://{}", script().display()),
                "max_restarts": 3,
            },
            "workers": {"min": 2, "max": 2},
            "resources": {"memory_mb": 1024},
        });
        let job = self.rt.block_on(self.client.submit_job(&spec, None))?;
        let id = job.id;
        let mut lines = Vec::new();
        let mut after = None;
        let mut warm = 0;
        let took = kill_and_time(
            || {
                loop {
                    let page = self
                        .rt
                        .block_on(self.client.job_logs(id, after, Some(1000)))?;
                    let more = page.lines.len() == 1000;
                    if let Some(last) = page.lines.last() {
                        after = Some(last.id);
                    }
                    lines.extend(page.lines.iter().flat_map(|l| parse_all(&l.message)));
                    warm += page
                        .lines
                        .iter()
                        .filter(|l| l.message.contains("warm interpreter"))
                        .count();
                    if !more {
                        break;
                    }
                }
                let job = self.rt.block_on(self.client.job(id))?;
                if job.state.is_terminal() {
                    bail!("job {id} ended: {:?} {:?}", job.state, job.state_reason);
                }
                Ok(lines.clone())
            },
            Duration::from_secs(180),
        );
        eprintln!("job {id}: {warm} rank(s) restarted in a warm interpreter");
        if trace() {
            // The job's own lines (not the steps before the restart), as
            // the API has them.
            let page = self
                .rt
                .block_on(self.client.job_logs(id, None, Some(1000)))?;
            for l in page
                .lines
                .iter()
                .filter(|l| !l.message.contains("] step ") || l.generation > 1)
                .take(60)
            {
                let text: String = l.message.chars().take(160).collect();
                eprintln!("  {} g{} {text}", l.at.format("%H:%M:%S%.3f"), l.generation);
            }
        }
        let _ = self.rt.block_on(self.client.cancel_job(id));
        let start = Instant::now();
        while !self.rt.block_on(self.client.job(id))?.state.is_terminal() {
            if start.elapsed() > Duration::from_secs(60) {
                bail!("job {id} did not end after its cancel");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        took
    }
}

/// One throughput run's script arguments and what it measures.
struct Run {
    extra: Vec<String>,
    steps: u64,
    warmup: u64,
    batch: u64,
    /// Whether the rate is the median of the printed windows' rates (each
    /// `--print-every` steps) after the warm-up, not the mean over them
    /// all: a steady state that a few seconds of something else on the
    /// machine (an executor importing PyTorch into the next generation's
    /// spare interpreter) do not move.
    windows: bool,
}

impl Run {
    /// The network layer's run: no loader, no compile.
    fn plain() -> Run {
        Run {
            extra: Vec::new(),
            steps: STEPS,
            warmup: WARMUP,
            batch: BATCH,
            windows: false,
        }
    }

    fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = [
            "--sleep",
            "0",
            "--batch",
            &self.batch.to_string(),
            "--steps",
            &self.steps.to_string(),
            // A line a step would pass the log's rate limit.
            "--print-every",
            "50",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(self.extra.iter().cloned());
        a
    }

    /// Rank 0's samples/s from step `warmup` to the last, by the script's
    /// own clock, in `lines`.
    fn samples_per_second(&self, lines: &[String], world: u64) -> anyhow::Result<f64> {
        let at: std::collections::BTreeMap<u64, f64> = lines
            .iter()
            .flat_map(|l| parse_all(l))
            .filter(|s| s.rank == 0)
            .map(|s| (s.step, s.t))
            .collect();
        let (Some(t0), Some(t1)) = (at.get(&self.warmup), at.get(&self.steps)) else {
            bail!(
                "rank 0's steps {} and {} are not in its output (it printed steps {:?}); its last lines: {}",
                self.warmup,
                self.steps,
                at.keys().collect::<Vec<_>>(),
                lines[lines.len().saturating_sub(6)..].join(" | ")
            );
        };
        let per_sample = self.batch as f64 * world as f64;
        if self.windows {
            let points: Vec<(u64, f64)> = at
                .range(self.warmup..=self.steps)
                .map(|(s, t)| (*s, *t))
                .collect();
            let rates: Vec<f64> = points
                .windows(2)
                .filter(|w| w[1].1 > w[0].1)
                .map(|w| (w[1].0 - w[0].0) as f64 * per_sample / (w[1].1 - w[0].1))
                .collect();
            if rates.len() < 3 {
                bail!("fewer than 3 printed windows after the warm-up");
            }
            return Ok(median(rates));
        }
        Ok((self.steps - self.warmup) as f64 * per_sample / (t1 - t0))
    }
}

/// samples/s of `torchrun --standalone --nproc-per-node WORLD` running
/// the script with `run`'s arguments.
fn torchrun_throughput(work: &Path, world: u64, run: &Run) -> anyhow::Result<f64> {
    let (dir, mut cmd) = torchrun_command(work)?;
    cmd.args(["--standalone", "--nproc-per-node", &world.to_string()])
        .arg(script())
        .args(run.args())
        .env("TORCHINDUCTOR_CACHE_DIR", dir.join("inductor"));
    let mut p = Proc::spawn(cmd)?;
    let code = p.wait_exit(Duration::from_secs(900))?;
    let out = p.output();
    let _ = std::fs::remove_dir_all(&dir);
    if code != Some(0) {
        bail!(
            "torchrun exited {code:?}: {}",
            out.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
        );
    }
    let lines: Vec<String> = out.lines().map(str::to_owned).collect();
    run.samples_per_second(&lines, world)
}

/// Scripts as people write them, under Trainyard and under torchrun in
/// the same run: a `torch.compile`d model's samples/s; the speed-up
/// DataLoader worker processes give over `num_workers=0` on a dataset
/// whose items take 1 ms each to load; and a package environment's
/// install time, cold (resolve, download, install) and cached (another job
/// with the same requirements on the same executors).
fn as_written(short: bool) -> anyhow::Result<()> {
    let runs = if short { 1 } else { 3 };
    let c = Cluster::start()?;
    let work = c.server.work.clone();
    let world = 2;

    let compiled = Run {
        extra: vec!["--compile".into()],
        steps: 300,
        warmup: 100,
        batch: BATCH,
        windows: false,
    };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for n in 0..runs {
        let a = c.throughput_of(world, n, &compiled, None)?.0;
        let b = torchrun_throughput(&work, world, &compiled)?;
        eprintln!("compiled, run {n}: {a:.0} samples/s as a job, {b:.0} under torchrun");
        ours.push(a);
        theirs.push(b);
    }
    Figure::new(
        "script",
        format!("a torch.compile'd 2-rank DDP script's samples/s (batch {BATCH}, after 100 steps), median of {runs}"),
        median(ours),
        "samples/s",
        "torchrun --standalone, the same script".to_owned(),
        median(theirs),
        Better::Higher,
    )
    .target(Target::AtLeast(1.0))
    .emit();

    let loader = |workers: u32| Run {
        extra: vec![
            "--loader".into(),
            "--workers".into(),
            workers.to_string(),
            "--item-ms".into(),
            "1".into(),
        ],
        // Steps are printed every 50: the rate is the median of 50-step
        // windows after the first 100, under torchrun too.
        steps: 900,
        warmup: 100,
        batch: 32,
        windows: true,
    };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for n in 0..runs {
        let a0 = c.throughput_of(world, n, &loader(0), None)?.0;
        let a2 = c.throughput_of(world, n, &loader(2), None)?.0;
        let b0 = torchrun_throughput(&work, world, &loader(0))?;
        let b2 = torchrun_throughput(&work, world, &loader(2))?;
        eprintln!(
            "loader, run {n}: job {a0:.0} -> {a2:.0} samples/s with 2 workers, torchrun {b0:.0} -> {b2:.0}"
        );
        ours.push(a2 / a0);
        theirs.push(b2 / b0);
    }
    Figure::new(
        "script",
        format!("DataLoader with 2 worker processes: speed-up over num_workers=0 of a 2-rank script job (batch 32, items of 1 ms to load; the median 50-step window after 100 steps), median of {runs}"),
        median(ours),
        "×",
        "torchrun's speed-up, the same script".to_owned(),
        median(theirs),
        Better::Higher,
    )
    .target(Target::AtLeast(0.9))
    .emit();

    // A package environment: the first job installs it on each executor,
    // the second finds it.
    let requirements = json!(["tabulate==0.9.0", "tqdm==4.66.5"]);
    let install_seconds = |lines: &[String], word: &str| -> Option<f64> {
        let all: Vec<f64> = lines
            .iter()
            .filter(|l| l.contains(word))
            .filter_map(|l| {
                let s = l.split(" in ").nth(1)?;
                s.split(" s").next()?.trim().parse().ok()
            })
            .collect();
        all.into_iter().reduce(f64::max)
    };
    let quick = Run {
        extra: Vec::new(),
        steps: 100,
        warmup: 50,
        batch: 32,
        windows: false,
    };
    let (_, cold) = c.throughput_of(world, 100, &quick, Some(requirements.clone()))?;
    let (_, warm) = c.throughput_of(world, 101, &quick, Some(requirements))?;
    let cold = install_seconds(&cold, "packages: environment")
        .context("no install time in the first job's log")?;
    let warm = install_seconds(&warm, "packages: this executor's environment")
        .context("no cached time in the second job's log")?;
    eprintln!("packages: {cold:.2} s cold, {warm:.3} s cached");
    Figure::new(
        "script",
        "a script's package environment (tabulate, tqdm over the runtime): ready when cached (another job, same requirements), slowest rank".to_owned(),
        warm,
        "s",
        "cold: resolved, downloaded and installed by uv, confined".to_owned(),
        cold,
        Better::Lower,
    )
    .emit();
    c.server.stop();
    Ok(())
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

fn main() -> anyhow::Result<()> {
    let short = std::env::args().any(|a| a == "--short");
    let runs = if short { 3 } else { 5 };
    let exe_dir = std::env::current_exe()?
        .parent()
        .context("no binary folder")?
        .to_path_buf();
    std::env::set_var("TRAINYARD_BIN_DIR", &exe_dir);

    // `--throughput`: only the network layer's figures; `--as-written`:
    // only the scripts-as-written figures.
    if std::env::args().any(|a| a == "--throughput") {
        return throughput(short);
    }
    if std::env::args().any(|a| a == "--as-written") {
        return as_written(short);
    }
    let c = Cluster::start()?;
    let mut ours = Vec::new();
    for n in 0..runs {
        let t = c.restart(n)?;
        eprintln!("trainyard restart {n}: {t:.2} s");
        ours.push(t);
    }
    let work = c.server.work.clone();
    // torchrun 2.11's restarts with the c10d backend sometimes never make
    // a step (each new worker's gloo connectFullMesh dials a peer address
    // from the attempt before); such a run is counted, not timed.
    let (mut theirs, mut lost) = (Vec::new(), 0);
    for n in 0..runs * 3 {
        if theirs.len() == runs {
            break;
        }
        match torchrun(&work) {
            Ok(t) => {
                eprintln!("torchrun restart {n}: {t:.2} s");
                theirs.push(t);
            }
            Err(e) => {
                eprintln!("torchrun restart {n}: not recovered: {e}");
                lost += 1;
            }
        }
    }
    if theirs.is_empty() {
        bail!("torchrun never recovered from the kill in {lost} runs");
    }
    let baseline = if lost == 0 {
        "torchrun --max-restarts 3 --rdzv-backend c10d".to_owned()
    } else {
        format!(
            "torchrun --max-restarts 3 --rdzv-backend c10d ({lost} of {} runs never recovered, not timed)",
            lost + theirs.len()
        )
    };
    Figure::new(
        "script",
        format!("restart after SIGKILL of a script rank (2 ranks, DDP gloo), median of {runs}"),
        median(ours),
        "s",
        baseline,
        median(theirs),
        Better::Lower,
    )
    .target(Target::AtMost(TARGET))
    .emit();
    c.server.stop();
    throughput(short)?;
    as_written(short)
}

/// The network layer against no layer: the same script's samples/s as a
/// 2- and a 3-rank job, each run on a cluster with the layer and on one
/// without it in turn (both kept up), so that the machine's drift falls
/// on both alike.
fn throughput(short: bool) -> anyhow::Result<()> {
    let runs = if short { 3 } else { 5 };
    let on = Cluster::start_with(3, "on")?;
    let off = Cluster::start_with(3, "off")?;
    for world in [2u64, 3] {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for n in 0..runs {
            let a = on.throughput(world, n)?;
            let b = off.throughput(world, n)?;
            eprintln!("world {world}, run {n}: {a:.0} samples/s with the layer, {b:.0} without");
            with.push(a);
            without.push(b);
        }
        Figure::new(
            "script",
            format!(
                "a {world}-rank DDP gloo script job's samples/s, each rank in its network namespace (the job's hub between them on one host; batch {BATCH}), median of {runs}"
            ),
            median(with),
            "samples/s",
            "--sandbox off (the host's network, no layer)".to_owned(),
            median(without),
            Better::Higher,
        )
        .target(Target::AtLeast(THROUGHPUT_TARGET))
        .emit();
    }
    on.server.stop();
    off.server.stop();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_glued_on_one_line_are_each_read() {
        let glued = "step 100 rank 0 restart 0 pid 7 t 1.5step 100 rank 1 restart 0 pid 8 t 1.6";
        let steps = parse_all(glued);
        assert_eq!(steps.len(), 2, "{glued}");
        assert_eq!((steps[0].rank, steps[0].t), (0, 1.5));
        assert_eq!((steps[1].rank, steps[1].t), (1, 1.6));
        let prefixed = parse_all("[rank 1] step 50 rank 1 restart 2 pid 9 t 3.25");
        assert_eq!(prefixed.len(), 1);
        assert_eq!(
            (prefixed[0].step, prefixed[0].restart, prefixed[0].pid),
            (50, 2, 9)
        );
        assert!(parse_all("step 5 of 9 done").is_empty());
    }
}
