//! A dataset bigger than a worker's data budget: 32 npz shards, over 1 GiB,
//! on the S3 server, streamed by a ring that loses a rank to SIGKILL and
//! gains a new executor in the middle of its one epoch. The epoch's
//! accounting the ranks report (a count and an order-independent hash of
//! the sample ids, which the shards carry) must equal the training set's,
//! computed by Python when it wrote the shards; every executor's peak RSS
//! is printed and bounded; and the held-out accuracy, measured by PyTorch
//! on the downloaded weights over a Parquet file written by pyarrow,
//! matches a run on the same data as one file.

use serde_json::json;
use std::process::Command;
use std::time::Duration;
use trainyard_common::JobState;
use trainyard_e2e::{eventually, kill9, Platform, TestS3};

/// Shards, samples per shard, features: 32 × 16448 × (512 × 4 + 16) bytes
/// ≈ 1.01 GiB.
const SHARDS: usize = 32;
const PER_SHARD: usize = 16_448;
const FEATURES: usize = 512;
/// The executors' data memory budget, in MiB.
const BUDGET_MB: u64 = 192;

const WRITE_SHARDS: &str = r#"
import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
out, shards, per, f, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), 10
rng = np.random.default_rng(11)
centers = rng.normal(0, 0.15, (k, f)).astype(np.float32)
def mix(ids):
    z = ids.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
def make(n, first):
    y = rng.integers(0, k, n).astype(np.int64)
    x = centers[y] + rng.standard_normal((n, f), dtype=np.float32)
    ids = (np.arange(first, first + n, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(977)).astype(np.int64)
    return x.astype(np.float32), y, ids
total = np.uint64(0)
xs, ys = [], []
with np.errstate(over="ignore"):
    for i in range(shards):
        x, y, ids = make(per, i * per)
        np.savez(f"{out}/part-{i:03}.npz", x=x, y=y, id=ids)
        total = total + np.sum(mix(ids), dtype=np.uint64)
        xs.append(x); ys.append(y)
np.savez(f"{out}/single.npz", x=np.concatenate(xs), y=np.concatenate(ys))
del xs, ys
x, y, _ = make(8192, 1 << 40)
t = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), f), "y": y})
pq.write_table(t, f"{out}/eval.parquet", row_group_size=2048)
print(shards * per, int(total))
"#;

/// Peak resident memory of process `pid`, in MiB (`VmHWM`).
fn peak_rss_mb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb >> 10)
}

/// Peak resident memory, in MiB, of an executor that only loads libtorch
/// and runs its probe (`trainyard-executor --probe`): the floor every
/// executor stands on before any data.
fn executor_floor_mb(python: &str) -> u64 {
    let exe = trainyard_e2e::binary("trainyard-executor").expect("the executor binary");
    let out = Command::new(python)
        .args([
            "-c",
            "import resource, subprocess, sys\n\
             subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)\n\
             print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
        ])
        .arg(exe)
        .arg("--probe")
        .output()
        .expect("running the probe");
    assert!(
        out.status.success(),
        "the probe: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kb: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a size in KiB");
    kb >> 10
}

