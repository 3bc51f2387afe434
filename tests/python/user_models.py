"""User models for the bring-your-own-model tests (tests/e2e/user_models.rs).

A user writes a model with PyTorch, saves it with `torch.jit.script`, and
submits the file; the platform trains it and hands back the trained module
(`model.pt`) and its `state_dict()` (`model.safetensors`). This module is
the Python side of the tests that hold the platform to that promise:

- `write DIR`: writes the five models of the matrix (and the dropout-free
  CNN of the exactness and resume tests, and the asynchronous-PS matrix's
  residual CNNs, token model and LayerNorm MLP) as TorchScript files, and
  splits the digits dataset into `train.npz` (what the jobs get) and
  `test.npz` (rows no job ever sees), with the same rows as int64 token
  ids in `train_ids.npz` and `test_ids.npz`;
- `reference DIR RECIPE`: trains each model with plain PyTorch on the same
  recipe as the jobs (the same initial module, optimizer, learning rate
  schedule, global batch, epochs, the job's own training split in the
  executor's order, and again in the orders of other seeds) and evaluates
  it on `test.npz`, all models in one process;
- `reference-cells DIR CELLS`: PyTorch's own training of each cell's model
  and job-spec optimizer (momentum, Adam, AdamW; weight decay, warm-up
  cosine, clip) as one worker with the global batch, evaluated on the
  model's test rows (the asynchronous-PS matrix, tests/support/async_matrix.rs);
- `evaluate DIR CELLS`: evaluates downloaded results on `test.npz` in eval
  mode under no_grad, once through `torch.jit.load(model.pt)` and once by
  loading `model.safetensors` into a fresh instance of the Python class
  with `load_state_dict(strict=True)`, and checks the file's names, shapes
  and dtypes against `state_dict()`;
- `exact DIR RECIPE MODEL.safetensors`: trains the exactness model with
  plain PyTorch in exactly the executor's data order and compares its final
  parameters and buffers with the job's;
- `compare GOT.safetensors WANT.safetensors`: the relative difference of
  each tensor of two results (a resumed job's and the original's);
- `checkpoint DIR RECIPE MANIFEST`: assembles a checkpoint's shards into a
  state dict, loads it into the module and evaluates it on the job's own
  held-out rows, as the job evaluated itself at that step.

Each command prints one JSON document on stdout. RECIPE is a JSON file:
{"seed", "eval_fraction", "batch" (global), "epochs", "optimizer": {"kind",
"lr"}, "schedule": "constant" | "cosine", "models": [names], and for
`reference` "orders": [seeds of the data orders to train in] and
"lr_by_model": {name: the learning rate of a model trained at its own}}.
"""

import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file

# ---- The models (what a user writes) ----


class BnCnn(nn.Module):
    """Two conv layers with BatchNorm, dropout before the classifier."""

    def __init__(self, p: float = 0.2):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.drop = nn.Dropout(p)
        self.fc = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x):
        h = x.reshape(-1, 1, 8, 8)
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(h))), 2)
        h = F.max_pool2d(F.relu(self.bn2(self.conv2(h))), 2)
        return self.fc(self.drop(h.flatten(1)))


class ResCnn(nn.Module):
    """A residual CNN: a BatchNorm stem, a residual block with a GroupNorm
    and a BatchNorm branch, max pooling and dropout before the classifier
    (the model of the asynchronous-PS matrix, tests/e2e/async_ps.rs)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.conv_a = nn.Conv2d(16, 16, 3, padding=1)
        self.gn = nn.GroupNorm(4, 16)
        self.conv_b = nn.Conv2d(16, 16, 3, padding=1)
        self.bn_b = nn.BatchNorm2d(16)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        h = F.relu(self.bn(self.stem(x.reshape(-1, 1, 8, 8))))
        r = F.relu(self.gn(self.conv_a(h)))
        h = F.relu(h + self.bn_b(self.conv_b(r)))
        return self.head(self.drop(F.max_pool2d(h, 2).flatten(1)))


class ResGn(nn.Module):
    """A residual CNN of another shape (issue 48's stranger's model): a
    GroupNorm stem to 32 channels, a residual block whose branch is conv,
    BatchNorm, ReLU, conv, BatchNorm, global mean pooling and dropout
    before the classifier."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 32, 3, padding=1)
        self.gn = nn.GroupNorm(4, 32)
        self.conv_a = nn.Conv2d(32, 32, 3, padding=1)
        self.bn_a = nn.BatchNorm2d(32)
        self.conv_b = nn.Conv2d(32, 32, 3, padding=1)
        self.bn_b = nn.BatchNorm2d(32)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        h = F.relu(self.gn(self.stem(x.reshape(-1, 1, 8, 8))))
        r = self.bn_b(self.conv_b(F.relu(self.bn_a(self.conv_a(h)))))
        h = F.relu(h + r)
        return self.head(self.drop(h.mean((2, 3))))


