//! `trainyard-ring`: runs one rank of a ring all-reduce in its own process,
//! for the multi-process correctness tests and the bus-bandwidth benchmark.
//!
//! The process binds a data-plane listener, prints `{"addr": …}` on a line,
//! reads the JSON array of every rank's address from standard input, builds
//! the ring and then either checks sums of seeded random inputs (`check`) or
//! times all-reduces of several sizes (`bench`), printing one JSON line.
//! It listens on 127.0.0.1 unless `--listen` names another address.

use clap::{Parser, Subcommand};
use std::io::BufRead;
use std::time::{Duration, Instant};
use trainyard_dataplane::{DataPlane, Ring, RingConfig};
use trainyard_shutdown::Shutdown;
use uuid::Uuid;

#[derive(Debug, Parser)]
#[command(
    name = "trainyard-ring",
    about = "One rank of a ring all-reduce (tests and benchmarks)"
)]
struct Cli {
    /// This rank.
    #[arg(long)]
    rank: u32,
    /// The job id the ranks share (any UUID; all ranks must agree).
    #[arg(long, default_value = "00000000-0000-0000-0000-000000000001")]
    job: Uuid,
    /// The shared secret.
    #[arg(long, default_value = "ring-secret")]
    secret: String,
    /// Where the data-plane listener binds (another host's address in the
    /// slow-links benchmark's lab; port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// All-reduce seeded random vectors and compare with the exact sum.
    Check {
        /// Elements.
        #[arg(long)]
        len: usize,
        /// Seed of the inputs.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Segment size in elements (small values exercise the pipeline).
        #[arg(long)]
        segment: Option<usize>,
        /// Repetitions (buffers are reused).
        #[arg(long, default_value_t = 2)]
        repeat: u32,
        /// All-reduces up to this many bytes run without the sending thread
        /// (0: always pipelined).
        #[arg(long)]
        inline_bytes: Option<usize>,
    },
    /// Time all-reduces of the given sizes.
    Bench {
        /// Sizes in bytes.
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
        /// Timed iterations per size (after one warm-up).
        #[arg(long, default_value_t = 5)]
        iters: u32,
    },
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Input `i` of `rank`: uniform in [-1, 1).
fn input(seed: u64, rank: u32, i: usize) -> f32 {
    let bits = splitmix(seed ^ (u64::from(rank) << 40) ^ i as u64);
    ((bits >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let plane = DataPlane::bind(&cli.listen)?;
    println!(
        "{}",
        serde_json::json!({ "addr": plane.local_addr().to_string() })
    );
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let peers: Vec<String> = serde_json::from_str(&line)?;
    let world = peers.len() as u32;
    let stop = Shutdown::new();
    let cfg = RingConfig {
        job: cli.job,
        generation: 1,
        rank: cli.rank,
        peers,
        secret: cli.secret.into_bytes(),
        connect_timeout: Duration::from_secs(30),
        collective_timeout: Duration::from_secs(120),
    };
    let mut ring = Ring::connect(&plane, &cfg, &stop)?;
    match cli.what {
        What::Check {
            len,
            seed,
            segment,
            repeat,
            inline_bytes,
        } => {
            if let Some(s) = segment {
                ring.set_segment(s);
            }
            if let Some(b) = inline_bytes {
                ring.set_inline_bytes(b);
            }
            let want: Vec<f64> = (0..len)
                .map(|i| (0..world).map(|r| f64::from(input(seed, r, i))).sum())
                .collect();
            let mut v = vec![0f32; len];
            let mut max_err = 0f64;
            let mut hash = 0xcbf2_9ce4_8422_2325u64;
            for _ in 0..repeat {
                for (i, x) in v.iter_mut().enumerate() {
                    *x = input(seed, cli.rank, i);
                }
                ring.allreduce(&mut v, &stop)?;
                for (got, want) in v.iter().zip(&want) {
                    max_err = max_err.max((f64::from(*got) - want).abs());
                }
            }
            for x in &v {
                hash = (hash ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3);
            }
            println!(
                "{}",
                serde_json::json!({ "rank": cli.rank, "world": world, "len": len, "max_abs_err": max_err, "hash": format!("{hash:016x}") })
            );
        }
        What::Bench { sizes, iters } => {
            let mut results = Vec::new();
            for bytes in sizes {
                let mut v: Vec<f32> = (0..bytes / 4).map(|i| input(7, cli.rank, i)).collect();
                ring.allreduce(&mut v, &stop)?;
                // Line the ranks up before timing.
                ring.allgather_u64(&[0], &stop)?;
                let t = Instant::now();
                for _ in 0..iters {
                    ring.allreduce(&mut v, &stop)?;
                }
                let secs = t.elapsed().as_secs_f64() / f64::from(iters);
                results.push(serde_json::json!({ "bytes": bytes, "seconds": secs }));
            }
            println!(
                "{}",
                serde_json::json!({ "rank": cli.rank, "world": world, "results": results })
            );
        }
    }
    Ok(())
}