/// Ranks of the ring of `generation`, from its "rank r of n starts" lines.
fn ring_size(p: &Platform, id: &str, generation: i64) -> Option<usize> {
    let logs = p.logs(id);
    let line = logs
        .iter()
        .find(|l| l.generation == generation && l.message.contains(" starts on "))?;
    line.message
        .split(" of ")
        .nth(1)?
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn spec(name: &str, dataset: serde_json::Value, workers: u32, batch: u32) -> serde_json::Value {
    json!({
        "name": name,
        "model": {"kind": "mlp", "inputs": FEATURES, "hidden": [32], "outputs": 10},
        "dataset": dataset,
        "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "lr": 0.001},
        "batch_size": batch, "epochs": 1, "seed": 5,
        "strategy": "allreduce",
        "workers": {"min": workers.min(2), "max": workers},
        "checkpoint": {"at_end": false},
        // One worker per executor (they offer 2 GiB).
        "resources": {"memory_mb": 1536}
    })
}

#[test]
fn a_gib_of_shards_on_s3_is_trained_exactly_once_through_a_kill_and_a_join() {
    let s3 = TestS3::from_env();
    let dir = std::env::temp_dir().join(format!("trainyard-sharded-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args(["-c", WRITE_SHARDS])
        .arg(&dir)
        .args([SHARDS, PER_SHARD, FEATURES].map(|v| v.to_string()))
        .output()
        .expect("running Python");
    assert!(
        out.status.success(),
        "writing the shards: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut words = stdout.split_whitespace();
    let want_samples: u64 = words.next().unwrap().parse().unwrap();
    let want_hash: u64 = words.next().unwrap().parse().unwrap();
    let mut bytes = 0;
    for i in 0..SHARDS {
        let name = format!("part-{i:03}.npz");
        bytes += std::fs::metadata(dir.join(&name)).unwrap().len();
        s3.upload(&format!("data/train/{name}"), &dir.join(&name));
    }
    assert!(bytes >= 1 << 30, "{bytes} bytes of shards");
    let eval_url = s3.upload("data/eval/eval.parquet", &dir.join("eval.parquet"));
    println!(
        "{SHARDS} shards, {:.2} GiB, {want_samples} samples on the S3 server",
        bytes as f64 / f64::from(1 << 30)
    );

    let p = Platform::builder("sharded")
        .s3(&s3)
        .heartbeat_misses(10)
        .executor_env("TRAINYARD_DATA_MEMORY_MB", &BUDGET_MB.to_string())
        // Steps of a few ms more, so that the kill and the join both land
        // well inside the one epoch.
        .executor_env("TRAINYARD_SLOW_WORKER", "*:4")
        .start();
    let mut execs: Vec<_> = (0..3).map(|i| p.executor(&format!("shards-{i}"))).collect();
    let sharded = spec(
        "sharded-gib",
        json!({"kind": "file", "url": format!("{}/data/train/part-*.npz", s3.url),
               "eval_url": eval_url, "id_column": "id", "shuffle_buffer": 4096}),
        3,
        64,
    );
    let id = p.submit(&sharded);
    let full = eventually(Duration::from_secs(120), || {
        let g = p.job(&id).generation;
        (ring_size(&p, &id, g) == Some(3)).then_some(g)
    })
    .unwrap_or_else(|| panic!("a ring of 3 forms: {:?}", p.log_messages(&id)));
    p.wait_steps(&id, 40, Duration::from_secs(120));

    // The same data as one file, on an executor of its own, meanwhile.
    let single_exec = p.executor("single");
    let single_spec = spec(
        "single-file",
        json!({"kind": "file", "url": format!("file://{}", dir.join("single.npz").display()),
               "eval_url": eval_url}),
        1,
        192,
    );
    let single = p.submit(&single_spec);

    let victim = execs.remove(1);
    let victim_rss = peak_rss_mb(victim.pid());
    kill9(victim.pid());
    eventually(Duration::from_secs(60), || {
        p.log_messages(&id)
            .into_iter()
            .find(|l| l.contains("ring of 2 rebuilt"))
    })
    .unwrap_or_else(|| panic!("the ring rebuilds with 2: {:?}", p.log_messages(&id)));
    execs.push(p.executor("shards-new"));
    eventually(Duration::from_secs(90), || {
        let g = p.job(&id).generation;
        (g > full + 1 && ring_size(&p, &id, g) == Some(3)).then_some(g)
    })
    .unwrap_or_else(|| panic!("the ring grows back to 3: {:?}", p.log_messages(&id)));
    let job = p.wait_end(&id, Duration::from_secs(600));
    assert_eq!(
        job.state,
        JobState::Succeeded,
        "{job:?} {:?}",
        p.log_messages(&id)
    );
    assert!(
        p.log_messages(&id)
            .iter()
            .any(|l| l.contains("received weights and optimizer state")),
        "the new executor joined the epoch under way"
    );

    // The epoch's accounting, as rank 0 logged it.
    let account = eventually(Duration::from_secs(20), || {
        p.log_messages(&id)
            .into_iter()
            .find(|l| l.starts_with("epoch 0 consumed "))
    })
    .unwrap_or_else(|| panic!("an epoch-0 accounting line: {:?}", p.log_messages(&id)));
    let samples: u64 = account
        .trim_start_matches("epoch 0 consumed ")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let hash = u64::from_str_radix(account.rsplit(' ').next().unwrap(), 16).unwrap();
    println!("{account}; the training set: {want_samples} samples, hash {want_hash:016x}");
    assert_eq!(
        (samples, hash),
        (want_samples, want_hash),
        "every sample exactly once"
    );

    let mut rss: Vec<(String, u64)> = vec![("shards-1 (killed)".into(), victim_rss)];
    for (i, e) in execs.iter().enumerate() {
        rss.push((format!("sharded executor {i}"), peak_rss_mb(e.pid())));
    }
    let single_job = p.wait_end(&single, Duration::from_secs(600));
    assert_eq!(single_job.state, JobState::Succeeded, "{single_job:?}");
    let single_rss = peak_rss_mb(single_exec.pid());
    for (name, mb) in &rss {
        println!("peak RSS of {name}: {mb} MiB");
    }
    println!("peak RSS of the single-file executor: {single_rss} MiB (the whole set in memory)");
    // Data may take about twice its budget above the floor (decoded
    // windows and units within the budget, plus the shard in flight from
    // the store), whatever the dataset's size; 128 MiB more for allocator
    // slack and the libtorch pages training touches beyond the probe's.
    let floor = executor_floor_mb(&python);
    let bound = floor + 2 * BUDGET_MB + 128;
    let dataset_mb = bytes >> 20;
    println!(
        "an executor's floor (libtorch loaded, its probe run): {floor} MiB; bound {bound} MiB; the dataset {dataset_mb} MiB"
    );
    for (name, mb) in &rss {
        assert!(
            *mb > 0 && *mb <= bound,
            "{name} peaked at {mb} MiB, over {bound} MiB: the floor {floor} MiB, twice the data budget ({BUDGET_MB} MiB) and 128 MiB"
        );
        // Streaming saves more than the whole dataset against holding it.
        assert!(
            mb + dataset_mb < single_rss,
            "{name} peaked at {mb} MiB: not a dataset ({dataset_mb} MiB) below the single-file executor ({single_rss} MiB)"
        );
    }
    // Judged by PyTorch on the weights a user downloads, over every row of
    // the held-out Parquet file (written apart from the training shards).
    let eval_file = dir.join("eval.parquet");
    let a = p.pytorch_accuracy(&id, &sharded, &eval_file, &dir);
    let b = p.pytorch_accuracy(&single, &single_spec, &eval_file, &dir);
    println!(
        "held-out accuracy (PyTorch, 8192 rows): sharded {:.2}%, single file {:.2}% (the platform reported {:.2}% and {:.2}%)",
        a * 100.0,
        b * 100.0,
        p.result_accuracy(&id) * 100.0,
        p.result_accuracy(&single) * 100.0
    );
    assert!((a - b).abs() <= 0.01, "sharded {a} vs single file {b}");
    assert!(a > 0.5, "the model learned something: {a}");
    let _ = std::fs::remove_dir_all(&dir);
}
