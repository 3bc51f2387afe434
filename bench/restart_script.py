"""The training script of the restart-latency benchmark (`script-bench`):
plain PyTorch DDP over gloo, nothing of Trainyard in it. It trains a small
CNN on random 8x8 images, saves a checkpoint every `--every` steps to
`TRAINYARD_CHECKPOINT_DIR` (or `./checkpoints`) and loads it when it is
restarted, and prints one line per step with the wall-clock time, its
process id and torchrun's restart count:

    step 12 rank 1 restart 0 pid 4242 t 1733333333.123456

so the benchmark can kill a rank and time the first step of the next
generation the same way under torchrun and under Trainyard.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--print-every", type=int, default=1)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    ckpt_dir = os.environ.get("TRAINYARD_CHECKPOINT_DIR", "checkpoints")
    os.makedirs(ckpt_dir, exist_ok=True)
    torch.manual_seed(rank)

    model = DDP(
        nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(16 * 64, 10),
        )
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ckpt = os.path.join(ckpt_dir, "last.pt")
    step = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    while step < args.steps:
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
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
        if args.sleep > 0:
            time.sleep(args.sleep)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
