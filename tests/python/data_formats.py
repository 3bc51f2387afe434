"""Data as other tools write it, for the data-format tests (tests/e2e/data_formats.rs).

A user's data rarely starts as the platform's own npz: it is Parquet shards
that pyarrow, polars, pandas and DuckDB wrote with whatever codec they
default to, integer token ids, a torchvision ImageFolder tree of JPEGs and
PNGs, or WebDataset tar shards. This module is the Python side of the test
that holds the platform to training on such data as well as PyTorch trains
on the same files:

- `write DIR`: splits digits (data/digits.npz) into 1297 training and 500
  test rows, and writes the training rows in every format of the test
  (below), the test rows in the form each case is evaluated on, the
  TorchScript models (`mlp.pt`, `embed.pt`, `masked.pt`, `cnn.pt`) and a
  Parquet file whose label column has a null (`null_label.parquet`);
- `reference DIR RECIPE`: trains each case's model with plain PyTorch from
  the case's own files (Parquet through pyarrow, images through PIL) on the
  case's recipe, once per data order in `RECIPE["orders"]`, and evaluates
  each run in eval mode on the case's test rows;
- `evaluate DIR CELLS RECIPE`: evaluates downloaded results on their
  case's test rows in eval mode under no_grad, through
  `torch.jit.load(model.pt)` and through `model.safetensors` loaded into a
  fresh module (`strict=True`, names, shapes and dtypes checked against
  `state_dict()`); images are resized and centre-cropped as the recipe
  says, never flipped.

The cases (what `write` makes in DIR):

- `parquet_mixed`: `parquet/*.parquet`, shards of the training rows written
  by pyarrow with each codec (snappy, gzip, zstd, lz4 — LZ4_RAW —, brotli,
  none; dictionary on/off, data page v1/v2, small row groups), polars,
  pandas and DuckDB; `x` a fixed-size or variable-length list of 64
  float32 or float64, `y` an int32 or int64. Next to each shard,
  `<shard>.expect.npz` holds `x` (float32 [n, 64]) and `y` (int64 [n]) as
  pyarrow reads it. Model: an MLP over float [N, 64].
- `tokens_npz`, `tokens_parquet`: each pixel quantised to 17 levels, token
  = pixel index * 17 + level (vocabulary 1088), int64 `x` [N, 64], in
  `tokens.npz` and `tokens.parquet` (fixed-size list<int64>[64]). Model: an
  embedding over int64 [N, 64].
- `two_inputs_npz`, `two_inputs_parquet`: the token ids with about a
  fifth of each row hidden (a seeded mask per row; a hidden position's
  id replaced by a random token), for a model whose `forward(ids, mask)`
  takes two tensors: `ids` int64 [N, 64], `mask` bool [N, 64] (true where
  the id is real) and `y` int64, in `two_inputs.npz` and in
  `two_inputs.parquet` (`ids` a fixed-size list<int64>[64], `mask` a
  fixed-size list<bool>[64]); the job names them in `dataset.inputs`.
  `two_inputs_test.npz` holds the test rows, masked alike (another seed).
  Model: the embedding, its vectors multiplied by the mask before they are
  flattened; the mask arrives as the platform hands it over (int64 0/1,
  as every input is when none is floating-point), and so in PyTorch's
  runs and evaluation.
- `image_folder`: `images/train/<class>/<n>.{jpg,png}`, RGB digits of a few
  sizes, tinted, half JPEG and half PNG; the classes are the sorted folder
  names. `images/test/` is the test set (no job reads it).
- `webdataset`: `wds/shard-00000{0..3}.tar`, each sample `<key>.jpg` and
  `<key>.cls` (the class as ASCII); `wds_test/shard-000000.tar` the test
  set.
Both image cases: a small CNN over float [N, 3, H, W] (pixels / 255,
normalized per channel), after the recipe's transforms.

Each command prints one JSON document on stdout. RECIPE is a JSON file:
{"orders": [seeds of the data orders], "cases": {case: {"batch" (global),
"epochs", "optimizer": {"kind": "adam" | "momentum", "lr"}, and for the
image cases "transforms" (the spec's list) and "normalize": {"mean",
"std"}}}}. CELLS: [{"cell", "case", "pt", "safetensors"}].
"""

