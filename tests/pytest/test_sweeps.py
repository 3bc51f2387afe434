"""Sweeps from the SDK against the real server: a small grid over the
learning rate runs to its end, and its best trial is a real job of the
user's whose own metrics are the ones the sweep reports."""

import pytest

import trainyard
from conftest import DIGITS, UNPLACEABLE, mlp_spec


def _base(name, url, steps, **extra):
    """A digits MLP job of ``steps`` steps (rather than the helper's epoch)."""
    spec = mlp_spec(name, url, **extra)
    spec.pop("epochs")
    spec["steps"] = steps
    return spec


def _last_eval(client, job_id):
    points = client.metrics(job_id, max_points=10_000)["points"]
    evals = [p for p in points if p.get("eval_accuracy") is not None]
    return evals[-1] if evals else None


def test_a_grid_sweep_finds_its_best_trial(platform):
    platform.ensure_executors(2)
    alice = platform.user("sweeps-alice")
    alice.upload(DIGITS, "digits.npz")
    base = _base("sdk-sweep", "artifact:digits.npz", 120, eval_fraction=0.2, seed=3)
    lrs = [0.0003, 0.01, 0.05]
    sweep = alice.sweep(
        base=base,
        parameters={"optimizer.lr": {"values": lrs}},
        metric="eval_accuracy",
        goal="maximize",
        search="grid",
        concurrency=2,
        name="sdk-lr-grid",
        wait=True,
        timeout=600,
    )
    assert isinstance(sweep, trainyard.Sweep)
    assert sweep.state == "succeeded", sweep.doc
    assert sweep.name == "sdk-lr-grid"
    assert sorted(t["params"]["optimizer.lr"] for t in sweep.trials) == lrs, "a grid runs every value once"
    assert all(t["state"] == "completed" for t in sweep.trials), sweep.trials
    assert sweep.rungs == [], "no early stopping asked for"

    # The best trial is a job of alice's that ran with the trial's learning
    # rate, belongs to the sweep, and whose own last evaluation is the
    # sweep's figure; no other trial did better.
    best = sweep.best
    assert best is not None
    run = sweep.best_run()
    job = run.job()
    assert job["owner"] == "sweeps-alice"
    assert job["state"] == "succeeded", job
    assert job["sweep"] == {"id": sweep.id, "trial": best["index"]}
    assert job["spec"]["optimizer"]["lr"] == best["params"]["optimizer.lr"]
    last = _last_eval(alice, job["id"])
    assert last is not None and last["step"] == 120
    assert best["metric"] == pytest.approx(last["eval_accuracy"], abs=1e-9)
    for t in sweep.trials:
        own = _last_eval(alice, t["job_id"])
        assert t["metric"] == pytest.approx(own["eval_accuracy"], abs=1e-9), t
        assert t["metric"] <= best["metric"], (t, best)

    # Listed, read back, and the user's alone.
    assert [s.id for s in alice.sweeps()][0] == sweep.id
    again = alice.get_sweep(sweep.id)
    assert again.best == best and again.state == "succeeded"
    with pytest.raises(trainyard.ApiError) as e:
        platform.user("sweeps-bob").get_sweep(sweep.id)
    assert e.value.status == 404
    assert platform.user("sweeps-bob").sweeps() == []


def test_a_bad_sweep_is_refused_naming_the_field(platform):
    alice = platform.user("sweeps-alice")
    base = _base("bad-sweep", None, 10)
    with pytest.raises(trainyard.ApiError) as e:
        alice.sweep(base=base, parameters={"optimizer.lr": {"uniform": [0.1, 0.01]}}, search="random", max_trials=2)
    assert e.value.status == 422
    assert any(f.startswith("parameters") for f in e.value.fields), e.value.errors
    with pytest.raises(trainyard.ApiError) as e:
        alice.sweep(base=base, parameters={"optimizer.lr": {"values": [0.1]}}, metric="accuracy", max_trials=1)
    assert e.value.status in (400, 422), e.value
    with pytest.raises(trainyard.ApiError) as e:
        alice.get_sweep("not-a-uuid")
    assert e.value.status == 400


def test_a_sweep_is_cancelled_with_its_trials(platform):
    alice = platform.user("sweeps-carol")
    # Generated data, resources no executor offers: the trials stay queued.
    base = _base("held", None, 10, resources=UNPLACEABLE)
    sweep = alice.sweep(base=base, parameters={"batch_size": {"values": [8, 16]}}, search="grid", concurrency=2)
    assert sweep.state == "running"
    sweep.cancel()
    with pytest.raises(trainyard.SweepFailed) as e:
        sweep.wait(timeout=120)
    assert e.value.state == "cancelled"
    for t in sweep.trials:
        assert t["state"] in ("cancelled", "pending"), t
        if t["job_id"]:
            assert alice.job(t["job_id"])["state"] == "cancelled"