class Tokens(nn.Module):
    """Token ids (int64: each pixel's position and value, 64 × 17 ids)
    through an embedding, mean pooled, and a small classifier: a model fed
    integers, not floats (its data is `train_ids.npz`)."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.emb = nn.Embedding(64 * 17, width)
        self.fc = nn.Linear(width, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, ids):
        return self.head(F.relu(self.fc(self.emb(ids).mean(1))))


class LnMlp(nn.Module):
    """An MLP with LayerNorm."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.norm = nn.LayerNorm(128)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(F.relu(self.norm(self.fc1(x))))


class Attention(nn.Module):
    """Pixels (0..1 in steps of 1/16) as tokens 0..16: a token embedding
    plus a learned position, LayerNorm, self-attention (residual),
    LayerNorm, and a linear classifier over the 64 tokens. (Mean pooling
    the tokens instead reached only 85-89 % on digits in a few epochs.)"""

    def __init__(self, width: int = 16):
        super().__init__()
        self.tok = nn.Embedding(17, width)
        self.pos = nn.Parameter(torch.randn(64, width) * 0.5)
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 2, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.head = nn.Linear(64 * width, 10)

    def forward(self, x):
        tokens = (x * 16).round().long().clamp(0, 16)
        h = self.tok(tokens) + self.pos
        a = self.norm1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        return self.head(self.norm2(h).flatten(1))


class Recurrent(nn.Module):
    """The 8 rows of a digit as a sequence of 8 features, through a GRU;
    the classifier reads its last output."""

    def __init__(self, hidden: int = 64):
        super().__init__()
        self.gru = nn.GRU(8, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x):
        out, _ = self.gru(x.reshape(-1, 8, 8))
        return self.head(out[:, -1])


class FrozenTied(nn.Module):
    """A frozen random projection (requires_grad=False), then one weight
    matrix shared by two layers (tied), then a classifier."""

    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(64, 96)
        self.frozen.weight.requires_grad_(False)
        self.frozen.bias.requires_grad_(False)
        self.a = nn.Linear(96, 96)
        self.b = nn.Linear(96, 96)
        self.b.weight = self.a.weight
        self.head = nn.Linear(96, 10)

    def forward(self, x):
        h = torch.tanh(self.frozen(x))
        h = F.relu(self.a(h))
        h = F.relu(self.b(h))
        return self.head(h)


class Counted(nn.Module):
    """An MLP that keeps an int64 count of the samples it trained on and a
    running mean of its inputs (a float buffer) that it subtracts."""

    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))
        self.register_buffer("mean", torch.zeros(64))
        self.fc1 = nn.Linear(64, 96)
        self.fc2 = nn.Linear(96, 10)

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.seen.add_(x.shape[0])
                self.mean.mul_(0.9).add_(x.mean(0), alpha=0.1)
        h = x - self.mean
        return self.fc2(F.relu(self.fc1(h)))