import io
import json
import os
import sys
import tarfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file

# ---- The models (what a user writes) ----


class Mlp(nn.Module):
    """64 floats → 128 → 10."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


VOCAB = 64 * 17


class Embed(nn.Module):
    """Token ids (int64 [N, 64]) → an embedding of 8 each → flattened →
    10. The forward indexes an embedding table, so it needs integer input:
    a float tensor is an error, not a silent cast. (Mean-pooling the
    embeddings instead reached only 82-86 % in 10 epochs: the one-hot
    levels need each pixel's own weights, which flattening keeps.)"""

    def __init__(self, width: int = 8):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, width)
        self.head = nn.Linear(64 * width, 10)

    def forward(self, x):
        return self.head(self.tok(x).flatten(1))


class Masked(nn.Module):
    """Two inputs, `forward(ids, mask)`: token ids (int64 [N, 64]) and
    which of them are real (0/1 [N, 64], any dtype), as `Embed`, each
    position's embedding multiplied by its mask before flattening (a
    hidden position holds a random token, which only the mask tells)."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, width)
        self.head = nn.Linear(64 * width, 10)

    def forward(self, ids, mask):
        emb = self.tok(ids)
        return self.head((emb * mask.unsqueeze(-1).to(emb.dtype)).flatten(1))


class Cnn(nn.Module):
    """Two 3×3 convolutions with max pooling over RGB [N, 3, 16, 16]."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        return self.fc(h.flatten(1))


MODELS = {"mlp": Mlp, "embed": Embed, "masked": Masked, "cnn": Cnn}

# Which model each case trains.
CASE_MODEL = {
    "parquet_mixed": "mlp",
    "tokens_npz": "embed",
    "tokens_parquet": "embed",
    "two_inputs_npz": "masked",
    "two_inputs_parquet": "masked",
    "image_folder": "cnn",
    "webdataset": "cnn",
}


def build(name):
    """A fresh instance of model `name`, initialized by the seed of its
    name (so `write` and a fresh copy start alike)."""
    torch.manual_seed(sum(map(ord, name)))
    return MODELS[name]()


# ---- Writing the data as other tools do ----

TRAIN_ROWS, TEST_ROWS = 1297, 500

# The image sizes (width, height) the digits are drawn at, in turn: two
# squares and a landscape one, so that `resize` must keep the aspect.
SIZES = [(20, 20), (24, 24), (24, 20)]


def digits():
    """(x float32 [n, 64] in [0, 1], y int64 [n]) of train and test: the
    split user_models.py makes (500 test rows drawn with seed 20)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    d = np.load(os.path.join(root, "data", "digits.npz"))
    x, y = np.asarray(d["x"], dtype=np.float32), np.asarray(d["y"]).reshape(-1).astype(np.int64)
    perm = np.random.default_rng(20).permutation(len(x))
    test, train = perm[:TEST_ROWS], perm[TEST_ROWS:]
    return (x[train], y[train]), (x[test], y[test])


def tokens(x):
    """Pixel i at level l (of 0..16) is token i * 17 + l."""
    level = np.clip(np.rint(x * 16), 0, 16).astype(np.int64)
    return np.arange(64, dtype=np.int64) * 17 + level


# The share of each row's tokens the two-input cases hide. With a quarter
# hidden PyTorch's own runs reached only 85-86 % (a fifth: 87.7); the same
# model ignoring the mask reached about 4 points less.
HIDDEN = 0.2


def masked(t, seed):
    """Token ids `t` with about `HIDDEN` of each row hidden (seeded): the
    ids, a hidden one replaced by a random token, and the mask (bool, true
    where the id is real)."""
    rng = np.random.default_rng(seed)
    mask = rng.random(t.shape) >= HIDDEN
    return np.where(mask, t, rng.integers(0, VOCAB, t.shape)), mask


def fixed_list(x, pa_type):
    """A 2-D array as an Arrow fixed-size list column of `pa_type`."""
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), type=pa_type), x.shape[1])


def with_pyarrow(x_type, y_type, **options):
    """pyarrow's `write_table` with `options` (codec, dictionary, data page
    version, row group size); `x` a fixed-size list of `x_type`."""

    def write(path, x, y):
        x = x.astype(x_type.to_pandas_dtype())
        pq.write_table(pa.table({"x": fixed_list(x, x_type), "y": pa.array(y, type=y_type)}), path, **options)

    return write


def with_polars(path, x, y):
    """polars' default (zstd): a fixed-size Array column, an Int32 label."""
    import polars as pl

    frame = pl.DataFrame({"x": x, "y": y.astype(np.int32)}, schema={"x": pl.Array(pl.Float32, 64), "y": pl.Int32})
    frame.write_parquet(path)


