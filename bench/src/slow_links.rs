//! `slow-links-bench`: Trainyard's collectives on links as slow as a real
//! cluster's, 1 Gbit/s per host, in one invocation on one machine.
//!
//! The hosts are the end-to-end lab's network namespaces on a bridge
//! (`trainyard_e2e::Lab`), every host's link limited to 1000 Mbit/s in each
//! direction (`tbf` on both ends of its veth), so a host moves at most
//! 125 MB/s out and 125 MB/s in: the line rate each figure is read against.
//!
//! * **Ring all-reduce.** N ranks, each a process in a host of its own:
//!   `trainyard-ring bench` bound to the host's address against
//!   `torch.distributed` all_reduce on gloo (`bench/ring/gloo_allreduce.py
//!   rank …`, one process per host, gloo on the host's `eth0`, rank 0's TCP
//!   store at its host's address), timed as `ring-bench` times them: the
//!   slowest rank's mean over `iters` all-reduces after a warm-up gives
//!   busbw = S/t × 2(N−1)/N. A ring moves 2(N−1)/N × S through every
//!   host's link each way, so busbw cannot pass the line rate; the ratio
//!   ring/gloo and each one's ratio to the line rate are printed.
//! * **Parameter servers: prefetch.** The executor's real shard server
//!   (`ps::serve_shard`, async SGD) holds a 16 MiB (full mode also
//!   64 MiB) MLP in host 0; W workers (hosts 1..=W) run the executor's
//!   real worker loop (`ps::work`), which pulls the model, computes the
//!   gradient with libtorch (one thread) and pushes it, each step. With
//!   prefetch the next pull travels while the gradient computes; without
//!   (`TRAINYARD_PS_PREFETCH=off`, the worker's benchmark knob) it waits
//!   for the push. The batch is chosen (a calibration on this machine,
//!   `slow-links-ps calibrate`, timing the gradient at two batch sizes) so
//!   that a gradient takes about as long as one pull of the model at the
//!   line rate: the case the overlap is for. The figure is the slowest worker's mean step time (arrival to
//!   arrival of its step reports after a warm-up) with prefetch against
//!   without; the ideal is max(pull, compute) + push against pull +
//!   compute + push.
//!
//! Every figure prints as `name: value (baseline value, ratio)` and is
//! recorded for `bench/report.py`. The PS processes are
//! `slow-links-ps` (crate `trainyard-train-bench`). Without root or
//! network namespaces the benchmark says so and measures nothing; child
//! processes are killed and the lab removed on every exit path.
//!
//! `slow-links-bench [--short]` (`--short`: 16 MiB only, N = 2 and 4,
//! fewer iterations and steps).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use trainyard_bench::figure::{number, record_data, Better, Figure};
use trainyard_e2e::Lab;

const MIB: usize = 1 << 20;
/// Every host's link rate, each way.
const RATE_MBIT: u64 = 1000;
/// The bench's name in the record.
const BENCH: &str = "slow-links";

/// The line rate in MB/s (10⁶ bytes).
fn line_mbps() -> f64 {
    RATE_MBIT as f64 / 8.0
}

fn main() -> anyhow::Result<()> {
    let short = std::env::args().any(|a| a == "--short");
    if !Lab::available() {
        println!("# slow links: no lab on this machine (it needs root and network namespaces): nothing measured");
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow::anyhow!("no binary folder"))?;
    let ring_bin = dir.join("trainyard-ring");
    let ps_bin = dir.join("slow-links-ps");
    anyhow::ensure!(
        ring_bin.exists(),
        "build trainyard-ring first (cargo build --release -p trainyard-dataplane)"
    );
    anyhow::ensure!(
        ps_bin.exists(),
        "build slow-links-ps first (cargo build --release -p trainyard-train-bench)"
    );
    let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let (worlds, sizes, iters): (&[u32], Vec<usize>, u32) = if short {
        (&[2, 4], vec![16 * MIB], 3)
    } else {
        (&[2, 3, 4], vec![16 * MIB, 64 * MIB], 5)
    };
    let (ks, workers, warmup, steps): (&[u32], &[u32], u64, u64) = if short {
        (&[1], &[1, 2], 2, 6)
    } else {
        (&[1, 2], &[1, 2], 2, 10)
    };
    let hosts = (*worlds.iter().max().unwrap_or(&2) as usize)
        .max(1 + *workers.iter().max().unwrap_or(&1) as usize);
    let lab = Lab::new(hosts)?;
    for i in 0..hosts {
        lab.set_rate(i, Some(RATE_MBIT))?;
    }
    println!(
        "# slow links: {hosts} lab hosts (network namespaces on a bridge), each link {RATE_MBIT} Mbit/s each way: line rate {} MB/s",
        number(line_mbps())
    );

    // Ring all-reduce against gloo.
    let ring_rows = ring_against_gloo(&lab, worlds, &sizes, iters, (&ring_bin, &python))?;
    // Parameter servers with and without prefetch.
    let ps_rows = ps_prefetch(&lab, &ps_bin, ks, workers, (warmup, steps))?;
    record_data(
        BENCH,
        &serde_json::json!({"rate_mbit": RATE_MBIT, "line_mbps": line_mbps(), "iters": iters,
            "ring": ring_rows, "ps_warmup": warmup, "ps_steps": steps, "ps": ps_rows}),
    );
    drop(lab);
    Ok(())
}