def build(name):
    """A fresh instance of the model `name`, initialized by the seed of its
    name (so `write` and a fresh copy start alike)."""
    torch.manual_seed(sum(map(ord, name)))
    return {
        "bn_cnn": lambda: BnCnn(0.2),
        "attention": Attention,
        "recurrent": Recurrent,
        "frozen_tied": FrozenTied,
        "counted": Counted,
        "res_cnn": ResCnn,
        "res_gn": ResGn,
        "tokens": Tokens,
        "ln_mlp": LnMlp,
        # The exactness and resume tests: BatchNorm on, no dropout, so a
        # run is a deterministic function of the data order.
        "bn_cnn_exact": lambda: BnCnn(0.0),
    }[name]()


MATRIX = ["bn_cnn", "attention", "recurrent", "frozen_tied", "counted"]
ALL = MATRIX + ["bn_cnn_exact", "res_cnn", "res_gn", "tokens", "ln_mlp"]

# Models fed token ids (`train_ids.npz`, `test_ids.npz`), not pixels.
IDS = {"tokens"}


def ids_of(x):
    """Pixels (0..1 in steps of 1/16) as token ids: position × 17 + value
    (0..16), int64."""
    v = np.clip(np.rint(np.asarray(x, dtype=np.float64) * 16), 0, 16).astype(np.int64)
    return v + 17 * np.arange(v.shape[1], dtype=np.int64)


def data_files(name):
    """The (train, test) files of model `name`."""
    return ("train_ids.npz", "test_ids.npz") if name in IDS else ("train.npz", "test.npz")

# ---- The executor's data split and order (executor/src/replica) ----

# The generator is evaluate_mlp.py's port of replica/rng.rs (this folder
# is on the path when the file runs as a script).
from evaluate_mlp import SplitMix64  # noqa: E402


def split(n, seed, eval_fraction):
    """`Dataset::load`: (held-out indices, training indices)."""
    order = SplitMix64(seed, 0x5E1).permutation(n)
    # Rust's f64::round rounds half away from zero; n * f is never negative.
    n_eval = min(int(math.floor(n * eval_fraction + 0.5)), n - 1)
    return order[:n_eval], order[n_eval:]


def epoch_order(train, seed, epoch):
    """`data::epoch_order`."""
    return [train[i] for i in SplitMix64(seed, 0xE0C0 + epoch).permutation(len(train))]


def steps(train, seed, epochs, batch):
    """The global batches of a one-worker job (`data::slice` with world 1):
    each epoch's order cut into runs of `batch`, the last one ragged."""
    for e in range(epochs):
        order = epoch_order(train, seed, e)
        for at in range(0, len(order), batch):
            yield order[at : at + batch]


# ---- Data ----


def load(path):
    d = np.load(path)
    x = torch.from_numpy(np.asarray(d["x"])).reshape(len(d["x"]), -1)
    x = x if x.dtype == torch.int64 else x.float()
    y = torch.from_numpy(np.asarray(d["y"])).long().flatten()
    return x, y


def write(out):
    """The models and the train/test files."""
    os.makedirs(out, exist_ok=True)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    d = np.load(os.path.join(root, "data", "digits.npz"))
    x, y = np.asarray(d["x"]), np.asarray(d["y"]).reshape(-1)
    # 500 rows no job ever sees, drawn with a seed of their own.
    perm = np.random.default_rng(20).permutation(len(x))
    test, train = perm[:500], perm[500:]
    np.savez(os.path.join(out, "train.npz"), x=x[train], y=y[train])
    np.savez(os.path.join(out, "test.npz"), x=x[test], y=y[test])
    ids = ids_of(x.reshape(len(x), -1))
    np.savez(os.path.join(out, "train_ids.npz"), x=ids[train], y=y[train])
    np.savez(os.path.join(out, "test_ids.npz"), x=ids[test], y=y[test])
    files = {}
    for name in ALL:
        path = os.path.join(out, f"{name}.pt")
        torch.jit.script(build(name)).save(path)
        files[name] = path
    return {"models": files, "train": len(train), "test": len(test)}


# ---- Training and evaluation ----


