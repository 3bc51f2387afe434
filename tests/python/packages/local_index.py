"""A package index of the test's own (PEP 503 "simple" pages over plain
HTTP), as an admin's mirror would serve, with two packages a job may ask
for:

* `tiny-ok` 1.0: a pure-Python wheel (`import tiny_ok`);
* `hostile-build` 0.1: an sdist whose in-tree build backend (PEP 517, no
  build requirements) runs when uv asks for its metadata, and tries what a
  malicious `setup.py` would: read host files, reach the platform's
  database and API, write outside its environment. It prints what it got
  as one JSON line (`hostile-build got {...}`) and fails the build.

usage: local_index.py DIR DB_PORT API_PORT MARKER_PATH
"""

import base64
import hashlib
import io
import json
import os
import sys
import tarfile
import zipfile

BACKEND = r'''
import json, os, socket

def _attempts():
    got = {}
    for path in ["/etc/passwd", os.path.expanduser("~root/.bash_history")]:
        try:
            with open(path, "rb") as f:
                got["read " + path] = "read " + f.read(16).hex()
        except OSError as e:
            got["read " + path] = "denied: " + e.__class__.__name__
    for name, port in [("database", DB_PORT), ("api", API_PORT)]:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=3).close()
            got[name] = "connected"
        except OSError as e:
            got[name] = "unreachable: " + e.__class__.__name__
    # Through the install's own proxy, as the installer reaches the index.
    proxy = os.environ.get("HTTPS_PROXY", "")
    if proxy.startswith("http://"):
        host, port = proxy[len("http://"):].rstrip("/").rsplit(":", 1)
        try:
            s = socket.create_connection((host, int(port)), timeout=3)
            s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % DB_PORT)
            answer = s.recv(64).decode(errors="replace").split("\r\n")[0]
            got["database via the proxy"] = ("connected: " if " 200 " in answer else "denied: ") + answer
        except OSError as e:
            got["database via the proxy"] = "unreachable: " + e.__class__.__name__
    try:
        with open(MARKER, "w") as f:
            f.write("pwned")
        got["write"] = "wrote " + MARKER
    except OSError as e:
        got["write"] = "denied: " + e.__class__.__name__
    print("hostile-build got " + json.dumps(got, sort_keys=True), flush=True)
    raise RuntimeError("hostile-build: the build step ran and got: " + json.dumps(got, sort_keys=True))

def get_requires_for_build_wheel(config_settings=None):
    return []

def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _attempts()

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _attempts()

def build_sdist(sdist_directory, config_settings=None):
    _attempts()
'''

PYPROJECT = """[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]

[project]
name = "hostile-build"
version = "0.1"
"""


def add(tar, name, text):
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def sdist(path, db_port, api_port, marker):
    backend = BACKEND.replace("DB_PORT", str(db_port)).replace("API_PORT", str(api_port))
    backend = backend.replace("MARKER", repr(marker))
    with tarfile.open(path, "w:gz") as tar:
        add(tar, "hostile_build-0.1/pyproject.toml", PYPROJECT)
        add(tar, "hostile_build-0.1/backend.py", backend)
        add(tar, "hostile_build-0.1/PKG-INFO", "Metadata-Version: 2.1\nName: hostile-build\nVersion: 0.1\n")


def wheel(path):
    files = {
        "tiny_ok/__init__.py": "VALUE = 42\n",
        "tiny_ok-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tiny-ok\nVersion: 1.0\n",
        "tiny_ok-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: trainyard-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append("tiny_ok-1.0.dist-info/RECORD,,")
    files["tiny_ok-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)


def main():
    root, db_port, api_port, marker = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.makedirs(os.path.join(root, "files"), exist_ok=True)
    packages = {
        "hostile-build": "hostile_build-0.1.tar.gz",
        "tiny-ok": "tiny_ok-1.0-py3-none-any.whl",
    }
    sdist(os.path.join(root, "files", packages["hostile-build"]), db_port, api_port, marker)
    wheel(os.path.join(root, "files", packages["tiny-ok"]))
    links = []
    for name, file in packages.items():
        page = os.path.join(root, "simple", name)
        os.makedirs(page, exist_ok=True)
        with open(os.path.join(root, "files", file), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        with open(os.path.join(page, "index.html"), "w") as f:
            f.write(f'<!DOCTYPE html><html><body><a href="../../files/{file}#sha256={digest}">{file}</a></body></html>\n')
        links.append(f'<a href="{name}/">{name}</a>')
    with open(os.path.join(root, "simple", "index.html"), "w") as f:
        f.write("<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>\n")
    print(json.dumps(packages))


if __name__ == "__main__":
    main()
