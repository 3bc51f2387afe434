"""``trainyard.report()``: a script job's rank tells the platform how far it
got. Inside a script job (``TRAINYARD_REPORT_FILE`` is set), each call
appends one JSON line to the rank's report file, which its executor reads:
rank 0's ``loss``, ``lr``, ``eval_loss``, ``eval_accuracy`` and
``samples_per_sec`` become the job's metrics (the API's curve, the UI, the
progress bars), every rank's step feeds the watchdog, and
``checkpoint=True`` commits ``TRAINYARD_CHECKPOINT_DIR`` at once (rank 0).
Anywhere else (under torchrun, on a laptop) it does nothing, so a script
may call it unconditionally.
"""

import json
import math
import os
from typing import Any


def report(step: int, checkpoint: bool = False, **metrics: Any) -> None:
    """Reports step ``step`` with ``metrics`` (numbers; others are ignored)."""
    path = os.environ.get("TRAINYARD_REPORT_FILE")
    if not path:
        return
    values = {}
    for k, v in metrics.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            values[str(k)[:64]] = f
    line = json.dumps({"step": int(step), "checkpoint": bool(checkpoint), "metrics": values})
    with open(path, "a") as out:
        out.write(line + "\n")
