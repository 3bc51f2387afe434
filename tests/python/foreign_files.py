"""Dataset files as other tools write them, for the executor's reader tests
(`executor/src/data/formats/tests.rs`).

`python foreign_files.py parquet <dir>` writes Parquet files with pyarrow
(every codec, dictionary and plain encodings, data pages v1 and v2, many
row groups, every numeric dtype, lists fixed and variable, nullable
columns without nulls), polars, pandas and DuckDB, and beside each case an
`.npz` of what *pyarrow* reads from it; it prints a JSON list of the cases:
`{"file", "x": [columns], "y", "kind", "expect", "groups"}`. `kind` is the
tensor dtype the reader must give the features.

`python foreign_files.py images <dir>` writes JPEG and PNG files with
Pillow, a WebDataset tar of them, and `.npz` files of what Pillow decodes
(and resizes, and crops); it prints a JSON description.
"""

import io
import json
import os
import sys
import tarfile

import numpy as np


def table_data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int64)
    return x, y


def parquet(out):
    import duckdb
    import pandas as pd
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    cases = []

    def expect(name, file, x_cols, y_col, kind, x_dtype):
        t = pq.read_table(file)
        parts = []
        for c in x_cols:
            col = t.column(c)
            if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type) or pa.types.is_large_list(col.type):
                parts.append(np.array(col.to_pylist(), dtype=x_dtype))
            else:
                parts.append(np.array(col.to_pylist(), dtype=x_dtype).reshape(-1, 1))
        x = np.concatenate(parts, axis=1)
        yv = t.column(y_col).to_numpy()
        y = yv.astype(np.float32) if yv.dtype.kind == "f" else yv.astype(np.int64)
        path = os.path.join(out, name + ".expect.npz")
        np.savez(path, x=x, y=y)
        groups = pq.ParquetFile(file).metadata.num_row_groups
        cases.append({"file": file, "x": x_cols, "y": y_col, "kind": kind, "expect": path, "groups": groups})

    # pyarrow: every codec, both encodings, both page versions, many row
    # groups, every dtype.
    n = 300
    x, y = table_data(n, 1)
    rng = np.random.default_rng(2)
    cols = {
        "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 8),
        "xl": pa.array([list(r.astype(np.float64)) for r in x], type=pa.list_(pa.float64())),
        "ids": pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 1000, n * 4).astype(np.int64)), 4),
        "mask": pa.array([list(r) for r in rng.integers(0, 2, (n, 4)).astype(bool)], type=pa.list_(pa.bool_())),
        "f16": pa.array(rng.normal(size=n).astype(np.float16)),
        "f64": pa.array(rng.normal(size=n)),
        "i8": pa.array(rng.integers(-100, 100, n).astype(np.int8)),
        "u8": pa.array(rng.integers(0, 256, n).astype(np.uint8)),
        "u16": pa.array(rng.integers(0, 60000, n).astype(np.uint16)),
        "i32": pa.array(rng.integers(-(2**30), 2**30, n).astype(np.int32)),
        "u32": pa.array(rng.integers(0, 2**32 - 1, n).astype(np.uint32)),
        "b": pa.array(rng.integers(0, 2, n).astype(bool)),
        "dict": pa.array(rng.integers(0, 5, n).astype(np.int64)).dictionary_encode(),
        "opt": pa.array(list(rng.integers(0, 9, n).astype(np.int64)), type=pa.int64(), from_pandas=False),
        "y": pa.array(y),
        "yf": pa.array(rng.normal(size=n).astype(np.float32)),
    }
    schema_fields = [pa.field(k, v.type, nullable=(k == "opt")) for k, v in cols.items()]
    table = pa.Table.from_arrays(list(cols.values()), schema=pa.schema(schema_fields))
    codecs = ["none", "snappy", "gzip", "zstd", "lz4", "brotli"]
    for i, codec in enumerate(codecs):
        for version in ["1.0", "2.0"]:
            name = f"pyarrow-{codec}-v{version[0]}-{'dict' if i % 2 == 0 else 'plain'}"
            f = os.path.join(out, name + ".parquet")
            pq.write_table(
                table,
                f,
                compression=codec,
                use_dictionary=(i % 2 == 0),
                data_page_version=version,
                row_group_size=64,
            )
            expect(name, f, ["x"], "y", "float", np.float32)
    f = os.path.join(out, "pyarrow-zstd-v2-plain.parquet")
    # The dtype cases, on one file.
    expect("dtypes-float", f, ["f16", "f64", "i8", "u8", "u16", "i32", "u32", "b", "dict", "opt"], "yf", "float", np.float32)
    expect("dtypes-ints", f, ["i8", "u8", "u16", "i32", "u32", "dict", "opt"], "y", "int64", np.int64)
    expect("dtypes-tokens", f, ["ids"], "y", "int64", np.int64)
    expect("dtypes-bool", f, ["b"], "y", "bool", bool)
    expect("dtypes-mask", f, ["mask"], "y", "bool", bool)
    expect("dtypes-u8", f, ["u8"], "y", "uint8", np.uint8)
    expect("dtypes-varlist", f, ["xl"], "y", "float", np.float32)

    # polars: its default (zstd) and two more codecs, an Array column.
    x, y = table_data(200, 3)
    df = pl.DataFrame({"x": x, "y": y})
    for codec in ["zstd", "lz4", "gzip"]:
        name = f"polars-{codec}"
        f = os.path.join(out, name + ".parquet")
        if codec == "zstd":
            df.write_parquet(f)
        else:
            df.write_parquet(f, compression=codec, row_group_size=50)
        expect(name, f, ["x"], "y", "float", np.float32)

    # pandas (through pyarrow, its default engine): lists from an object
    # column, float64 values.
    x, y = table_data(150, 4)
    pdf = pd.DataFrame({"x": list(x.astype(np.float64)), "y": y})
    name = "pandas-default"
    f = os.path.join(out, name + ".parquet")
    pdf.to_parquet(f)
    expect(name, f, ["x"], "y", "float", np.float32)

    # DuckDB: its default (snappy) and zstd, a LIST and a fixed-size array.
    x, y = table_data(120, 5)
    con = duckdb.connect()
    con.execute("CREATE TABLE t (x FLOAT[], xa DOUBLE[8], y BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", [(list(map(float, r)), list(map(float, r)), int(v)) for r, v in zip(x, y)])
    for codec in ["default", "zstd", "gzip"]:
        name = f"duckdb-{codec}"
        f = os.path.join(out, name + ".parquet")
        opts = "FORMAT parquet" + ("" if codec == "default" else f", COMPRESSION {codec}")
        con.execute(f"COPY (SELECT * FROM t ORDER BY rowid) TO '{f}' ({opts})")
        expect(name, f, ["x"], "y", "float", np.float32)
        expect(name + "-array", f, ["xa"], "y", "float", np.float32)

    # Refusals: a null label in row group 1, a null list, ragged lists.
    f = os.path.join(out, "null-label.parquet")
    yv = [int(v) for v in y[:100]]
    yv[70] = None
    pq.write_table(pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x[:100].reshape(-1)), 8), "y": pa.array(yv, type=pa.int64())}), f, row_group_size=50)
    f = os.path.join(out, "null-list.parquet")
    xs = [list(map(float, r)) for r in x[:10]]
    xs[3] = None
    pq.write_table(pa.table({"x": pa.array(xs, type=pa.list_(pa.float32())), "y": pa.array(y[:10])}), f)
    f = os.path.join(out, "ragged.parquet")
    xs = [list(map(float, r)) for r in x[:10]]
    xs[6] = xs[6][:5]
    pq.write_table(pa.table({"x": pa.array(xs, type=pa.list_(pa.float32())), "y": pa.array(y[:10])}), f)
    return cases


