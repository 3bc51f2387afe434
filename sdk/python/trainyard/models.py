"""The shapes of the API's requests and responses that this SDK reads and writes.

Each ``TypedDict`` here names a component schema of the platform's OpenAPI
document (``openapi/openapi.json``, also served at ``/openapi.json``) and
declares only the fields the SDK itself touches, with their types.
``SCHEMAS`` maps each declaration to its schema's name and ``OPERATIONS``
lists every (method, path template) the client calls. The test
``tests/pytest/test_sdk_contract.py`` checks both against the document, so
a renamed field, a changed type or a moved route fails the suite instead of
failing a user.

Values are plain ``dict``s decoded from JSON: these declarations are for
readers, type checkers and that test, not a runtime layer.
"""

from typing import Any, Dict, List, Optional

try:  # Python 3.11+
    from typing import NotRequired, TypedDict
except ImportError:  # pragma: no cover - older interpreters
    from typing_extensions import NotRequired, TypedDict  # type: ignore


class Violation(TypedDict):
    """One offending field of a request (``errors[]`` of a problem)."""

    field: str
    message: str


class Problem(TypedDict):
    """An ``application/problem+json`` error body (RFC 9457)."""

    type: str
    title: str
    status: int
    detail: str
    errors: NotRequired[List[Violation]]


class TorchscriptSpec(TypedDict):
    """``model`` of a TorchScript job as ``fit`` writes it (``kind`` is ``torchscript``)."""

    url: str


class FileData(TypedDict):
    """``dataset`` of a file dataset as ``fit`` writes it (``kind`` is ``file``)."""

    url: str
    format: NotRequired[Optional[str]]


class OptimizerSpec(TypedDict):
    """``optimizer`` of a spec."""

    kind: str
    lr: float
    weight_decay: NotRequired[float]


class WorkerRange(TypedDict):
    """``workers`` of a spec: start with ``min``, grow to ``max``."""

    min: int
    max: int


class JobSpec(TypedDict):
    """The fields of a job spec that ``fit`` and ``run_script`` fill in
    (``**spec`` may add any other). A model job has ``model``, ``dataset``,
    ``loss``, ``optimizer`` and ``batch_size``; a script job ``script`` and
    ``inputs`` instead."""

    name: str
    model: NotRequired[Optional[Dict[str, Any]]]
    dataset: NotRequired[Optional[Dict[str, Any]]]
    loss: NotRequired[Optional[str]]
    optimizer: NotRequired[Optional[OptimizerSpec]]
    batch_size: NotRequired[Optional[int]]
    script: NotRequired[Optional[Dict[str, Any]]]
    inputs: NotRequired[List[str]]
    epochs: NotRequired[Optional[int]]
    steps: NotRequired[Optional[int]]
    strategy: NotRequired[str]
    workers: NotRequired[WorkerRange]
    eval_fraction: NotRequired[float]
    seed: NotRequired[int]


class Job(TypedDict):
    """A job as the API shows it."""

    id: str
    name: str
    owner: str
    state: str
    state_reason: str
    spec: JobSpec
    created_at: str
    finished_at: NotRequired[Optional[str]]


class JobPage(TypedDict):
    """``GET /v1/jobs``: a page of jobs and the cursor of the next."""

    jobs: List[Job]
    next_cursor: NotRequired[Optional[str]]


class JobEvent(TypedDict):
    """One entry of a job's event log."""

    id: int
    at: str
    kind: str
    reason: str
    data: Dict[str, Any]


class EventPage(TypedDict):
    """``GET /v1/jobs/{id}/events``: a page of events."""

    events: List[JobEvent]
    next_after: NotRequired[Optional[int]]


class JobLogLine(TypedDict):
    """One stored log line of a role."""

    id: int
    at: str
    role: str
    index: int
    level: str
    message: str


class LogPage(TypedDict):
    """``GET /v1/jobs/{id}/logs``: a page of log lines."""

    lines: List[JobLogLine]
    next_after: NotRequired[Optional[int]]


class MetricSample(TypedDict):
    """One (possibly averaged) point of a training curve."""

    step: int
    loss: float
    eval_loss: NotRequired[Optional[float]]
    eval_accuracy: NotRequired[Optional[float]]


class MetricSeries(TypedDict):
    """``GET /v1/jobs/{id}/metrics``: a job's training curve."""

    steps_recorded: int
    downsampled: bool
    points: List[MetricSample]


class CheckpointInfo(TypedDict):
    """One committed checkpoint."""

    step: int
    manifest_url: str


