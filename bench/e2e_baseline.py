"""Baseline of `e2e-bench`: the digits MLP job's model, AdamW optimizer and
per-worker batch trained by one plain Python PyTorch eager process with one
thread, on the same data file. Prints one JSON object with samples/s."""
import json
import sys
import time

import numpy as np
import torch

cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
torch.manual_seed(0)
data = np.load(cfg["data"])
x = torch.from_numpy(data["x"]).float()
y = torch.from_numpy(data["y"]).long()
dims = [x.shape[1]] + cfg["hidden"] + [int(y.max()) + 1]
layers = []
for a, b in zip(dims, dims[1:]):
    layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers[:-1])
opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
batch, warmup, steps = cfg["batch"], cfg["warmup"], cfg["steps"]
n = x.shape[0]
perm, pos = torch.randperm(n), 0
for i in range(warmup + steps):
    if i == warmup:
        start = time.perf_counter()
    if pos + batch > n:
        perm, pos = torch.randperm(n), 0
    idx = perm[pos:pos + batch]
    pos += batch
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    loss.backward()
    opt.step()
    loss.item()
elapsed = time.perf_counter() - start
print(json.dumps({"samples_per_sec": steps * batch / elapsed, "ms_per_step": elapsed / steps * 1000, "torch": torch.__version__}))
