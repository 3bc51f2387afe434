//! `e2e-bench`: whole-system figures with the real binaries — samples/s of
//! the digits MLP job with 1, 2 and 4 workers in each pattern, the share of
//! its step time spent communicating, and the recovery time after an
//! executor is SIGKILLed mid-training.
//!
//! It makes a fresh database on the test Postgres server, starts the
//! release `trainyard serve` (production heartbeats: 1 s, lost after 3
//! silent beats; no provisioner) and four `trainyard-executor` processes
//! with one libtorch thread each, all on this machine.
//!
//! * Throughput: each (pattern, workers) job trains the digits MLP
//!   (64-128-10, AdamW, 32 samples per worker per step; the PS jobs have
//!   one shard, sync). After a warm-up, samples/s is wall-clock: the steps
//!   rank 0 made between two report arrivals a window apart (4 s short,
//!   12 s full), × workers × batch, over the time between the arrivals; the
//!   job is cancelled after. The step-time breakdown is rank 0's mean data,
//!   compute and comm seconds, as the executor reports them, over the same
//!   steps. Baseline: the
//!   same model, optimizer and batch in one plain Python PyTorch eager
//!   process with one thread (`bench/e2e_baseline.py`), run in the same
//!   invocation. The communication share is comm ÷ step time. The ring ×2
//!   row is also held against PyTorch DDP over gloo, two processes of one
//!   thread with the same model, optimizer and per-rank batch (the same
//!   script with `"world": 2`).
//! * Users' models: the same MLP as a TorchScript module
//!   (`bench/e2e_baseline.py write`), submitted as `{"kind": "torchscript"}`, so
//!   every step crosses the sandbox's process boundary (the executor's role
//!   thread ↔ the confined model process). Ring ×2 is held to ≥ 1.0× DDP;
//!   both patterns are shown against the built-in model in-process.
//! * Recovery: a 2-worker job (each pattern; for PS, a checkpoint every 50
//!   steps) trains; the executor of a worker, of the shard's primary in a
//!   job with `replicas: 1`, or of the (unreplicated) shard is SIGKILLed;
//!   recovery is the time from the kill until the API has a step that a
//!   later generation trained (every metric point carries the generation
//!   that measured it, so a late report of the killed generation's steps
//!   does not count as resumption). It is split into detection (kill →
//!   the scheduler's new placement: the data-plane peers report the kill
//!   and the scheduler confirms it, see
//!   `trainyard_scheduler::service::suspect`) and resumption. Each kill
//!   runs 3 times (short) or 5 (full); the figures are medians, and every
//!   kind but the unreplicated shard is held to the target of 1.0 s. A
//!   ring rank and a PS worker are killed both with the built-in model and
//!   with the TorchScript one (its confined model process dies with its
//!   executor). Baseline: the same job's cold start (submit → its first
//!   step at the API), measured the same way in the same run. Role
//!   start-up is that cold start for the TorchScript job (a model process
//!   spawned, confined and loaded) beside the built-in one (a role
//!   thread). A role's first step reaches
//!   the API at once, later ones in reports every 0.5 s.
//!
//! `e2e-bench [--short] [--recovery]` (`--recovery`: the recovery runs
//! alone, recorded as `e2e-recovery`); the executor needs libtorch on its library path
//! (`source scripts/common.sh && torch_env`) and `TRAINYARD_PYTHON` names
//! the torch venv's Python for the baseline.

use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::future::Future;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use trainyard_bench::figure::{record_data, Better, Figure};
use trainyard_bench::server::Server;
use trainyard_client::{Client, ClientError};
use trainyard_common::api::Job;
use trainyard_common::{EventKind, JobState};
use trainyard_e2e::{kill9, repo_root, start_executor, Proc};
use uuid::Uuid;

