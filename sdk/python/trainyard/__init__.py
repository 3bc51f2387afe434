"""Trainyard's Python SDK: a client of the platform's REST API, and ``fit``.

    import trainyard
    client = trainyard.Client()          # $TRAINYARD_API, $TRAINYARD_API_TOKEN
    run = client.fit(net, (x, y), epochs=5, validation=(xv, yv))
    run.wait()                           # a progress bar; JobFailed if it fails
    trained = run.model()                # torch.jit.ScriptModule

:class:`Client` has a method per user operation (jobs, events, metrics,
logs, checkpoints, models, artifacts); :class:`ApiError` is any error answer;
:mod:`trainyard.models` declares the API's shapes the SDK uses.
"""

from .client import ApiError, Client
from .fit import JobFailed, Run, split_permutation
from .report import report

__all__ = ["ApiError", "Client", "JobFailed", "Run", "report", "split_permutation"]
__version__ = "0.1.0"
