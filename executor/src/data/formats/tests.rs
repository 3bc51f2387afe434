//! The readers on files other tools wrote (`tests/python/foreign_files.py`
//! with pyarrow, polars, pandas, DuckDB and Pillow), each compared with
//! what pyarrow or Pillow reads from the same file.

use super::images::{decode, ImageRecipe};
use super::parquet::read_parquet_unit;
use super::{webdataset, Columns};
use crate::data::samples::DataError;
use serde_json::Value;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};
use trainyard_common::spec::Transform;

/// Runs `foreign_files.py what` into a fresh folder; its JSON answer.
pub(crate) fn foreign(what: &str) -> (PathBuf, Value) {
    // One folder per call: tests run side by side.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ty-foreign-{what}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/foreign_files.py");
    let python = std::env::var("TRAINYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(python)
        .arg(script)
        .arg(what)
        .arg(&dir)
        .output()
        .expect("python3 with pyarrow, polars, pandas, duckdb and Pillow (scripts/test's venv)");
    assert!(
        out.status.success(),
        "foreign_files.py {what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_slice(&out.stdout).expect("its JSON");
    (dir, v)
}

fn npz(path: &str) -> Vec<(String, Tensor)> {
    Tensor::read_npz(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn get(named: &[(String, Tensor)], name: &str) -> Tensor {
    named
        .iter()
        .find(|(n, _)| n == name || n.trim_end_matches(".npy") == name)
        .map(|(_, t)| t.shallow_clone())
        .unwrap_or_else(|| panic!("no {name}"))
}

fn columns(x: &[&str], y: &str) -> Columns {
    Columns {
        x: x.iter().map(|s| s.to_string()).collect(),
        y: y.into(),
        id: None,
        stacked: false,
    }
}

/// Every row group of `file`, concatenated.
fn read_all(file: &str, c: &Columns, groups: usize) -> Result<(Tensor, Tensor), DataError> {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for g in 0..groups {
        let (x, y, _) = read_parquet_unit(Path::new(file), file, g, c)?;
        xs.push(x);
        ys.push(y);
    }
    Ok((Tensor::cat(&xs, 0), Tensor::cat(&ys, 0)))
}

#[test]
fn parquet_from_every_writer_and_codec_reads_as_pyarrow_reads_it() {
    let (_dir, cases) = foreign("parquet");
    let cases = cases.as_array().expect("a list");
    assert!(cases.len() >= 25, "{cases:?}");
    let mut multi_group = 0;
    for case in cases {
        let file = case["file"].as_str().unwrap();
        let x_cols: Vec<&str> = case["x"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let groups = case["groups"].as_u64().unwrap() as usize;
        multi_group += usize::from(groups > 1);
        let (x, y) = read_all(file, &columns(&x_cols, case["y"].as_str().unwrap()), groups)
            .unwrap_or_else(|e| panic!("{file} {x_cols:?}: {e}"));
        let want = npz(case["expect"].as_str().unwrap());
        let (wx, wy) = (get(&want, "x"), get(&want, "y"));
        let kind = match case["kind"].as_str().unwrap() {
            "float" => Kind::Float,
            "int64" => Kind::Int64,
            "bool" => Kind::Bool,
            "uint8" => Kind::Uint8,
            k => panic!("kind {k}"),
        };
        assert_eq!(x.kind(), kind, "{file} {x_cols:?}");
        assert_eq!(x.size(), wx.size(), "{file} {x_cols:?}");
        assert!(
            x.equal(&wx),
            "{file} {x_cols:?}: the features differ from pyarrow's"
        );
        assert_eq!(y.kind(), wy.kind(), "{file}");
        assert!(y.equal(&wy), "{file}: the labels differ from pyarrow's");
    }
    assert!(
        multi_group >= 15,
        "{multi_group} files with several row groups"
    );
}

#[test]
fn parquet_columns_named_as_inputs_stack_along_dimension_one() {
    let (_dir, cases) = foreign("parquet");
    let case = |name: &str| {
        cases
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["expect"].as_str().unwrap().contains(name))
            .unwrap()
            .clone()
    };
    let (tokens, mask) = (case("dtypes-tokens"), case("dtypes-mask"));
    let file = tokens["file"].as_str().unwrap();
    let groups = tokens["groups"].as_u64().unwrap() as usize;
    let mut c = columns(&["ids", "mask"], "y");
    c.stacked = true;
    let (x, _) = read_all(file, &c, groups).unwrap();
    let ids = get(&npz(tokens["expect"].as_str().unwrap()), "x");
    let m = get(&npz(mask["expect"].as_str().unwrap()), "x");
    assert_eq!(x.size(), vec![ids.size()[0], 2, 4]);
    assert_eq!(x.kind(), Kind::Int64, "ids with a boolean mask are int64");
    assert!(x.select(1, 0).equal(&ids));
    assert!(x.select(1, 1).equal(&m.to_kind(Kind::Int64)));
    // Inputs of other widths are refused by name.
    let mut c = columns(&["ids", "x"], "y");
    c.stacked = true;
    let e = read_all(file, &c, groups)
        .expect_err("widths 4 and 8")
        .to_string();
    assert!(
        e.contains("input \"x\" has shape") && e.contains("one shape"),
        "{e}"
    );
}

#[test]
fn parquet_refusals_name_the_column_the_row_group_and_the_row() {
    let (dir, _) = foreign("parquet");
    let file = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let c = columns(&["x"], "y");
    let nulls = file("null-label.parquet");
    // Row 70 of 100 in row groups of 50: row 20 of group 1; group 0 reads.
    assert!(read_parquet_unit(Path::new(&nulls), &nulls, 0, &c).is_ok());
    let e = read_parquet_unit(Path::new(&nulls), &nulls, 1, &c)
        .expect_err("a null label")
        .to_string();
    assert!(
        e.contains("\"y\"") && e.contains("row group 1") && e.contains("row 20 is null"),
        "{e}"
    );
    let list = file("null-list.parquet");
    let e = read_parquet_unit(Path::new(&list), &list, 0, &c)
        .expect_err("a null list")
        .to_string();
    assert!(e.contains("\"x\"") && e.contains("row 3 is null"), "{e}");
    let ragged = file("ragged.parquet");
    let e = read_parquet_unit(Path::new(&ragged), &ragged, 0, &c)
        .expect_err("ragged lists")
        .to_string();
    assert!(e.contains("row 6 holds 5 values") && e.contains("8"), "{e}");
    let e = read_parquet_unit(Path::new(&ragged), &ragged, 0, &columns(&["x"], "label"))
        .expect_err("no such column")
        .to_string();
    assert!(
        e.contains("no label column \"label\"") && e.contains("x, y"),
        "{e}"
    );
}

fn recipe(channels: u32, fixed: Vec<Transform>) -> ImageRecipe {
    ImageRecipe { channels, fixed }
}

/// Mean absolute difference of two uint8 images.
fn mad(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Float) - b.to_kind(Kind::Float))
        .abs()
        .mean(Kind::Double)
        .double_value(&[])
}

#[test]
fn images_decode_and_resize_as_pillow_does() {
    let (_dir, v) = foreign("images");
    for img in v["images"].as_array().unwrap() {
        let file = img["file"].as_str().unwrap();
        let bytes = std::fs::read(file).unwrap();
        let want = npz(img["expect"].as_str().unwrap());
        let png = img["format"] == "PNG";
        let to_tensor = |d: super::images::Decoded, c: i64| {
            Tensor::from_slice(&d.values).reshape([c, i64::from(d.height), i64::from(d.width)])
        };
        let rgb = to_tensor(decode(file, "i", &bytes, &recipe(3, vec![])).unwrap(), 3);
        let wrgb = get(&want, "rgb");
        assert_eq!(rgb.size(), wrgb.size(), "{file}");
        // PNG is lossless; JPEG decoders may differ by a rounding step.
        if png {
            assert!(rgb.equal(&wrgb), "{file}: RGB differs from Pillow's");
        } else {
            assert!(mad(&rgb, &wrgb) < 1.0, "{file}: {}", mad(&rgb, &wrgb));
        }
        let gray = to_tensor(decode(file, "i", &bytes, &recipe(1, vec![])).unwrap(), 1);
        assert_eq!(gray.size(), get(&want, "gray").size());
        assert!(mad(&gray, &get(&want, "gray")) < 1.0, "{file}: grayscale");
        let fixed = vec![Transform::Resize(16), Transform::CenterCrop(16)];
        let small = to_tensor(decode(file, "i", &bytes, &recipe(3, fixed)).unwrap(), 3);
        let wsmall = get(&want, "resized");
        assert_eq!(small.size(), vec![3, 16, 16], "{file}");
        assert!(
            mad(&small, &wsmall) < 3.0,
            "{file}: resized and cropped unlike Pillow's bilinear: {}",
            mad(&small, &wsmall)
        );
    }
    let wide = v["wide"].as_str().unwrap();
    let e = decode(
        wide,
        "wide.png",
        &std::fs::read(wide).unwrap(),
        &recipe(1, vec![]),
    )
    .expect_err("too wide")
    .to_string();
    assert!(e.contains("wide.png") && e.contains("cannot decode"), "{e}");
    let e = decode("u", "notes.png", b"hello, not an image", &recipe(3, vec![]))
        .expect_err("not an image")
        .to_string();
    assert!(e.contains("not a JPEG or PNG"), "{e}");
}

#[test]
fn webdataset_shards_read_by_key_in_units_and_refuse_what_is_missing() {
    let (_dir, v) = foreign("images");
    let tar = v["tar"].as_str().unwrap();
    assert_eq!(webdataset::count(Path::new(tar), tar).unwrap(), 4);
    let fixed = vec![Transform::Resize(16), Transform::CenterCrop(16)];
    let (x, y) = webdataset::read_unit(Path::new(tar), tar, 0, &recipe(3, fixed.clone())).unwrap();
    assert_eq!(x.len(), 4);
    assert!(x
        .iter()
        .all(|i| i.size() == vec![3, 16, 16] && i.kind() == Kind::Uint8));
    assert_eq!(Vec::<i64>::try_from(&y).unwrap(), vec![3, 1, 4, 1]);
    // The same pixels as the files decoded one by one.
    for (i, img) in v["images"].as_array().unwrap().iter().enumerate() {
        let file = img["file"].as_str().unwrap();
        let d = decode(
            file,
            "i",
            &std::fs::read(file).unwrap(),
            &recipe(3, fixed.clone()),
        )
        .unwrap();
        let one = Tensor::from_slice(&d.values).reshape([3, 16, 16]);
        assert!(x[i].equal(&one), "sample {i}");
    }
    // Without a crop the images keep their sizes (the batch's crops or
    // its check come later).
    let (x, _) = webdataset::read_unit(Path::new(tar), tar, 0, &recipe(3, vec![])).unwrap();
    assert_eq!(x[0].size(), vec![3, 30, 40]);
    assert_eq!(x[1].size(), vec![3, 44, 30]);
    // A hostile member name is only a key; a sample without a class is
    // refused by its key.
    let bad = v["bad_tar"].as_str().unwrap();
    assert_eq!(webdataset::count(Path::new(bad), bad).unwrap(), 2);
    let e = webdataset::read_unit(
        Path::new(bad),
        bad,
        0,
        &recipe(3, vec![Transform::CenterCrop(8)]),
    )
    .expect_err("k9 has no class")
    .to_string();
    assert!(e.contains("sample k9 has no .cls"), "{e}");
    assert_eq!(webdataset::units_of(600), vec![256, 256, 88]);
}