def with_pandas(path, x, y):
    """pandas' default (pyarrow, snappy): a column of numpy arrays, which
    is a variable-length list<double>."""
    import pandas as pd

    pd.DataFrame({"x": list(x.astype(np.float64)), "y": y}).to_parquet(path)


def with_duckdb(options, label):
    """DuckDB's `COPY ... TO` with `options`: `x` a LIST of floats, the
    label cast to `label`."""

    def write(path, x, y):
        import duckdb

        con = duckdb.connect()
        con.register("rows", pa.table({"x": pa.array(list(x), type=pa.list_(pa.float32())), "y": pa.array(y)}))
        con.execute(f"COPY (SELECT x, y::{label} AS y FROM rows) TO '{path}' ({options})")
        con.close()

    return write


# The shards of `parquet_mixed`: (file name, writer).
PARQUET_WRITERS = [
    ("pa-snappy.parquet", with_pyarrow(pa.float32(), pa.int64(), compression="snappy", row_group_size=32)),
    (
        "pa-gzip.parquet",
        with_pyarrow(pa.float64(), pa.int64(), compression="gzip", use_dictionary=False, data_page_version="2.0"),
    ),
    (
        "pa-zstd.parquet",
        with_pyarrow(pa.float32(), pa.int64(), compression="zstd", data_page_version="2.0", row_group_size=40),
    ),
    # pyarrow's "lz4" is Parquet's LZ4_RAW.
    (
        "pa-lz4.parquet",
        with_pyarrow(pa.float32(), pa.int64(), compression="lz4", use_dictionary=False, row_group_size=50),
    ),
    ("pa-brotli.parquet", with_pyarrow(pa.float32(), pa.int32(), compression="brotli", data_page_version="2.0")),
    (
        "pa-none.parquet",
        with_pyarrow(pa.float32(), pa.int64(), compression="none", use_dictionary=False, row_group_size=17),
    ),
    ("polars-default.parquet", with_polars),
    ("pandas-default.parquet", with_pandas),
    ("duckdb-default.parquet", with_duckdb("FORMAT parquet", "BIGINT")),
    ("duckdb-zstd.parquet", with_duckdb("FORMAT parquet, COMPRESSION zstd", "INTEGER")),
]


def write_parquet_shards(folder, x, y):
    """The training rows as Parquet shards, each from another writer; next
    to each, `<shard>.expect.npz` with what pyarrow reads of it."""
    os.makedirs(folder, exist_ok=True)
    bounds = np.linspace(0, len(x), len(PARQUET_WRITERS) + 1).round().astype(int)
    shards = []
    for (name, write), lo, hi in zip(PARQUET_WRITERS, bounds[:-1], bounds[1:]):
        path = os.path.join(folder, name)
        xs, ys = x[lo:hi], y[lo:hi]
        write(path, xs, ys)
        back = pq.read_table(path)
        got_x = np.asarray(back.column("x").to_pylist(), dtype=np.float32)
        got_y = np.asarray(back.column("y").to_pylist(), dtype=np.int64)
        # Digits are multiples of 1/16: exact in every float width.
        if got_x.shape != xs.shape or not np.array_equal(got_x, xs) or not np.array_equal(got_y, ys):
            raise SystemExit(f"{name}: pyarrow reads other rows than were written")
        np.savez(path + ".expect.npz", x=got_x, y=got_y)
        meta = pq.ParquetFile(path).metadata
        shards.append(
            {
                "file": name,
                "rows": int(hi - lo),
                "row_groups": meta.num_row_groups,
                "codec": meta.row_group(0).column(0).compression,
                "created_by": meta.created_by,
                "x": str(back.schema.field("x").type),
                "y": str(back.schema.field("y").type),
            }
        )
    return shards


