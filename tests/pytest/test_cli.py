"""The command-line client's artifacts: ``trainyard upload FILE [--name N]``
prints the artifact with its ``artifact:`` URL, ``trainyard artifacts``
lists them — with the API and token as flags or as environment."""

import hashlib
import os
import subprocess

from conftest import binary


def cli(*args, env=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_API")}
    full.update(env or {})
    r = subprocess.run([str(binary("trainyard")), *args], capture_output=True, text=True, timeout=60, env=full)
    assert r.returncode == 0, f"trainyard {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_upload_and_list_with_the_cli(platform, tmp_path):
    token = platform.user_token("cli-dana")
    data = os.urandom(30_000)
    f = tmp_path / "weights.bin"
    f.write_bytes(data)
    out = cli("upload", str(f), "--name", "from-cli.bin", "--api", platform.api, "--token", token)
    assert "artifact:from-cli.bin" in out, out
    assert hashlib.sha256(data).hexdigest() in out, out
    # The file's own name without --name; the connection from the environment.
    env = {"TRAINYARD_API": platform.api, "TRAINYARD_API_TOKEN": token}
    out = cli("upload", str(f), env=env)
    assert "artifact:weights.bin" in out, out
    listing = cli("artifacts", env=env)
    assert "from-cli.bin" in listing and "weights.bin" in listing, listing

    dana = platform.user("cli-dana")
    for name in ("from-cli.bin", "weights.bin"):
        a = dana.artifact(name)
        assert (a["size"], a["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert dana.artifact_content("from-cli.bin") == data
    # A bad name is refused, with a message and a failing exit status.
    r = subprocess.run([str(binary("trainyard")), "upload", str(f), "--name", ".hidden", "--api", platform.api, "--token", token], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and ".hidden" in r.stderr, (r.returncode, r.stdout, r.stderr)
    # Another user's listing does not show them.
    other = cli("artifacts", "--api", platform.api, "--token", platform.user_token("cli-erin"))
    assert "from-cli.bin" not in other, other
