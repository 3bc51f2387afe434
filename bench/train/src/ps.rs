//! Parameter-server goodput benchmark: the executor's real shard servers
//! (`ps::serve_shard`, each behind its own data-plane listener, as on
//! separate executors; sync consistency, SGD applied to every version) serve
//! a 64 MiB model to 1–4 workers, which pull every shard concurrently and
//! push a gradient slice to each, speaking the PS wire protocol over
//! authenticated loopback TCP. Goodput is the model bytes moved (pulled +
//! pushed) per second. The ceiling is measured in the same invocation by a
//! plain tokio sender and receiver moving the same bytes over one loopback
//! connection.
//!
//! `cargo run --release -p trainyard-train-bench --bin ps-bench [-- --quick]`
//! after `source scripts/common.sh && torch_env`. Prints GB/s per
//! (workers, shards) and the ratio to the ceiling (target ≥ 0.6).

use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trainyard_bench::figure::{record_data, Better, Figure, Target};
use trainyard_common::cluster::{Assignment, PsPeer, Range, RoleKey, RoleKind, WorkerPeer};
use trainyard_common::spec::Strategy;
use trainyard_dataplane::handshake::Hello;
use trainyard_dataplane::ps::{self, DataCursor, Message, PushHeader};
use trainyard_dataplane::{plane, DataPlane};
use trainyard_shutdown::Shutdown;

const MODEL_BYTES: usize = 64 << 20;
const SECRET: &str = "ps-bench-secret";

fn spec() -> trainyard_common::JobSpec {
    serde_json::from_value::<trainyard_common::JobSpec>(serde_json::json!({
        "name": "ps-bench",
        "model": {"kind": "mlp", "inputs": 4, "hidden": [4], "outputs": 2},
        "dataset": {"kind": "classification", "samples": 64, "features": 4, "classes": 2},
        "loss": "cross_entropy",
        "optimizer": {"kind": "sgd", "lr": 0.01},
        "batch_size": 8,
        "steps": 1,
        "strategy": "parameter_server",
        "parameter_servers": 1,
        "consistency": "sync"
    }))
    .expect("a valid spec")
}

/// A running shard tier: its servers' threads and addresses.
struct Tier {
    stop: Shutdown,
    threads: Vec<std::thread::JoinHandle<()>>,
    peers: Vec<PsPeer>,
    job: uuid::Uuid,
}

fn start_tier(shards: u32, workers: u32) -> Tier {
    let n = (MODEL_BYTES / 4) as u64;
    let job = uuid::Uuid::new_v4();
    let stop = Shutdown::new();
    let planes: Vec<Arc<DataPlane>> = (0..shards)
        .map(|_| Arc::new(DataPlane::bind("127.0.0.1:0").expect("a listener")))
        .collect();
    let peers: Vec<PsPeer> = (0..shards)
        .map(|s| PsPeer {
            shard: s,
            standby: false,
            executor_id: uuid::Uuid::new_v4(),
            address: planes[s as usize].local_addr().to_string(),
            ranges: vec![Range {
                param: "w".into(),
                start: n * u64::from(s) / u64::from(shards),
                end: n * u64::from(s + 1) / u64::from(shards),
                buffer: false,
            }],
        })
        .collect();
    let workers: Vec<WorkerPeer> = (0..workers)
        .map(|r| WorkerPeer {
            rank: r,
            executor_id: uuid::Uuid::new_v4(),
            address: "127.0.0.1:1".into(),
            device: 0,
        })
        .collect();
    let threads = (0..shards)
        .map(|s| {
            let a = Assignment {
                key: RoleKey {
                    job_id: job,
                    generation: 1,
                    role: RoleKind::Ps,
                    index: s,
                },
                device: None,
                strategy: Strategy::ParameterServer,
                secret: SECRET.into(),
                spec: spec(),
                workers: workers.clone(),
                parameter_servers: peers.clone(),
                resume: None,
                data_policy: trainyard_common::artifact::DataPolicy::unrestricted(),
                checkpoint_wanted: false,
                restarts: None,
            };
            let (stop, plane) = (stop.clone(), planes[s as usize].clone());
            std::thread::spawn(move || {
                let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
                trainyard_executor::ps::serve_shard(
                    &a,
                    &stop,
                    &tx,
                    &plane,
                    None,
                    trainyard_executor::storage::no_storage(),
                    &trainyard_executor::context::Context::for_tests(),
                );
            })
        })
        .collect();
    Tier {
        stop,
        threads,
        peers,
        job,
    }
}

