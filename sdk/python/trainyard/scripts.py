"""Running your own training script on the platform: ``client.run_script``.

    run = client.run_script("train.py", files=["model.py"], inputs=["digits.npz"],
                            workers=(2, 4), args=["--epochs", "4"])
    run.wait()                         # raises JobFailed if it failed
    run.outputs()                      # [{"path": "model.pt", "size": ...}]
    run.output("model.pt", "model.pt")  # downloads rank 0's file

The script is uploaded as an artifact (with ``files``, packed with them as a
``.tar.gz`` whose top folder holds the script); each input is a local file
uploaded under its own name (so the script finds it in
``TRAINYARD_INPUT_DIR`` by that name) or an ``artifact:``/URL string passed
as it is. Every rank runs the script under torchrun's variables; see
``docs/users/scripts.md``.
"""

import io
import os
import tarfile
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .fit import Run, _workers

PathLike = Union[str, os.PathLike]


def _is_reference(s: Any) -> bool:
    return isinstance(s, str) and (s.startswith("artifact:") or "://" in s)


def _pack(script: str, files: Iterable[PathLike]) -> bytes:
    """A .tar.gz of ``script`` and ``files`` (folders with their contents),
    each at the top level under its own name; links are refused."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in [script, *map(os.fspath, files)]:
            top = os.path.basename(os.path.normpath(path))

            def refuse_links(info: tarfile.TarInfo) -> tarfile.TarInfo:
                if info.issym() or info.islnk():
                    raise ValueError(f"{info.name} is a link; a script's files must be files and folders")
                return info

            tar.add(path, arcname=top, filter=refuse_links)
    return buf.getvalue()


def run_script(
    client: Any,
    script: PathLike,
    *,
    files: Sequence[PathLike] = (),
    inputs: Sequence[Union[PathLike, str]] = (),
    workers: Union[int, Tuple[int, int]] = 1,
    args: Sequence[str] = (),
    env: Optional[Dict[str, str]] = None,
    python: Optional[str] = None,
    max_restarts: Optional[int] = None,
    max_seconds: Optional[int] = None,
    memory_mb: Optional[int] = None,
    name: Optional[str] = None,
    priority: Optional[int] = None,
) -> Run:
    """Submits ``script`` (a local ``.py`` file) as a script job; its :class:`Run`.

    ``workers`` is a world size or a ``(min, max)`` range; ``args``, ``env``,
    ``python``, ``max_restarts`` and ``max_seconds`` (how long one run of
    the script may take; a day by default) go to the spec's ``script``;
    ``memory_mb`` to ``resources``.
    """
    script = os.fspath(script)
    base = os.path.basename(script)
    if not base.endswith(".py"):
        raise ValueError(f"{script}: a script is a .py file")
    spec_script: Dict[str, Any] = {"args": [str(a) for a in args]}
    if files:
        stem = base[: -len(".py")]
        code = client.upload(_pack(script, files), name=f"{stem}-code.tar.gz")
        spec_script["code"] = code["url"]
        spec_script["entrypoint"] = base
    else:
        spec_script["code"] = client.upload(script, name=base)["url"]
    if env:
        spec_script["env"] = dict(env)
    if python:
        spec_script["python"] = python
    if max_restarts is not None:
        spec_script["max_restarts"] = max_restarts
    if max_seconds is not None:
        spec_script["max_seconds"] = max_seconds
    refs: List[str] = []
    for i in inputs:
        if _is_reference(i):
            refs.append(str(i))
        else:
            refs.append(client.upload(os.fspath(i))["url"])
    spec: Dict[str, Any] = {
        "name": name or base[: -len(".py")],
        "script": spec_script,
        "workers": _workers(workers),
    }
    if refs:
        spec["inputs"] = refs
    if memory_mb is not None:
        spec["resources"] = {"memory_mb": memory_mb}
    if priority is not None:
        spec["priority"] = priority
    job = client.submit(spec)
    return Run(client, job["id"], job=job)
