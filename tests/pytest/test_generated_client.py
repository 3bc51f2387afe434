"""A client generated from the OpenAPI document builds and submits every kind of job.

``openapi/openapi.json`` is meant for real client generators, not only for
people reading it. This test runs one, openapi-python-client 0.29.1 (from
PyPI; ``scripts/openapi_client.sh``'s ``ensure_openapi_python_client``
installs it and sets ``TRAINYARD_OPENAPI_PYTHON_CLIENT``), on the committed
document into a scratch folder, and fails on anything the generator
complains about: a model it skips or names twice (it used to drop the
``bounded`` consistency mode and two role outcomes, and ``JobSpec`` then
imported a module it never wrote), a repeated operationId. It then imports
the generated package and, through its functions and models only (no raw
dicts, no other HTTP client), submits a spec of every model kind, dataset
kind, strategy and consistency mode the document lists to the session's
``platform`` with the admin token, and checks that each is accepted (201)
and reads back (``GET /v1/jobs/{id}``) as the same spec, into the same
generated classes. The jobs ask for more memory than any test executor has,
so they are never placed, and are cancelled at the end.

The generated package needs httpx, attrs and python-dateutil in the venv
that runs pytest.
"""

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import DIGITS, UNPLACEABLE

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "openapi" / "openapi.json"
GENERATOR_VERSION = "0.29.1"
#: The generated package's name: one no installed module has.
PACKAGE = "trainyard_generated_client"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The generated package (``.root``: its folder, ``.models``, ``.types``,
    ``.jobs``: its job operations, ``.client``: the class of an
    authenticated client)."""
    exe = os.environ.get("TRAINYARD_OPENAPI_PYTHON_CLIENT")
    if not exe:
        pytest.fail(
            "TRAINYARD_OPENAPI_PYTHON_CLIENT is not set: it names the openapi-python-client executable "
            f"({GENERATOR_VERSION}) this test runs; `source scripts/common.sh; source scripts/openapi_client.sh; "
            "ensure_openapi_python_client` installs it and sets it (./scripts/test does)",
            pytrace=False,
        )
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and GENERATOR_VERSION in version.stdout, (
        f"{exe} --version: {version.stdout}{version.stderr} (want {GENERATOR_VERSION})"
    )
    missing = [dep for dep in ("httpx", "attrs", "dateutil") if importlib.util.find_spec(dep) is None]
    if missing:
        pytest.fail(
            f"the generated client needs {missing} in the venv that runs pytest "
            "(pip install httpx attrs python-dateutil)",
            pytrace=False,
        )

    out = tmp_path_factory.mktemp("generated-client")
    config = out / "config.yaml"
    # No post hooks: they only format the output with ruff (and warn when
    # ruff is missing, which would hide a real warning among them).
    config.write_text(f"package_name_override: {PACKAGE}\npost_hooks: []\n")
    run = subprocess.run(
        [exe, "generate", "--path", str(DOC), "--meta", "none", "--config", str(config), "--output-path", str(out / PACKAGE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = run.stdout + run.stderr
    # A clean run prints one line, "Generating <folder>"; anything else is a
    # warning (a schema skipped, a duplicate model) or an error.
    complaints = [line for line in report.splitlines() if line.strip() and not line.startswith("Generating ")]
    assert run.returncode == 0 and not complaints, (
        f"openapi-python-client {GENERATOR_VERSION} complained about openapi/openapi.json "
        f"(exit {run.returncode}):\n{report}"
    )

    sys.path.insert(0, str(out))
    try:
        pkg = SimpleNamespace(
            root=out / PACKAGE,
            models=importlib.import_module(f"{PACKAGE}.models"),
            client=importlib.import_module(PACKAGE).AuthenticatedClient,
            types=importlib.import_module(f"{PACKAGE}.types"),
            jobs=SimpleNamespace(
                **{op: importlib.import_module(f"{PACKAGE}.api.jobs.{op}") for op in ("submit_job", "get_job", "cancel_job")}
            ),
        )
        yield pkg
    finally:
        sys.path.remove(str(out))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def _spec(m, name, model, dataset, loss, strategy, **extra):
    """A spec of the generated ``JobSpec`` class: a few steps, Adam, and
    memory no test executor has (the job is never placed)."""
    return m.JobSpec(
        name=f"generated-client-{name}",
        model=model,
        dataset=dataset,
        loss=loss,
        optimizer=extra.pop("optimizer", None) or m.OptimizerSpec(kind=m.OptimizerKind.ADAM, lr=0.01),
        batch_size=16,
        steps=20,
        strategy=strategy,
        resources=m.Resources(memory_mb=UNPLACEABLE["memory_mb"]),
        **extra,
    )


def _digits_npz(m):
    # A file of the repository: readable by URL, and not in the platform's
    # own store (which no job may name).
    return m.FileDataset(kind=m.FileDatasetKind.FILE, url=DIGITS.resolve().as_uri(), format_=m.FileFormat.NPZ)


#: One spec per case, together every model kind, dataset kind, strategy and
#: consistency mode (``test_the_cases_cover_every_kind`` holds them to it).
CASES = {
    "mlp-classification-allreduce": lambda m: _spec(
        m,
        "mlp-classification",
        m.MlpModel(kind=m.MlpModelKind.MLP, inputs=8, hidden=[16, 8], outputs=3),
        m.ClassificationDataset(kind=m.ClassificationDatasetKind.CLASSIFICATION, samples=256, features=8, classes=3),
        m.Loss.CROSS_ENTROPY,
        m.Strategy.ALLREDUCE,
        workers=m.WorkerRange(min_=2, max_=4),
    ),
    "mlp-regression-ps-sync": lambda m: _spec(
        m,
        "mlp-regression",
        m.MlpModel(kind=m.MlpModelKind.MLP, inputs=4, hidden=[8], outputs=2),
        m.RegressionDataset(kind=m.RegressionDatasetKind.REGRESSION, samples=128, features=4, targets=2),
        m.Loss.MSE,
        m.Strategy.PARAMETER_SERVER,
        parameter_servers=2,
        consistency=m.SyncConsistency.SYNC,
        optimizer=m.OptimizerSpec(
            kind=m.OptimizerKind.SGD,
            lr=0.05,
            schedule=m.WarmupCosineSchedule(kind=m.WarmupCosineScheduleKind.WARMUP_COSINE, warmup_steps=5),
        ),
    ),
    "cnn-classification-ps-async": lambda m: _spec(
        m,
        "cnn",
        m.CnnModel(kind=m.CnnModelKind.CNN, channels=1, height=8, width=8, conv_channels=[4, 8], hidden=16, classes=10),
        m.ClassificationDataset(kind=m.ClassificationDatasetKind.CLASSIFICATION, samples=200, features=64, classes=10),
        m.Loss.CROSS_ENTROPY,
        m.Strategy.PARAMETER_SERVER,
        consistency=m.AsyncConsistency.ASYNC,
        replicas=1,
    ),
    "transformer-text-ps-bounded": lambda m: _spec(
        m,
        "transformer",
        m.TransformerModel(kind=m.TransformerModelKind.TRANSFORMER, vocab=256, context=16, layers=1, heads=2, width=16),
        m.TextDataset(kind=m.TextDatasetKind.TEXT, characters=4096),
        m.Loss.CROSS_ENTROPY,
        m.Strategy.PARAMETER_SERVER,
        parameter_servers=2,
        consistency=m.BoundedConsistency(bounded=m.StalenessBound(staleness=4)),
        optimizer=m.OptimizerSpec(
            kind=m.OptimizerKind.ADAMW,
            lr=0.001,
            schedule=m.ConstantSchedule(kind=m.ConstantScheduleKind.CONSTANT),
        ),
    ),
    "mlp-file-auto": lambda m: _spec(
        m,
        "mlp-file",
        m.MlpModel(kind=m.MlpModelKind.MLP, inputs=64, hidden=[32], outputs=10),
        _digits_npz(m),
        m.Loss.CROSS_ENTROPY,
        m.Strategy.AUTO,
        consistency=m.BoundedConsistency(bounded=m.StalenessBound(staleness=0)),
    ),
    "torchscript-file-allreduce": lambda m: _spec(
        m,
        "torchscript",
        # Never opened: the job is cancelled before any executor inspects it.
        m.TorchscriptModel(kind=m.TorchscriptModelKind.TORCHSCRIPT, url=(ROOT / "data" / "never-read.pt").as_uri()),
        _digits_npz(m),
        m.Loss.CROSS_ENTROPY,
        m.Strategy.ALLREDUCE,
    ),
}


def _kinds(schema: dict) -> set:
    """The values a union's or enum's variants are told apart by: their
    ``kind``, their one property (``{"bounded": …}``) or their string."""
    out = set()
    for v in schema.get("oneOf", [schema]):
        if "enum" in v:
            out |= set(v["enum"])
        elif "kind" in v.get("properties", {}):
            out |= set(v["properties"]["kind"]["enum"])
        else:
            out |= set(v["properties"])
    return out


def test_the_cases_cover_every_kind(generated):
    """Every model kind, dataset kind, strategy and consistency mode of the
    document is in some case (a new one fails here until it is added)."""
    schemas = json.loads(DOC.read_text())["components"]["schemas"]
    specs = [build(generated.models).to_dict() for build in CASES.values()]

    def consistency(s):
        c = s.get("consistency")
        return c if isinstance(c, str) else next(iter(c)) if c else None

    for field, schema, of in (
        ("model", "ModelSpec", lambda s: s["model"]["kind"]),
        ("dataset", "DatasetSpec", lambda s: s["dataset"]["kind"]),
        ("strategy", "Strategy", lambda s: s["strategy"]),
        ("consistency", "Consistency", consistency),
    ):
        want = _kinds(schemas[schema])
        covered = {of(s) for s in specs}
        assert want and want <= covered, f"no case submits {field} {sorted(want - covered)}"


def test_every_operation_is_a_function_of_its_own(generated):
    """The generator writes one module per operationId (and silently lets a
    repeated one overwrite another): each operation of the document has a
    unique id and a module of its own."""
    doc = json.loads(DOC.read_text())
    ops = [(f"{method.upper()} {path}", op.get("operationId")) for path, item in doc["paths"].items() for method, op in item.items()]
    ids = [i for _, i in ops]
    assert None not in ids, f"operations without an operationId: {[w for w, i in ops if i is None]}"
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    assert not repeated, f"operationIds used more than once: {repeated}"
    modules = sorted(p.stem for p in (generated.root / "api").glob("*/*.py") if p.stem != "__init__")
    assert modules == sorted(ids), f"generated modules {modules} are not the operations {sorted(ids)}"


def _assert_within(sent, back, where="spec"):
    """Everything the client sent is in what came back (the server fills in
    the defaults of fields the client left out)."""
    if isinstance(sent, dict):
        assert isinstance(back, dict), f"{where}: sent {sent!r}, read back {back!r}"
        for k, v in sent.items():
            assert k in back, f"{where}.{k}: sent {v!r}, missing from what was read back {back!r}"
            _assert_within(v, back[k], f"{where}.{k}")
    elif isinstance(sent, list):
        assert isinstance(back, list) and len(back) == len(sent), f"{where}: sent {sent!r}, read back {back!r}"
        for i, (a, b) in enumerate(zip(sent, back)):
            _assert_within(a, b, f"{where}[{i}]")
    else:
        assert sent == back, f"{where}: sent {sent!r}, read back {back!r}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_generated_client_submits_and_reads_back(generated, platform, case):
    m, jobs = generated.models, generated.jobs
    spec = CASES[case](m)
    client = generated.client(base_url=platform.api, token=platform.admin_token)
    with client:
        submitted = jobs.submit_job.sync_detailed(client=client, body=spec)
        assert submitted.status_code == HTTPStatus.CREATED, f"{case}: {submitted.status_code} {submitted.content[:2000]!r}"
        job = submitted.parsed
        assert isinstance(job, m.Job), f"{case}: parsed as {type(job)}"
        try:
            _assert_within(spec.to_dict(), job.spec.to_dict())
            read = jobs.get_job.sync_detailed(job.id, client=client)
            assert read.status_code == HTTPStatus.OK, f"{case}: {read.status_code} {read.content[:2000]!r}"
            assert isinstance(read.parsed, m.Job) and read.parsed.id == job.id
            back = read.parsed.spec
            # The same spec: as the server wrote it, and as the generated
            # models parsed it (into the classes it was built from).
            _assert_within(spec.to_dict(), json.loads(read.content)["spec"])
            _assert_within(spec.to_dict(), back.to_dict())
            assert back.to_dict() == job.spec.to_dict()
            for field in ("model", "dataset", "consistency", "strategy", "loss"):
                assert type(getattr(back, field)) is type(getattr(spec, field)), (
                    f"{case}: {field} read back as {type(getattr(back, field)).__name__}, "
                    f"sent as {type(getattr(spec, field)).__name__}"
                )
            if spec.optimizer.schedule is not generated.types.UNSET:
                assert type(back.optimizer.schedule) is type(spec.optimizer.schedule), case
        finally:
            # 409: it ended otherwise first (an executor another test started
            # may inspect the TorchScript case's file, which does not exist).
            cancelled = jobs.cancel_job.sync_detailed(job.id, client=client)
            assert cancelled.status_code in (HTTPStatus.OK, HTTPStatus.CONFLICT), (
                f"{case}: cancel: {cancelled.status_code} {cancelled.content[:500]!r}"
            )