fn call(s: &mut TcpStream, m: Message, payload: &[f32], buf: &mut Vec<f32>, len: usize) -> Message {
    ps::write_message(s, 1, &m, payload).expect("a request");
    let reply = ps::read_message(s).expect("a reply");
    if reply.message.carries_values() {
        ps::read_values(s, &reply, len, buf).expect("a payload");
    }
    reply.message
}

/// Runs `steps` pull+push rounds of `workers` workers; returns seconds,
/// and rank 0's mean seconds per measured step in its pull calls and in its
/// push calls (a push is answered once applied, so in sync mode the push
/// call holds the update; over all shards, which run concurrently).
fn run(tier: &Tier, workers: u32, warmup: u32, steps: u32) -> (f64, f64, f64) {
    let never = Shutdown::new();
    let barrier = std::sync::Barrier::new(workers as usize + 1);
    let mut elapsed = 0.0;
    let phases = std::sync::Mutex::new((0.0f64, 0.0f64));
    std::thread::scope(|scope| {
        for rank in 0..workers {
            let (barrier, never, phases) = (&barrier, &never, &phases);
            scope.spawn(move || {
                let mut links: Vec<(TcpStream, usize, Vec<f32>, Vec<f32>)> = tier
                    .peers
                    .iter()
                    .map(|p| {
                        let hello = Hello {
                            job: tier.job,
                            generation: 1,
                            kind: trainyard_dataplane::EndpointRole::ParameterServer as u8,
                            from: rank,
                            to: p.shard,
                        };
                        let s = plane::connect(
                            &p.address,
                            &hello,
                            SECRET.as_bytes(),
                            Instant::now() + Duration::from_secs(10),
                            never,
                        )
                        .expect("a connection");
                        s.set_nodelay(true).expect("nodelay");
                        let len = (p.ranges[0].end - p.ranges[0].start) as usize;
                        (s, len, vec![0f32; len], vec![1e-6f32; len])
                    })
                    .collect();
                if rank == 0 {
                    for (s, len, buf, _) in &mut links {
                        let init = vec![0.5f32; *len];
                        let m = Message::Init {
                            version: 0,
                            cursor: DataCursor::default(),
                        };
                        call(s, m, &init, buf, *len);
                    }
                }
                barrier.wait();
                for (version, step) in (0..u64::from(warmup + steps)).zip(0..) {
                    if step == warmup {
                        barrier.wait();
                    }
                    let times = std::thread::scope(|inner| {
                        let calls: Vec<_> = links
                            .iter_mut()
                            .map(|(s, len, buf, grad)| {
                                inner.spawn(move || {
                                    let t0 = Instant::now();
                                    let pull = Message::Pull { at_least: version };
                                    let Message::Weights { version: at, .. } =
                                        call(s, pull, &[], buf, *len)
                                    else {
                                        panic!("a pull answered without values");
                                    };
                                    let t1 = Instant::now();
                                    let push = Message::Push(PushHeader {
                                        computed_at: at,
                                        samples: 1,
                                        lr: 0.01,
                                        next_cursor: DataCursor::default(),
                                        checkpoint: None,
                                    });
                                    call(s, push, grad, buf, 0);
                                    (t1 - t0, t1.elapsed())
                                })
                            })
                            .collect();
                        calls
                            .into_iter()
                            .filter_map(|c| c.join().ok())
                            .fold((0.0f64, 0.0f64), |(p, q), (a, b)| {
                                (p.max(a.as_secs_f64()), q.max(b.as_secs_f64()))
                            })
                    });
                    if rank == 0 && step >= warmup {
                        let mut ph = phases.lock().unwrap_or_else(|p| p.into_inner());
                        ph.0 += times.0 / f64::from(steps);
                        ph.1 += times.1 / f64::from(steps);
                    }
                }
                barrier.wait();
            });
        }
        barrier.wait(); // connected
        barrier.wait(); // warm-up done
        let started = Instant::now();
        barrier.wait(); // all steps done
        elapsed = started.elapsed().as_secs_f64();
    });
    let (pull, push) = phases.into_inner().unwrap_or_else(|p| p.into_inner());
    (elapsed, pull, push)
}

