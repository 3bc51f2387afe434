"""The HTTP client of the Trainyard API: one method per user operation.

``Client`` speaks the REST API of ``trainyard serve`` with a bearer token
(a user's, made by an admin with ``POST /v1/tokens``, or the admin's own):
jobs, their events, metrics, logs, checkpoints and trained model, and
artifacts — the files a user uploads so that a job can read them as
``artifact:NAME`` without any filesystem shared with the executors.
Listings that the API pages are followed to their end. Every error answer
becomes an :class:`ApiError` carrying the problem document's status, detail
and field errors. ``Client.fit`` (in :mod:`trainyard.fit`) builds on these.

:class:`ApiError` lives in :mod:`trainyard.errors` (and is re-exported
here) so that :mod:`trainyard.fit` can catch it without importing this
module: the client imports ``fit``, lazily, and never the other way round.
"""

import os
import urllib.parse
from typing import Any, BinaryIO, Dict, Iterator, List, Optional, Union

import requests

from .errors import ApiError
from .models import Artifact, CheckpointList, Job, JobEvent, JobLogLine, MetricSeries, ModelTensors, WhoAmI
from .sweeps import Sweep, sweep_spec

#: Where the API is when neither the argument nor ``TRAINYARD_API`` says.
DEFAULT_API = "http://127.0.0.1:8080"

#: Bytes per read when a download is written to a file.
_CHUNK = 1 << 20


def _quote(segment: str) -> str:
    return urllib.parse.quote(str(segment), safe="")


