"""Evaluates Trainyard's final weights of an MLP job in plain PyTorch.

Usage: evaluate_mlp.py MODEL.safetensors SPEC.json DATA

It rebuilds the job's MLP (Linear layers fc0, fc1, ... with ReLU between
them, as the executor's built-in model) and loads the weights the platform
wrote (safetensors, one tensor per parameter). DATA is the job's dataset
(npz): the job's held-out split is recomputed (the same seeded SplitMix64
permutation the executor uses). When the spec names a separate held-out
set (`dataset.eval_url`), DATA is that set instead (npz, or Parquet with a
fixed-size-list column `x` and a label column `y`) and every row of it is
evaluated, in batches. Prints one JSON line: {"accuracy": ..., "loss":
..., "samples": ..., "correct": "0110..."}, where `correct` says for each
evaluated row, in order, whether the model's argmax is its label (so two
models can be compared row by row on the same held-out set).
"""

import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


class SplitMix64:
    """The executor's seeded generator (executor/src/replica/rng.rs)."""

    def __init__(self, seed, stream):
        self.state = (seed ^ ((stream * GOLDEN) & MASK)) & MASK
        self.next()

    def next(self):
        self.state = (self.state + GOLDEN) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return (self.next() * n) >> 64

    def permutation(self, n):
        p = list(range(n))
        for i in range(n - 1, 0, -1):
            j = self.below(i + 1)
            p[i], p[j] = p[j], p[i]
        return p


def read(path):
    """Features and labels of an npz or a Parquet file."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        t = pq.read_table(path)
        col = t.column("x").combine_chunks()
        width = col.type.list_size
        x = col.flatten().to_numpy().reshape(-1, width)
        y = t.column("y").to_numpy()
        return torch.from_numpy(np.ascontiguousarray(x)).float(), torch.from_numpy(y).long()
    data = np.load(path)
    return torch.from_numpy(data["x"]).float(), torch.from_numpy(data["y"]).long().flatten()


def main():
    model_path, spec_path, data_path = sys.argv[1:4]
    spec = json.load(open(spec_path))
    weights = load_file(model_path)
    x, y = read(data_path)
    n = x.shape[0]
    if spec.get("dataset", {}).get("eval_url"):
        held_out = torch.arange(n)
        n_eval = n
    else:
        order = SplitMix64(spec.get("seed", 0), 0x5E1).permutation(n)
        fraction = spec.get("eval_fraction", 0.1)
        n_eval = min(int(math.floor(n * fraction + 0.5)), n - 1)
        held_out = torch.tensor(order[:n_eval][:4096])
    layers = len(spec["model"]["hidden"]) + 1
    loss_sum, right, correct = 0.0, 0, []
    with torch.no_grad():
        for rows in held_out.split(4096):
            h = x[rows].flatten(1)
            for i in range(layers):
                h = F.linear(h, weights[f"fc{i}.weight"], weights[f"fc{i}.bias"])
                if i < layers - 1:
                    h = torch.relu(h)
            target = y[rows]
            loss_sum += F.cross_entropy(h, target, reduction="sum").item()
            hits = h.argmax(-1) == target
            right += hits.sum().item()
            correct.extend("1" if hit else "0" for hit in hits.tolist())
    samples = len(held_out)
    print(
        json.dumps(
            {
                "accuracy": right / samples,
                "loss": loss_sum / samples,
                "samples": int(n_eval),
                "correct": "".join(correct),
            }
        )
    )


if __name__ == "__main__":
    main()
