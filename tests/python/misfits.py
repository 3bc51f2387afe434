"""Writes TorchScript modules that cannot train on digits (64 features,
labels 0-9) — a forward of two tensors, too few classes, the wrong input
width — plus one that can (with BatchNorm) and a file that is not
TorchScript, into the folder argv[1]. The executor's inspection tests and
the end-to-end refusal test both use them."""

import os
import sys

import torch


class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x, mask):
        return self.fc(x * mask)


class Few(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 3)

    def forward(self, x):
        return self.fc(x)


class Wide(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(784, 10)

    def forward(self, x):
        return self.fc(x)


class Good(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 10)
        self.bn = torch.nn.BatchNorm1d(10)

    def forward(self, x):
        return self.bn(self.fc(x))


d = sys.argv[1]
for name, cls in [("two", Two), ("few", Few), ("wide", Wide), ("good", Good)]:
    torch.jit.script(cls()).save(os.path.join(d, name + ".pt"))
with open(os.path.join(d, "junk.pt"), "wb") as f:
    f.write(b"not a TorchScript archive")
