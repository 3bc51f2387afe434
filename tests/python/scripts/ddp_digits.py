"""A user's own distributed training script, in plain PyTorch: nothing in
it is Trainyard's. It trains a small CNN with BatchNorm on 8x8 digits with
DistributedDataParallel over gloo, shards the data with its own
DistributedSampler, saves a checkpoint after every epoch and loads it when
it is restarted, and rank 0 saves the trained weights. It runs the same
under `torchrun --nproc-per-node 2 ddp_digits.py` and as a Trainyard script
job; the folders come from the environment, with local defaults.

The options are what people add to such a script every day: DataLoader
worker processes (`--workers`, `--start-method`, `--persistent`),
`torch.compile` (`--compile`), and packages of their own (`--progress`:
tqdm's bar, `--sklearn`: scikit-learn's accuracy, `--table`: tabulate's
summary). None changes what is trained. With `--compile` each rank prints
inductor's compiled-graph cache hits and misses after its first step (a
warm restart finds its kernels); `--fail-once-after N` exits with an error
after epoch N's checkpoint, on the first try only, as a script with a
transient fault does.
"""

import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:  # Optional: Trainyard's SDK, if the runtime has it, reports progress.
    from trainyard import report
except ImportError:

    def report(step, checkpoint=False, **metrics):
        pass


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.1), nn.Linear(32 * 2 * 2, 10))

    def forward(self, x):
        return self.head(self.features(x.view(-1, 1, 8, 8)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--data", default="digits-train.npz")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--start-method", default=None, choices=["fork", "spawn", "forkserver"])
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--sklearn", action="store_true")
    p.add_argument("--table", action="store_true")
    p.add_argument("--fail-once-after", type=int, default=None)
    args = p.parse_args()
    if args.progress:
        import tqdm

        print(f"tqdm {tqdm.__version__} from {tqdm.__file__}", flush=True)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    inputs = os.environ.get("TRAINYARD_INPUT_DIR", ".")
    ckpt_dir = os.environ.get("TRAINYARD_CHECKPOINT_DIR", "checkpoints")
    out_dir = os.environ.get("TRAINYARD_OUTPUT_DIR", "outputs")
    os.makedirs(ckpt_dir, exist_ok=True)

    d = np.load(os.path.join(inputs, args.data))
    x = torch.from_numpy(np.asarray(d["x"])).float() / 16.0
    y = torch.from_numpy(np.asarray(d["y"])).long().flatten()
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=1)
    extra = {}
    if args.workers:
        extra = {"num_workers": args.workers, "persistent_workers": args.persistent}
        if args.start_method:
            extra["multiprocessing_context"] = args.start_method
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, **extra)

    net = Net()
    model = DDP(torch.compile(net) if args.compile else net)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    ckpt = os.path.join(ckpt_dir, "last.pt")
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"] + 1
        print(f"rank {rank}: resumed after epoch {state['epoch']}", flush=True)

    for epoch in range(start, args.epochs):
        model.train()
        sampler.set_epoch(epoch)
        total, n = 0.0, 0
        batches = loader
        if args.progress:
            batches = tqdm.tqdm(loader, disable=rank != 0, mininterval=5)
        for xb, yb in batches:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            total, n = total + loss.item(), n + 1
            if args.compile and epoch == start and n == 1:
                from torch._dynamo.utils import counters

                c = counters["inductor"]
                print(
                    f"rank {rank} compiled graphs: cache hits {c['fxgraph_cache_hit']} misses {c['fxgraph_cache_miss']}",
                    flush=True,
                )
        print(f"rank {rank} epoch {epoch} loss {total / max(n, 1):.4f}", flush=True)
        # Rank 0 saves (DDP keeps the replicas equal); every rank loads.
        if rank == 0:
            tmp = ckpt + ".tmp"
            state = {"model": net.state_dict(), "opt": opt.state_dict(), "epoch": epoch}
            torch.save(state, tmp)
            os.replace(tmp, ckpt)
        report(epoch + 1, checkpoint=True, loss=total / max(n, 1), lr=args.lr, batches=n)
        first_try = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if epoch == args.fail_once_after and first_try:
            dist.barrier()
            print(f"rank {rank}: failing once after epoch {epoch}", flush=True)
            raise SystemExit(3)

    if rank == 0 and (args.sklearn or args.table):
        net.eval()
        with torch.no_grad():
            predicted = net(x).argmax(1).numpy()
        if args.sklearn:
            import sklearn
            from sklearn.metrics import accuracy_score

            train_accuracy = accuracy_score(y.numpy(), predicted)
            print(f"scikit-learn {sklearn.__version__}: train accuracy {train_accuracy:.4f}", flush=True)
        if args.table:
            from tabulate import tabulate

            print(tabulate([["rows", len(y)], ["epochs", args.epochs]], headers=["what", "n"]), flush=True)
    if rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        torch.save(net.state_dict(), os.path.join(out_dir, "model.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
