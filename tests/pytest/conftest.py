"""The Python suite's platform: the real ``trainyard serve`` and executors.

The session fixture ``platform`` starts the built ``trainyard`` binary (from
``$TRAINYARD_BIN_DIR``, else ``$CARGO_TARGET_DIR/debug`` or ``./target/debug``:
``cargo build --workspace --bins`` first) on a free loopback port against a
fresh Postgres database on ``$TRAINYARD_TEST_DATABASE_URL``, with the
heartbeat settings of the Rust harness (``tests/support/platform.rs``), an
admin token of its own, no provisioner, and its objects in the test S3
server that ``scripts/garage.sh``'s ``start_test_s3`` runs (the
``TRAINYARD_TEST_S3_*`` variables; the API gets the ``AWS_*`` variables and
the executors ``TRAINYARD_OBJECT_STORE_OPTIONS``, as
``tests/support/s3.rs`` configures them). So nothing is shared between the
user's side and the executors but the API and the object store.

One server serves the whole session; tests that need other server flags
start a variant (``platform.variant(...)``, a context manager) with a
database and an S3 prefix of its own. Executors are started on demand
(``platform.ensure_executors(n)``). Everything started is stopped at the
end: processes killed, databases dropped, folders removed.
"""

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest
import requests

import trainyard

ROOT = Path(__file__).resolve().parents[2]
#: The heartbeat interval every test server runs with (as the Rust harness).
HEARTBEAT_MS = 200
#: Heartbeats an executor may miss before it is lost (5 s).
HEARTBEAT_MISSES = 25
#: How long a starting server may take to answer ``/readyz``.
READY_LIMIT_S = 60.0
#: How long a started executor may take to register.
REGISTER_LIMIT_S = 60.0
#: The digits set the tests train on.
DIGITS = ROOT / "data" / "digits.npz"

# Variables of the caller's shell that would change what the processes do.
_SCRUBBED = (
    "TRAINYARD_API",
    "TRAINYARD_API_TOKEN",
    "TRAINYARD_ADMIN_TOKEN",
    "TRAINYARD_JOIN_TOKEN",
    "TRAINYARD_OBJECT_STORE",
    "TRAINYARD_OBJECT_STORE_OPTIONS",
    "TRAINYARD_PROVISIONER",
    "TRAINYARD_ALLOW_DATA_URLS",
    "DATABASE_URL",
)


def binary(name: str) -> Path:
    """A built binary of the workspace."""
    if os.environ.get("TRAINYARD_BIN_DIR"):
        d = Path(os.environ["TRAINYARD_BIN_DIR"])
    else:
        d = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target") / "debug"
    path = d / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `cargo build --workspace --bins` first", pytrace=False)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra: Dict[str, str]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env.update(extra)
    return env


def _torch_lib_path() -> Dict[str, str]:
    """``LD_LIBRARY_PATH`` with the venv's libtorch, which the executor links
    (``torch_env`` sets it in the scripts; a bare pytest may not have it)."""
    current = os.environ.get("LD_LIBRARY_PATH", "")
    if "torch/lib" in current:
        return {}
    try:
        import torch
    except ImportError:
        return {}
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    return {"LD_LIBRARY_PATH": lib + (":" + current if current else "")}


class Database:
    """A fresh database on the test Postgres server (dropped by ``drop``)."""

    def __init__(self) -> None:
        # Never a default such as the machine's own server on 127.0.0.1:5432:
        # users' scripts run in these tests (scripts/common.sh,
        # ensure_test_postgres, starts the suite's private cluster).
        self.admin_url = os.environ.get("TRAINYARD_TEST_DATABASE_URL", "")
        if not self.admin_url:
            pytest.fail(
                "TRAINYARD_TEST_DATABASE_URL is not set: run ./scripts/test, or "
                "`source scripts/common.sh; ensure_postgres_binaries; ensure_test_postgres` first",
                pytrace=False,
            )
        # scripts/test drops leftovers named ty_test_% at its start and end.
        self.name = f"ty_test_py_{uuid.uuid4().hex[:16]}"
        self._psql(f'create database "{self.name}"')
        u = urllib.parse.urlsplit(self.admin_url)
        self.url = urllib.parse.urlunsplit((u.scheme, u.netloc, "/" + self.name, u.query, u.fragment))

    def _psql(self, sql: str) -> None:
        r = subprocess.run(["psql", self.admin_url, "-Atqc", sql], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"psql {sql!r}: {r.stderr.strip()}")

    def drop(self) -> None:
        with contextlib.suppress(Exception):
            self._psql(f'drop database if exists "{self.name}" with (force)')