def draw(x, i, rng):
    """Digit `x` (64 floats in [0, 1]) as an RGB image of the `i`-th size:
    upscaled bilinearly, ink and paper of random colours (so that the three
    channels differ)."""
    w, h = SIZES[i % len(SIZES)]
    gray = Image.fromarray(np.rint(x.reshape(8, 8) * 255).astype(np.uint8), "L")
    v = np.asarray(gray.resize((w, h), Image.BILINEAR), dtype=np.float32)[..., None] / 255
    ink, paper = rng.uniform(0.45, 1.0, 3), rng.uniform(0.0, 0.35, 3)
    rgb = paper + (ink - paper) * v
    return Image.fromarray(np.rint(rgb * 255).clip(0, 255).astype(np.uint8), "RGB")


def encoded(img, fmt):
    buf = io.BytesIO()
    if fmt == "jpg":
        img.save(buf, "JPEG", quality=90)
    else:
        img.save(buf, "PNG")
    return buf.getvalue()


def write_images(out, name, x, y, rng):
    """An ImageFolder tree `images/<name>/<class>/<n>.{jpg,png}` (every
    other image a JPEG) and WebDataset shards of the same images as JPEGs;
    how many files of each kind."""
    kinds = {"jpg": 0, "png": 0}
    samples = []
    for i in range(len(x)):
        img = draw(x[i], i, rng)
        ext = "jpg" if i % 2 == 0 else "png"
        folder = os.path.join(out, "images", name, str(int(y[i])))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i:05}.{ext}"), "wb") as f:
            f.write(encoded(img, ext))
        kinds[ext] += 1
        samples.append((f"sample{i:06}", encoded(img, "jpg"), int(y[i])))
    # WebDataset: training in four shards, the test rows in one.
    folder = os.path.join(out, "wds" if name == "train" else "wds_test")
    os.makedirs(folder, exist_ok=True)
    parts = 4 if name == "train" else 1
    for s, chunk in enumerate(np.array_split(np.arange(len(samples)), parts)):
        with tarfile.open(os.path.join(folder, f"shard-{s:06}.tar"), "w") as tar:
            for j in chunk:
                key, jpg, cls = samples[j]
                for member, data in [(f"{key}.jpg", jpg), (f"{key}.cls", str(cls).encode())]:
                    info = tarfile.TarInfo(member)
                    info.size = len(data)
                    info.mtime = 1_700_000_000
                    tar.addfile(info, io.BytesIO(data))
    return dict(kinds, wds_shards=parts)


def write(out):
    os.makedirs(out, exist_ok=True)
    (x, y), (tx, ty) = digits()
    np.savez(os.path.join(out, "test.npz"), x=tx, y=ty)
    shards = write_parquet_shards(os.path.join(out, "parquet"), x, y)
    t, tt = tokens(x), tokens(tx)
    np.savez(os.path.join(out, "tokens.npz"), x=t, y=y)
    np.savez(os.path.join(out, "tokens_test.npz"), x=tt, y=ty)
    pq.write_table(pa.table({"x": fixed_list(t, pa.int64()), "y": pa.array(y)}), os.path.join(out, "tokens.parquet"))
    (ids, mask), (tids, tmask) = masked(t, 11), masked(tt, 12)
    np.savez(os.path.join(out, "two_inputs.npz"), ids=ids, mask=mask, y=y)
    np.savez(os.path.join(out, "two_inputs_test.npz"), ids=tids, mask=tmask, y=ty)
    two = {"ids": fixed_list(ids, pa.int64()), "mask": fixed_list(mask, pa.bool_()), "y": pa.array(y)}
    pq.write_table(pa.table(two), os.path.join(out, "two_inputs.parquet"))
    rng = np.random.default_rng(5)
    images = {"train": write_images(out, "train", x, y, rng), "test": write_images(out, "test", tx, ty, rng)}
    # A label column with a null (row 5 of 100): a job over it must refuse,
    # naming the column, rather than train on a made-up label.
    labels = pa.array([None if i == 5 else int(v) for i, v in enumerate(y[:100])], type=pa.int64())
    null = pa.table({"x": fixed_list(x[:100], pa.float32()), "y": labels})
    pq.write_table(null, os.path.join(out, "null_label.parquet"))
    models = {}
    for name in MODELS:
        path = os.path.join(out, f"{name}.pt")
        torch.jit.script(build(name)).save(path)
        models[name] = path
    return {"train": len(x), "test": len(tx), "parquet": shards, "images": images, "models": models}


