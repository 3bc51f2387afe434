//! Data benchmark: what streaming a sharded dataset costs a training job.
//! The same job (an MLP 256-1024-1024-10, batches of 256) is trained by the
//! executor's own loop (a ring of one) on the same samples three ways in one
//! invocation: in memory (one npz loaded whole), streamed from local npz
//! shards through a glob, and streamed from the S3 server (Garage) when
//! `TRAINYARD_TEST_S3_*` name one (`scripts/garage.sh`'s `start_test_s3`),
//! each from a cold cache tier. Figures: the step time of each streamed run
//! against in memory (target ≤ 1.05 while a step computes longer than its
//! samples take to read), the data-stall share (waiting for a batch over
//! the step), and the loader's read throughput over one epoch against a
//! plain parallel reader of the same objects (8 concurrent whole-object
//! reads).
//!
//!
//! **JPEG.** A compute-bound job (a CNN 3×32×32 → 32, 64 channels → 256
//! → 10, batches of 128) trains on the same images in memory (float
//! tensors in one npz) and as JPEGs in WebDataset tar shards, decoded by
//! the executor's loader (one decode thread per rank: the loader's own)
//! with a seeded horizontal flip and a normalization per batch; target ≤
//! 1.05 on the step time.
//!
//! `cargo run --release -p trainyard-train-bench --bin data-bench
//! [-- --quick]` after `source scripts/common.sh && torch_env`.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tch::{Device, Tensor};
use trainyard_bench::figure::{record_data, Better, Figure, Target};
use trainyard_common::spec::UncheckedJobSpec;
use trainyard_executor::data::{Cursor, Dataset};
use trainyard_executor::replica::process::Host;
use trainyard_executor::ring;
use trainyard_executor::storage::Fetcher;
use trainyard_shutdown::Shutdown;

const SHARDS: usize = 24;
const PER_SHARD: i64 = 4096;
const FEATURES: i64 = 256;

/// JPEG shards and images per shard of the JPEG section.
const JPEG_SHARDS: usize = 8;
const JPEG_PER_SHARD: usize = 2048;

/// The CNN job of the JPEG section over `dataset`.
fn image_job(dataset: serde_json::Value, steps: u64) -> UncheckedJobSpec {
    serde_json::from_value::<trainyard_common::JobSpec>(serde_json::json!({
        "name": "data-bench-jpeg",
        "model": {"kind": "cnn", "channels": 3, "height": 32, "width": 32,
                  "conv_channels": [32, 64], "hidden": 256, "classes": 10},
        "dataset": dataset,
        "loss": "cross_entropy",
        "optimizer": {"kind": "sgd", "lr": 0.01},
        "batch_size": 128,
        "steps": steps,
        "eval_fraction": 0.0,
        "checkpoint": {"at_end": false}
    }))
    .expect("a valid spec")
    .into()
}

