"""The training script of the restart-latency benchmark (`script-bench`):
plain PyTorch DDP over gloo, nothing of Trainyard in it. It trains a small
CNN on random 8x8 images, saves a checkpoint every `--every` steps to
`TRAINYARD_CHECKPOINT_DIR` (or `./checkpoints`) and loads it when it is
restarted, and prints one line per step with the wall-clock time, its
process id and torchrun's restart count:

    step 12 rank 1 restart 0 pid 4242 t 1733333333.123456

so the benchmark can kill a rank and time the first step of the next
generation the same way under torchrun and under Trainyard.

`--loader` reads the batches through a DataLoader (`--workers` worker
processes) from a dataset whose items each take `--item-ms` to load, as
files on a disk do; `--compile` trains `torch.compile(model)`.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    """Random 8x8 images, each taking `ms` to "load"."""

    def __init__(self, n, ms):
        self.n, self.ms = n, ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.ms > 0:
            time.sleep(self.ms / 1000)
        g = torch.Generator().manual_seed(i)
        return torch.randn(1, 8, 8, generator=g), int(torch.randint(0, 10, (1,), generator=g))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--print-every", type=int, default=1)
    p.add_argument("--loader", action="store_true")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--item-ms", type=float, default=0.0)
    p.add_argument("--compile", action="store_true")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    ckpt_dir = os.environ.get("TRAINYARD_CHECKPOINT_DIR", "checkpoints")
    os.makedirs(ckpt_dir, exist_ok=True)
    torch.manual_seed(rank)

    net = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 64, 10),
    )
    model = DDP(torch.compile(net) if args.compile else net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ckpt = os.path.join(ckpt_dir, "last.pt")
    step = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    batches = None
    if args.loader:
        data = Slow(args.steps * args.batch, args.item_ms)
        batches = iter(DataLoader(data, batch_size=args.batch, num_workers=args.workers))
    while step < args.steps:
        if batches is not None:
            x, y = next(batches)
        else:
            x, y = torch.randn(args.batch, 1, 8, 8), torch.randint(0, 10, (args.batch,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        step += 1
        if step % args.print_every == 0:
            print(
                f"step {step} rank {rank} restart {restart} pid {os.getpid()} t {time.time():.6f}",
                flush=True,
            )
        if rank == 0 and step % args.every == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
        if args.sleep > 0:
            time.sleep(args.sleep)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
