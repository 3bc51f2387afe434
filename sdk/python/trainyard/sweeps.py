"""Hyperparameter sweeps from Python: :class:`Sweep`, a handle on one.

``client.sweep(base=spec, parameters={...}, metric=..., goal=...)`` posts a
sweep (``POST /v1/sweeps``): the platform expands it into trials, runs
each as an ordinary job of the caller's (``concurrency`` at a time) and,
with ``early_stopping={"asha": {...}}``, stops trials whose metric falls
behind at a rung. The :class:`Sweep` it returns reads the sweep back
(:meth:`Sweep.refresh`), waits for it (:meth:`Sweep.wait`), cancels it, and
hands out its best trial's job as a :class:`~trainyard.fit.Run`.

Errors follow the rest of the SDK: an error answer of the API is an
:class:`~trainyard.errors.ApiError` (a spec the API refuses: status 422,
``errors`` naming each field); a sweep that ends without a completed trial,
or is cancelled, makes :meth:`Sweep.wait` raise :class:`SweepFailed`, as a
failed job makes ``Run.wait`` raise ``JobFailed``.
"""

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from .models import Sweep as SweepDoc
from .models import SweepBest, SweepTrial

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client
    from .fit import Run

#: States a sweep does not leave.
TERMINAL = {"succeeded", "failed", "cancelled"}


class SweepFailed(Exception):
    """A sweep that ended ``failed`` (no trial completed) or ``cancelled``:
    ``sweep`` is the sweep as it ended, ``state`` its state and ``reason``
    its ``reason``."""

    def __init__(self, sweep: SweepDoc):
        self.sweep = sweep
        self.state = sweep.get("state", "")
        self.reason = sweep.get("reason", "")
        super().__init__(f"sweep {sweep.get('id')} ({sweep.get('name')}) {self.state}: {self.reason}")


def sweep_spec(
    base: Dict[str, Any],
    parameters: Dict[str, Dict[str, Any]],
    *,
    metric: str = "eval_accuracy",
    goal: str = "maximize",
    max_trials: Optional[int] = None,
    concurrency: int = 1,
    search: str = "random",
    early_stopping: Optional[Dict[str, Any]] = None,
    name: Optional[str] = None,
    seed: Optional[int] = None,
) -> Dict[str, Any]:
    """The body of ``POST /v1/sweeps`` these arguments stand for (fields left
    at ``None`` are left out, for the API's defaults). The API checks it."""
    spec: Dict[str, Any] = {
        "name": name if name is not None else str(base.get("name") or "sweep"),
        "base": base,
        "parameters": parameters,
        "search": search,
        "metric": metric,
        "goal": goal,
        "concurrency": concurrency,
    }
    if max_trials is not None:
        spec["max_trials"] = max_trials
    if early_stopping is not None:
        spec["early_stopping"] = early_stopping
    if seed is not None:
        spec["seed"] = seed
    return spec


class Sweep:
    """A sweep seen from Python (``client.sweep(...)`` or ``client.get_sweep(id)``).

    ``id``, ``name``, ``state``, ``trials``, ``best`` and ``rungs`` are the
    sweep as it was last read (:meth:`refresh` reads it again); ``doc`` is
    that whole document.
    """

    def __init__(self, client: "Client", doc: SweepDoc):
        self.client = client
        self.doc = doc

    def __repr__(self) -> str:
        return f"Sweep({self.id!r}, {self.name!r}, {self.state})"

    @property
    def id(self) -> str:
        return self.doc["id"]

    @property
    def name(self) -> str:
        return self.doc.get("name", "")

    @property
    def state(self) -> str:
        return self.doc.get("state", "")

    @property
    def trials(self) -> List[SweepTrial]:
        return self.doc.get("trials") or []

    @property
    def best(self) -> Optional[SweepBest]:
        """The best trial so far (``{"index", "job_id", "params", "metric"}``), or ``None``."""
        return self.doc.get("best")

    @property
    def rungs(self) -> List[int]:
        """The step counts of the early-stopping rungs (empty without early stopping)."""
        return self.doc.get("rungs") or []

    def refresh(self) -> "Sweep":
        """Reads the sweep again; itself."""
        self.doc = self.client.get_sweep(self.id).doc
        return self

    def cancel(self) -> "Sweep":
        """Cancels the sweep and its running trials (idempotent); itself, as it is then."""
        self.doc = self.client.cancel_sweep(self.id).doc
        return self

    def wait(self, timeout: Optional[float] = None, poll: float = 1.0) -> "Sweep":
        """Waits until the sweep ends; itself. Raises :class:`SweepFailed` if it
        ended ``failed`` or ``cancelled``, ``TimeoutError`` after ``timeout``
        seconds (the sweep goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.refresh().state not in TERMINAL:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"sweep {self.id} still {self.state} after {timeout} s")
            time.sleep(poll)
        if self.state != "succeeded":
            raise SweepFailed(self.doc)
        return self

    def trial(self, index: int) -> SweepTrial:
        """Trial ``index`` as last read (``IndexError`` when there is none)."""
        for t in self.trials:
            if t.get("index") == index:
                return t
        raise IndexError(f"sweep {self.id} has no trial {index}")

    def run(self, index: int) -> "Run":
        """A :class:`~trainyard.fit.Run` of trial ``index``'s job (``ValueError``
        while it has none: the trial is pending)."""
        job = self.trial(index).get("job_id")
        if not job:
            raise ValueError(f"trial {index} of sweep {self.id} has no job yet")
        return self.client.run(job)

    def best_run(self) -> "Run":
        """A :class:`~trainyard.fit.Run` of the best trial's job (``ValueError``
        while no trial has reported the metric)."""
        best = self.best
        if not best or not best.get("job_id"):
            raise ValueError(f"sweep {self.id} has no best trial yet")
        return self.client.run(best["job_id"])
