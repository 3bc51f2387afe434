//! The loader on real shards: npz written by libtorch, Parquet by the
//! Arrow writer, read back through a glob and a manifest.
use super::order::id_mix;
use crate::replica::data::{Cursor, Dataset};
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
