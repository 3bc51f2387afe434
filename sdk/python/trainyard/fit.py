"""Training a PyTorch module on the platform from Python: ``fit`` and ``Run``.

``fit`` turns what a notebook holds — an ``nn.Module`` and ``(x, y)``
arrays — into a platform job: it scripts the module with
``torch.jit.script``, writes the arrays as an ``.npz`` file with the keys the
executors read (``x`` and ``y``), uploads both as artifacts under names
derived from their SHA-256 (so fitting the same model or data again uploads
nothing), and submits a spec whose ``model`` is ``{"kind": "torchscript",
"url": "artifact:..."}`` and whose ``dataset`` is ``{"kind": "file", "url":
"artifact:..."}``. The executors read them from the platform's object
store: nothing is shared with them but the API.

Held-out data (``validation=``) becomes the job's own evaluation set. The
spec has no separate evaluation file: a job holds out its first
``round(n * eval_fraction)`` rows in a seeded permutation (SplitMix64,
``executor/src/replica/rng.rs``) of its dataset. ``fit`` therefore writes
the training and the held-out rows into one file, the held-out rows exactly
at the positions that permutation puts first, with ``eval_fraction`` set so
that those are the rows held out: the job never trains on them, and the
held-out loss and accuracy it reports are on exactly that set.

``Run`` is the handle of the submitted job: ``wait()`` (a tqdm bar with the
loss), ``model()`` (the trained ``torch.jit.ScriptModule``), ``metrics()``,
``events()``, ``logs()``, ``final_eval()``.
"""

import hashlib
import io
import math
import os
import re
import tempfile
import time
import warnings
import zipfile
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .errors import ApiError
from .models import Job

if TYPE_CHECKING:
    # For the annotations only: at run time the client imports this module
    # (``Client.fit``), never this module the client.
    from .client import Client

#: States a job never leaves.
TERMINAL = ("succeeded", "failed", "cancelled")

#: The stream label of the executor's held-out split (``Dataset::load``).
SPLIT_STREAM = 0x5E1
#: The most held-out rows a job evaluates (``Dataset::eval_batch``).
EVAL_ROWS_MAX = 4096
#: The largest ``eval_fraction`` a spec may have.
MAX_EVAL_FRACTION = 0.5

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


class JobFailed(Exception):
    """A job that ended ``failed`` or ``cancelled``: ``job`` is the job as it
    ended, ``state`` its state and ``reason`` its ``state_reason``."""

    def __init__(self, job: Job):
        self.job = job
        self.state = job.get("state", "")
        self.reason = job.get("state_reason", "")
        super().__init__(f"job {job.get('id')} ({job.get('name')}) {self.state}: {self.reason}")


# ----- the executor's seeded split ------------------------------------------


def split_permutation(n: int, seed: int = 0, stream: int = SPLIT_STREAM) -> List[int]:
    """The permutation of ``range(n)`` an executor draws for ``seed``: the
    first ``round(n * eval_fraction)`` entries are a job's held-out rows.

    SplitMix64 seeded with ``seed ^ stream * golden``, one draw discarded,
    then Fisher–Yates from the top with ``(next * (i + 1)) >> 64`` draws — the
    same arithmetic as the executor's ``Rng::permutation``.
    """
    state = (seed ^ ((stream * _GOLDEN) & _MASK)) & _MASK

    def draw() -> int:
        nonlocal state
        state = (state + _GOLDEN) & _MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    draw()  # Rng::new discards its first draw.
    p = list(range(n))
    for i in range(n - 1, 0, -1):
        j = (draw() * (i + 1)) >> 64
        p[i], p[j] = p[j], p[i]
    return p


# ----- files and artifacts ---------------------------------------------------

_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def _is_url(s: str) -> bool:
    return s.startswith("artifact:") or "://" in s


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def artifact_name(stem: str, sha256: str, ext: str) -> str:
    """``STEM-<first 16 hex of the SHA-256>EXT``, cut to the API's rules
    (1–128 of ``A-Za-z0-9._-``, not starting with a dot)."""
    stem = _NAME_BAD.sub("-", stem).strip(".-") or "file"
    return f"{stem[:96]}-{sha256[:16]}{ext}"


def ensure_artifact(client: "Client", path: str, stem: str, ext: str) -> Dict[str, Any]:
    """Uploads the file at ``path`` under a name derived from its content,
    unless an artifact of that name with the same SHA-256 is already there;
    the artifact's metadata."""
    sha = _sha256_file(path)
    name = artifact_name(stem, sha, ext)
    try:
        existing = client.artifact(name)
        if existing.get("sha256") == sha:
            return existing
    except ApiError as e:
        if e.status != 404:
            raise
    return client.upload(path, name)