def optimizer(recipe, params):
    """The recipe's optimizer: `sgd` and `adam` (the matrix of
    user_models.rs), or a job spec's `momentum`, `adam` and `adamw` with
    its weight decay and momentum (the PS matrix)."""
    o = recipe["optimizer"]
    wd = o.get("weight_decay", 0.0)
    if o["kind"] == "sgd":
        return torch.optim.SGD(params, lr=o["lr"], weight_decay=wd)
    if o["kind"] == "momentum":
        return torch.optim.SGD(params, lr=o["lr"], momentum=o.get("momentum", 0.9), weight_decay=wd)
    if o["kind"] == "adam":
        return torch.optim.Adam(params, lr=o["lr"], eps=1e-8, weight_decay=wd)
    if o["kind"] == "adamw":
        return torch.optim.AdamW(params, lr=o["lr"], eps=1e-8, weight_decay=wd)
    raise ValueError(f"optimizer {o['kind']} is not part of these tests")


def learning_rate(recipe, step, total):
    """`progress::learning_rate` at 1-based `step` of `total`: constant, or
    (schedule "cosine") a cosine decay from the rate to 0 with no warm-up
    (`warmup_cosine` with `warmup_steps` 0), or a spec's `warmup_cosine`
    in the optimizer (`optimizer.schedule`)."""
    lr = recipe["optimizer"]["lr"]
    sched = recipe["optimizer"].get("schedule")
    if isinstance(sched, dict) and sched.get("kind") == "warmup_cosine":
        warmup = sched.get("warmup_steps", 0)
        if step <= warmup:
            return lr * step / max(warmup, 1)
        t = (step - warmup) / max(total - warmup, 1)
        return 0.5 * lr * (1.0 + math.cos(math.pi * min(t, 1.0)))
    if recipe.get("schedule", "constant") == "constant":
        return lr
    return 0.5 * lr * (1.0 + math.cos(math.pi * min(step / max(total, 1), 1.0)))


def train(module, recipe, x, y, order=None):
    """Plain PyTorch on the job's recipe: the job's training split of
    `train.npz`, in the executor's order (or, with `order`, in the order
    the executor would take with that seed), the global batch, the epochs,
    cross entropy (log_softmax + nll, mean) and the optimizer on the job's
    schedule."""
    _, rows = split(len(x), recipe["seed"], recipe["eval_fraction"])
    params = [p for p in module.parameters() if p.requires_grad]
    opt = optimizer(recipe, params)
    module.train()
    seed = recipe["seed"] if order is None else order
    # Dropout's masks from a seeded generator: a reference run repeats.
    torch.manual_seed(seed)
    batches = list(steps(rows, seed, recipe["epochs"], recipe["batch"]))
    for t, idx in enumerate(batches, start=1):
        for group in opt.param_groups:
            group["lr"] = learning_rate(recipe, t, len(batches))
        i = torch.tensor(idx)
        opt.zero_grad(set_to_none=True)
        loss = F.nll_loss(F.log_softmax(module(x[i]), -1), y[i])
        loss.backward()
        clip = recipe["optimizer"].get("grad_clip")
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
    return module


def evaluate(module, x, y, batch=256):
    """Accuracy and mean loss in eval mode under no_grad, in batches."""
    module.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for at in range(0, len(x), batch):
            out = module(x[at : at + batch])
            t = y[at : at + batch]
            loss += F.cross_entropy(out, t, reduction="sum").item()
            correct += (out.argmax(-1) == t).sum().item()
    return {"accuracy": correct / len(x), "loss": loss / len(x), "samples": len(x)}


def of(recipe, name):
    """The recipe of model `name`: its own learning rate, if
    `recipe["lr_by_model"]` gives one."""
    lr = recipe.get("lr_by_model", {}).get(name)
    if lr is None:
        return recipe
    return dict(recipe, optimizer=dict(recipe["optimizer"], lr=lr))


def reference(out, recipe):
    """Each model trained once per data order in `recipe["orders"]` (the
    job's seed first): the accuracy of each run and their mean."""
    x, y = load(os.path.join(out, "train.npz"))
    tx, ty = load(os.path.join(out, "test.npz"))
    result = {}
    for name in recipe["models"]:
        started = time.time()
        runs = []
        mine = of(recipe, name)
        for order in recipe.get("orders", [recipe["seed"]]):
            m = train(torch.jit.load(os.path.join(out, f"{name}.pt")), mine, x, y, order)
            runs.append(evaluate(m, tx, ty))
        result[name] = {
            "runs": runs,
            "accuracy": sum(r["accuracy"] for r in runs) / len(runs),
            "seconds": round(time.time() - started, 2),
        }
    return result


