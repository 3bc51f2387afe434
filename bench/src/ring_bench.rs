//! `ring-bench`: bus bandwidth of Trainyard's ring all-reduce, side by side
//! with `torch.distributed` all_reduce on the gloo backend and with a plain
//! tokio ring that only sends and receives the same bytes (the loopback
//! ceiling), all over 127.0.0.1 in one invocation.
//!
//! For each ring size N and buffer size S every contender runs N processes
//! and times `iters` all-reduces after a warm-up; the slowest rank's mean
//! time t gives algbw = S/t and, as nccl-tests define it, bus bandwidth
//! busbw = algbw × 2(N−1)/N (the bytes each rank must move, per second).
//! Figures print as `name: value (baseline value, ratio)`.
//!
//! `ring-bench [--short]` runs everything (`--short`: 1 and 16 MiB, fewer
//! iterations); `ring-bench ceiling-rank …` is one rank of the tokio
//! ceiling, started by the benchmark itself.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;
use trainyard_bench::figure::{record_data, Better, Figure, Target};

const MIB: usize = 1 << 20;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("ceiling-rank") {
        return ceiling_rank(&args[1..]);
    }
    let short = args.iter().any(|a| a == "--short");
    let sizes: Vec<usize> = if short {
        vec![MIB, 16 * MIB]
    } else {
        vec![MIB, 16 * MIB, 64 * MIB, 256 * MIB]
    };
    let iters = if short { 3 } else { 5 };
    let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow::anyhow!("no binary folder"))?;
    let ring_bin = dir.join("trainyard-ring");
    anyhow::ensure!(
        ring_bin.exists(),
        "build trainyard-ring first (cargo build --release -p trainyard-dataplane)"
    );
    let gloo_script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ring/gloo_allreduce.py");
    let size_list = sizes
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    println!("# ring all-reduce bus bandwidth over loopback, {iters} iterations per size, slowest rank's mean");
    let mut rows = Vec::new();
    for world in [2u32, 3, 4] {
        let ours = spawn_ranks(world, |r| {
            let mut c = Command::new(&ring_bin);
            c.args([
                "--rank",
                &r.to_string(),
                "bench",
                "--sizes",
                &size_list,
                "--iters",
                &iters.to_string(),
            ]);
            c
        })?;
        let ceiling = spawn_ranks(world, |r| {
            let mut c = Command::new(&exe);
            c.args([
                "ceiling-rank",
                &r.to_string(),
                &size_list,
                &iters.to_string(),
            ]);
            c
        })?;
        let port = free_port()?;
        let out = Command::new(&python)
            .arg(&gloo_script)
            .args([
                world.to_string(),
                port.to_string(),
                iters.to_string(),
                size_list.clone(),
            ])
            .stderr(Stdio::inherit())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "the gloo baseline failed (is torch installed for {python}?)"
        );
        let gloo: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        for (i, &bytes) in sizes.iter().enumerate() {
            let bus = |secs: f64| {
                bytes as f64 / secs * 2.0 * f64::from(world - 1) / f64::from(world) / 1e9
            };
            let t_ours = worst(&ours, i);
            let t_ceiling = worst(&ceiling, i);
            let t_gloo = gloo["results"][i]["seconds"].as_f64().unwrap_or(f64::NAN);
            let (b_ours, b_gloo, b_ceiling) = (bus(t_ours), bus(t_gloo), bus(t_ceiling));
            let name = format!("ring busbw N={world} {} MiB", bytes / MIB);
            let ours_vs_gloo = Figure::new(
                "ring",
                name.clone(),
                b_ours,
                "GB/s",
                "gloo",
                b_gloo,
                Better::Higher,
            );
            // The target: no slower than gloo from 16 MiB up.
            if bytes >= 16 * MIB {
                ours_vs_gloo.target(Target::AtLeast(1.0)).emit();
            } else {
                ours_vs_gloo.emit();
            }
            Figure::new(
                "ring",
                name,
                b_ours,
                "GB/s",
                "tokio ring ceiling",
                b_ceiling,
                Better::Higher,
            )
            .emit();
            rows.push(serde_json::json!({"world": world, "bytes": bytes, "trainyard_gbps": b_ours, "gloo_gbps": b_gloo, "ceiling_gbps": b_ceiling}));
        }
    }
    record_data("ring", &serde_json::json!({"iters": iters, "rows": rows}));
    Ok(())
}