/// Writes the JPEG section's images: WebDataset shards under `dir/wds`
/// and the same pixels as floats in `dir/images.npz`.
fn write_images(dir: &Path) {
    use image::codecs::jpeg::JpegEncoder;
    let wds = dir.join("wds");
    std::fs::create_dir_all(&wds).expect("a folder");
    let (mut floats, mut labels) = (Vec::new(), Vec::new());
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for s in 0..JPEG_SHARDS {
        let file = std::fs::File::create(wds.join(format!("shard-{s:06}.tar"))).expect("a shard");
        let mut tar = tar::Builder::new(file);
        for i in 0..JPEG_PER_SHARD {
            // Smooth images with some texture: JPEGs of a realistic size.
            let (a, b, c) = (next() % 256, next() % 256, next() % 7 + 1);
            let mut rgb = Vec::with_capacity(32 * 32 * 3);
            for y in 0..32u64 {
                for x in 0..32u64 {
                    let noise = next() % 24;
                    rgb.push(((a + x * c + noise) % 256) as u8);
                    rgb.push(((b + y * c + noise) % 256) as u8);
                    rgb.push((((x + y) * 4 + noise) % 256) as u8);
                }
            }
            let class = (next() % 10) as i64;
            let mut jpeg = Vec::new();
            JpegEncoder::new_with_quality(&mut jpeg, 90)
                .encode(&rgb, 32, 32, image::ExtendedColorType::Rgb8)
                .expect("a JPEG");
            for (name, bytes) in [
                (format!("s{i:06}.jpg"), jpeg),
                (format!("s{i:06}.cls"), class.to_string().into_bytes()),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_size(bytes.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                tar.append_data(&mut h, name, bytes.as_slice())
                    .expect("a member");
            }
            // Planar, as the loader lays images out.
            floats.extend(
                (0..3)
                    .flat_map(|ch| (0..1024).map(move |p| (ch, p)))
                    .map(|(ch, p)| f32::from(rgb[p * 3 + ch]) / 255.0),
            );
            labels.push(class);
        }
        tar.finish().expect("a tar");
    }
    let n = (JPEG_SHARDS * JPEG_PER_SHARD) as i64;
    Tensor::write_npz(
        &[
            ("x", Tensor::from_slice(&floats).reshape([n, 3, 32, 32])),
            ("y", Tensor::from_slice(&labels)),
        ],
        dir.join("images.npz"),
    )
    .expect("the images in memory");
}

/// Trains the CNN `steps` steps on `dataset`: ms per step, stall share.
fn train_images(dataset: serde_json::Value, steps: u64) -> (f64, f64) {
    train_spec(&image_job(dataset, steps), &Fetcher::local_only())
}

fn job(url: &str, steps: u64) -> UncheckedJobSpec {
    serde_json::from_value::<trainyard_common::JobSpec>(serde_json::json!({
        "name": "data-bench",
        "model": {"kind": "mlp", "inputs": FEATURES, "hidden": [1024, 1024], "outputs": 10},
        "dataset": {"kind": "file", "url": url, "shuffle_buffer": 4096, "memory_mb": 128},
        "loss": "cross_entropy",
        "optimizer": {"kind": "sgd", "lr": 0.01},
        "batch_size": 256,
        "steps": steps,
        "eval_fraction": 0.0,
        "checkpoint": {"at_end": false}
    }))
    .expect("a valid spec")
    .into()
}

/// Trains `steps` steps; returns ms per step (after the first few) and
/// the share of step time spent waiting for data.
fn train(url: &str, steps: u64, fetcher: &Fetcher) -> (f64, f64) {
    train_spec(&job(url, steps), fetcher)
}

/// Trains `spec` by the executor's loop (a ring of one); ms per step
/// (after the first few, which include the first fetch and decode) and
/// the share of step time spent waiting for data.
fn train_spec(spec: &UncheckedJobSpec, fetcher: &Fetcher) -> (f64, f64) {
    let stop = Shutdown::new();
    let (mut total, mut data, mut n) = (0.0, 0.0, 0);
    let mut from = None;
    ring::run(
        spec,
        Device::Cpu,
        fetcher,
        &Host::for_tests(),
        &stop,
        &mut |s| {
            // The first steps include the first shard's fetch and decode.
            if s.step > 5 {
                from.get_or_insert_with(Instant::now);
                total += s.data_seconds + s.compute_seconds + s.comm_seconds;
                data += s.data_seconds;
                n += 1;
            }
        },
    )
    .expect("training");
    let wall = from.map_or(0.0, |f| f.elapsed().as_secs_f64());
    (wall * 1000.0 / f64::from(n.max(1)), data / total.max(1e-9))
}

/// MB/s of the loader over one epoch (rank 0 of 1, no training).
fn stream_rate(url: &str, fetcher: &Fetcher) -> f64 {
    let spec = job(url, 1);
    let d = Dataset::load(&spec, fetcher).expect("the dataset");
    let bytes = d.train_len() as f64 * (FEATURES as f64 * 4.0 + 8.0);
    let started = Instant::now();
    let rx = d.stream(&spec, 0, 1, Cursor::default());
    while let Ok(b) = rx.recv() {
        if b.next.epoch > 0 {
            break;
        }
    }
    bytes / started.elapsed().as_secs_f64() / 1e6
}

fn cold_fetcher(
    dir: &Path,
    name: &str,
    options: &[(String, String)],
    rt: &tokio::runtime::Runtime,
) -> Fetcher {
    let cache = trainyard_store::cache::Cache::open(&dir.join(name), 4 << 30).expect("a cache");
    Fetcher::new(options.to_vec(), Arc::new(cache), rt.handle().clone())
}

/// The benchmark's shards under `shards` and the whole set in one file
/// (its path), seeded.
fn write_shards(dir: &Path, shards: &Path) -> std::path::PathBuf {
    tch::manual_seed(1);
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for i in 0..SHARDS {
        let x = Tensor::randn([PER_SHARD, FEATURES], (tch::Kind::Float, Device::Cpu));
        let y = Tensor::randint(10, [PER_SHARD], (tch::Kind::Int64, Device::Cpu));
        Tensor::write_npz(
            &[("x", &x), ("y", &y)],
            shards.join(format!("part-{i:03}.npz")),
        )
        .expect("a shard");
        xs.push(x);
        ys.push(y);
    }
    let whole = dir.join("whole.npz");
    Tensor::write_npz(
        &[("x", Tensor::cat(&xs, 0)), ("y", Tensor::cat(&ys, 0))],
        &whole,
    )
    .expect("the whole set");
    drop((xs, ys));
    whole
}

/// The shards on S3: their folder's URL, the store's options, the store.
type S3Shards = (String, Vec<(String, String)>, trainyard_store::Store);

/// The shards uploaded to the test S3 server, where one is
/// (`TRAINYARD_TEST_S3_URL`): its URL, options and store.
fn upload_shards(shards: &Path, rt: &tokio::runtime::Runtime) -> Option<S3Shards> {
    std::env::var("TRAINYARD_TEST_S3_URL").ok().map(|base| {
        let var = |k: &str| std::env::var(k).unwrap_or_default();
        let options: Vec<(String, String)> = [
            ("aws_endpoint", var("TRAINYARD_TEST_S3_ENDPOINT")),
            ("aws_region", var("TRAINYARD_TEST_S3_REGION")),
            ("aws_access_key_id", var("TRAINYARD_TEST_S3_ACCESS_KEY_ID")),
            (
                "aws_secret_access_key",
                var("TRAINYARD_TEST_S3_SECRET_ACCESS_KEY"),
            ),
            ("aws_allow_http", "true".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let url = format!("{base}/data-bench-{}", uuid::Uuid::new_v4().simple());
        let store = trainyard_store::Store::open(&url, &options).expect("the S3 store");
        for i in 0..SHARDS {
            let name = format!("part-{i:03}.npz");
            let bytes = std::fs::read(shards.join(&name)).expect("a shard");
            rt.block_on(store.put(&name, bytes.into()))
                .expect("an upload");
        }
        (url, options, store)
    })
}

/// Read throughput: the loader over one epoch against 8 concurrent
/// whole-object reads of the same objects, locally and on S3.
fn read_throughput(
    dir: &Path,
    shards: &Path,
    glob: &str,
    rt: &tokio::runtime::Runtime,
    s3: Option<&S3Shards>,
    record: &mut serde_json::Value,
) {
    let local = Fetcher::local_only();
    let names: Vec<String> = (0..SHARDS).map(|i| format!("part-{i:03}.npz")).collect();
    let file_rate = stream_rate(glob, &local);
    let started = Instant::now();
    let mut total = 0u64;
    std::thread::scope(|s| {
        let handles: Vec<_> = names
            .chunks(SHARDS.div_ceil(8))
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|n| std::fs::read(shards.join(n)).map_or(0, |b| b.len() as u64))
                        .sum::<u64>()
                })
            })
            .collect();
        total = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    });
    let plain_file = total as f64 / started.elapsed().as_secs_f64() / 1e6;
    Figure::new(
        "data",
        "loader read throughput, local shards",
        file_rate,
        "MB/s",
        "8 parallel reads",
        plain_file,
        Better::Higher,
    )
    .emit();
    record["local_stream_mbps"] = serde_json::json!(file_rate);
    record["local_plain_mbps"] = serde_json::json!(plain_file);
    if let Some((url, options, store)) = s3 {
        let f = cold_fetcher(dir, "cache-rate", options, rt);
        let rate = stream_rate(&format!("{url}/part-*.npz"), &f);
        let started = Instant::now();
        let got: u64 = rt.block_on(async {
            let gets = names.iter().map(|n| store.get(n));
            let mut sum = 0u64;
            use futures::StreamExt;
            let mut s = futures::stream::iter(gets).buffer_unordered(8);
            while let Some(r) = s.next().await {
                sum += r.map_or(0, |b| b.len() as u64);
            }
            sum
        });
        let plain = got as f64 / started.elapsed().as_secs_f64() / 1e6;
        Figure::new(
            "data",
            "loader read throughput, S3 shards",
            rate,
            "MB/s",
            "8 concurrent object_store gets",
            plain,
            Better::Higher,
        )
        .emit();
        record["s3_stream_mbps"] = serde_json::json!(rate);
        record["s3_plain_mbps"] = serde_json::json!(plain);
        let _ = rt.block_on(store.delete_prefix(""));
    }
}