def reference_cells(out, cells):
    """PyTorch's own training of each cell's model and recipe, as one
    worker with the cell's global batch: {"cell", "model", "optimizer" (the
    job spec's), "batch", "epochs", "seed", "eval_fraction", "orders"};
    one run per seed of "orders", each split and ordered as a job of that
    seed; the mean accuracy on the model's test rows."""
    result = {}
    for c in cells:
        name = c["model"]
        train_file, test_file = data_files(name)
        x, y = load(os.path.join(out, train_file))
        tx, ty = load(os.path.join(out, test_file))
        runs = []
        for order in c.get("orders", [c["seed"]]):
            # As a job of seed `order`: its held-out rows and its order.
            job = dict(c, seed=order)
            m = train(torch.jit.load(os.path.join(out, f"{name}.pt")), job, x, y, order)
            runs.append(evaluate(m, tx, ty)["accuracy"])
        result[c["cell"]] = {"runs": runs, "accuracy": sum(runs) / len(runs)}
    return result


def structure(model, tensors):
    """Problems of a downloaded state dict against `model.state_dict()`:
    names, shapes and dtypes must be exactly the module's."""
    want = model.state_dict()
    problems = []
    for k in sorted(set(want) - set(tensors)):
        problems.append(f"{k} is missing")
    for k in sorted(set(tensors) - set(want)):
        problems.append(f"{k} is not in the module's state_dict()")
    for k in sorted(set(want) & set(tensors)):
        a, b = tensors[k], want[k]
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            problems.append(f"{k} is {a.dtype} {list(a.shape)}, the module's {b.dtype} {list(b.shape)}")
    return problems


def invariants(name, initial, tensors):
    """What each model promises beyond its accuracy."""
    problems = []
    if name == "frozen_tied":
        for k in ["frozen.weight", "frozen.bias"]:
            if k in tensors and not torch.equal(tensors[k], initial[k]):
                problems.append(f"{k} has requires_grad=False but changed")
        if "a.weight" in tensors and "b.weight" in tensors:
            if not torch.equal(tensors["a.weight"], tensors["b.weight"]):
                problems.append("a.weight and b.weight are one tied Parameter but differ")
            if torch.equal(tensors["a.weight"], initial["a.weight"]):
                problems.append("the tied a.weight never trained")
    for k, v in tensors.items():
        if k in initial and initial[k].dtype.is_floating_point and not torch.isfinite(v).all():
            problems.append(f"{k} is not finite")
    return problems


def evaluate_cells(out, cells):
    """Each cell: {"cell", "model", "pt", "safetensors"}."""
    result = {}
    for c in cells:
        r = {"problems": []}
        try:
            name = c["model"]
            tx, ty = load(os.path.join(out, data_files(name)[1]))
            initial = torch.jit.load(os.path.join(out, f"{name}.pt")).state_dict()
            tensors = load_file(c["safetensors"])
            r["problems"] += structure(build(name), tensors)
            r["problems"] += invariants(name, initial, tensors)
            fresh = build(name)
            fresh.load_state_dict(tensors, strict=True)
            r["safetensors"] = evaluate(fresh, tx, ty)
            scripted = torch.jit.load(c["pt"])
            for k, v in scripted.state_dict().items():
                if k in tensors and not torch.equal(v, tensors[k]):
                    r["problems"].append(f"{k} differs between model.pt and model.safetensors")
            r["torchscript"] = evaluate(scripted, tx, ty)
            r["buffers"] = {
                k: v.tolist()
                for k, v in tensors.items()
                if v.dtype == torch.long
            }
        except Exception as e:  # noqa: BLE001 - one broken cell must not hide the others
            r["problems"].append(f"{type(e).__name__}: {e}")
        result[c["cell"]] = r
    return result