/// The slowest rank's time for size `i`.
fn worst(ranks: &[serde_json::Value], i: usize) -> f64 {
    ranks
        .iter()
        .filter_map(|r| r["results"][i]["seconds"].as_f64())
        .fold(0.0, f64::max)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts `world` ranks that print their address, read every rank's
/// address on stdin and print one JSON result line; returns the results.
fn spawn_ranks(world: u32, cmd: impl Fn(u32) -> Command) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut kids = Vec::new();
    for r in 0..world {
        let mut c = cmd(r);
        let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let out = BufReader::new(
            child
                .stdout
                .take()
                .ok_or_else(|| anyhow::anyhow!("no stdout"))?,
        );
        kids.push((child, out));
    }
    let mut addrs = Vec::new();
    for (_, out) in &mut kids {
        let mut l = String::new();
        out.read_line(&mut l)?;
        let v: serde_json::Value = serde_json::from_str(&l)?;
        addrs.push(v["addr"].as_str().unwrap_or_default().to_owned());
    }
    let peers = serde_json::to_string(&addrs)?;
    for (child, _) in &mut kids {
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdin"))?;
        writeln!(stdin, "{peers}")?;
    }
    let mut results = Vec::new();
    for (mut child, mut out) in kids {
        let mut l = String::new();
        out.read_line(&mut l)?;
        anyhow::ensure!(child.wait()?.success(), "a rank failed");
        results.push(serde_json::from_str(&l)?);
    }
    Ok(results)
}

/// One rank of the ceiling: sends `2(N−1)/N × size` bytes to the right
/// neighbour while receiving as many from the left, in 1 MiB writes, with
/// tokio; no arithmetic, no framing.
fn ceiling_rank(args: &[String]) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rank: u32 = args
        .first()
        .ok_or_else(|| anyhow::anyhow!("rank"))?
        .parse()?;
    let sizes: Vec<usize> = args
        .get(1)
        .ok_or_else(|| anyhow::anyhow!("sizes"))?
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let iters: u32 = args
        .get(2)
        .ok_or_else(|| anyhow::anyhow!("iters"))?
        .parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!(
            "{}",
            serde_json::json!({"addr": listener.local_addr()?.to_string()})
        );
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        let peers: Vec<String> = serde_json::from_str(&line)?;
        let world = peers.len() as u32;
        let right_addr = peers[((rank + 1) % world) as usize].clone();
        let (right, left) = tokio::join!(
            async {
                loop {
                    if let Ok(s) = tokio::net::TcpStream::connect(&right_addr).await {
                        return s;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            listener.accept()
        );
        let (mut right, (mut left, _)) = (right, left?);
        right.set_nodelay(true)?;
        let send_buf = vec![1u8; MIB];
        let mut recv_buf = vec![0u8; MIB];
        let mut results = Vec::new();
        for &bytes in &sizes {
            let volume = bytes * 2 * (world as usize - 1) / world as usize;
            let mut timed = 0.0;
            for it in 0..=iters {
                let t = Instant::now();
                let send = async {
                    let mut left_to_send = volume;
                    while left_to_send > 0 {
                        let n = left_to_send.min(MIB);
                        right.write_all(&send_buf[..n]).await?;
                        left_to_send -= n;
                    }
                    Ok::<_, std::io::Error>(())
                };
                let recv = async {
                    let mut left_to_recv = volume;
                    while left_to_recv > 0 {
                        let n = left_to_recv.min(MIB);
                        left.read_exact(&mut recv_buf[..n]).await?;
                        left_to_recv -= n;
                    }
                    Ok::<_, std::io::Error>(())
                };
                let (a, b) = tokio::join!(send, recv);
                a?;
                b?;
                if it > 0 {
                    timed += t.elapsed().as_secs_f64();
                }
            }
            results.push(serde_json::json!({"bytes": bytes, "seconds": timed / f64::from(iters)}));
        }
        println!(
            "{}",
            serde_json::json!({"rank": rank, "world": world, "results": results})
        );
        Ok(())
    })
}
