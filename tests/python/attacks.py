"""Writes hostile TorchScript modules into the folder argv[1], each a model a
plain user could upload. The files they aim at are read from
argv[1]/targets.json ({"read": [paths], "write": path}), so that a test can
point them at its own secrets.

- read-<i>.pt: in training mode only (the inspection's eval-mode forward
  never runs it), copies the first bytes of target i into a buffer of its
  own, which the trained model would carry back to the user;
- read-eval.pt: the same read of target 0 in every forward, so that the
  inspection's trial runs it (the sandbox, not the screen, must stop it);
- write.pt: maps the "write" target shared and overwrites it;
- hog.pt: allocates 8 GiB in every forward;
- hog-train.pt: allocates 8 GiB in training mode only, so that it passes
  the inspection and is killed at its memory limit on every try to train;
- spin.pt: loops forever in forward;
- truncated.pt / fuzzed.pt: a good archive cut in half, and one whose
  pickled data is scrambled (the loader must not take the executor down).
Every module maps 64 features to 10 classes (the digits dataset).
"""

import json
import os
import random
import sys

import torch

d = sys.argv[1]
targets = json.load(open(os.path.join(d, "targets.json")))


def reader(path, training_only):
    class Read(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 10)
            self.register_buffer("leak", torch.zeros(32, dtype=torch.uint8))
            self.path = path
            self.training_only = training_only

        def forward(self, x):
            if self.training or not self.training_only:
                b = torch.from_file(self.path, size=32, dtype=torch.uint8)
                self.leak.copy_(b)
            return self.fc(x)

    return Read()


class Write(torch.nn.Module):
    def __init__(self, path):
        super().__init__()
        self.fc = torch.nn.Linear(64, 10)
        self.path = path

    def forward(self, x):
        t = torch.from_file(self.path, shared=True, size=16, dtype=torch.uint8)
        t.fill_(65)
        # Used, so that TorchScript keeps the write.
        return self.fc(x) + t[0].float() * 0.0


class Hog(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        big = torch.ones([2147483648])
        return self.fc(x) + big[0]


class TrainingHog(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        if self.training:
            # Sized by the batch, so that no constant folding runs it early.
            big = torch.ones([x.size(0) * 67108864])
            return self.fc(x) + big[0]
        return self.fc(x)


class Spin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        y = x
        while bool(y.sum() > -1e30) or bool(y.sum() <= -1e30):
            y = y * 1.0
        return self.fc(y)


class Good(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(x)


for i, path in enumerate(targets["read"]):
    torch.jit.script(reader(path, True)).save(os.path.join(d, f"read-{i}.pt"))
torch.jit.script(reader(targets["read"][0], False)).save(os.path.join(d, "read-eval.pt"))
torch.jit.script(Write(targets["write"])).save(os.path.join(d, "write.pt"))
torch.jit.script(Hog()).save(os.path.join(d, "hog.pt"))
torch.jit.script(TrainingHog()).save(os.path.join(d, "hog-train.pt"))
torch.jit.script(Spin()).save(os.path.join(d, "spin.pt"))

good = os.path.join(d, "good-for-fuzz.pt")
torch.jit.script(Good()).save(good)
raw = open(good, "rb").read()
with open(os.path.join(d, "truncated.pt"), "wb") as f:
    f.write(raw[: len(raw) // 2])
# Scramble the pickled data (stored uncompressed) but keep the zip intact.
buf = bytearray(raw)
start = raw.find(b"data.pkl") + 64
rng = random.Random(7)
for k in range(start, min(start + 200, len(buf))):
    buf[k] = rng.randrange(256)
with open(os.path.join(d, "fuzzed.pt"), "wb") as f:
    f.write(bytes(buf))