def relative_differences(got, want):
    """Per tensor ‖got − want‖ / ‖want‖ (integers compared exactly)."""
    out = {}
    for k, w in want.items():
        if k not in got:
            out[k] = None
            continue
        g = got[k]
        if not w.dtype.is_floating_point:
            out[k] = 0.0 if torch.equal(g.to(w.dtype), w) else float("inf")
            continue
        g, w = g.double(), w.double()
        out[k] = ((g - w).norm() / w.norm().clamp_min(1e-30)).item()
    return out


def exact(out, recipe, got_path):
    x, y = load(os.path.join(out, "train.npz"))
    m = train(torch.jit.load(os.path.join(out, "bn_cnn_exact.pt")), recipe, x, y)
    want = m.state_dict()
    got = load_file(got_path)
    return {
        "relative": relative_differences(got, want),
        "problems": structure(build("bn_cnn_exact"), got),
        "num_batches_tracked": int(want["bn1.num_batches_tracked"]),
    }


def compare(got_path, want_path):
    """Two downloaded state dicts, tensor by tensor."""
    got, want = load_file(got_path), load_file(want_path)
    return {
        "relative": relative_differences(got, want),
        "buffers": {k: v.tolist() for k, v in got.items() if v.dtype == torch.long},
    }


def assemble(manifest_path, model):
    """A checkpoint's state dict: each shard's `weights` is the listed
    pieces of the flattened tensors, concatenated; integer buffers were
    stored as floats and go back to their dtype."""
    manifest = json.load(open(manifest_path))
    folder = os.path.dirname(manifest_path)
    want = model.state_dict()
    flat = {k: torch.full((v.numel(),), float("nan"), dtype=torch.float64) for k, v in want.items()}
    problems = []
    for s in manifest["shards"]:
        path = os.path.join(folder, os.path.basename(s["key"]))
        with safe_open(path, framework="pt") as f:
            weights = f.get_tensor("weights").double()
            ranges = json.loads(f.metadata()["ranges"])
        at = 0
        for r in ranges:
            n = r["end"] - r["start"]
            if r["param"] not in flat:
                problems.append(f"the checkpoint holds {r['param']}, which the module does not have")
            else:
                flat[r["param"]][r["start"] : r["end"]] = weights[at : at + n]
            at += n
    state = {}
    for k, v in want.items():
        if torch.isnan(flat[k]).any():
            problems.append(f"the checkpoint lacks (part of) {k}")
        state[k] = flat[k].reshape(v.shape).to(v.dtype)
    return state, problems


def checkpoint(out, recipe, manifest_path):
    name = recipe["models"][0]
    model = build(name)
    state, problems = assemble(manifest_path, model)
    x, y = load(os.path.join(out, "train.npz"))
    held_out, _ = split(len(x), recipe["seed"], recipe["eval_fraction"])
    result = {"problems": problems}
    if not problems:
        model.load_state_dict(state, strict=True)
        i = torch.tensor(held_out[:4096])
        result.update(evaluate(model, x[i], y[i]))
        result["buffers"] = {k: v.tolist() for k, v in state.items() if v.dtype == torch.long}
    return result


def main():
    # One thread: the executors train with one libtorch thread, and the
    # exactness test wants the same reductions.
    torch.set_num_threads(1)
    command, out = sys.argv[1], sys.argv[2]
    if command == "write":
        result = write(out)
    elif command == "reference":
        result = reference(out, json.load(open(sys.argv[3])))
    elif command == "reference-cells":
        result = reference_cells(out, json.load(open(sys.argv[3])))
    elif command == "evaluate":
        result = evaluate_cells(out, json.load(open(sys.argv[3])))
    elif command == "exact":
        result = exact(out, json.load(open(sys.argv[3])), sys.argv[4])
    elif command == "compare":
        result = compare(out, sys.argv[3])
    elif command == "checkpoint":
        result = checkpoint(out, json.load(open(sys.argv[3])), sys.argv[4])
    else:
        raise SystemExit(f"unknown command {command}: write, reference, evaluate, exact, compare or checkpoint")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