def images(out):
    from PIL import Image

    rng = np.random.default_rng(7)
    made = []
    for i, (w, h, fmt) in enumerate([(40, 30, "PNG"), (30, 44, "PNG"), (40, 30, "JPEG"), (33, 33, "JPEG")]):
        # Smooth images: JPEG's loss and the resampling stay small.
        yy, xx = np.mgrid[0:h, 0:w]
        rgb = np.stack([
            (xx * 255 // max(w - 1, 1)),
            (yy * 255 // max(h - 1, 1)),
            ((xx + yy + i * 17) * 3) % 256,
        ], axis=-1).astype(np.uint8)
        ext = "png" if fmt == "PNG" else "jpg"
        f = os.path.join(out, f"img{i}.{ext}")
        Image.fromarray(rgb).save(f, format=fmt, quality=95)
        with Image.open(f) as im:
            decoded = np.asarray(im.convert("RGB")).transpose(2, 0, 1)
            gray = np.asarray(im.convert("L"))[None]
            # torchvision's Resize(16) + CenterCrop(16) on a PIL image.
            short = 16
            if im.width <= im.height:
                size = (short, im.height * short // im.width)
            else:
                size = (im.width * short // im.height, short)
            r = im.convert("RGB").resize(size, Image.BILINEAR)
            left = int(round((r.width - 16) / 2.0))
            top = int(round((r.height - 16) / 2.0))
            crop = np.asarray(r.crop((left, top, left + 16, top + 16))).transpose(2, 0, 1)
        np.savez(f + ".expect.npz", rgb=decoded, gray=gray, resized=crop)
        made.append({"file": f, "format": fmt, "expect": f + ".expect.npz"})
    # A WebDataset shard: the four images (classes 3, 1, 4, 1) and a
    # hostile member name that is only ever a key.
    tar = os.path.join(out, "shard-000000.tar")
    with tarfile.open(tar, "w") as t:
        for i, m in enumerate(made):
            key = f"s{i:04d}"
            data = open(m["file"], "rb").read()
            ext = m["file"].rsplit(".", 1)[1]
            for name, payload in [(f"{key}.{ext}", data), (f"{key}.cls", str([3, 1, 4, 1][i]).encode())]:
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                t.addfile(info, io.BytesIO(payload))
    bad = os.path.join(out, "bad-000000.tar")
    with tarfile.open(bad, "w") as t:
        payload = open(made[0]["file"], "rb").read()
        for name, p in [("../../etc/passwd.png", payload), ("../../etc/passwd.cls", b"2"), ("k9.png", payload)]:
            info = tarfile.TarInfo(name)
            info.size = len(p)
            t.addfile(info, io.BytesIO(p))
    # A PNG whose header claims a side beyond the reader's limit.
    Image.new("L", (20000, 1)).save(os.path.join(out, "wide.png"))
    return {"images": made, "tar": tar, "bad_tar": bad, "wide": os.path.join(out, "wide.png")}


if __name__ == "__main__":
    what, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    print(json.dumps(parquet(out) if what == "parquet" else images(out)))
