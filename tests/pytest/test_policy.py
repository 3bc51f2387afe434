"""The URL policy at submit, against the real server: a user's job reads its
own artifacts and what an admin allowed with ``--allow-data-url``, and
nothing else — not another user's artifact, not a local file, not the
platform's own objects, not another bucket. Each refusal is a 4xx problem
naming ``model.url`` or ``dataset.url``; an allowed prefix trains."""

import shutil

import pytest
from conftest import DIGITS, UNPLACEABLE, mlp_spec, wait_state

import trainyard


def torchscript_spec(name: str, model_url: str, data_url: str) -> dict:
    spec = mlp_spec(name, data_url)
    spec["model"] = {"kind": "torchscript", "url": model_url}
    return spec


def refused(client: trainyard.Client, spec: dict, field: str) -> trainyard.ApiError:
    with pytest.raises(trainyard.ApiError) as e:
        client.submit(spec)
    err = e.value
    assert 400 <= err.status < 500, err
    assert field in err.fields, f"the problem names {err.fields}, not {field}: {err.body}"
    assert err.detail, err.body
    return err


@pytest.fixture(scope="module")
def users(platform):
    alice, bob = platform.user("pol-alice"), platform.user("pol-bob")
    alice.upload(DIGITS, "digits.npz")
    bob.upload(DIGITS, "bobs-digits.npz")
    bob.upload(b"not really a model", "bobs-model.pt")
    return alice, bob


def test_another_users_artifact_is_refused(platform, users):
    alice, _ = users
    refused(alice, mlp_spec("steal-data", "artifact:bobs-digits.npz"), "dataset.url")
    spec = torchscript_spec("steal-model", "artifact:bobs-model.pt", "artifact:digits.npz")
    err = refused(alice, spec, "model.url")
    assert err.status == 422, err
    # Owner-qualified spellings do not reach bob's namespace either.
    for url in ("artifact:pol-bob/bobs-digits.npz", "artifact:../pol-bob/bobs-digits.npz"):
        refused(alice, mlp_spec("steal-data", url), "dataset.url")
    refused(alice, mlp_spec("no-such", "artifact:never-uploaded.npz"), "dataset.url")


def test_local_files_are_refused(platform, users):
    alice, _ = users
    err = refused(alice, torchscript_spec("passwd", "file:///etc/passwd", "artifact:digits.npz"), "model.url")
    assert err.status == 422, err
    join_token = platform.data_dir / "join-token"
    assert join_token.is_file(), "the server keeps its join token in its data folder"
    refused(alice, mlp_spec("join-token", f"file://{join_token}"), "dataset.url")
    refused(alice, mlp_spec("digits-on-disk", f"file://{DIGITS}"), "dataset.url")


def test_the_platforms_own_objects_are_refused(platform, users):
    alice, _ = users
    admin = platform.admin
    # A real job of this platform whose weights would be at {store}/{id}/final/.
    victim = admin.submit(mlp_spec("victim", None, resources=UNPLACEABLE))
    try:
        for url in (
            f"{platform.s3.url}/{victim['id']}/final/model.safetensors",
            f"{platform.s3.url}/{victim['id']}/step-1/shard-0.safetensors",
        ):
            refused(alice, torchscript_spec("weights", url, "artifact:digits.npz"), "model.url")
            refused(alice, mlp_spec("weights-as-data", url), "dataset.url")
        # The store's artifacts themselves are reached only as artifact: names.
        refused(alice, mlp_spec("raw-artifact", f"{platform.s3.url}/artifacts/pol-bob/bobs-digits.npz"), "dataset.url")
    finally:
        admin.cancel(victim["id"])


def test_an_unallowed_bucket_is_refused(platform, users):
    alice, _ = users
    refused(alice, mlp_spec("other-bucket", "s3://someone-elses-bucket/data.npz"), "dataset.url")
    refused(alice, torchscript_spec("http", "https://example.invalid/net.pt", "artifact:digits.npz"), "model.url")


def test_the_admin_may_read_any_url(platform, users):
    job = platform.admin.submit(mlp_spec("admin-local", f"file://{DIGITS}", resources=UNPLACEABLE))
    assert job["state"] == "queued", job
    platform.admin.cancel(job["id"])


def test_an_allowed_prefix_is_read_and_nothing_beside_it(platform, tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    shutil.copy(DIGITS, allowed / "digits.npz")
    (tmp_path / "allowed-not").mkdir()
    shutil.copy(DIGITS, tmp_path / "allowed-not" / "digits.npz")
    with platform.variant("--allow-data-url", f"file://{allowed}/", label="allow") as p:
        carol = p.user("pol-carol")
        refused(carol, mlp_spec("beside", f"file://{tmp_path}/allowed-not/digits.npz"), "dataset.url")
        refused(carol, mlp_spec("dotdot", f"file://{allowed}/../allowed-not/digits.npz"), "dataset.url")
        refused(carol, mlp_spec("passwd", f"file://{allowed}/../../../../etc/passwd"), "dataset.url")
        p.ensure_executors(1)
        job = carol.submit(mlp_spec("allowed", f"file://{allowed}/digits.npz"))
        end = wait_state(carol, job["id"], {"succeeded", "failed", "cancelled"}, limit=180)
        assert end["state"] == "succeeded", f"{end['state']}: {end['state_reason']}\n{p.output('py-allow-0')}"
        final = trainyard.Run(carol, job["id"]).final_eval()
        assert final and final["eval_accuracy"] > 0.8, final
