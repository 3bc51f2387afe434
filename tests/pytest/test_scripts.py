"""``client.run_script``: a user's own DDP script, packed with a module it
imports, trained on two executors with the object store in S3, its output
downloaded and evaluated by PyTorch in eval mode."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import trainyard

from conftest import DIGITS, ROOT

SCRIPTS = ROOT / "tests" / "python" / "scripts"


def test_run_script_packs_files_trains_on_two_ranks_and_returns_outputs(platform, tmp_path):
    platform.ensure_executors(2)
    client = trainyard.Client(platform.api, platform.user_token("script-alice"))
    main = tmp_path / "main.py"
    main.write_text("import ddp_digits\n\nddp_digits.main()\n")
    run = client.run_script(
        main,
        files=[SCRIPTS / "ddp_digits.py"],
        inputs=[DIGITS],
        workers=2,
        args=["--epochs", "3", "--data", "digits.npz"],
        memory_mb=1024,
        name="sdk-ddp",
    )
    job = run.wait(progress=False, timeout=300)
    assert job["state"] == "succeeded", job
    spec = job["spec"]
    assert spec["script"]["entrypoint"] == "main.py"
    assert spec["script"]["code"] == "artifact:main-code.tar.gz"
    assert spec["inputs"] == ["artifact:digits.npz"]
    lines = [l["message"] for l in run.logs()]
    for rank in (0, 1):
        assert any(l.startswith(f"[rank {rank}] rank {rank} epoch 2 loss") for l in lines), lines
    assert [o["path"] for o in run.outputs()] == ["model.pt"]
    path = run.output("model.pt", tmp_path / "model.pt")

    sys.path.insert(0, str(SCRIPTS))
    from ddp_digits import Net

    net = Net()
    net.load_state_dict(torch.load(path))
    net.eval()
    d = np.load(DIGITS)
    x = torch.from_numpy(np.asarray(d["x"])).float() / 16.0
    y = torch.from_numpy(np.asarray(d["y"])).long().flatten()
    with torch.no_grad():
        accuracy = (net(x).argmax(1) == y).float().mean().item()
    assert accuracy > 0.9, accuracy

    with pytest.raises(trainyard.ApiError) as e:
        client.output(run.id, "missing.pt")
    assert e.value.status == 404
    with pytest.raises(ValueError):
        client.run_script(tmp_path / "model.pt")


def test_run_script_and_outputs_from_the_cli(platform, tmp_path):
    import os
    import subprocess

    from conftest import binary

    platform.ensure_executors(2)
    token = platform.user_token("script-cli-bob")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_API")}
    env.update({"TRAINYARD_API": platform.api, "TRAINYARD_API_TOKEN": token})

    def cli(*args, timeout=60):
        r = subprocess.run([str(binary("trainyard")), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)
        assert r.returncode == 0, f"trainyard {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        return r.stdout

    main = tmp_path / "main.py"
    main.write_text("import ddp_digits\n\nddp_digits.main()\n")
    out = cli(
        "run-script", str(main), "--files", str(SCRIPTS / "ddp_digits.py"), "--input", str(DIGITS),
        "--workers", "2", "--memory-mb", "1024", "--follow", "--", "--epochs", "1", "--data", "digits.npz",
        timeout=300,
    )
    job_id = out.split()[3]
    listing = cli("outputs", job_id)
    assert "model.pt" in listing, listing
    cli("outputs", job_id, "model.pt", "-o", str(tmp_path / "m.pt"))
    state = torch.load(tmp_path / "m.pt")
    assert "head.2.weight" in state, list(state)
    spec = platform.user("script-cli-bob").job(job_id)["spec"]
    assert spec["script"]["args"] == ["--epochs", "1", "--data", "digits.npz"], spec
    assert spec["workers"] == {"min": 2, "max": 2}, spec