class TestS3:
    """The test S3 server under a fresh prefix (``s3://BUCKET/py-<uuid>``)."""

    __test__ = False  # not a test class

    def __init__(self) -> None:
        missing = [k for k in ("URL", "ENDPOINT", "REGION", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY") if not os.environ.get(f"TRAINYARD_TEST_S3_{k}")]
        if missing:
            pytest.fail(
                "TRAINYARD_TEST_S3_* is not set: run ./scripts/test, which starts a Garage S3 server "
                "(or `source scripts/common.sh scripts/garage.sh; start_test_s3 DIR`)",
                pytrace=False,
            )
        v = lambda k: os.environ[f"TRAINYARD_TEST_S3_{k}"]  # noqa: E731
        self.url = f"{v('URL')}/py-{uuid.uuid4().hex}"
        self.endpoint, self.region, self.key, self.secret = v("ENDPOINT"), v("REGION"), v("ACCESS_KEY_ID"), v("SECRET_ACCESS_KEY")

    def aws_env(self) -> Dict[str, str]:
        """The standard AWS variables (how the API is configured)."""
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
        }

    def options(self) -> str:
        """Object-store options (how the executors are configured)."""
        return (
            f"aws_endpoint={self.endpoint},aws_region={self.region},aws_access_key_id={self.key},"
            f"aws_secret_access_key={self.secret},aws_allow_http=true"
        )


class Platform:
    """A running ``trainyard serve`` and the executors started against it."""

    def __init__(self, label: str, server_args: Optional[List[str]] = None):
        self.label = label
        #: The extra flags of ``trainyard serve`` this one was started with.
        self.server_args = list(server_args or [])
        self.dir = Path(tempfile.mkdtemp(prefix=f"ty-py-{label}-"))
        self.data_dir = self.dir / "data"
        self.s3 = TestS3()
        self.db = Database()
        self.admin_token = "ty_admin_" + secrets.token_hex(16)
        self.port = free_port()
        self.api = f"http://127.0.0.1:{self.port}"
        self.executors: List[subprocess.Popen] = []
        self._tokens: Dict[str, str] = {}
        self._logs: List[Path] = []
        self.server: Optional[subprocess.Popen] = None
        try:
            self._start_server()
        except BaseException:
            self.stop()
            raise

    # ----- processes ------------------------------------------------------

    def _spawn(self, name: str, cmd: List[str], env: Dict[str, str]) -> subprocess.Popen:
        log = self.dir / f"{name}.log"
        self._logs.append(log)
        with open(log, "wb") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(env), start_new_session=True)

    def _start_server(self) -> None:
        cmd = [
            str(binary("trainyard")),
            "serve",
            "--listen", f"127.0.0.1:{self.port}",
            "--heartbeat-interval-ms", str(HEARTBEAT_MS),
            "--heartbeat-misses", str(HEARTBEAT_MISSES),
            "--data-dir", str(self.data_dir),
            "--admin-token", self.admin_token,
            "--provisioner", "none",
            "--database-url", self.db.url,
            "--object-store", self.s3.url,
            *self.server_args,
        ]  # fmt: skip
        self.server = self._spawn("server", cmd, self.s3.aws_env())
        deadline = time.monotonic() + READY_LIMIT_S
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"trainyard serve exited ({self.server.returncode}) before it was ready:\n{self.output('server')}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(self.api + "/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"trainyard serve not ready after {READY_LIMIT_S} s:\n{self.output('server')}")

    @property
    def join_token(self) -> str:
        """The join token the server made in its data folder."""
        return (self.data_dir / "join-token").read_text().strip()

    def start_executors(self, n: int) -> List[subprocess.Popen]:
        """Starts ``n`` more executors (2 GiB, one libtorch thread each, a cache
        folder of their own) and waits until they are registered and live."""
        started = []
        for _ in range(n):
            name = f"py-{self.label}-{len(self.executors)}"
            cmd = [
                str(binary("trainyard-executor")),
                "--api", self.api,
                "--join-token", self.join_token,
                "--name", name,
                "--ram-mb", "2048",
                "--torch-threads", "1",
            ]  # fmt: skip
            env = {
                "TRAINYARD_OBJECT_STORE_OPTIONS": self.s3.options(),
                "TRAINYARD_CACHE_DIR": str(self.dir / f"cache-{name}"),
                **_torch_lib_path(),
            }
            p = self._spawn(name, cmd, env)
            p.name = name  # type: ignore[attr-defined]
            self.executors.append(p)
            started.append(p)
        names = {p.name for p in started}  # type: ignore[attr-defined]
        deadline = time.monotonic() + REGISTER_LIMIT_S
        while True:
            for p in started:
                if p.poll() is not None:
                    raise RuntimeError(f"executor {p.name} exited ({p.returncode}):\n{self.output(p.name)}")  # type: ignore[attr-defined]
            live = {e["name"] for e in self.admin.request("GET", "/v1/executors", params={"state": "live"}).json()["executors"]}
            if names <= live:
                return started
            if time.monotonic() > deadline:
                raise RuntimeError(f"executors {sorted(names - live)} did not register in {REGISTER_LIMIT_S} s")
            time.sleep(0.2)

    def ensure_executors(self, n: int) -> None:
        """At least ``n`` running executors (started here when fewer)."""
        running = [p for p in self.executors if p.poll() is None]
        if len(running) < n:
            self.start_executors(n - len(running))

    def output(self, name: str) -> str:
        """The last 60 lines a process of this platform printed."""
        path = self.dir / f"{name}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-60:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Kills the executors and the server, drops the database, removes the folder."""
        for p in self.executors + ([self.server] if self.server else []):
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        self.db.drop()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ----- clients ----------------------------------------------------------

    @property
    def admin(self) -> trainyard.Client:
        """A client with the admin token."""
        return trainyard.Client(self.api, self.admin_token)

    def user_token(self, name: str) -> str:
        """A user token acting as ``name`` (made once per name with ``POST /v1/tokens``)."""
        if name not in self._tokens:
            self._tokens[name] = self.admin.create_token(name, role="user", label="pytest")["token"]
        return self._tokens[name]

    def user(self, name: str) -> trainyard.Client:
        """A client acting as the user ``name``."""
        return trainyard.Client(self.api, self.user_token(name))

    @contextlib.contextmanager
    def variant(self, *server_args: str, label: str = "variant") -> Iterator["Platform"]:
        """Another platform with these extra server flags (its own database and
        S3 prefix), stopped when the block ends."""
        p = Platform(label, list(server_args))
        try:
            yield p
        finally:
            p.stop()


