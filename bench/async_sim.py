"""Asynchronous PS simulated in plain PyTorch: where an out-of-sync job's
accuracy comes from, with and without staleness.

The platform's async mode (executor/src/ps) applies each worker's push of
`64 / M` samples as one optimizer step at the push rate (`stale_updates.lr:
share`: `lr / M` for SGD, `lr / √M` for Adam and AdamW), on values some
pushes old. This script trains the same model, recipe and data order
(tests/python/user_models.py's split, orders and schedule) three ways, in
one process, so the two effects can be told apart:

* `sync`: one step per global batch of 64 (what a sync job does);
* `seq M`: the global batch cut into M pushes, each one optimizer step at
  the push rate, on the newest values (M workers without staleness);
* `async M`: the same, each gradient taken on the values `M - 1` pushes
  old (M alike workers, round robin).

`--noise` replaces Adam's `1 / √M` by a rate from Adam's own moments:
with R the noise-to-signal ratio of the push's gradient (Σ(v̂ − m̂²) / Σm̂²),
`(1 / M) · √((1 + R) / (1 + R / M))`, the rate at which M pushes move as
far as one sync step when the update is m̂ / √v̂ (1/M for a noiseless
gradient, 1/√M for a noise-dominated one).

It is a tool for aiming, not evidence: the e2e test and `async-bench`
judge the platform itself.

usage: async_sim.py DATA_DIR MODEL-RECIPE SEEDS VARIANT[,VARIANT...] [--noise]
  DATA_DIR: what `user_models.py write DIR` wrote;
  RECIPE: adamw, adam or sgd_momentum (tests/support/async_matrix.rs's);
  VARIANT: sync, seq2, seq4, async2, async4.
"""

import copy
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import user_models as um  # noqa: E402

RECIPES = {
    "sgd_momentum": {"kind": "momentum", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4,
                     "schedule": {"kind": "warmup_cosine", "warmup_steps": 50}, "grad_clip": 1.0},
    "adamw": {"kind": "adamw", "lr": 0.003, "weight_decay": 0.01,
              "schedule": {"kind": "warmup_cosine", "warmup_steps": 0}},
}


def recipe_of(recipe, model):
    if recipe in RECIPES:
        return RECIPES[recipe]
    lr = {"recurrent": 0.008, "attention": 0.002, "ln_mlp": 0.002}.get(model, 0.003)
    return {"kind": "adam", "lr": lr, "schedule": {"kind": "warmup_cosine", "warmup_steps": 0}}


def noise_rate(opt, params, workers):
    """The push rate from Adam's moments (1/√M before its first step)."""
    num = den = 0.0
    for p in params:
        s = opt.state.get(p)
        if not s or "exp_avg" not in s:
            continue
        t = float(s["step"])
        b1, b2 = opt.param_groups[0]["betas"]
        m = s["exp_avg"] / (1 - b1**t)
        v = s["exp_avg_sq"] / (1 - b2**t)
        num += float((v - m * m).clamp(min=0).sum())
        den += float((m * m).sum())
    if den == 0:
        return workers**-0.5
    r = num / den
    return (1 / workers) * ((1 + r) / (1 + r / workers)) ** 0.5


def run(data, model, recipe, seed, workers, delay, noise):
    train_file, test_file = um.data_files(model)
    x, y = um.load(os.path.join(data, train_file))
    tx, ty = um.load(os.path.join(data, test_file))
    c = {"optimizer": recipe_of(recipe, model), "batch": 64, "epochs": 15, "seed": seed,
         "eval_fraction": 0.05}
    module = torch.jit.load(os.path.join(data, f"{model}.pt"))
    if workers == 1:
        return um.evaluate(um.train(module, c, x, y, seed), tx, ty)["accuracy"] * 100
    module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    opt = um.optimizer(c, params)
    adaptive = c["optimizer"]["kind"] in ("adam", "adamw")
    torch.manual_seed(seed)
    _, rows = um.split(len(x), seed, 0.05)
    per = 64 // workers
    shares = [[] for _ in range(workers)]
    for e in range(15):
        order = um.epoch_order(rows, seed, e)
        for at in range(0, len(order), 64):
            batch = order[at : at + 64]
            for k in range(workers):
                if batch[k * per : (k + 1) * per]:
                    shares[k].append(batch[k * per : (k + 1) * per])
    steps = max(len(s) for s in shares)
    pushes = [(k, t, shares[k][t]) for t in range(steps) for k in range(workers) if t < len(shares[k])]
    history = [copy.deepcopy(module.state_dict())]
    for k, t, idx in pushes:
        now = copy.deepcopy(module.state_dict())
        module.load_state_dict(history[max(0, len(history) - 1 - delay)])
        i = torch.tensor(idx)
        opt.zero_grad(set_to_none=True)
        F.nll_loss(F.log_softmax(module(x[i]), -1), y[i]).backward()
        grads = [p.grad.clone() for p in params]
        # Only rank 0's buffers are the job's.
        if k == 0:
            now.update({n: v.clone() for n, v in module.state_dict().items() if "running" in n or "num_batches" in n})
        module.load_state_dict(now)
        for p, g in zip(params, grads):
            p.grad = g
        if c["optimizer"].get("grad_clip"):
            torch.nn.utils.clip_grad_norm_(params, c["optimizer"]["grad_clip"])
        rate = workers**-0.5 if adaptive else 1 / workers
        if noise and adaptive:
            rate = noise_rate(opt, params, workers)
        for g in opt.param_groups:
            g["lr"] = um.learning_rate(c, t + 1, steps) * rate
        opt.step()
        history.append(copy.deepcopy(module.state_dict()))
        history = history[-(delay + 2) :]
    return um.evaluate(module, tx, ty)["accuracy"] * 100


def main():
    data, cell, seeds, variants = sys.argv[1:5]
    noise = "--noise" in sys.argv
    model, recipe = cell.split("-", 1)
    for v in variants.split(","):
        if v == "sync":
            workers, delay = 1, 0
        else:
            workers = int(v[-1])
            delay = 0 if v.startswith("seq") else workers - 1
        accs = [round(run(data, model, recipe, int(s), workers, delay, noise), 1) for s in seeds.split(",")]
        print(f"{cell} {v}{' (noise rate)' if noise and v != 'sync' else ''}: {accs} mean {statistics.mean(accs):.2f}", flush=True)


if __name__ == "__main__":
    main()