/// JPEG: decoding in the loader against tensors in memory.
fn jpeg_runs(dir: &Path, quick: bool, record: &mut serde_json::Value) {
    write_images(dir);
    let jpeg_steps = if quick { 60 } else { 200 };
    let in_memory = serde_json::json!({"kind": "file",
        "url": format!("file://{}", dir.join("images.npz").display())});
    let jpegs = serde_json::json!({"kind": "file",
        "url": format!("file://{}/wds/shard-*.tar", dir.display()),
        "shuffle_buffer": 2048, "memory_mb": 256,
        "transforms": [{"horizontal_flip": 0.5}],
        "normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}});
    train_images(jpegs.clone(), 10);
    let (img_mem_ms, img_mem_stall) = train_images(in_memory, jpeg_steps);
    let (jpeg_ms, jpeg_stall) = train_images(jpegs, jpeg_steps);
    println!(
        "# data, JPEG: CNN 3x32x32 -> conv 32, 64 -> 256 -> 10, batch 128, {jpeg_steps} steps; {JPEG_SHARDS} WebDataset shards of {JPEG_PER_SHARD} 32x32 JPEGs (quality 90), flip + normalize per batch; decode threads: 1 per rank (the loader's)"
    );
    Figure::new(
        "data",
        "step time, JPEG WebDataset shards (1 decode thread)",
        jpeg_ms,
        "ms",
        "in memory",
        img_mem_ms,
        Better::Lower,
    )
    .target(Target::AtMost(1.05))
    .emit();
    Figure::new(
        "data",
        "data-stall share, JPEG WebDataset shards",
        jpeg_stall * 100.0,
        "%",
        "in memory",
        img_mem_stall * 100.0,
        Better::Lower,
    )
    .emit();
    record["jpeg_ms"] = serde_json::json!(jpeg_ms);
    record["jpeg_in_memory_ms"] = serde_json::json!(img_mem_ms);
    record["jpeg_stall"] = serde_json::json!(jpeg_stall);
    record["jpeg_decode_threads"] = serde_json::json!(1);
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let steps = if quick { 120 } else { 400 };
    // One core is left to the loader, as the checkpoint benchmark leaves
    // one to its uploader: on a GPU machine the CPU is idle while a step
    // computes; here the compute, the loader and the S3 server share two
    // cores. Every run (in memory too) trains with the same threads.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tch::set_num_threads((cores.saturating_sub(1)).max(1) as i32);
    let dir = std::env::temp_dir().join(format!("trainyard-data-bench-{}", std::process::id()));
    let shards = dir.join("shards");
    std::fs::create_dir_all(&shards).expect("a folder");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let whole = write_shards(&dir, &shards);
    let glob = format!("file://{}/part-*.npz", shards.display());
    let local = Fetcher::local_only();

    // Warm-up: allocator, page cache.
    train(&glob, 20, &local);
    let (mem_ms, mem_stall) = train(&format!("file://{}", whole.display()), steps, &local);
    let (file_ms, file_stall) = train(&glob, steps, &local);
    let mut runs = vec![("local shards", file_ms, file_stall)];

    let s3 = upload_shards(&shards, &rt);
    if let Some((url, options, _)) = &s3 {
        let f = cold_fetcher(&dir, "cache-train", options, &rt);
        let (ms, stall) = train(&format!("{url}/part-*.npz"), steps, &f);
        runs.push(("S3 shards", ms, stall));
    }
    println!(
        "# data: MLP 256-1024-1024-10, batch 256, {steps} steps; {SHARDS} npz shards of {PER_SHARD} samples x {FEATURES} f32 ({} MiB); shuffle buffer 4096, 128 MiB budget{}",
        (SHARDS as i64 * PER_SHARD * (FEATURES * 4 + 8)) >> 20,
        if s3.is_none() { "; no S3 server (TRAINYARD_TEST_S3_URL unset): S3 skipped" } else { "" }
    );
    let mut record =
        serde_json::json!({"steps": steps, "in_memory_ms": mem_ms, "in_memory_stall": mem_stall});
    for (name, ms, stall) in &runs {
        Figure::new(
            "data",
            format!("step time, {name}"),
            *ms,
            "ms",
            "in memory",
            mem_ms,
            Better::Lower,
        )
        .target(Target::AtMost(1.05))
        .emit();
        Figure::new(
            "data",
            format!("data-stall share, {name}"),
            stall * 100.0,
            "%",
            "in memory",
            mem_stall * 100.0,
            Better::Lower,
        )
        .emit();
        record[format!("{name} ms")] = serde_json::json!(ms);
        record[format!("{name} stall")] = serde_json::json!(stall);
    }

    read_throughput(&dir, &shards, &glob, &rt, s3.as_ref(), &mut record);
    jpeg_runs(&dir, quick, &mut record);
    record_data("data", &record);
    let _ = std::fs::remove_dir_all(&dir);
}