# ---- Reading each case's files, as PyTorch users do ----


def read_parquet(paths, x="x"):
    """Features (column `x`) and labels (int64) of Parquet files, via
    pyarrow."""
    xs, ys = [], []
    for p in paths:
        t = pq.read_table(p)
        xs.append(np.asarray(t.column(x).to_pylist()))
        ys.append(np.asarray(t.column("y").to_pylist(), dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def image_folder(root):
    """torchvision's ImageFolder: classes the sorted folder names, files
    in sorted order; each decoded with PIL to RGB."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    images, labels = [], []
    for k, c in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(root, c))):
            with Image.open(os.path.join(root, c, f)) as img:
                images.append(img.convert("RGB"))
            labels.append(k)
    return images, np.asarray(labels, dtype=np.int64)


def webdataset(folder):
    """WebDataset shards: samples grouped by key (the name before the first
    dot), `.jpg` decoded with PIL, `.cls` the class as text."""
    images, labels = [], []
    for shard in sorted(f for f in os.listdir(folder) if f.endswith(".tar")):
        samples = {}
        with tarfile.open(os.path.join(folder, shard)) as tar:
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                samples.setdefault(key, {})[ext] = tar.extractfile(m).read()
        for key in samples:
            s = samples[key]
            with Image.open(io.BytesIO(s["jpg"])) as img:
                images.append(img.convert("RGB"))
            labels.append(int(s["cls"].decode().strip()))
    return images, np.asarray(labels, dtype=np.int64)


def resize_shorter(img, n):
    """torchvision `Resize(n)` on a PIL image: the shorter side to n, the
    longer in proportion (truncated), bilinear."""
    w, h = img.size
    if w <= h:
        size = (n, int(n * h / w))
    else:
        size = (int(n * w / h), n)
    return img.resize(size, Image.BILINEAR)


class Images:
    """Decoded images and the recipe's transforms (a resize, a crop, a
    flip, each optional, in that order): the resize applied once, the crop
    and flip per sample and epoch."""

    ORDER = ["resize", "center_crop", "random_crop", "horizontal_flip"]

    def __init__(self, images, labels, recipe):
        self.labels = torch.from_numpy(labels)
        steps = recipe["transforms"]
        kinds = [k for t in steps for k in t]
        if not set(kinds) <= set(self.ORDER):
            raise ValueError(f"transforms {steps}: only {self.ORDER} are part of these tests")
        if kinds != sorted(kinds, key=self.ORDER.index) or len(set(kinds)) != len(kinds):
            raise ValueError(f"transforms {steps}: one of each at most, in the order {self.ORDER}")
        size = next((t["resize"] for t in steps if "resize" in t), None)
        self.crop = next((("center", t["center_crop"]) for t in steps if "center_crop" in t), None)
        self.crop = next((("random", t["random_crop"]) for t in steps if "random_crop" in t), self.crop)
        self.flip = next((t["horizontal_flip"] for t in steps if "horizontal_flip" in t), 0.0)
        self.arrays = [np.asarray(resize_shorter(i, size) if size else i, dtype=np.uint8) for i in images]
        norm = recipe["normalize"]
        self.mean = torch.tensor(norm["mean"], dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(norm["std"], dtype=torch.float32).view(3, 1, 1)

    def __len__(self):
        return len(self.arrays)

    def batch(self, idx, rng=None):
        """Samples `idx` as float [n, 3, s, s]: cropped (at random with
        `rng`, else centred, as torchvision's CenterCrop rounds), flipped
        with probability `flip` when training, /255, normalized."""
        out = []
        for i in idx:
            a = self.arrays[i]
            if self.crop:
                kind, s = self.crop
                h, w = a.shape[:2]
                if kind == "random" and rng is not None:
                    top, left = rng.integers(0, h - s + 1), rng.integers(0, w - s + 1)
                else:
                    top, left = int(round((h - s) / 2.0)), int(round((w - s) / 2.0))
                a = a[top : top + s, left : left + s]
            if rng is not None and self.flip > 0 and rng.random() < self.flip:
                a = a[:, ::-1]
            out.append(torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1))
        x = torch.stack(out).float() / 255
        return (x - self.mean) / self.std, self.labels[list(idx)]


class Arrays:
    """Features and labels in memory (no per-epoch transform); `x` one
    array, or a tuple of them for a forward of several inputs (a batch's
    `x` then a tuple too, passed one per argument)."""

    def __init__(self, x, y):
        def t(a):
            return torch.from_numpy(np.ascontiguousarray(a))

        self.x = tuple(map(t, x)) if isinstance(x, tuple) else t(x)
        self.y = torch.from_numpy(y)

    def __len__(self):
        return len(self.y)

    def batch(self, idx, rng=None):
        i = torch.as_tensor(idx)
        x = tuple(a[i] for a in self.x) if isinstance(self.x, tuple) else self.x[i]
        return x, self.y[i]


def forward(module, x):
    """`module` on a batch's `x`: one tensor, or a tuple, one per argument."""
    return module(*x) if isinstance(x, tuple) else module(x)


def case_data(out, case, recipe, split):
    """The `split` ("train" or "test") rows of `case`, read from the files
    the job reads (train) or the case's test files."""
    if case == "parquet_mixed":
        if split == "test":
            d = np.load(os.path.join(out, "test.npz"))
            return Arrays(d["x"].astype(np.float32), d["y"].astype(np.int64))
        folder = os.path.join(out, "parquet")
        x, y = read_parquet(sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".parquet")))
        return Arrays(x.astype(np.float32), y)
    if case == "tokens_npz" or (case == "tokens_parquet" and split == "test"):
        d = np.load(os.path.join(out, "tokens.npz" if split == "train" else "tokens_test.npz"))
        return Arrays(d["x"].astype(np.int64), d["y"].astype(np.int64))
    if case == "tokens_parquet":
        x, y = read_parquet([os.path.join(out, "tokens.parquet")])
        return Arrays(x.astype(np.int64), y)
    if case == "two_inputs_npz" or (case == "two_inputs_parquet" and split == "test"):
        d = np.load(os.path.join(out, "two_inputs.npz" if split == "train" else "two_inputs_test.npz"))
        ids, mask, y = d["ids"], d["mask"], d["y"]
    elif case == "two_inputs_parquet":
        path = os.path.join(out, "two_inputs.parquet")
        (ids, y), (mask, _) = read_parquet([path], "ids"), read_parquet([path], "mask")
    if case in ("two_inputs_npz", "two_inputs_parquet"):
        # As the platform hands them over: both int64 (the mask 0/1).
        return Arrays((ids.astype(np.int64), mask.astype(np.int64)), y.astype(np.int64))
    if case == "image_folder":
        images, labels = image_folder(os.path.join(out, "images", split))
    elif case == "webdataset":
        images, labels = webdataset(os.path.join(out, "wds" if split == "train" else "wds_test"))
    else:
        raise ValueError(f"unknown case {case}")
    return Images(images, labels, recipe)