/// The ring's bus bandwidth against gloo's, one rank per host, for each
/// world and size (`ring_bin` and `python` run them): the rows recorded.
fn ring_against_gloo(
    lab: &Lab,
    worlds: &[u32],
    sizes: &[usize],
    iters: u32,
    (ring_bin, python): (&std::path::Path, &str),
) -> anyhow::Result<Vec<serde_json::Value>> {
    let gloo_script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ring/gloo_allreduce.py");
    println!("# ring all-reduce bus bandwidth, one rank per host, {iters} iterations per size after a warm-up, slowest rank's mean");
    let size_list = sizes
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut ring_rows = Vec::new();
    for &world in worlds {
        let ours = ring_ranks(lab, world, ring_bin, &size_list, iters)?;
        let gloo = gloo_ranks(lab, world, python, &gloo_script, &size_list, iters)?;
        for (i, &bytes) in sizes.iter().enumerate() {
            let bus = |secs: f64| {
                bytes as f64 / secs * 2.0 * f64::from(world - 1) / f64::from(world) / 1e6
            };
            let t_ours = ours
                .iter()
                .filter_map(|r| r["results"][i]["seconds"].as_f64())
                .fold(0.0, f64::max);
            let t_gloo = gloo["results"][i]["seconds"].as_f64().unwrap_or(f64::NAN);
            let (b_ours, b_gloo) = (bus(t_ours), bus(t_gloo));
            let at = format!("N={world} {} MiB at 1 Gbit/s", bytes / MIB);
            let ring = format!("slow-links ring busbw {at}");
            Figure::new(BENCH, &ring, b_ours, "MB/s", "gloo", b_gloo, Better::Higher).emit();
            Figure::new(
                BENCH,
                ring,
                b_ours,
                "MB/s",
                "line rate",
                line_mbps(),
                Better::Higher,
            )
            .emit();
            Figure::new(
                BENCH,
                format!("slow-links gloo busbw {at}"),
                b_gloo,
                "MB/s",
                "line rate",
                line_mbps(),
                Better::Higher,
            )
            .emit();
            ring_rows.push(serde_json::json!({"world": world, "bytes": bytes,
                "trainyard_mbps": b_ours, "gloo_mbps": b_gloo, "trainyard_seconds": t_ours, "gloo_seconds": t_gloo}));
        }
    }

    Ok(ring_rows)
}