@pytest.fixture(scope="session")
def platform() -> Iterator[Platform]:
    """The session's platform (see the module's doc)."""
    p = Platform("session")
    try:
        yield p
    finally:
        p.stop()


def wait_state(client: trainyard.Client, job_id: str, states, limit: float = 120.0) -> dict:
    """Polls a job until its state is one of ``states``; the job."""
    deadline = time.monotonic() + limit
    while True:
        job = client.job(job_id)
        if job["state"] in states:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job['state']} after {limit} s: {json.dumps(job)[:2000]}")
        time.sleep(0.2)


def mlp_spec(name: str, url: Optional[str], **extra) -> dict:
    """A small built-in MLP job on a digits file at ``url`` (``.npz`` whatever
    its name), or on generated data when ``url`` is ``None``."""
    dataset = {"kind": "file", "url": url, "format": "npz"} if url else {"kind": "classification", "samples": 100, "features": 64, "classes": 10}
    spec = {
        "name": name,
        "model": {"kind": "mlp", "inputs": 64, "hidden": [32], "outputs": 10},
        "dataset": dataset,
        "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "lr": 0.01},
        "batch_size": 32,
        "epochs": 1,
    }
    spec.update(extra)
    return spec


#: Resources no test executor offers: a job asking for them stays queued.
UNPLACEABLE = {"memory_mb": 1 << 20}
