"""The SDK's job operations against the real server: listings followed
across pages, a job's events, cancel, and the identity of a user token."""

from conftest import UNPLACEABLE, mlp_spec, wait_state


def test_listings_follow_every_page(platform):
    pager = platform.user("jobs-pager")
    # Generated data; the resources keep them queued.
    ids = [pager.submit(mlp_spec(f"page-{i}", None, resources=UNPLACEABLE))["id"] for i in range(5)]
    try:
        listed = [j["id"] for j in pager.jobs(page_size=2)]
        assert listed == ids[::-1], "every page, newest first, once each"
        assert [j["id"] for j in pager.jobs(state="queued", page_size=1)] == ids[::-1]
        assert pager.jobs(state="succeeded") == []
        assert [j["owner"] for j in platform.admin.jobs(owner="jobs-pager", page_size=3)] == ["jobs-pager"] * 5
        assert platform.user("jobs-other").jobs() == [], "a user sees only its own jobs"
    finally:
        for i in ids:
            pager.cancel(i)
    for i in ids:
        job = wait_state(pager, i, {"cancelled"})
        assert job["finished_at"], job
    events = pager.events(ids[0])
    assert [e["kind"] for e in events][0] == "submitted"
    assert events[-1]["to_state"] == "cancelled", events
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)
    assert pager.checkpoints(ids[0])["checkpoints"] == []


def test_whoami(platform):
    me = platform.user("jobs-me").whoami()
    assert (me["user"], me["role"], me["open"]) == ("jobs-me", "user", False)
    assert platform.admin.whoami()["role"] == "admin"
