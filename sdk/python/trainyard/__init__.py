"""Trainyard's Python SDK: a client of the platform's REST API, and ``fit``.

    import trainyard
    client = trainyard.Client()          # $TRAINYARD_API, $TRAINYARD_API_TOKEN
    run = client.fit(net, (x, y), epochs=5, validation=(xv, yv))
    run.wait()                           # a progress bar; JobFailed if it fails
    trained = run.model()                # torch.jit.ScriptModule
    sweep = client.sweep(base=spec, parameters={"optimizer.lr": {"values": [1e-3, 1e-2]}},
                         search="grid", wait=True)
    sweep.best                           # {"index", "job_id", "params", "metric"}

:class:`Client` has a method per user operation (jobs, events, metrics,
logs, checkpoints, models, artifacts); :class:`ApiError` is any error answer;
:mod:`trainyard.models` declares the API's shapes the SDK uses.
"""

from .client import ApiError, Client
from .fit import JobFailed, Run, split_permutation
from .report import report
from .sweeps import Sweep, SweepFailed

__all__ = ["ApiError", "Client", "JobFailed", "Run", "Sweep", "SweepFailed", "report", "split_permutation"]
__version__ = "0.1.0"
