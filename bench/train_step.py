"""Python PyTorch eager twin of `train-bench`: the same models, batch,
optimizer and thread count; prints one JSON object with ms per step."""
import json
import sys
import time

import torch

cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
torch.manual_seed(0)


class Mlp(torch.nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x):
        for i, l in enumerate(self.layers):
            x = l(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


class Cnn(torch.nn.Module):
    def __init__(self, c, h, w, convs, hidden, classes):
        super().__init__()
        self.shape = (c, h, w)
        chans = [c] + convs
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(a, b, 3, padding=1) for a, b in zip(chans, chans[1:]))
        flat = convs[-1] * (h >> len(convs)) * (w >> len(convs))
        self.fc0 = torch.nn.Linear(flat, hidden)
        self.fc1 = torch.nn.Linear(hidden, classes)

    def forward(self, x):
        x = x.reshape(x.shape[0], *self.shape)
        for c in self.convs:
            x = torch.nn.functional.max_pool2d(torch.relu(c(x)), 2)
        return self.fc1(torch.relu(self.fc0(x.flatten(1))))


def bench(model, features, classes, batch, warmup, steps):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(batch, features)
    y = torch.randint(0, classes, (batch,))
    for i in range(warmup + steps):
        if i == warmup:
            start = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
    return (time.perf_counter() - start) / steps * 1000


m = cfg["mlp"]
c = cfg["cnn"]
out = {
    "torch": torch.__version__,
    "mlp_ms": bench(Mlp(m["dims"]), m["dims"][0], m["dims"][-1], m["batch"], cfg["warmup"], cfg["steps"]),
    "cnn_ms": bench(Cnn(c["channels"], c["side"], c["side"], c["convs"], c["hidden"], c["classes"]),
                    c["channels"] * c["side"] * c["side"], c["classes"], c["batch"], cfg["warmup"], cfg["steps"]),
}
print(json.dumps(out))
