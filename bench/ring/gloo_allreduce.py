"""Baseline for the ring benchmark: torch.distributed all_reduce (gloo) over loopback.

Runs `world` processes on 127.0.0.1, times `iters` all-reduces (SUM) of a float32
tensor of each size after one warm-up, and prints one JSON line per size with the
slowest rank's mean time, the same way `trainyard-ring bench` is timed.

    gloo_allreduce.py WORLD PORT ITERS SIZES
        all ranks here, on loopback (ring-bench)
    gloo_allreduce.py rank RANK WORLD MASTER_ADDR PORT ITERS SIZES IFNAME
        one rank in this process, rank 0's TCP store at MASTER_ADDR:PORT, gloo on
        interface IFNAME (slow-links-bench starts one per lab host); rank 0 prints
        the JSON line.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, world, port, sizes, iters, out, master="127.0.0.1", ifname="lo"):
    os.environ["MASTER_ADDR"] = master
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = []
    for size in sizes:
        t = torch.rand(size // 4, dtype=torch.float32)
        dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        secs = (time.perf_counter() - start) / iters
        worst = torch.tensor([secs], dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        results.append({"bytes": size, "seconds": worst.item()})
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


class Print:
    """Rank 0's results, printed (one rank per process)."""

    def __init__(self, world):
        self.world = world

    def put(self, results):
        print(json.dumps({"world": self.world, "results": results}), flush=True)


def main():
    if sys.argv[1] == "rank":
        rank, world, master, port, iters = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
        sizes = [int(s) for s in sys.argv[7].split(",")]
        rank_main(int(rank), int(world), int(port), sizes, int(iters), Print(int(world)), master, sys.argv[8])
        return
    world, port, iters = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    sizes = [int(s) for s in sys.argv[4].split(",")]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, sizes, iters, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = out.get(timeout=1800)
    for p in procs:
        p.join()
    print(json.dumps({"world": world, "results": results}))


if __name__ == "__main__":
    main()
