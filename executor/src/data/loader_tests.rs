//! The loader on real shards: npz written by libtorch, Parquet by the
//! Arrow writer, read back through a glob and a manifest.
use super::order::id_mix;
use crate::data::{Cursor, Dataset};
use crate::storage::Fetcher;
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use tch::Tensor;
use trainyard_common::spec::UncheckedJobSpec;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ty-shards-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Shard `i` of `sizes`: 4 features, a class in 0..3, ids 1000 + global row.
fn rows(sizes: &[u64], i: usize) -> (Vec<f32>, Vec<i64>, Vec<i64>) {
    let base: u64 = sizes[..i].iter().sum();
    let n = sizes[i];
    let x = (0..n * 4).map(|v| (v % 7) as f32).collect();
    let y = (0..n).map(|r| ((base + r) % 3) as i64).collect();
    let id = (0..n).map(|r| (1000 + base + r) as i64).collect();
    (x, y, id)
}

fn write_npz(dir: &std::path::Path, sizes: &[u64]) {
    for i in 0..sizes.len() {
        let (x, y, id) = rows(sizes, i);
        let t = [
            ("x", Tensor::from_slice(&x).reshape([sizes[i] as i64, 4])),
            ("y", Tensor::from_slice(&y)),
            ("id", Tensor::from_slice(&id)),
        ];
        Tensor::write_npz(&t, dir.join(format!("part-{i:03}.npz"))).unwrap();
    }
}

fn write_parquet(dir: &std::path::Path, sizes: &[u64], group: usize) {
    use arrow_array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};
    for i in 0..sizes.len() {
        let (x, y, id) = rows(sizes, i);
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        let schema = Arc::new(Schema::new(vec![
            Field::new("pixels", DataType::FixedSizeList(item.clone(), 4), false),
            Field::new("label", DataType::Int64, false),
            Field::new("sample", DataType::Int64, false),
        ]));
        let xs = FixedSizeListArray::new(item, 4, Arc::new(Float32Array::from(x)), None);
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(xs),
                Arc::new(Int64Array::from(y)),
                Arc::new(Int64Array::from(id)),
            ],
        )
        .unwrap();
        let file = std::fs::File::create(dir.join(format!("part-{i:03}.parquet"))).unwrap();
        let props = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(group))
            .build();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }
}

fn spec(dataset: serde_json::Value, max: u32) -> UncheckedJobSpec {
    let s: trainyard_common::JobSpec = serde_json::from_value(json!({
        "name": "sharded",
        "model": {"kind": "mlp", "inputs": 4, "hidden": [8], "outputs": 3},
        "dataset": dataset, "loss": "cross_entropy",
        "optimizer": {"kind": "sgd", "lr": 0.1},
        "batch_size": 5, "epochs": 2, "seed": 3, "eval_fraction": 0.2,
        "workers": {"min": 1, "max": max}, "strategy": "allreduce"
    }))
    .unwrap();
    s.into()
}

/// One epoch from `worlds` (the world size at each step, the last one
/// repeated): the id hash and count of everything the ranks got.
fn epoch(d: &Dataset, spec: &UncheckedJobSpec, worlds: &[u32]) -> (u64, u64) {
    let mut cursor = Cursor::default();
    let (mut hash, mut count, mut i) = (0u64, 0u64, 0);
    while cursor.epoch == 0 {
        let world = worlds[i.min(worlds.len() - 1)];
        i += 1;
        let mut next = None;
        for rank in 0..world {
            let b = d.stream(spec, rank, world, cursor).recv().unwrap();
            hash = hash.wrapping_add(b.id_hash);
            count += b.samples as u64;
            next = Some(b.next);
        }
        cursor = next.unwrap();
    }
    (hash, count)
}

fn expected(ids: impl Iterator<Item = u64>) -> (u64, u64) {
    ids.fold((0, 0), |(h, n), id| (h.wrapping_add(id_mix(id)), n + 1))
}