/// A plain tokio sender and receiver on one loopback connection: GB/s.
fn ceiling(bytes: usize) -> f64 {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let receiver = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 8 << 20];
            let mut got = 0;
            while got < bytes {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0);
                got += n;
            }
        });
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let chunk = vec![7u8; 8 << 20];
        let started = Instant::now();
        let mut sent = 0;
        while sent < bytes {
            let n = chunk.len().min(bytes - sent);
            s.write_all(&chunk[..n]).await.unwrap();
            sent += n;
        }
        receiver.await.unwrap();
        bytes as f64 / started.elapsed().as_secs_f64() / 1e9
    })
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (warmup, steps) = if quick { (1, 3) } else { (2, 8) };
    tch::set_num_threads(1);
    // The ceiling, measured with as many bytes as the largest case moves.
    let ceil = ceiling(MODEL_BYTES * 2 * 4 * steps as usize);
    println!(
        "# parameter servers: a {} MiB model, sync SGD through the executor's shard servers, {steps} steps after {warmup} warm-up; loopback ceiling (one tokio sender → receiver) {ceil:.2} GB/s",
        MODEL_BYTES >> 20
    );
    // What the shard's update alone costs (the fused SGD pass over the
    // whole model, as one shard applies it), for reading the rows below.
    let update_ms = {
        let n = MODEL_BYTES / 4;
        let mut opt =
            trainyard_executor::replica::optim::SliceOptimizer::new(spec().optimizer(), n);
        let (mut w, g) = (vec![0.5f32; n], vec![1e-6f32; n]);
        opt.step(&mut w, &g, None, 1.0, 0.01);
        let t = Instant::now();
        for _ in 0..3 {
            opt.step(&mut w, &g, None, 1.0, 0.01);
        }
        t.elapsed().as_secs_f64() / 3.0 * 1e3
    };
    println!(
        "#   the SGD update of the whole {} MiB alone: {update_ms:.1} ms",
        MODEL_BYTES >> 20
    );
    let mut rows = Vec::new();
    for shards in 1..=2u32 {
        for workers in 1..=4u32 {
            let tier = start_tier(shards, workers);
            let (secs, pull_s, push_s) = run(&tier, workers, warmup, steps);
            let moved = MODEL_BYTES as f64 * 2.0 * f64::from(workers) * f64::from(steps);
            let goodput = moved / secs / 1e9;
            Figure::new(
                "ps",
                format!("ps goodput {workers} worker(s) {shards} shard(s)"),
                goodput,
                "GB/s",
                "loopback ceiling",
                ceil,
                Better::Higher,
            )
            .target(Target::AtLeast(0.6))
            .emit();
            println!(
                "#   {workers} worker(s), {shards} shard(s): rank 0's step {:.1} ms = pull {:.1} ms + push and update {:.1} ms",
                secs / f64::from(steps) * 1e3,
                pull_s * 1e3,
                push_s * 1e3
            );
            rows.push(serde_json::json!({"workers": workers, "shards": shards, "goodput_gbps": goodput,
                "step_ms": secs / f64::from(steps) * 1e3, "pull_ms": pull_s * 1e3, "push_ms": push_s * 1e3}));
            tier.stop.trigger();
            for t in tier.threads {
                let _ = t.join();
            }
        }
    }
    record_data(
        "ps",
        &serde_json::json!({"model_bytes": MODEL_BYTES, "steps": steps, "warmup": warmup, "update_ms": update_ms,
            "ceiling_gbps": ceil, "rows": rows}),
    );
}