/// A PS step with and without prefetch, for each shard count `ks` and
/// worker count: the rows recorded.
fn ps_prefetch(
    lab: &Lab,
    ps_bin: &std::path::Path,
    ks: &[u32],
    workers: &[u32],
    (warmup, steps): (u64, u64),
) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut ps_rows = Vec::new();
    for &k in ks {
        // A worker's share of the batch computes as long as a pull takes.
        let calib = run_json(Command::new(ps_bin).args([
            "calibrate",
            &k.to_string(),
            &line_mbps().to_string(),
        ]))?;
        let model_bytes = calib["model_bytes"].as_u64().unwrap_or(0) as usize;
        let pull_s = calib["pull_seconds"].as_f64().unwrap_or(f64::NAN);
        let share = calib["batch"].as_u64().unwrap_or(64) as u32;
        let tried = calib["tried"].as_array().cloned().unwrap_or_default();
        let last = tried.last().cloned().unwrap_or_default();
        let (at_batch, at_secs) = (
            last["batch"].as_f64().unwrap_or(f64::NAN),
            last["seconds"].as_f64().unwrap_or(f64::NAN),
        );
        println!(
            "# parameter servers: a {:.0} MiB MLP, async SGD, one shard (host 0), {warmup} warm-up + {steps} steps; a pull at the line rate takes {:.0} ms, a gradient of {share} samples about as long here (calibrated: {at_batch} took {:.0} ms)",
            model_bytes as f64 / MIB as f64,
            pull_s * 1e3,
            at_secs * 1e3
        );
        for &w in workers {
            let batch = share * w;
            let mut timed = Vec::new();
            for prefetch in [false, true] {
                let r = ps_run(lab, ps_bin, k, batch, w, warmup, steps, prefetch)?;
                println!(
                    "#   {w} worker(s), prefetch {}: step {:.0} ms (gradient {:.0} ms{}, pull+push on the critical path {:.0} ms)",
                    if prefetch { "on " } else { "off" },
                    r.step * 1e3,
                    r.compute * 1e3,
                    if prefetch { " with the next pull beside it" } else { "" },
                    r.comm * 1e3
                );
                ps_rows.push(serde_json::json!({"model_bytes": model_bytes, "workers": w, "batch": batch,
                    "prefetch": prefetch, "step_ms": r.step * 1e3, "gradient_ms": r.compute * 1e3, "comm_ms": r.comm * 1e3}));
                timed.push(r);
            }
            Figure::new(
                BENCH,
                format!(
                    "slow-links ps step {w} worker(s) {:.0} MiB at 1 Gbit/s, prefetch",
                    model_bytes as f64 / MIB as f64
                ),
                timed[1].step * 1e3,
                "ms",
                "no prefetch",
                timed[0].step * 1e3,
                Better::Lower,
            )
            .emit();
        }
    }
    Ok(ps_rows)
}

/// Child processes, killed (and reaped) when dropped, and by a watchdog
/// once `limit` has passed (a hung rank never hangs the benchmark).
struct Kids {
    kids: Vec<Child>,
    done: Arc<AtomicBool>,
    limit: Duration,
    started: Instant,
}

impl Kids {
    fn new(limit: Duration) -> Kids {
        Kids {
            kids: Vec::new(),
            done: Arc::new(AtomicBool::new(false)),
            limit,
            started: Instant::now(),
        }
    }

