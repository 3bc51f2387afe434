"""Evaluates Trainyard's final weights of an MLP job in plain PyTorch.

Usage: evaluate_mlp.py MODEL.safetensors SPEC.json DATA.npz

It rebuilds the job's MLP (Linear layers fc0, fc1, ... with ReLU between
them, as the executor's built-in model), loads the weights the platform
wrote (safetensors, one tensor per parameter), recomputes the job's
held-out split (the same seeded SplitMix64 permutation the executor uses)
and prints one JSON line: {"accuracy": ..., "loss": ..., "samples": ...}.
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


def main():
    model_path, spec_path, data_path = sys.argv[1:4]
    spec = json.load(open(spec_path))
    weights = load_file(model_path)
    data = np.load(data_path)
    x = torch.from_numpy(data["x"]).float()
    y = torch.from_numpy(data["y"]).long().flatten()
    n = x.shape[0]
    order = SplitMix64(spec.get("seed", 0), 0x5E1).permutation(n)
    fraction = spec.get("eval_fraction", 0.1)
    n_eval = min(int(math.floor(n * fraction + 0.5)), n - 1)
    held_out = torch.tensor(order[:n_eval][:4096])
    layers = len(spec["model"]["hidden"]) + 1
    h = x[held_out].flatten(1)
    with torch.no_grad():
        for i in range(layers):
            h = F.linear(h, weights[f"fc{i}.weight"], weights[f"fc{i}.bias"])
            if i < layers - 1:
                h = torch.relu(h)
        target = y[held_out]
        loss = F.cross_entropy(h, target).item()
        accuracy = (h.argmax(-1) == target).float().mean().item()
    print(json.dumps({"accuracy": accuracy, "loss": loss, "samples": int(n_eval)}))


if __name__ == "__main__":
    main()