#[test]
fn npz_shards_through_a_glob_each_training_sample_once() {
    let dir = scratch("npz");
    let sizes = [17u64, 9, 30, 4, 21];
    write_npz(&dir, &sizes);
    let url = format!("file://{}/part-*.npz", dir.display());
    let spec = spec(
        json!({"kind": "file", "url": url, "id_column": "id", "shuffle_buffer": 8}),
        3,
    );
    let d = Dataset::load(&spec, &Fetcher::local_only()).unwrap();
    let train = d.train_len() as u64;
    // One of five shards is held out (20 %): the training ids are the rest.
    let total: u64 = sizes.iter().sum();
    let (h, n) = epoch(&d, &spec, &[3, 3, 2, 1, 2, 3]);
    assert_eq!(n, train);
    let held = sizes.iter().find(|&&s| total - s == train).copied();
    assert!(held.is_some(), "one whole shard is held out");
    let mut all = Vec::new();
    let mut base = 0;
    for &s in &sizes {
        if total - s != train || all.len() as u64 + s > train + s {
            all.push((base, s));
        }
        base += s;
    }
    // The hash is one of the hashes of "all ids but one shard's".
    let options: Vec<(u64, u64)> = (0..sizes.len())
        .map(|skip| {
            let mut b = 0;
            let mut ids = Vec::new();
            for (i, &s) in sizes.iter().enumerate() {
                if i != skip {
                    ids.extend(1000 + b..1000 + b + s);
                }
                b += s;
            }
            expected(ids.into_iter())
        })
        .collect();
    assert!(options.contains(&(h, n)), "{h:x} {n} not in {options:?}");
    // Held-out shards evaluate in bounded pieces.
    let mut rows = 0;
    let r = d.evaluate_shards(&mut |b| {
        rows += b.0.size()[0];
        (1.0, Some(0.5))
    });
    assert_eq!(r.unwrap().unwrap(), (1.0, Some(0.5)));
    assert_eq!(rows as u64, total - train);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn parquet_row_groups_through_a_manifest_and_an_eval_url() {
    let dir = scratch("parquet");
    let sizes = [23u64, 11, 40];
    write_parquet(&dir, &sizes, 7);
    let manifest = json!({"shards": [
        {"url": "part-000.parquet"}, {"url": "part-001.parquet", "samples": 11}
    ]});
    std::fs::write(dir.join("train.json"), manifest.to_string()).unwrap();
    let ds = json!({"kind": "file", "url": format!("file://{}/train.json", dir.display()),
        "format": "parquet", "eval_url": format!("file://{}/part-002.parquet", dir.display()),
        "x_columns": ["pixels"], "y_column": "label", "id_column": "sample", "shuffle_buffer": 6});
    let spec = spec(ds, 2);
    let d = Dataset::load(&spec, &Fetcher::local_only()).unwrap();
    assert_eq!(d.train_len(), 34);
    let want = expected(1000..1034);
    assert_eq!(epoch(&d, &spec, &[2]), want);
    assert_eq!(epoch(&d, &spec, &[1, 2, 2, 1]), want);
    let mut rows = 0;
    d.evaluate_shards(&mut |b| {
        rows += b.0.size()[0];
        (0.0, None)
    })
    .unwrap()
    .unwrap();
    assert_eq!(rows, 40);

    // A missing or mistyped column is named.
    let bad = json!({"kind": "file", "url": format!("file://{}/part-*.parquet", dir.display()),
        "x_columns": ["pixel"], "y_column": "label"});
    let e = Dataset::load(&self::spec(bad, 1), &Fetcher::local_only())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("no feature column \"pixel\"") && e.contains("pixels, label, sample"),
        "{e}"
    );
    let bad = json!({"kind": "file", "url": format!("file://{}/part-*.parquet", dir.display()),
        "x_columns": ["pixels", "label"], "y_column": "label"});
    let e = Dataset::load(&self::spec(bad, 1), &Fetcher::local_only())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("feature column \"pixels\" is FixedSizeList"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// One Parquet file of one row group (what polars and pyarrow write for
/// a small table) cannot be held out from by row groups: its rows are
/// split instead, so `eval_fraction` holds and the held-out set is there.
#[test]
fn a_parquet_file_of_one_row_group_still_holds_rows_out() {
    let dir = scratch("one-group");
    write_parquet(&dir, &[40], 1 << 20);
    let url = format!("file://{}/part-000.parquet", dir.display());
    let s = spec(
        json!({"kind": "file", "url": url, "format": "parquet", "x_columns": ["pixels"], "y_column": "label"}),
        1,
    );
    let d = Dataset::load(&s, &Fetcher::local_only()).unwrap();
    assert_eq!(d.train_len(), 32, "0.2 of 40 rows held out");
    let (x, y) = d.eval_batch(&s).expect("a held-out set");
    assert_eq!((x.size()[0], y.size()[0]), (8, 8));
    let (_, count) = epoch(&d, &s, &[1]);
    assert_eq!(count, 32);
    // Without a held-out fraction it streams as before.
    let mut all = s.clone();
    all.eval_fraction = 0.0;
    let d = Dataset::load(&all, &Fetcher::local_only()).unwrap();
    assert_eq!(d.train_len(), 40);
    assert!(d.stats().is_some(), "streamed");
}

/// A file of a few row groups (3 of 34 rows) holds rows out too: whole
/// groups would hold out 34 of 100 rows where 20 were asked for.
#[test]
fn a_parquet_file_of_a_few_row_groups_holds_the_fraction_out() {
    // One file of 100 rows in groups of `group` rows.
    let load = |name: &str, group: usize| {
        let dir = scratch(name);
        write_parquet(&dir, &[100], group);
        let url = format!("file://{}/part-000.parquet", dir.display());
        let s = spec(
            json!({"kind": "file", "url": url, "format": "parquet", "x_columns": ["pixels"], "y_column": "label"}),
            1,
        );
        (Dataset::load(&s, &Fetcher::local_only()).unwrap(), s)
    };
    let (d, s) = load("few-groups", 34);
    assert_eq!(
        d.train_len(),
        80,
        "0.2 of 100 rows held out, not a group of 34"
    );
    let (x, _) = d.eval_batch(&s).expect("a held-out set");
    assert_eq!(x.size()[0], 20);
    let (_, count) = epoch(&d, &s, &[1]);
    assert_eq!(count, 80);
    // Ten groups are fine enough to hold out by groups: it streams.
    let (d, _) = load("ten-groups", 10);
    assert_eq!(d.train_len(), 80);
    assert!(d.stats().is_some(), "streamed");
}

/// A file of a few row groups whose features are a variable-length list
/// (pyarrow's default `list<double>`, whose width the metadata does not
/// give) is split by rows too: the groups are counted as decoded.
#[test]
fn a_few_row_groups_of_variable_lists_hold_rows_out() {
    let dir = scratch("variable-groups");
    let file = dir.join("lists.parquet");
    let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(python)
        .args([
            "-c",
            "import sys, pyarrow as pa, pyarrow.parquet as pq\n\
             x = [[float(i % 7), float(i % 3), 1.0, 0.5] for i in range(100)]\n\
             t = pa.table({'x': pa.array(x), 'y': pa.array([i % 2 for i in range(100)])})\n\
             pq.write_table(t, sys.argv[1], row_group_size=34)\n\
             assert pq.ParquetFile(sys.argv[1]).num_row_groups == 3\n",
        ])
        .arg(&file)
        .status()
        .expect("python with pyarrow (scripts/test's venv)");
    assert!(ok.success());
    let s = spec(
        json!({"kind": "file", "url": format!("file://{}", file.display()), "format": "parquet"}),
        1,
    );
    let d = Dataset::load(&s, &Fetcher::local_only()).unwrap();
    assert_eq!(d.train_len(), 80, "0.2 of 100 rows held out");
}

/// A file of a few row groups that does not fit the data memory budget at
/// once is not gathered: it streams and holds out whole groups (9 groups
/// of 60 000 rows, 13 MB decoded, against the least budget, 16 MiB, whose
/// units' share is about 8.4 MB).
#[test]
fn a_few_row_groups_past_the_budget_still_stream() {
    let dir = scratch("big-groups");
    write_parquet(&dir, &[540_000], 60_000);
    let url = format!("file://{}/part-000.parquet", dir.display());
    let s = spec(
        json!({"kind": "file", "url": url, "format": "parquet", "x_columns": ["pixels"],
               "y_column": "label", "memory_mb": 16, "shuffle_buffer": 16}),
        1,
    );
    let d = Dataset::load(&s, &Fetcher::local_only()).unwrap();
    assert!(d.stats().is_some(), "streamed");
    assert_eq!(
        d.train_len(),
        540_000 - 2 * 60_000,
        "two whole groups held out"
    );
}

/// The same through a file polars wrote with its defaults (zstd, one row
/// group): 64 scalar feature columns and an integer label column, as a
/// user's `df.write_parquet` of a table of pixels gives; and again in
/// row groups of 30 rows (4 groups).
#[test]
fn a_polars_table_of_scalar_columns_holds_rows_out() {
    let dir = scratch("polars-scalars");
    let file = dir.join("digits.parquet");
    let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(python)
        .args([
            "-c",
            "import sys, numpy as np, polars as pl\n\
             r = np.random.default_rng(0)\n\
             cols = {f'px{i}': r.random(100) * 16 for i in range(64)}\n\
             cols['digit'] = r.integers(0, 10, 100)\n\
             pl.DataFrame(cols).write_parquet(sys.argv[1])\n\
             pl.DataFrame(cols).write_parquet(sys.argv[2], row_group_size=30)\n",
        ])
        .arg(&file)
        .arg(dir.join("groups.parquet"))
        .status()
        .expect("python with polars (scripts/test's venv)");
    assert!(ok.success());
    let x: Vec<String> = (0..64).map(|i| format!("px{i}")).collect();
    for name in ["digits.parquet", "groups.parquet"] {
        let mut s = spec_for(
            json!({"kind": "file", "url": format!("file://{}", dir.join(name).display()),
                   "x_columns": x, "y_column": "digit"}),
            json!({"kind": "mlp", "inputs": 64, "hidden": [8], "outputs": 10}),
            0.1,
        );
        s.batch_size = Some(10);
        let d = Dataset::load(&s, &Fetcher::local_only()).unwrap();
        assert_eq!(d.train_len(), 90, "{name}");
        let (x, y) = d.eval_batch(&s).expect("a held-out set");
        assert_eq!(x.size(), [10, 64], "{name}");
        assert!(x.isfinite().all().int64_value(&[]) == 1);
        assert!(y.max().int64_value(&[]) < 10 && y.min().int64_value(&[]) >= 0);
    }
}

#[test]
fn a_budget_too_small_says_what_to_change() {
    let dir = scratch("budget");
    write_npz(&dir, &[50, 50]);
    let url = format!("file://{}/part-*.npz", dir.display());
    let spec = spec(
        json!({"kind": "file", "url": url, "shuffle_buffer": 16_000_000, "memory_mb": 16}),
        1,
    );
    let e = Dataset::load(&spec, &Fetcher::local_only())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("dataset.memory_mb") && e.contains("shuffle_buffer"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A spec over `dataset` for a model of `model`.
fn spec_for(dataset: serde_json::Value, model: serde_json::Value, eval: f64) -> UncheckedJobSpec {
    let s: trainyard_common::JobSpec = serde_json::from_value(json!({
        "name": "images", "model": model, "dataset": dataset, "loss": "cross_entropy",
        "optimizer": {"kind": "sgd", "lr": 0.1}, "batch_size": 5, "epochs": 2, "seed": 3,
        "eval_fraction": eval, "workers": {"min": 1, "max": 1}, "strategy": "allreduce"
    }))
    .unwrap();
    s.into()
}

#[test]
fn an_image_folder_streams_seeded_augmented_normalized_batches() {
    let (src, v) = crate::data::formats::tests::foreign("images");
    let dir = scratch("image-folder");
    // Classes a, b, c (0, 1, 2 by their sorted names), a stray text file,
    // and a link to a host file that the listing must not follow.
    let layout = [("b", 0), ("a", 1), ("a", 2), ("c", 3)];
    let images = v["images"].as_array().unwrap();
    for (class, i) in layout {
        let file = PathBuf::from(images[i]["file"].as_str().unwrap());
        std::fs::create_dir_all(dir.join(class)).unwrap();
        std::fs::copy(&file, dir.join(class).join(file.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.join("a/notes.txt"), "not an image").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.join("c/passwd.png")).unwrap();
    let ds = json!({"kind": "file", "url": format!("file://{}/", dir.display()),
        "transforms": [{"resize": 16}, {"center_crop": 16}, {"random_crop": 12}, {"horizontal_flip": 0.5}],
        "normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}});
    let model = json!({"kind": "mlp", "inputs": 432, "hidden": [8], "outputs": 3});
    let spec = spec_for(ds, model, 0.0);
    let d = Dataset::load(&spec, &Fetcher::local_only()).unwrap();
    assert_eq!(d.train_len(), 4, "four images; no text file, no link");
    let first = d
        .stream(&spec, 0, 1, Cursor::default())
        .recv()
        .unwrap_or_else(|_| panic!("{}", d.loader_failure()));
    assert_eq!(first.x.size(), vec![4, 3, 12, 12]);
    assert_eq!(first.x.kind(), tch::Kind::Float);
    let (lo, hi) = (
        first.x.min().double_value(&[]),
        first.x.max().double_value(&[]),
    );
    assert!(
        (-2.0..=2.0).contains(&lo) && (-2.0..=2.0).contains(&hi) && lo < hi,
        "{lo} {hi}"
    );
    let mut labels = Vec::<i64>::try_from(&first.y).unwrap();
    labels.sort_unstable();
    assert_eq!(labels, vec![0, 0, 1, 2]);
    // Seeded: the same epoch twice is the same batch; the next epoch draws
    // other crops and flips.
    let again = d.stream(&spec, 0, 1, Cursor::default()).recv().unwrap();
    assert!(again.x.equal(&first.x));
    let next = Cursor {
        epoch: 1,
        offset: 0,
    };
    let later = d
        .stream(&spec, 0, 1, next)
        .recv()
        .unwrap_or_else(|_| panic!("{}", d.loader_failure()));
    assert_eq!(later.x.size(), first.x.size());
    assert!(!later.x.equal(&first.x) || !later.y.equal(&first.y));
    // Without the center crop the images keep their aspects until the
    // batch's random crop, as torchvision's Resize + RandomCrop do; held
    // out, they are center-cropped.
    let ds = json!({"kind": "file", "url": format!("file://{}/", dir.display()),
        "transforms": [{"resize": 16}, {"random_crop": 12}]});
    let model = json!({"kind": "mlp", "inputs": 432, "hidden": [8], "outputs": 3});
    let spec = spec_for(ds, model, 0.25);
    let d = Dataset::load(&spec, &Fetcher::local_only()).unwrap();
    let b = d
        .stream(&spec, 0, 1, Cursor::default())
        .recv()
        .unwrap_or_else(|_| panic!("{}", d.loader_failure()));
    assert_eq!(b.x.size(), vec![3, 3, 12, 12]);
    let mut held = 0;
    d.evaluate_shards(&mut |(x, _)| {
        assert_eq!(x.size()[1..], [3, 12, 12]);
        held += x.size()[0];
        (0.0, None)
    })
    .unwrap()
    .unwrap();
    assert_eq!(held, 1);
    // Without any crop they cannot form one batch, and the error says
    // what to add.
    let ds = json!({"kind": "file", "url": format!("file://{}/", dir.display()),
        "transforms": [{"resize": 16}, {"horizontal_flip": 0.5}]});
    let model = json!({"kind": "torchscript", "url": "file:///unused.pt"});
    let spec = spec_for(ds, model, 0.0);
    let d = Dataset::load(&spec, &Fetcher::local_only()).unwrap();
    assert!(d.stream(&spec, 0, 1, Cursor::default()).recv().is_err());
    assert!(
        d.loader_failure().contains("center_crop"),
        "{}",
        d.loader_failure()
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&src);
}

#[test]
fn webdataset_shards_and_integer_features_keep_their_meaning() {
    let (src, v) = crate::data::formats::tests::foreign("images");
    let tar = v["tar"].as_str().unwrap();
    let glob = format!(
        "file://{}/shard-*.tar",
        std::path::Path::new(tar).parent().unwrap().display()
    );
    let ds = json!({"kind": "file", "url": glob, "channels": 1,
        "transforms": [{"resize": 16}, {"center_crop": 16}]});
    let model = json!({"kind": "mlp", "inputs": 256, "hidden": [8], "outputs": 5});
    let spec = spec_for(ds, model, 0.0);
    let d = Dataset::load(&spec, &Fetcher::local_only()).unwrap();
    assert_eq!(d.train_len(), 4);
    let b = d.stream(&spec, 0, 1, Cursor::default()).recv().unwrap();
    assert_eq!(b.x.size(), vec![4, 1, 16, 16]);
    // Without normalize, pixels are only scaled to [0, 1] (ToTensor).
    assert!(b.x.max().double_value(&[]) <= 1.0 && b.x.min().double_value(&[]) >= 0.0);
    let mut labels = Vec::<i64>::try_from(&b.y).unwrap();
    labels.sort_unstable();
    assert_eq!(labels, vec![1, 1, 3, 4]);

    // Token ids in an npz stay int64 for a TorchScript model, and become
    // floats for a built-in one; uint8 pixels with normalize become floats.
    let dir = scratch("kinds");
    let ids = Tensor::arange(40, (tch::Kind::Int, tch::Device::Cpu)).reshape([10, 4]);
    let pixels = ids.to_kind(tch::Kind::Uint8) * 5;
    let y = Tensor::arange(10, (tch::Kind::Int64, tch::Device::Cpu)).remainder(3);
    Tensor::write_npz(&[("x", &ids), ("y", &y)], dir.join("tokens.npz")).unwrap();
    Tensor::write_npz(&[("x", &pixels), ("y", &y)], dir.join("pixels.npz")).unwrap();
    let module = crate::replica::tests::module_file();
    let url = |n: &str| format!("file://{}/{n}", dir.display());
    let script = json!({"kind": "torchscript", "url": format!("file://{}", module.display())});
    let mlp = json!({"kind": "mlp", "inputs": 4, "hidden": [8], "outputs": 3});
    let kind_of = |ds: serde_json::Value, model: &serde_json::Value| {
        let spec = spec_for(ds, model.clone(), 0.2);
        let d = Dataset::load(&spec, &Fetcher::local_only()).unwrap();
        let b = d.stream(&spec, 0, 1, Cursor::default()).recv().unwrap();
        let (x, _) = d.eval_batch(&spec).unwrap();
        assert_eq!(x.kind(), b.x.kind(), "evaluation sees what training sees");
        b.x
    };
    let tokens = json!({"kind": "file", "url": url("tokens.npz")});
    assert_eq!(kind_of(tokens.clone(), &script).kind(), tch::Kind::Int64);
    assert_eq!(kind_of(tokens, &mlp).kind(), tch::Kind::Float);
    let scaled = json!({"kind": "file", "url": url("pixels.npz"),
        "normalize": {"mean": [0.5], "std": [0.5]}});
    let x = kind_of(scaled, &script);
    assert_eq!(x.kind(), tch::Kind::Float);
    assert!(x.max().double_value(&[]) <= 1.0 && x.min().double_value(&[]) >= -1.0);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&src);
}

/// An image folder and WebDataset shards on the test S3 server (Garage,
/// started by `scripts/test`): listed through the store (nested keys for
/// the folder, a glob for the tars), fetched through a cold cache tier,
/// decoded and batched as from local files.
#[test]
fn images_stream_from_s3_as_from_local_files() {
    use crate::storage::tests::test_s3;
    let (src, v) = crate::data::formats::tests::foreign("images");
    let (options, prefix) = test_s3("images");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = trainyard_store::Store::open(&prefix, &options).unwrap();
    let images = v["images"].as_array().unwrap();
    for (key, i) in [
        ("train/b/0.png", 0),
        ("train/a/1.png", 1),
        ("train/a/2.jpg", 2),
        ("train/c/3.jpg", 3),
    ] {
        let bytes = std::fs::read(images[i]["file"].as_str().unwrap()).unwrap();
        rt.block_on(store.put(key, bytes.into())).unwrap();
    }
    let tar = std::fs::read(v["tar"].as_str().unwrap()).unwrap();
    rt.block_on(store.put("wds/shard-000000.tar", tar.into()))
        .unwrap();
    let dir = scratch("s3-images");
    let cache =
        Arc::new(trainyard_store::cache::Cache::open(&dir.join("cache"), 64 << 20).unwrap());
    let fetcher = Fetcher::new(options, cache, rt.handle().clone());
    let batch = |ds: serde_json::Value, inputs: i64| {
        let model = json!({"kind": "mlp", "inputs": inputs, "hidden": [8], "outputs": 5});
        let spec = spec_for(ds, model, 0.0);
        let d = Dataset::load(&spec, &fetcher).unwrap();
        let b = d
            .stream(&spec, 0, 1, Cursor::default())
            .recv()
            .unwrap_or_else(|_| panic!("{}", d.loader_failure()));
        let mut labels = Vec::<i64>::try_from(&b.y).unwrap();
        labels.sort_unstable();
        (b.x.size(), labels)
    };
    let folder = json!({"kind": "file", "url": format!("{prefix}/train/"),
        "transforms": [{"resize": 16}, {"center_crop": 16}]});
    assert_eq!(batch(folder, 768), (vec![4, 3, 16, 16], vec![0, 0, 1, 2]));
    let tars = json!({"kind": "file", "url": format!("{prefix}/wds/shard-*.tar"),
        "transforms": [{"resize": 16}, {"random_crop": 12}]});
    assert_eq!(batch(tars, 432), (vec![4, 3, 12, 12], vec![1, 1, 3, 4]));
    let _ = rt.block_on(store.delete_prefix(""));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&src);
}