    /// Starts `cmd` with its stdin and stdout piped (stderr: ours).
    fn spawn(&mut self, mut cmd: Command) -> anyhow::Result<(ChildStdin, BufReader<ChildStdout>)> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
        let pid = child.id();
        self.kids.push(child);
        let (done, left) = (
            self.done.clone(),
            self.limit.saturating_sub(self.started.elapsed()),
        );
        std::thread::spawn(move || {
            let until = Instant::now() + left;
            while Instant::now() < until {
                if done.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            if !done.load(Ordering::Relaxed) {
                eprintln!("slow-links: process {pid} ran past {left:?}: killing it");
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        });
        Ok((
            stdin.ok_or_else(|| anyhow::anyhow!("no stdin"))?,
            BufReader::new(stdout.ok_or_else(|| anyhow::anyhow!("no stdout"))?),
        ))
    }

    /// Waits for every child; fails unless all succeeded.
    fn wait_all(mut self) -> anyhow::Result<()> {
        let mut failed = 0;
        for c in &mut self.kids {
            if !c.wait()?.success() {
                failed += 1;
            }
        }
        self.kids.clear();
        anyhow::ensure!(
            failed == 0,
            "{failed} process(es) failed (see their stderr)"
        );
        Ok(())
    }
}

impl Drop for Kids {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        for c in &mut self.kids {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// Reads one JSON line (failing on end of output).
fn read_json(out: &mut impl BufRead, what: &str) -> anyhow::Result<serde_json::Value> {
    let mut l = String::new();
    anyhow::ensure!(out.read_line(&mut l)? > 0, "{what} printed nothing");
    serde_json::from_str(&l).map_err(|e| anyhow::anyhow!("{what} printed {l:?}: {e}"))
}

/// Runs `cmd` to its end; its one line of JSON output.
fn run_json(cmd: &mut Command) -> anyhow::Result<serde_json::Value> {
    let out = cmd.stderr(Stdio::inherit()).output()?;
    anyhow::ensure!(out.status.success(), "{cmd:?} failed");
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// `trainyard-ring bench` with rank r in host r; every rank's result.
fn ring_ranks(
    lab: &Lab,
    world: u32,
    ring_bin: &std::path::Path,
    sizes: &str,
    iters: u32,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut kids = Kids::new(Duration::from_secs(300));
    let mut pipes = Vec::new();
    for r in 0..world {
        let mut c = lab.command(r as usize, ring_bin);
        c.args([
            "--rank",
            &r.to_string(),
            "--listen",
            &format!("{}:0", lab.host(r as usize).addr),
            "bench",
            "--sizes",
            sizes,
            "--iters",
            &iters.to_string(),
        ]);
        pipes.push(kids.spawn(c)?);
    }
    let mut addrs = Vec::new();
    for (_, out) in &mut pipes {
        let v = read_json(out, "a ring rank")?;
        addrs.push(v["addr"].as_str().unwrap_or_default().to_owned());
    }
    let peers = serde_json::to_string(&addrs)?;
    for (stdin, _) in &mut pipes {
        writeln!(stdin, "{peers}")?;
    }
    let mut results = Vec::new();
    for (_, out) in &mut pipes {
        results.push(read_json(out, "a ring rank")?);
    }
    kids.wait_all()?;
    Ok(results)
}

/// gloo all_reduce with rank r in host r; rank 0's result (the slowest
/// rank's times).
fn gloo_ranks(
    lab: &Lab,
    world: u32,
    python: &str,
    script: &std::path::Path,
    sizes: &str,
    iters: u32,
) -> anyhow::Result<serde_json::Value> {
    let mut kids = Kids::new(Duration::from_secs(300));
    let master = lab.host(0).addr.to_string();
    // A port of its own per run: the last run's store may linger.
    let port = (29500 + world).to_string();
    let mut outs = Vec::new();
    for r in 0..world {
        let mut c = lab.command(r as usize, python);
        c.arg(script)
            .args([
                "rank",
                &r.to_string(),
                &world.to_string(),
                &master,
                &port,
                &iters.to_string(),
                sizes,
                "eth0",
            ])
            .env("GLOO_SOCKET_IFNAME", "eth0");
        outs.push(kids.spawn(c)?);
    }
    let result = read_json(&mut outs[0].1, "gloo rank 0")?;
    kids.wait_all()?;
    Ok(result)
}

/// One PS measurement: the slowest worker's mean seconds per step, and
/// its mean compute and critical-path communication per step.
struct PsTimes {
    step: f64,
    compute: f64,
    comm: f64,
}

/// A shard in host 0 and `workers` workers in hosts 1..=workers train
/// `warmup + steps` steps each; the measured steps' times.
#[allow(clippy::too_many_arguments)]
fn ps_run(
    lab: &Lab,
    ps_bin: &std::path::Path,
    k: u32,
    batch: u32,
    workers: u32,
    warmup: u64,
    steps: u64,
    prefetch: bool,
) -> anyhow::Result<PsTimes> {
    let mut kids = Kids::new(Duration::from_secs(300));
    let total = (warmup + steps).to_string();
    let (k, batch_s, world) = (k.to_string(), batch.to_string(), workers.to_string());
    let mut shard = lab.command(0, ps_bin);
    shard.args([
        "shard",
        &lab.host(0).addr.to_string(),
        &k,
        &batch_s,
        &world,
        &total,
    ]);
    let (shard_in, mut shard_out) = kids.spawn(shard)?;
    let addr = read_json(&mut shard_out, "the PS shard")?["addr"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut outs = Vec::new();
    for r in 0..workers {
        let mut c = lab.command(1 + r as usize, ps_bin);
        c.args([
            "worker",
            &r.to_string(),
            &world,
            &addr,
            &k,
            &batch_s,
            &total,
        ])
        .env("TRAINYARD_PS_PREFETCH", if prefetch { "on" } else { "off" });
        outs.push(kids.spawn(c)?);
    }
    let mut times = PsTimes {
        step: 0.0,
        compute: 0.0,
        comm: 0.0,
    };
    for (_, out) in &mut outs {
        let v = read_json(out, "a PS worker")?;
        let rows = v["steps"].as_array().cloned().unwrap_or_default();
        let at = |i: usize, key: &str| rows.get(i).and_then(|r| r[key].as_f64());
        let first = warmup as usize - 1;
        let last = rows.len().saturating_sub(1);
        anyhow::ensure!(
            last > first,
            "a PS worker reported {} steps, fewer than the warm-up and one more",
            rows.len()
        );
        let (t0, t1) = (at(first, "t"), at(last, "t"));
        let (Some(t0), Some(t1)) = (t0, t1) else {
            anyhow::bail!("a PS worker's report has no times");
        };
        let n = (last - first) as f64;
        let mean = |key: &str| ((first + 1)..=last).filter_map(|i| at(i, key)).sum::<f64>() / n;
        if (t1 - t0) / n > times.step {
            times = PsTimes {
                step: (t1 - t0) / n,
                compute: mean("compute"),
                comm: mean("comm"),
            };
        }
    }
    drop(shard_in); // the shard serves until its stdin closes
    kids.wait_all()?;
    Ok(times)
}