class Client:
    """A client of one Trainyard API.

    ``api`` is the base URL (default ``$TRAINYARD_API``, else
    ``http://127.0.0.1:8080``), ``token`` the bearer token (default
    ``$TRAINYARD_API_TOKEN``; none for an open loopback server). ``timeout``
    bounds each wait for the server, in seconds.
    """

    def __init__(self, api: Optional[str] = None, token: Optional[str] = None, *, timeout: float = 60.0):
        self.api = (api or os.environ.get("TRAINYARD_API") or DEFAULT_API).rstrip("/")
        self.token = token if token is not None else os.environ.get("TRAINYARD_API_TOKEN")
        self.timeout = timeout
        self.session = requests.Session()
        if self.token:
            self.session.headers["Authorization"] = f"Bearer {self.token}"
        self.session.headers["User-Agent"] = "trainyard-python"

    def __repr__(self) -> str:
        return f"trainyard.Client({self.api!r})"

    # ----- plumbing -------------------------------------------------------

    def request(self, method: str, path: str, *, params: Optional[Dict[str, Any]] = None, json: Any = None, data: Any = None, headers: Optional[Dict[str, str]] = None, stream: bool = False) -> requests.Response:
        """Sends one request to ``path`` (under the base URL); raises :class:`ApiError` on an error status."""
        params = {k: v for k, v in (params or {}).items() if v is not None}
        r = self.session.request(method, self.api + path, params=params or None, json=json, data=data, headers=headers, stream=stream, timeout=self.timeout)
        if r.status_code >= 400:
            try:
                raise ApiError.from_response(r)
            finally:
                r.close()
        return r

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        r = self.request(method, path, **kw)
        return r.json() if r.content else None

    def _download(self, path: str, params: Dict[str, Any], to: Optional[Union[str, os.PathLike]]) -> Union[bytes, str]:
        if to is None:
            return self.request("GET", path, params=params).content
        with self.request("GET", path, params=params, stream=True) as r, open(to, "wb") as f:
            for chunk in r.iter_content(_CHUNK):
                f.write(chunk)
        return os.fspath(to)

    def _pages(self, path: str, key: str, params: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
        """Items under ``key`` of every page of an ``after``-paged listing."""
        params = dict(params)
        while True:
            page = self._json("GET", path, params=params)
            items = page.get(key) or []
            yield from items
            after = page.get("next_after")
            if after is None or not items:
                return
            params["after"] = after

    # ----- identity -------------------------------------------------------

    def whoami(self) -> WhoAmI:
        """Who the server takes this client for: ``{"user", "role", "open", ...}``."""
        return self._json("GET", "/v1/whoami")

    def create_token(self, owner: str, role: str = "user", label: str = "", expires_in_secs: Optional[int] = None) -> Dict[str, Any]:
        """Makes an API token acting as ``owner`` (admins only); the answer's ``token`` is shown only here."""
        body: Dict[str, Any] = {"owner": owner, "role": role, "label": label}
        if expires_in_secs is not None:
            body["expires_in_secs"] = expires_in_secs
        return self._json("POST", "/v1/tokens", json=body)

    # ----- jobs -----------------------------------------------------------

    def iter_jobs(self, state: Optional[str] = None, owner: Optional[str] = None, page_size: Optional[int] = None) -> Iterator[Job]:
        """Every job visible to the caller, newest first, page after page.

        ``state`` filters by state (comma-separated, e.g. ``"queued,running"``);
        ``owner`` (admins) by owner; ``page_size`` is the API's ``limit``.
        """
        params: Dict[str, Any] = {"state": state, "owner": owner, "limit": page_size}
        while True:
            page = self._json("GET", "/v1/jobs", params=params)
            yield from page.get("jobs") or []
            cursor = page.get("next_cursor")
            if not cursor:
                return
            params["cursor"] = cursor

    def jobs(self, state: Optional[str] = None, owner: Optional[str] = None, page_size: Optional[int] = None) -> List[Job]:
        """Every job visible to the caller, newest first (all pages); see :meth:`iter_jobs`."""
        return list(self.iter_jobs(state=state, owner=owner, page_size=page_size))

    def job(self, id: str) -> Job:
        """One job."""
        return self._json("GET", f"/v1/jobs/{_quote(id)}")

    def submit(self, spec: Dict[str, Any], idempotency_key: Optional[str] = None) -> Job:
        """Submits a job spec (a dict, as ``POST /v1/jobs`` takes it); the new job.

        With ``idempotency_key``, a retried submit returns the same job.
        """
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._json("POST", "/v1/jobs", json=spec, headers=headers)

    def cancel(self, id: str) -> Job:
        """Cancels a job (idempotent); the job as it is then."""
        return self._json("POST", f"/v1/jobs/{_quote(id)}/cancel")

    def events(self, id: str, after: Optional[int] = None) -> List[JobEvent]:
        """The job's event log, oldest first (every page; after event ``after`` when given)."""
        return list(self._pages(f"/v1/jobs/{_quote(id)}/events", "events", {"after": after, "limit": 1000}))

    def logs(self, id: str, after: Optional[int] = None) -> List[JobLogLine]:
        """The job's log lines from every role, oldest first (every page)."""
        return list(self._pages(f"/v1/jobs/{_quote(id)}/logs", "lines", {"after": after, "limit": 1000}))

    def metrics(self, id: str, max_points: Optional[int] = None) -> MetricSeries:
        """The job's training curve: ``points`` by step (averaged into buckets past ``max_points``)."""
        return self._json("GET", f"/v1/jobs/{_quote(id)}/metrics", params={"max_points": max_points})

    def checkpoints(self, id: str) -> CheckpointList:
        """The job's committed checkpoints, newest first."""
        return self._json("GET", f"/v1/jobs/{_quote(id)}/checkpoints")

    def model(self, id: str, format: str = "torchscript", path: Optional[Union[str, os.PathLike]] = None) -> Union[bytes, str]:
        """The job's trained model: ``torchscript`` (TorchScript jobs: the module
        with its trained parameters and buffers, for ``torch.jit.load``) or
        ``safetensors`` (every tensor of its ``state_dict()``). The bytes, or,
        with ``path``, streamed into that file (its path is returned)."""
        return self._download(f"/v1/jobs/{_quote(id)}/model", {"format": format}, path)

    def outputs(self, id: str) -> List[Dict[str, Any]]:
        """A script job's outputs (rank 0's ``TRAINYARD_OUTPUT_DIR``): ``[{"path", "size"}]``."""
        return self._json("GET", f"/v1/jobs/{_quote(id)}/outputs").get("outputs") or []

    def output(self, id: str, path: str, to: Optional[Union[str, os.PathLike]] = None) -> Union[bytes, str]:
        """One output's bytes, or, with ``to``, streamed into that file (its path is returned)."""
        quoted = "/".join(_quote(p) for p in path.split("/"))
        return self._download(f"/v1/jobs/{_quote(id)}/outputs/{quoted}", {}, to)

    def tensors(self, id: str) -> ModelTensors:
        """Every tensor of the job's model: names, shapes, kinds."""
        return self._json("GET", f"/v1/jobs/{_quote(id)}/tensors")

    # ----- artifacts ------------------------------------------------------

    def upload(self, path_or_bytes: Union[str, os.PathLike, bytes, bytearray, BinaryIO], name: Optional[str] = None) -> Artifact:
        """Uploads a file as the artifact ``name`` (replacing one of that name); its metadata.

        ``path_or_bytes`` is a path (streamed from disk, never read whole
        into memory; ``name`` defaults to its file name), bytes, or an open
        binary file. Jobs read it as ``artifact:NAME`` (the answer's ``url``).
        """
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            if not name:
                raise ValueError("upload of bytes needs a name")
            return self._json("PUT", f"/v1/artifacts/{_quote(name)}", data=bytes(path_or_bytes), headers=headers)
        if isinstance(path_or_bytes, (str, os.PathLike)):
            name = name or os.path.basename(os.fspath(path_or_bytes))
            # requests sends an open file in blocks, with its size as Content-Length.
            with open(path_or_bytes, "rb") as f:
                return self._json("PUT", f"/v1/artifacts/{_quote(name)}", data=f, headers=headers)
        if not name:
            raise ValueError("upload of a file object needs a name")
        return self._json("PUT", f"/v1/artifacts/{_quote(name)}", data=path_or_bytes, headers=headers)

    def artifacts(self, owner: Optional[str] = None) -> List[Artifact]:
        """The caller's artifacts (an admin: everyone's, or ``owner``'s)."""
        return self._json("GET", "/v1/artifacts", params={"owner": owner}).get("artifacts") or []

    def artifact(self, name: str, owner: Optional[str] = None) -> Artifact:
        """One artifact's metadata (``ApiError`` with status 404 when there is none)."""
        return self._json("GET", f"/v1/artifacts/{_quote(name)}", params={"owner": owner})

    def artifact_content(self, name: str, path: Optional[Union[str, os.PathLike]] = None, owner: Optional[str] = None) -> Union[bytes, str]:
        """An artifact's bytes, or, with ``path``, streamed into that file (its path is returned)."""
        return self._download(f"/v1/artifacts/{_quote(name)}/content", {"owner": owner}, path)

    def delete_artifact(self, name: str, owner: Optional[str] = None) -> None:
        """Deletes an artifact (``ApiError`` 409 while an unfinished job uses it)."""
        self.request("DELETE", f"/v1/artifacts/{_quote(name)}", params={"owner": owner}).close()

    # ----- sweeps ---------------------------------------------------------

    def sweep(
        self,
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
        wait: bool = False,
        timeout: Optional[float] = None,
    ) -> Sweep:
        """Starts a hyperparameter sweep over ``base`` (a job spec dict); its :class:`Sweep`.

        ``parameters`` maps dotted spec paths to their values:
        ``{"optimizer.lr": {"log_uniform": [1e-4, 1e-1]}, "batch_size":
        {"values": [32, 64]}}`` (``uniform`` too; ``points`` spaces a range
        for a grid, ``integer`` rounds it); for a script job,
        ``"script.args.lr"`` passes ``--lr=VALUE`` to the script. ``search`` is ``"grid"`` or
        ``"random"``; ``metric`` one of ``eval_accuracy``, ``eval_loss`` and
        ``loss``, with ``goal`` ``"maximize"`` or ``"minimize"``.
        ``max_trials`` bounds the trials (a random search must give it; a
        grid runs every point without it), ``concurrency`` how many run at
        once. ``early_stopping={"asha": {"reduction_factor": 4,
        "min_steps": 25}}`` stops trials that fall behind at a rung (a script
        job adds ``"max_steps"``, the last step its script reports). With
        ``wait``, returns once the sweep has ended (see :meth:`Sweep.wait`).
        """
        spec = sweep_spec(
            base, parameters, metric=metric, goal=goal, max_trials=max_trials, concurrency=concurrency,
            search=search, early_stopping=early_stopping, name=name, seed=seed,
        )
        s = Sweep(self, self._json("POST", "/v1/sweeps", json=spec))
        return s.wait(timeout=timeout) if wait else s

    def sweeps(self) -> List[Sweep]:
        """The caller's sweeps, newest first."""
        return [Sweep(self, d) for d in self._json("GET", "/v1/sweeps").get("sweeps") or []]

    def get_sweep(self, id: str) -> Sweep:
        """One sweep (``ApiError`` 404 when there is none of the caller's)."""
        return Sweep(self, self._json("GET", f"/v1/sweeps/{_quote(id)}"))

    def cancel_sweep(self, id: str) -> Sweep:
        """Cancels a sweep and its running trials (idempotent); the sweep as it is then."""
        return Sweep(self, self._json("POST", f"/v1/sweeps/{_quote(id)}/cancel"))

    # ----- training from Python --------------------------------------------

    def fit(self, module: Any, data: Any, **kwargs: Any) -> "Run":  # noqa: F821 - defined in .fit
        """Trains a PyTorch module on the platform; see :func:`trainyard.fit.fit`."""
        from .fit import fit

        return fit(self, module, data, **kwargs)

    def run_script(self, script: Union[str, os.PathLike], **kwargs: Any) -> "Run":  # noqa: F821
        """Runs your own training script on the platform; see :func:`trainyard.scripts.run_script`."""
        from .scripts import run_script

        return run_script(self, script, **kwargs)

    def run(self, id: str) -> "Run":  # noqa: F821
        """A :class:`~trainyard.fit.Run` handle of an existing job."""
        from .fit import Run

        return Run(self, id)
