"""Baselines of `e2e-bench`: the digits MLP job's model, AdamW optimizer and
per-worker batch trained by plain Python PyTorch eager, on the same data
file, with one thread per process.

`e2e_baseline.py CONFIG`: one process when CONFIG's "world" is 1 (or
absent); with "world": N, PyTorch DistributedDataParallel over gloo, N
processes on this machine, each with the per-worker batch (the baseline of
a ring of N). Prints one JSON object with samples/s over all processes.

`e2e_baseline.py write PATH`: writes the same MLP (64-128-10) as a
TorchScript module, the model a user would bring."""
import json
import os
import socket
import sys
import tempfile
import time

import numpy as np
import torch


def mlp(dims):
    layers = []
    for a, b in zip(dims, dims[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def train(rank, cfg, port, out):
    world = cfg.get("world", 1)
    torch.set_num_threads(cfg["threads"])
    if world > 1:
        import torch.distributed as dist
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    data = np.load(cfg["data"])
    x = torch.from_numpy(data["x"]).float()
    y = torch.from_numpy(data["y"]).long()
    model = mlp([x.shape[1]] + cfg["hidden"] + [int(y.max()) + 1])
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    batch, warmup, steps = cfg["batch"], cfg["warmup"], cfg["steps"]
    g = torch.Generator().manual_seed(rank)
    n = x.shape[0]
    perm, pos = torch.randperm(n, generator=g), 0
    for i in range(warmup + steps):
        if i == warmup:
            if world > 1:
                dist.barrier()
            start = time.perf_counter()
        if pos + batch > n:
            perm, pos = torch.randperm(n, generator=g), 0
        idx = perm[pos:pos + batch]
        pos += batch
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        loss.item()
    if world > 1:
        dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"samples_per_sec": steps * batch * world / elapsed,
                       "ms_per_step": elapsed / steps * 1000, "world": world,
                       "torch": torch.__version__}, f)
    if world > 1:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    if sys.argv[1] == "write":
        torch.manual_seed(0)
        torch.jit.script(mlp([64, 128, 10])).save(sys.argv[2])
        sys.exit()
    cfg = json.loads(sys.argv[1])
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.json")
        world = cfg.get("world", 1)
        if world > 1:
            import torch.multiprocessing as mp
            mp.spawn(train, args=(cfg, free_port(), out), nprocs=world, join=True)
        else:
            train(0, cfg, 0, out)
        with open(out) as f:
            print(f.read())