# ---- Training and evaluation ----


def optimizer(recipe, params):
    o = recipe["optimizer"]
    if o["kind"] == "adam":
        return torch.optim.Adam(params, lr=o["lr"])
    if o["kind"] == "momentum":
        return torch.optim.SGD(params, lr=o["lr"], momentum=o.get("momentum", 0.9))
    raise ValueError(f"optimizer {o['kind']} is not part of these tests")


def train(module, recipe, data, seed):
    """Plain PyTorch: each epoch a seeded shuffle cut into batches of the
    job's global batch (the last one ragged), cross entropy (mean), the
    optimizer at a constant rate; crops and flips from the same seed."""
    opt = optimizer(recipe, [p for p in module.parameters() if p.requires_grad])
    module.train()
    torch.manual_seed(seed)
    order = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    for _ in range(recipe["epochs"]):
        perm = torch.randperm(len(data), generator=order).tolist()
        for at in range(0, len(perm), recipe["batch"]):
            x, y = data.batch(perm[at : at + recipe["batch"]], rng)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(forward(module, x), y).backward()
            opt.step()
    return module


def evaluate(module, data, batch=256):
    """Accuracy and mean loss in eval mode under no_grad."""
    module.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for at in range(0, len(data), batch):
            x, y = data.batch(range(at, min(at + batch, len(data))))
            out = forward(module, x)
            loss += F.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(-1) == y).sum().item()
    return {"accuracy": correct / len(data), "loss": loss / len(data), "samples": len(data)}