const JOIN: &str = "e2e-bench-join";
const BATCH: u64 = 32;
const LR: f64 = 0.005;
const WEIGHT_DECAY: f64 = 0.0001;
const EXECUTORS: usize = 4;
/// The production heartbeat (the API's defaults), set explicitly so that
/// what the report says is what ran.
const HEARTBEAT_MS: u64 = 1000;
const HEARTBEAT_MISSES: u32 = 3;

struct Cluster {
    server: Server,
    /// The API's typed client, driven by `rt` (the benchmark itself is
    /// plain threads and sleeps).
    client: Client,
    rt: tokio::runtime::Runtime,
    executors: Vec<(String, Proc)>,
}

impl Cluster {
    fn start() -> anyhow::Result<Cluster> {
        let server = Server::start(
            "e2e-bench",
            JOIN,
            &[
                ("RUST_LOG", "warn"),
                ("TRAINYARD_HEARTBEAT_INTERVAL_MS", &HEARTBEAT_MS.to_string()),
                ("TRAINYARD_HEARTBEAT_MISSES", &HEARTBEAT_MISSES.to_string()),
            ],
        )?;
        let client = Client::new(&server.url)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut c = Cluster {
            server,
            client,
            rt,
            executors: Vec::new(),
        };
        for i in 0..EXECUTORS {
            c.add_executor(&format!("bench-{i}"))?;
        }
        c.wait_live(EXECUTORS)?;
        Ok(c)
    }

    fn add_executor(&mut self, name: &str) -> anyhow::Result<()> {
        let cache = self.server.work.join(format!("cache-{name}"));
        let p = start_executor(
            &self.server.url,
            JOIN,
            name,
            2048,
            &[
                ("TRAINYARD_CACHE_DIR", cache.to_str().unwrap_or_default()),
                ("RUST_LOG", "warn"),
            ],
        )?;
        self.executors.push((name.to_owned(), p));
        Ok(())
    }

    /// Waits for one request of the client.
    fn api<T>(&self, call: impl Future<Output = Result<T, ClientError>>) -> anyhow::Result<T> {
        Ok(self.rt.block_on(call)?)
    }

    fn job(&self, id: Uuid) -> anyhow::Result<Job> {
        self.api(self.client.job(id))
    }

