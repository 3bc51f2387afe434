"""Evaluates weights saved by ddp_digits.py with PyTorch, in eval mode, on
digits no job trained on: `evaluate_ddp.py MODEL_PT TEST_NPZ` prints
{"accuracy": A, "rows": N}."""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_digits import Net  # noqa: E402

model = Net()
model.load_state_dict(torch.load(sys.argv[1]))
model.eval()
d = np.load(sys.argv[2])
x = torch.from_numpy(np.asarray(d["x"])).float() / 16.0
y = torch.from_numpy(np.asarray(d["y"])).long().flatten()
with torch.no_grad():
    right = (model(x).argmax(1) == y).sum().item()
print(json.dumps({"accuracy": right / len(y), "rows": len(y)}))