def reference(out, recipe):
    """Each case trained once per data order: each run's accuracy, the mean."""
    result = {}
    for case, r in recipe["cases"].items():
        started = time.time()
        data, test = case_data(out, case, r, "train"), case_data(out, case, r, "test")
        runs = []
        for seed in recipe["orders"]:
            m = train(torch.jit.load(os.path.join(out, f"{CASE_MODEL[case]}.pt")), r, data, seed)
            runs.append(evaluate(m, test))
        result[case] = {
            "runs": runs,
            "accuracy": sum(x["accuracy"] for x in runs) / len(runs),
            "train_rows": len(data),
            "seconds": round(time.time() - started, 2),
        }
    return result


def structure(model, tensors):
    """Problems of a downloaded state dict against `model.state_dict()`."""
    want = model.state_dict()
    problems = [f"{k} is missing" for k in sorted(set(want) - set(tensors))]
    problems += [f"{k} is not in the module's state_dict()" for k in sorted(set(tensors) - set(want))]
    for k in sorted(set(want) & set(tensors)):
        a, b = tensors[k], want[k]
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            problems.append(f"{k} is {a.dtype} {list(a.shape)}, the module's {b.dtype} {list(b.shape)}")
        elif a.dtype.is_floating_point and not torch.isfinite(a).all():
            problems.append(f"{k} is not finite")
    return problems


def evaluate_cells(out, cells, recipe):
    """Each cell through both downloaded files, on its case's test rows."""
    tests = {}
    result = {}
    for c in cells:
        r = {"problems": []}
        try:
            case = c["case"]
            if case not in tests:
                tests[case] = case_data(out, case, recipe["cases"][case], "test")
            name = CASE_MODEL[case]
            tensors = load_file(c["safetensors"])
            r["problems"] += structure(build(name), tensors)
            initial = torch.jit.load(os.path.join(out, f"{name}.pt")).state_dict()
            if all(torch.equal(tensors[k], v) for k, v in initial.items() if k in tensors):
                r["problems"].append("the weights are the initial ones: nothing trained")
            fresh = build(name)
            fresh.load_state_dict(tensors, strict=True)
            r["safetensors"] = evaluate(fresh, tests[case])
            scripted = torch.jit.load(c["pt"])
            for k, v in scripted.state_dict().items():
                if k in tensors and not torch.equal(v, tensors[k]):
                    r["problems"].append(f"{k} differs between model.pt and model.safetensors")
            r["torchscript"] = evaluate(scripted, tests[case])
        except Exception as e:  # noqa: BLE001 - one broken cell must not hide the others
            r["problems"].append(f"{type(e).__name__}: {e}")
        result[c["cell"]] = r
    return result


def main():
    # One thread, as each executor trains with one libtorch thread (and
    # the reference shares two cores with the platform).
    torch.set_num_threads(1)
    command, out = sys.argv[1], sys.argv[2]
    if command == "write":
        result = write(out)
    elif command == "reference":
        result = reference(out, json.load(open(sys.argv[3])))
    elif command == "evaluate":
        result = evaluate_cells(out, json.load(open(sys.argv[3])), json.load(open(sys.argv[4])))
    else:
        raise SystemExit(f"unknown command {command}: write, reference or evaluate")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