class CheckpointList(TypedDict):
    """``GET /v1/jobs/{id}/checkpoints``."""

    job_id: str
    checkpoints: List[CheckpointInfo]


class ParamInfo(TypedDict):
    """One tensor of a model's ``state_dict()``."""

    name: str
    shape: List[int]


class ModelTensors(TypedDict):
    """``GET /v1/jobs/{id}/tensors``."""

    job_id: str
    tensors: List[ParamInfo]
    parameters: int
    buffers: int


class WhoAmI(TypedDict):
    """``GET /v1/whoami``: who the server takes the caller for."""

    user: str
    role: str
    open: bool


class Artifact(TypedDict):
    """A user's uploaded file (``PUT /v1/artifacts/{name}``)."""

    name: str
    owner: str
    size: int
    sha256: str
    created_at: str
    url: str


class ArtifactPage(TypedDict):
    """``GET /v1/artifacts``."""

    artifacts: List[Artifact]


class SweepTrial(TypedDict):
    """One trial of a sweep."""

    index: int
    job_id: NotRequired[Optional[str]]
    params: Dict[str, Any]
    state: str
    rung_metrics: List[float]
    metric: NotRequired[Optional[float]]
    step: NotRequired[Optional[int]]
    workers: int
    reason: NotRequired[Optional[str]]


class SweepBest(TypedDict):
    """The best trial of a sweep so far."""

    index: int
    job_id: NotRequired[Optional[str]]
    params: Dict[str, Any]
    metric: float


class Sweep(TypedDict):
    """A hyperparameter sweep (``POST /v1/sweeps``, ``GET /v1/sweeps/{id}``)."""

    id: str
    name: str
    owner: str
    state: str
    reason: str
    created_at: str
    finished_at: NotRequired[Optional[str]]
    rungs: List[int]
    trials: List[SweepTrial]
    best: NotRequired[Optional[SweepBest]]


class SweepList(TypedDict):
    """``GET /v1/sweeps``: the caller's sweeps, newest first."""

    sweeps: List[Sweep]


#: Each declaration above and the component schema of the OpenAPI document it describes.
SCHEMAS = {
    Violation: "Violation",
    Problem: "Problem",
    TorchscriptSpec: "TorchscriptSpec",
    FileData: "FileData",
    OptimizerSpec: "OptimizerSpec",
    WorkerRange: "WorkerRange",
    JobSpec: "JobSpec",
    Job: "Job",
    JobPage: "JobPage",
    JobEvent: "JobEvent",
    EventPage: "EventPage",
    JobLogLine: "JobLogLine",
    LogPage: "LogPage",
    MetricSample: "MetricSample",
    MetricSeries: "MetricSeries",
    CheckpointInfo: "CheckpointInfo",
    CheckpointList: "CheckpointList",
    ParamInfo: "ParamInfo",
    ModelTensors: "ModelTensors",
    WhoAmI: "WhoAmI",
    Artifact: "Artifact",
    ArtifactPage: "ArtifactPage",
    SweepTrial: "SweepTrial",
    SweepBest: "SweepBest",
    Sweep: "Sweep",
    SweepList: "SweepList",
}

#: Every (method, path template) the client calls, as the OpenAPI document spells them.
OPERATIONS = [
    ("GET", "/v1/jobs"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs/{id}"),
    ("POST", "/v1/jobs/{id}/cancel"),
    ("GET", "/v1/jobs/{id}/events"),
    ("GET", "/v1/jobs/{id}/metrics"),
    ("GET", "/v1/jobs/{id}/logs"),
    ("GET", "/v1/jobs/{id}/outputs"),
    ("GET", "/v1/jobs/{id}/outputs/{path}"),
    ("GET", "/v1/jobs/{id}/checkpoints"),
    ("GET", "/v1/jobs/{id}/model"),
    ("GET", "/v1/jobs/{id}/tensors"),
    ("GET", "/v1/whoami"),
    ("POST", "/v1/tokens"),
    ("GET", "/v1/artifacts"),
    ("PUT", "/v1/artifacts/{name}"),
    ("GET", "/v1/artifacts/{name}"),
    ("GET", "/v1/artifacts/{name}/content"),
    ("DELETE", "/v1/artifacts/{name}"),
    ("GET", "/v1/sweeps"),
    ("POST", "/v1/sweeps"),
    ("GET", "/v1/sweeps/{id}"),
    ("POST", "/v1/sweeps/{id}/cancel"),
]