def write_npz(path: str, arrays: Dict[str, np.ndarray]) -> None:
    """Writes ``arrays`` as an uncompressed ``.npz`` whose bytes depend on the
    arrays alone (``np.savez`` stamps the current time into the archive, so
    the same data would hash differently on every call)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for key, a in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o600 << 16
            with z.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(a), allow_pickle=False)


def _array(a: Any) -> np.ndarray:
    """A NumPy array of ``a`` (a NumPy array, a torch tensor, or a sequence)."""
    if hasattr(a, "detach") and hasattr(a, "cpu"):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def _xy(data: Any, loss: str, what: str) -> Tuple[np.ndarray, np.ndarray]:
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise TypeError(f"{what} must be (x, y) arrays, a local file or a URL; got {type(data).__name__}")
    x, y = _array(data[0]), _array(data[1])
    if x.ndim < 1 or y.ndim < 1 or x.shape[0] != y.shape[0]:
        raise ValueError(f"{what}: x has shape {x.shape} and y {y.shape}: they need the same number of rows")
    x = x.astype(np.float32, copy=False)
    y = y.astype(np.int64 if loss == "cross_entropy" else np.float32, copy=False)
    return x, y


class _Data:
    """The dataset part of a spec and what ``fit`` knows of its rows."""

    def __init__(self, spec: Dict[str, Any], train_rows: Optional[int], eval_fraction: Optional[float]):
        self.spec = spec
        self.train_rows = train_rows
        self.eval_fraction = eval_fraction


def _prepare_data(client: "Client", data: Any, validation: Any, loss: str, seed: int, tmp: str) -> _Data:
    if isinstance(data, (str, os.PathLike)):
        if validation is not None:
            raise ValueError("validation= needs data given as (x, y) arrays, not a file or URL")
        s = os.fspath(data)
        if _is_url(s):
            return _Data({"kind": "file", "url": s}, None, None)
        if not os.path.isfile(s):
            raise FileNotFoundError(f"no such file: {s}")
        stem, ext = os.path.splitext(os.path.basename(s))
        a = ensure_artifact(client, s, stem, ext.lower())
        return _Data({"kind": "file", "url": a["url"]}, None, None)
    x, y = _xy(data, loss, "data")
    eval_fraction = None
    if validation is not None:
        xv, yv = _xy(validation, loss, "validation")
        if xv.shape[1:] != x.shape[1:]:
            raise ValueError(f"validation rows have shape {xv.shape[1:]}, training rows {x.shape[1:]}")
        nt, nv = x.shape[0], xv.shape[0]
        n = nt + nv
        if nt < 1 or nv < 1 or nv > MAX_EVAL_FRACTION * n:
            raise ValueError(f"{nv} validation rows beside {nt} training rows: at most as many as the training rows")
        if nv > EVAL_ROWS_MAX:
            warnings.warn(f"the job evaluates the first {EVAL_ROWS_MAX} of the {nv} validation rows", stacklevel=3)
        # Held-out row k goes where the executor's split puts its k-th
        # held-out index; training rows fill the rest in their order.
        order = np.asarray(split_permutation(n, seed), dtype=np.int64)
        xa = np.empty((n,) + x.shape[1:], dtype=x.dtype)
        ya = np.empty((n,) + y.shape[1:], dtype=y.dtype)
        xa[order[:nv]], ya[order[:nv]] = xv, yv
        xa[order[nv:]], ya[order[nv:]] = x, y
        x, y = xa, ya
        eval_fraction = nv / n
        assert round(n * eval_fraction) == nv
        train_rows = nt
    else:
        train_rows = None
    path = os.path.join(tmp, "data.npz")
    write_npz(path, {"x": x, "y": y})
    a = ensure_artifact(client, path, "data", ".npz")
    return _Data({"kind": "file", "url": a["url"]}, train_rows, eval_fraction)


def _prepare_model(client: "Client", module: Any, tmp: str) -> str:
    """The ``model.url`` of ``module``: a URL as given, a local ``.pt`` file or
    a (scripted) module uploaded as an artifact."""
    if isinstance(module, (str, os.PathLike)):
        s = os.fspath(module)
        if _is_url(s):
            return s
        stem, ext = os.path.splitext(os.path.basename(s))
        return ensure_artifact(client, s, stem, ext.lower() or ".pt")["url"]
    import torch  # only fit and Run.model need torch

    if isinstance(module, torch.jit.ScriptModule):
        scripted = module
    elif isinstance(module, torch.nn.Module):
        scripted = torch.jit.script(module)
    else:
        raise TypeError(f"module must be a torch.nn.Module, a ScriptModule, a .pt file or a URL; got {type(module).__name__}")
    path = os.path.join(tmp, "model.pt")
    scripted.save(path)
    stem = getattr(scripted, "original_name", None) or type(module).__name__
    return ensure_artifact(client, path, str(stem), ".pt")["url"]


def _optimizer(optimizer: Any) -> Dict[str, Any]:
    if optimizer is None:
        return {"kind": "adam", "lr": 0.001}
    if isinstance(optimizer, str):
        return {"kind": optimizer, "lr": 0.001 if optimizer in ("adam", "adamw") else 0.01}
    if isinstance(optimizer, dict):
        return dict(optimizer)
    raise TypeError("optimizer is a kind (\"adam\", \"sgd\", ...) or an optimizer spec dict")


def _workers(workers: Any) -> Dict[str, int]:
    if isinstance(workers, int):
        return {"min": workers, "max": workers}
    if isinstance(workers, (tuple, list)) and len(workers) == 2:
        return {"min": int(workers[0]), "max": int(workers[1])}
    if isinstance(workers, dict):
        return {"min": int(workers["min"]), "max": int(workers["max"])}
    raise TypeError("workers is a count, (min, max) or {\"min\", \"max\"}")


def fit(
    client: "Client",
    module: Any,
    data: Any,
    *,
    strategy: str = "auto",
    workers: Union[int, Sequence[int], Dict[str, int]] = 1,
    epochs: Optional[int] = None,
    steps: Optional[int] = None,
    batch_size: int = 32,
    optimizer: Any = None,
    loss: str = "cross_entropy",
    name: Optional[str] = None,
    validation: Any = None,
    **spec: Any,
) -> "Run":
    """Trains ``module`` on ``data`` on the platform; the :class:`Run` of its job.

    ``module``: a ``torch.nn.Module`` (scripted with ``torch.jit.script``), a
    ``torch.jit.ScriptModule``, a local ``.pt`` file, or a URL (``artifact:``,
    ``s3://``, ...) used as is. ``data``: ``(x, y)`` NumPy arrays or torch
    tensors (written as ``.npz`` with arrays ``x`` and ``y``: ``x`` float32,
    ``y`` int64 class ids for ``cross_entropy``), a local ``.npz`` /
    ``.safetensors`` / ``.txt`` file, or a URL. ``validation``: ``(x, y)``
    held out from training, on which the job reports its held-out loss and
    accuracy (see the module's doc). ``epochs`` or ``steps`` (default one
    epoch); ``optimizer``: a kind (``"adam"``, ``"sgd"``, ...) or a spec dict
    (default Adam at 0.001); ``workers``: a count or ``(min, max)``. Any other
    keyword is a field of the job spec (``seed``, ``eval_fraction``,
    ``checkpoint``, ``resources``, ...). Files are uploaded as artifacts named
    by their SHA-256 and not uploaded again when already there.
    """
    if epochs is not None and steps is not None:
        raise ValueError("give epochs or steps, not both")
    if epochs is None and steps is None:
        epochs = 1
    if validation is not None and "eval_fraction" in spec:
        raise ValueError("validation= sets the job's eval_fraction; do not give both")
    seed = int(spec.get("seed", 0))
    with tempfile.TemporaryDirectory(prefix="trainyard-fit-") as tmp:
        model_url = _prepare_model(client, module, tmp)
        dataset = _prepare_data(client, data, validation, loss, seed, tmp)
    body: Dict[str, Any] = {
        "name": name or f"fit-{type(module).__name__}"[:128],
        "model": {"kind": "torchscript", "url": model_url},
        "dataset": dataset.spec,
        "loss": loss,
        "optimizer": _optimizer(optimizer),
        "batch_size": int(batch_size),
        "strategy": strategy,
        "workers": _workers(workers),
    }
    if epochs is not None:
        body["epochs"] = int(epochs)
    else:
        body["steps"] = int(steps)  # type: ignore[arg-type]
    if dataset.eval_fraction is not None:
        body["eval_fraction"] = dataset.eval_fraction
    body.update(spec)
    job = client.submit(body)
    total = body.get("steps")
    if total is None and dataset.train_rows is not None:
        world = body["workers"]["min"]
        total = body["epochs"] * math.ceil(dataset.train_rows / (body["batch_size"] * world))
    return Run(client, job["id"], job=job, total_steps=total)


# ----- the job of a fit ------------------------------------------------------


class Run:
    """A platform job seen from Python (``client.fit(...)`` or ``client.run(id)``)."""

    def __init__(self, client: "Client", id: str, *, job: Optional[Job] = None, total_steps: Optional[int] = None):
        self.client = client
        self.id = id
        self._job = job
        self.total_steps = total_steps

    def __repr__(self) -> str:
        state = self._job.get("state") if self._job else "?"
        return f"Run({self.id!r}, {state})"

    def job(self) -> Job:
        """The job as it is now."""
        self._job = self.client.job(self.id)
        return self._job

    def metrics(self, max_points: Optional[int] = None) -> Dict[str, Any]:
        """The job's training curve (``GET /v1/jobs/{id}/metrics``)."""
        return self.client.metrics(self.id, max_points=max_points)

    def events(self) -> List[Dict[str, Any]]:
        """The job's event log, oldest first."""
        return self.client.events(self.id)

    def logs(self) -> List[Dict[str, Any]]:
        """The job's log lines, oldest first."""
        return self.client.logs(self.id)

    def cancel(self) -> Job:
        """Cancels the job."""
        self._job = self.client.cancel(self.id)
        return self._job

    def final_eval(self) -> Optional[Dict[str, Any]]:
        """The job's last held-out evaluation: ``{"step", "eval_loss",
        "eval_accuracy"}`` (``eval_accuracy`` is ``None`` for regression), or
        ``None`` before any. Once the job has succeeded this is its result's
        evaluation of the final weights (a parameter-server job's last
        periodic evaluation can be a few steps older); before, the newest
        evaluation in its metrics."""
        for e in reversed(self.events()):
            if e.get("kind") == "result":
                d = e.get("data") or {}
                if d.get("eval_loss") is not None:
                    return {"step": d.get("steps"), "eval_loss": d["eval_loss"], "eval_accuracy": d.get("eval_accuracy")}
        points = self.metrics(max_points=10_000).get("points") or []
        for p in reversed(points):
            if p.get("eval_loss") is not None:
                return {"step": p["step"], "eval_loss": p["eval_loss"], "eval_accuracy": p.get("eval_accuracy")}
        return None

    def wait(self, progress: bool = True, timeout: Optional[float] = None, poll: float = 1.0) -> Job:
        """Waits until the job ends; the job. Shows a progress bar (tqdm.auto:
        a widget in notebooks) with the step, state and training loss unless
        ``progress`` is false. Raises :class:`JobFailed` if it failed or was
        cancelled, ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.total_steps, unit="step", desc=self.id[:8], dynamic_ncols=True)
        try:
            while True:
                job = self.job()
                state = job.get("state", "")
                if bar is not None:
                    self._show(bar, state)
                if state in TERMINAL:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"job {self.id} still {state} after {timeout} s")
                time.sleep(poll)
        finally:
            if bar is not None:
                bar.close()
        if state != "succeeded":
            raise JobFailed(job)
        return job

    def _show(self, bar: Any, state: str) -> None:
        try:
            m = self.metrics(max_points=50)
        except ApiError:
            return
        points = m.get("points") or []
        done = int(m.get("steps_recorded") or 0)
        if bar.total is not None and done > bar.total:
            bar.total = done
        bar.update(done - bar.n)
        post: Dict[str, Any] = {"state": state}
        if points:
            post["loss"] = f"{points[-1]['loss']:.4f}"
            acc = next((p.get("eval_accuracy") for p in reversed(points) if p.get("eval_accuracy") is not None), None)
            if acc is not None:
                post["held_out_acc"] = f"{acc:.4f}"
        bar.set_postfix(post, refresh=True)

    def model(self) -> Any:
        """The trained module (``torch.jit.ScriptModule``, in eval mode): the
        submitted TorchScript module with the job's trained parameters and
        buffers (``GET /v1/jobs/{id}/model?format=torchscript``)."""
        import torch

        data = self.client.model(self.id, format="torchscript")
        m = torch.jit.load(io.BytesIO(data), map_location="cpu")
        m.eval()
        return m

    def outputs(self) -> List[Dict[str, Any]]:
        """A script job's outputs: the files its rank 0 left in
        ``TRAINYARD_OUTPUT_DIR`` (``[{"path", "size"}]``; empty before it
        succeeds)."""
        return self.client.outputs(self.id)

    def output(self, path: str, to: Optional[Union[str, os.PathLike]] = None) -> Union[bytes, str]:
        """One of a script job's outputs: its bytes, or, with ``to``, written
        to that file (its path is returned)."""
        return self.client.output(self.id, path, to)

    def safetensors(self) -> Dict[str, Any]:
        """Every tensor of the trained model's ``state_dict()`` as torch tensors."""
        from safetensors.torch import load as load_safetensors

        return load_safetensors(self.client.model(self.id, format="safetensors"))