    fn wait_live(&self, n: usize) -> anyhow::Result<()> {
        let start = Instant::now();
        while self
            .api(self.client.executors(Some("live")))?
            .executors
            .len()
            < n
        {
            if start.elapsed() > Duration::from_secs(120) {
                bail!("{n} executors did not register in 2 minutes");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// Waits until `id` is over: its final state.
    fn wait_end(&self, id: Uuid, limit: Duration) -> anyhow::Result<Job> {
        let start = Instant::now();
        loop {
            let job = self.job(id)?;
            match job.state {
                s if s.is_terminal() => return Ok(job),
                _ if start.elapsed() > limit => {
                    bail!("job {id} not done after {limit:?}: {job:?}")
                }
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// The furthest step rank 0 has reported (0 before any).
    fn last_step(&self, id: Uuid) -> anyhow::Result<u64> {
        Ok(self.progress(id)?.0)
    }

    /// The furthest step rank 0 has reported and the newest generation
    /// that measured one (one bucket over the whole curve).
    fn progress(&self, id: Uuid) -> anyhow::Result<(u64, i64)> {
        let m = self.api(self.client.job_metrics(id, Some(1)))?;
        Ok(m.points.last().map_or((0, 0), |p| {
            (u64::try_from(p.step).unwrap_or(0), p.generation)
        }))
    }

    fn generation(&self, id: Uuid) -> anyhow::Result<i64> {
        Ok(self.job(id)?.generation)
    }

    /// Cancels `id` and waits until it is over.
    fn cancel(&self, id: Uuid) -> anyhow::Result<()> {
        self.api(self.client.cancel_job(id))?;
        self.wait_end(id, Duration::from_secs(60))?;
        Ok(())
    }
}

/// The model a benchmark job trains: the built-in MLP (trained in the
/// executor's own process) or the same MLP as a user's TorchScript module
/// (trained in a confined child process, the sandbox's cost).
#[derive(Clone, Copy)]
enum Model<'a> {
    Builtin,
    TorchScript(&'a Path),
}

impl Model<'_> {
    fn json(self) -> Value {
        match self {
            Model::Builtin => json!({"kind": "mlp", "inputs": 64, "hidden": [128], "outputs": 10}),
            Model::TorchScript(p) => {
                json!({"kind": "torchscript", "url": format!("file://{}", p.display())})
            }
        }
    }

    /// The prefix of its figures' names.
    fn label(self) -> &'static str {
        match self {
            Model::Builtin => "",
            Model::TorchScript(_) => "TorchScript ",
        }
    }
}

fn spec(
    strategy: &str,
    workers: u64,
    steps: u64,
    checkpoint_every: Option<u64>,
    model: Model,
) -> Value {
    let digits = repo_root().join("data/digits.npz");
    let mut s = json!({
        "name": format!("e2e-bench-{strategy}-{workers}"),
        "model": model.json(),
        "dataset": {"kind": "file", "url": format!("file://{}", digits.display())},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adamw", "lr": LR, "weight_decay": WEIGHT_DECAY},
        "batch_size": BATCH,
        "steps": steps,
        "strategy": strategy,
        "workers": {"min": workers, "max": workers},
        "checkpoint": match checkpoint_every {
            Some(n) => json!({"every_steps": n, "keep": 2, "at_end": false}),
            None => json!({"at_end": false}),
        },
        "seed": 3,
        "eval_fraction": 0.2,
    });
    if strategy == "parameter_server" {
        s["parameter_servers"] = json!(1);
        s["consistency"] = json!("sync");
    }
    s
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// Mean (data, compute, comm) seconds per step of rank 0 over steps
/// `from` (exclusive) to `to`; points are bucket means once a job has more
/// steps than the API returns points.
fn breakdown(c: &Cluster, id: Uuid, from: u64, to: u64) -> anyhow::Result<(f64, f64, f64, usize)> {
    let m = c.api(c.client.job_metrics(id, Some(10_000)))?;
    let pts: Vec<_> = m
        .points
        .iter()
        .filter(|p| u64::try_from(p.step).is_ok_and(|s| s > from && s <= to))
        .collect();
    anyhow::ensure!(
        !pts.is_empty(),
        "job {id} reported no steps in ({from}, {to}]"
    );
    let col = |f: fn(&trainyard_common::api::MetricSample) -> f64| {
        pts.iter().map(|p| f(p)).collect::<Vec<_>>()
    };
    Ok((
        mean(&col(|p| p.data_seconds)),
        mean(&col(|p| p.compute_seconds)),
        mean(&col(|p| p.comm_seconds)),
        pts.len(),
    ))
}

/// Waits for the next report of `id` to arrive (its furthest step to
/// change): that step and the instant it was seen, polled every 10 ms.
fn next_report(c: &Cluster, id: Uuid) -> anyhow::Result<(u64, Instant)> {
    let first = c.last_step(id)?;
    let start = Instant::now();
    loop {
        let now = c.last_step(id)?;
        if now != first {
            return Ok((now, Instant::now()));
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(60),
            "job {id} reported nothing for a minute"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One throughput run: the job trains; after a warm-up, samples/s over a
/// window between two report arrivals (so the 0.5 s report cadence does not
/// blur the ends), then the mean breakdown of the window's steps; the job is
/// cancelled after.
fn throughput(
    c: &Cluster,
    strategy: &str,
    workers: u64,
    window: Duration,
    model: Model,
) -> anyhow::Result<Value> {
    let job = spec(strategy, workers, 100_000_000, None, model);
    let id = c.api(c.client.submit_job(&job, None))?.id;
    let start = Instant::now();
    while c.last_step(id)? == 0 {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(120),
            "job {id} did not start: {:?}",
            c.job(id)?
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let (s1, t1) = next_report(c, id)?;
    std::thread::sleep(window);
    let (s2, t2) = next_report(c, id)?;
    let job = c.job(id)?;
    anyhow::ensure!(
        job.state == JobState::Running,
        "job {id} is {}: {}",
        job.state,
        job.state_reason
    );
    let secs = t2.duration_since(t1).as_secs_f64();
    let sps = (s2 - s1) as f64 * (workers * BATCH) as f64 / secs;
    let (data, compute, comm, n) = breakdown(c, id, s1, s2)?;
    c.cancel(id)?;
    Ok(
        json!({"strategy": strategy, "workers": workers, "model": model.label().trim(),
        "samples_per_sec": sps,
        "window_s": secs, "steps": s2 - s1, "steps_per_sec": (s2 - s1) as f64 / secs,
        "data_ms": data * 1e3, "compute_ms": compute * 1e3, "comm_ms": comm * 1e3,
        "metric_points": n}),
    )
}

fn python() -> String {
    std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The benchmark job's recipe, as the Python baselines take it.
fn baseline_recipe(steps: u64) -> Value {
    json!({
        "data": repo_root().join("data/digits.npz"), "hidden": [128], "batch": BATCH,
        "lr": LR, "weight_decay": WEIGHT_DECAY, "steps": steps, "warmup": 20, "threads": 1,
    })
}

/// Runs a Python helper of the benchmark and reads the `samples_per_sec`
/// of the JSON object it prints.
fn samples_per_sec(script: &str, args: &[&str]) -> anyhow::Result<f64> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let out = Command::new(python())
        .arg(&path)
        .args(args)
        .output()
        .with_context(|| format!("running {}", python()))?;
    anyhow::ensure!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    v["samples_per_sec"].as_f64().context("no samples_per_sec")
}

/// One plain Python PyTorch eager process, one thread.
fn python_baseline(steps: u64) -> anyhow::Result<f64> {
    samples_per_sec("e2e_baseline.py", &[&baseline_recipe(steps).to_string()])
}

/// PyTorch DDP over gloo, `world` processes of one thread each.
fn ddp_baseline(steps: u64, world: u64) -> anyhow::Result<f64> {
    let mut cfg = baseline_recipe(steps);
    cfg["world"] = json!(world);
    samples_per_sec("e2e_baseline.py", &[&cfg.to_string()])
}

/// Writes the benchmark's MLP as a user's TorchScript module to `path`.
fn write_torchscript(path: &Path) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e_baseline.py");
    let out = Command::new(python())
        .arg(&script)
        .arg("write")
        .arg(path)
        .output()
        .with_context(|| format!("running {}", python()))?;
    anyhow::ensure!(
        out.status.success(),
        "writing the TorchScript model failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// What a recovery run measured (seconds).
struct Recovery {
    cold_start: f64,
    detect: f64,
    total: f64,
    killed: String,
    step_before: u64,
}

/// Which executor a recovery run kills.
#[derive(Clone, Copy, PartialEq)]
enum Victim {
    /// The executor of the highest-ranked worker that holds no shard.
    Worker,
    /// The executor of shard 0.
    Shard,
    /// The executor of shard 0's primary, in a job with `replicas: 1`.
    ReplicatedShard,
}

fn recovery(
    c: &mut Cluster,
    strategy: &str,
    victim: Victim,
    model: Model,
) -> anyhow::Result<Recovery> {
    let ckpt = (strategy == "parameter_server").then_some(50);
    let submitted = Instant::now();
    let mut s = spec(strategy, 2, 1_000_000, ckpt, model);
    if victim == Victim::ReplicatedShard {
        s["replicas"] = json!(1);
    }
    let id = c.api(c.client.submit_job(&s, None))?.id;
    let mut cold_start = None;
    let deadline = Instant::now() + Duration::from_secs(180);
    // Train past a few checkpoints.
    loop {
        let step = c.last_step(id)?;
        if step > 0 && cold_start.is_none() {
            cold_start = Some(submitted.elapsed().as_secs_f64());
        }
        if step >= 300 {
            break;
        }
        if Instant::now() > deadline {
            bail!("job {id} did not reach step 300: {:?}", c.job(id)?);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let a = c.api(c.client.job_assignments(id))?;
    let shard_hosts: Vec<&str> = a
        .parameter_servers
        .iter()
        .map(|s| s.executor.name.as_str())
        .collect();
    let name = match victim {
        Victim::Shard => shard_hosts.first().map(|s| (*s).to_owned()),
        Victim::ReplicatedShard => {
            let primary = a.parameter_servers.first();
            anyhow::ensure!(
                primary.is_some_and(|p| p.standby.is_some()),
                "shard 0 of {id} has no standby: {a:?}"
            );
            shard_hosts.first().map(|s| (*s).to_owned())
        }
        Victim::Worker => a
            .workers
            .iter()
            .rev()
            .map(|r| r.executor.name.as_str())
            .find(|n| !shard_hosts.contains(n))
            .map(str::to_owned),
    }
    .with_context(|| format!("no executor to kill in {a:?}"))?;
    let g0 = c.generation(id)?;
    let idx = c
        .executors
        .iter()
        .position(|(n, _)| *n == name)
        .with_context(|| format!("{name} is not one of ours"))?;
    let killed_at_wall = std::time::SystemTime::now();
    let killed = Instant::now();
    let at_kill = c.last_step(id)?;
    kill9(c.executors[idx].1.pid());
    let deadline = killed + Duration::from_secs(120);
    loop {
        if c.generation(id)? > g0 {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no new generation of {id} after the kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Resumed: the API holds a step measured by a generation after the
    // one killed (every metric point carries the generation that trained
    // it, so a late report of the old generation does not count).
    let total = loop {
        if c.progress(id)?.1 > g0 {
            break killed.elapsed().as_secs_f64();
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "job {id} did not resume after the kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // Detection: the first placement event after the kill (server clock = ours).
    let events = c.api(c.client.job_events(id, None, Some(1000)))?;
    let kill_ts = chrono_secs(killed_at_wall);
    let detect = events
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Placement)
        .map(|e| e.at.timestamp_micros() as f64 / 1e6)
        .find(|&t| t > kill_ts)
        .map_or(f64::NAN, |t| t - kill_ts);
    c.cancel(id)?;
    // Bring the fleet back to four.
    c.executors.remove(idx);
    c.add_executor(&name)?;
    c.wait_live(EXECUTORS)?;
    Ok(Recovery {
        cold_start: cold_start.unwrap_or(f64::NAN),
        detect,
        total,
        killed: name,
        step_before: at_kill,
    })
}

fn chrono_secs(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The target for kill → training resumed at the API (median).
const RECOVERY_TARGET_S: f64 = 1.0;

/// Emits the two figures of a throughput row: samples/s against
/// `baseline`, and communication against the step time.
fn emit_row(row: &Value, name: &str, baseline_name: &str, baseline: f64) {
    let n = |k: &str| row[k].as_f64().unwrap_or(f64::NAN);
    Figure::new(
        "e2e",
        format!("{name} samples/s"),
        n("samples_per_sec"),
        "samples/s",
        baseline_name,
        baseline,
        Better::Higher,
    )
    .emit();
    Figure::new(
        "e2e",
        format!("{name} communication per step"),
        n("comm_ms"),
        "ms",
        "step time",
        n("data_ms") + n("compute_ms") + n("comm_ms"),
        Better::Lower,
    )
    .emit();
}

/// A start-up figure: the TorchScript job's and the built-in one's
/// (strategy, model label, seconds).
type ColdStart = (&'static str, &'static str, f64);

/// Each kill `runs` times, the figures the medians: the recovery rows,
/// and the cold starts of the same jobs.
fn recoveries(
    c: &mut Cluster,
    runs: usize,
    torchscript: Model<'_>,
) -> anyhow::Result<(Vec<serde_json::Value>, Vec<ColdStart>)> {
    let mut recoveries = Vec::new();
    let mut cold_starts = Vec::new();
    // Each kill `runs` times; the figures are the medians.
    for (strategy, victim, what, model) in [
        ("allreduce", Victim::Worker, "ring rank", Model::Builtin),
        (
            "allreduce",
            Victim::Worker,
            "TorchScript ring rank",
            torchscript,
        ),
        (
            "parameter_server",
            Victim::Worker,
            "ps worker",
            Model::Builtin,
        ),
        (
            "parameter_server",
            Victim::Worker,
            "TorchScript ps worker",
            torchscript,
        ),
        (
            "parameter_server",
            Victim::ReplicatedShard,
            "replicated ps shard",
            Model::Builtin,
        ),
        (
            "parameter_server",
            Victim::Shard,
            "ps shard",
            Model::Builtin,
        ),
    ] {
        let mut all = Vec::new();
        for _ in 0..runs {
            let r = recovery(c, strategy, victim, model)?;
            println!(
                "#   {what}: killed {} after step {}; detection (kill → new placement) {:.2} s, resumption {:.2} s, total {:.2} s",
                r.killed,
                r.step_before,
                r.detect,
                r.total - r.detect,
                r.total
            );
            all.push(r);
        }
        let col = |f: fn(&Recovery) -> f64| median(&all.iter().map(f).collect::<Vec<_>>());
        let (total, detect, cold) = (col(|r| r.total), col(|r| r.detect), col(|r| r.cold_start));
        Figure::new(
            "e2e",
            format!("recovery after SIGKILL of a {what}"),
            total,
            "s",
            "cold start of the same job",
            cold,
            Better::Lower,
        )
        .emit();
        // The data-plane peers report the kill at once; the target
        // holds for the kinds a replica or a survivor takes over.
        if victim != Victim::Shard {
            Figure::new(
                "e2e",
                format!("recovery after SIGKILL of a {what}, median of {runs}"),
                total,
                "s",
                "target",
                RECOVERY_TARGET_S,
                Better::Lower,
            )
            .target(trainyard_bench::figure::Target::AtMost(1.0))
            .emit();
        }
        if victim == Victim::Worker {
            cold_starts.push((strategy, model.label(), cold));
        }
        recoveries.push(json!({"what": what, "strategy": strategy, "total_s": total,
            "detect_s": detect, "cold_start_s": cold,
            "step_before": all.last().map_or(0, |r| r.step_before),
            "runs": all.iter().map(|r| json!({"total_s": r.total, "detect_s": r.detect,
                "cold_start_s": r.cold_start, "killed": r.killed})).collect::<Vec<_>>()}));
    }
    Ok((recoveries, cold_starts))
}

/// Role start-up: a confined model process against a role thread, as a
/// job's submit → first step at the API.
fn startup_figures(cold_starts: &[ColdStart], short_name: impl Fn(&str) -> &'static str) {
    for strategy in ["allreduce", "parameter_server"] {
        let find = |label: &str| {
            cold_starts
                .iter()
                .find(|(s, l, _)| *s == strategy && *l == label)
                .map_or(f64::NAN, |c| c.2)
        };
        Figure::new(
            "e2e",
            format!(
                "start-up of a TorchScript {} job (submit → first step)",
                short_name(strategy)
            ),
            find("TorchScript "),
            "s",
            "built-in model, in-process",
            find(""),
            Better::Lower,
        )
        .emit();
    }
}

fn main() -> anyhow::Result<()> {
    let short = std::env::args().any(|a| a == "--short");
    // Only the recovery runs (no throughput rows, no Python baseline).
    let recovery_only = std::env::args().any(|a| a == "--recovery");
    let runs = if short { 3 } else { 5 };
    let window = Duration::from_secs(if short { 4 } else { 12 });
    let exe_dir = std::env::current_exe()?
        .parent()
        .context("no binary folder")?
        .to_path_buf();
    std::env::set_var("TRAINYARD_BIN_DIR", &exe_dir);
    let baseline_steps = if short { 2000 } else { 10_000 };
    let (baseline, ddp) = if recovery_only {
        (f64::NAN, f64::NAN)
    } else {
        (
            python_baseline(baseline_steps)?,
            ddp_baseline(baseline_steps, 2)?,
        )
    };
    let mut c = Cluster::start()?;
    // The same MLP as a user would bring it; executors read it like any
    // `file://` model and train it in their confined model process.
    let user_model = c.server.work.join("digits-mlp.pt");
    write_torchscript(&user_model)?;
    let torchscript = Model::TorchScript(&user_model);
    println!(
        "# end to end: digits MLP 64-128-10, AdamW, {BATCH} samples per worker per step, samples/s over {window:?} of training after a warm-up; {EXECUTORS} executors (1 libtorch thread each) and the API on this machine; baselines: one Python PyTorch eager process, 1 thread: {baseline:.0} samples/s; PyTorch DDP (gloo), 2 processes of 1 thread: {ddp:.0} samples/s"
    );
    let mut rows = Vec::new();
    let patterns: &[&str] = if recovery_only {
        &[]
    } else {
        &["allreduce", "parameter_server"]
    };
    let short_name = |strategy: &str| {
        if strategy == "allreduce" {
            "ring"
        } else {
            "ps"
        }
    };
    for &strategy in patterns {
        for workers in [1u64, 2, 4] {
            let row = throughput(&c, strategy, workers, window, Model::Builtin)?;
            let name = format!("e2e {} {workers} worker(s)", short_name(strategy));
            emit_row(&row, &name, "PyTorch eager, 1 process", baseline);
            if strategy == "allreduce" && workers == 2 {
                Figure::new(
                    "e2e",
                    "e2e ring 2 worker(s) samples/s against DDP",
                    row["samples_per_sec"].as_f64().unwrap_or(f64::NAN),
                    "samples/s",
                    "PyTorch DDP gloo, 2 processes",
                    ddp,
                    Better::Higher,
                )
                .emit();
            }
            rows.push(row);
        }
    }
    // Users' models: the sandbox's process boundary on the hot path.
    let mut user_rows = Vec::new();
    for &strategy in patterns {
        let row = throughput(&c, strategy, 2, window, torchscript)?;
        let builtin = rows
            .iter()
            .find(|r| r["strategy"] == strategy && r["workers"] == 2)
            .and_then(|r| r["samples_per_sec"].as_f64())
            .unwrap_or(f64::NAN);
        let name = format!("e2e TorchScript {} 2 worker(s)", short_name(strategy));
        emit_row(&row, &name, "built-in model, in-process", builtin);
        if strategy == "allreduce" {
            Figure::new(
                "e2e",
                "e2e TorchScript ring 2 worker(s) samples/s against DDP",
                row["samples_per_sec"].as_f64().unwrap_or(f64::NAN),
                "samples/s",
                "PyTorch DDP gloo, 2 processes",
                ddp,
                Better::Higher,
            )
            .target(trainyard_bench::figure::Target::AtLeast(1.0))
            .emit();
        }
        user_rows.push(row);
    }
    let (recoveries, cold_starts) = recoveries(&mut c, runs, torchscript)?;
    startup_figures(&cold_starts, short_name);
    record_data(
        if recovery_only { "e2e-recovery" } else { "e2e" },
        &json!({"window_s": window.as_secs_f64(), "batch": BATCH, "executors": EXECUTORS,
            "baseline_samples_per_sec": baseline, "ddp_samples_per_sec": ddp, "rows": rows,
            "user_model_rows": user_rows, "recoveries": recoveries,
            "heartbeat": {"interval_ms": HEARTBEAT_MS, "misses": HEARTBEAT_MISSES}}),
    );
    drop(std::mem::take(&mut c.executors));
    c.server.stop();
    Ok(())
}
