"""Artifacts through the SDK against the real server: upload, list, read,
replace and delete; names; who sees what; a streamed upload of a file
larger than a multipart part; the size limits; and a DELETE refused while
an unfinished job reads the artifact."""

import hashlib
import os
import tracemalloc

import pytest
from conftest import DIGITS, UNPLACEABLE, mlp_spec, wait_state

import trainyard


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_upload_list_read_replace_delete(platform):
    alice = platform.user("art-alice")
    first = b"first version\n" * 100
    r = alice.request("PUT", "/v1/artifacts/notes.txt", data=first)
    assert r.status_code == 201, r.text
    a = r.json()
    assert a == {**a, "name": "notes.txt", "owner": "art-alice", "size": len(first), "sha256": sha(first), "url": "artifact:notes.txt"}
    assert a["created_at"]
    assert alice.artifact("notes.txt") == a
    assert [x["name"] for x in alice.artifacts()] == ["notes.txt"]
    body = alice.request("GET", "/v1/artifacts/notes.txt/content")
    assert body.content == first
    assert body.headers["Content-Length"] == str(len(first))
    assert sha(first) in body.headers.get("ETag", ""), body.headers

    second = os.urandom(5000)
    r = alice.request("PUT", "/v1/artifacts/notes.txt", data=second)
    assert r.status_code == 200, f"a replacement answers 200: {r.status_code} {r.text}"
    assert (r.json()["sha256"], r.json()["size"]) == (sha(second), len(second))
    assert alice.artifact_content("notes.txt") == second
    assert len(alice.artifacts()) == 1, "a replacement is the same name, not a second artifact"

    alice.delete_artifact("notes.txt")
    for call in (lambda: alice.artifact("notes.txt"), lambda: alice.artifact_content("notes.txt"), lambda: alice.delete_artifact("notes.txt")):
        with pytest.raises(trainyard.ApiError) as e:
            call()
        assert e.value.status == 404, e.value
    assert alice.artifacts() == []


@pytest.mark.parametrize("name", [".hidden", "a" * 129, "with space", "semi;colon", "ünïcode"])
def test_a_bad_name_is_a_400_naming_the_field(platform, name):
    with pytest.raises(trainyard.ApiError) as e:
        platform.user("art-alice").upload(b"x", name)
    assert e.value.status == 400, e.value
    assert "name" in e.value.fields, e.value.body
    assert e.value.detail


def test_the_longest_name_and_every_allowed_character(platform):
    alice = platform.user("art-names")
    for name in ["a" * 128, "A-Z_a-z.0-9", "x"]:
        assert alice.upload(b"ok", name)["name"] == name
    assert sorted(a["name"] for a in alice.artifacts()) == sorted(["a" * 128, "A-Z_a-z.0-9", "x"])


def test_users_see_only_their_own_and_the_admin_sees_all(platform):
    alice, bob, admin = platform.user("vis-alice"), platform.user("vis-bob"), platform.admin
    bob.upload(b"bob's", "private.bin")
    alice.upload(b"alice's", "mine.bin")
    with pytest.raises(trainyard.ApiError) as e:
        alice.artifact("private.bin")
    assert e.value.status == 404, "another user's name is a 404, as if it did not exist"
    with pytest.raises(trainyard.ApiError) as e:
        alice.artifact_content("private.bin")
    assert e.value.status == 404
    with pytest.raises(trainyard.ApiError) as e:
        alice.delete_artifact("private.bin")
    assert e.value.status == 404
    assert [a["name"] for a in alice.artifacts()] == ["mine.bin"]
    assert alice.artifacts(owner="vis-bob") == [], "a user's owner= other than itself lists nothing"
    assert [a["name"] for a in admin.artifacts(owner="vis-bob")] == ["private.bin"]
    assert admin.artifact("private.bin", owner="vis-bob")["sha256"] == sha(b"bob's")
    assert admin.artifact_content("private.bin", owner="vis-bob") == b"bob's"
    everyone = {(a["owner"], a["name"]) for a in admin.artifacts()}
    assert {("vis-bob", "private.bin"), ("vis-alice", "mine.bin")} <= everyone
    # The same name in two namespaces: two artifacts.
    alice.upload(b"alice's too", "private.bin")
    assert bob.artifact_content("private.bin") == b"bob's"
    assert alice.artifact_content("private.bin") == b"alice's too"


def test_a_large_file_is_streamed_both_ways(platform, tmp_path):
    """20 MiB (more than two 8 MiB multipart parts) uploaded from disk and read
    back into a file, with the SDK never holding the file in memory."""
    alice = platform.user("art-big")
    src, back = tmp_path / "big.bin", tmp_path / "back.bin"
    h = hashlib.sha256()
    with open(src, "wb") as f:
        for _ in range(20):
            block = os.urandom(1 << 20)
            h.update(block)
            f.write(block)
    tracemalloc.start()
    try:
        a = alice.upload(src, "big.bin")
        alice.artifact_content("big.bin", path=back)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (a["size"], a["sha256"]) == (20 << 20, h.hexdigest())
    assert hashlib.sha256(back.read_bytes()).hexdigest() == h.hexdigest()
    assert peak < 6 << 20, f"the SDK held {peak} bytes at once for a 20 MiB file"


def test_delete_is_refused_while_an_unfinished_job_reads_it(platform):
    alice = platform.user("art-inuse")
    alice.upload(DIGITS, "digits.npz")
    # More memory than any test executor offers: the job stays queued.
    job = alice.submit(mlp_spec("holds-an-artifact", "artifact:digits.npz", resources=UNPLACEABLE))
    assert job["state"] == "queued", job
    with pytest.raises(trainyard.ApiError) as e:
        alice.delete_artifact("digits.npz")
    assert e.value.status == 409, e.value
    assert alice.artifact("digits.npz")["size"] == DIGITS.stat().st_size
    alice.cancel(job["id"])
    wait_state(alice, job["id"], {"cancelled"})
    alice.delete_artifact("digits.npz")
    assert alice.artifacts() == []


def test_the_size_limits(platform):
    with platform.variant("--max-artifact-bytes", "1000", "--max-artifact-bytes-per-user", "2500", label="limits") as p:
        alice, bob = p.user("lim-alice"), p.user("lim-bob")
        with pytest.raises(trainyard.ApiError) as e:
            alice.upload(b"x" * 1001, "too-big.bin")
        assert e.value.status == 413, e.value
        assert "body" in e.value.fields, e.value.body
        # Without a Content-Length (chunked): the limit holds while streaming.
        with pytest.raises(trainyard.ApiError) as e:
            alice.upload(iter([b"y" * 600, b"y" * 600]), "chunked.bin")
        assert e.value.status == 413, e.value
        assert alice.artifacts() == [], "a refused upload leaves nothing behind"

        assert alice.upload(b"a" * 1000, "a.bin")["size"] == 1000
        assert alice.upload(b"b" * 900, "b.bin")["size"] == 900
        with pytest.raises(trainyard.ApiError) as e:
            alice.upload(b"c" * 900, "c.bin")
        assert e.value.status == 413, "2800 bytes are over the user's 2500"
        assert "body" in e.value.fields, e.value.body
        assert bob.upload(b"c" * 900, "c.bin")["size"] == 900, "the total is per user"
        alice.delete_artifact("a.bin")
        assert alice.upload(b"c" * 900, "c.bin")["size"] == 900, "a delete frees its bytes"
        assert sorted(a["name"] for a in alice.artifacts()) == ["b.bin", "c.bin"]
