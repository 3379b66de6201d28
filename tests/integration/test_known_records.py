"""A launcher's writes to its own job record without reading it first (issue 55 item 1,
hypertf.store.knownrecords), against a real ZooKeeper and the real keeper: the record it
created, the admission it learns from the grant's stamp, its own ``starting``. Each write
stays version-checked, so anyone else's write in between (a kill, another client's change,
a grant whose stamp does not match) sends it back to reading, and nothing is lost."""

from __future__ import annotations

from typing import Any

from kazoo.client import KazooClient

from hypertf import store
from hypertf.core.grants import RecordStamp, grant_to_json
from hypertf.core.jobrecord import JobState
from hypertf.core.placement import new_task_key
from hypertf.core.records import decode
from hypertf.store import Store
from tests.integration.zkspy import one_gpu, spy


def record(zk: KazooClient, path: str) -> dict[str, Any]:
    return decode(zk.get(path)[0], "job record")


def test_a_cycle_writes_its_record_without_reading_it(zk, layout, fake_agents, keeper):
    """submit, starting, release: the record is never read back (another read of the
    grant between changes nothing), and it ends as the read path would write it (the
    keeper's admission kept, the launcher's end added)."""
    fake_agents({"n1": 1, "n2": 1})
    keeper()
    launcher = Store(zk, layout)
    gets = spy(zk, "get")
    key = new_task_key("root")
    grant = launcher.queue.submit(one_gpu(), key)
    launcher.jobs.update(key, state=JobState.STARTING)
    assert launcher.queue.read_grant(key) == grant  # a later read of the grant forgets nothing
    assert launcher.matrix.release(key) is True
    assert layout.job(key) not in gets
    ended = record(zk, layout.job(key))
    assert ended["state"] == JobState.RELEASED
    assert ended["stopped_on"] == "all"
    assert ended["placements"][0]["host"] == grant.placements[0].host
    assert isinstance(ended["admitted"], float) and "waited_s" in ended
    assert ended["created"] <= ended["admitted"] <= ended["released"]


def test_another_write_in_between_is_read_and_kept(zk, secured, layout, fake_agents, keeper):
    """A change by another client after the admission: the release's first try fails its
    version check, it reads the record and keeps that change."""
    fake_agents({"n1": 1, "n2": 1})
    keeper()
    launcher = Store(zk, layout)
    key = new_task_key("root")
    launcher.queue.submit(one_gpu(), key)
    other = store.connect(secured, identity="admin")
    try:
        Store(other, layout).jobs.update(key, note="from elsewhere")
    finally:
        store.close(other)
    gets = spy(zk, "get")
    assert launcher.matrix.release(key) is True
    assert layout.job(key) in gets
    ended = record(zk, layout.job(key))
    assert ended["state"] == JobState.RELEASED and ended["note"] == "from elsewhere"


def test_a_kill_in_between_keeps_the_killed_end(zk, layout, fake_agents, keeper):
    fake_agents({"n1": 1, "n2": 1})
    keeper()
    launcher = Store(zk, layout)
    key = new_task_key("root")
    launcher.queue.submit(one_gpu(), key)
    assert launcher.matrix.kill(key, command="hypertf kill") is True
    assert launcher.matrix.release(key) is False  # the lease was gone: the end is recorded only
    ended = record(zk, layout.job(key))
    assert ended["state"] == JobState.KILLED and ended["killed_by"]["command"] == "hypertf kill"


def test_a_stamp_that_does_not_match_is_not_believed(zk, layout, fake_agents, keeper):
    """A grant whose stamp names other bytes (here written by hand as the admin): nothing
    is known of the admission, so the release reads the record first."""
    fake_agents({"n1": 1, "n2": 1})
    keeper()
    launcher = Store(zk, layout)
    key = new_task_key("root")
    grant = launcher.queue.submit(one_gpu(), key)
    launcher.jobs.known.take(key)  # what the real stamp taught: forgotten
    version = zk.exists(layout.job(key)).version
    zk.set(layout.grant(key), grant_to_json(
        key, grant.placements, grant.ports, 1.0, record=RecordStamp.of(b"other", version, 1.0)))
    assert launcher.queue.read_grant(key) is not None  # learns nothing: the digest differs
    gets = spy(zk, "get")
    assert launcher.matrix.release(key) is True
    assert layout.job(key) in gets
    assert record(zk, layout.job(key))["state"] == JobState.RELEASED


def test_damaged_stamps_are_none():
    good = RecordStamp.of(b"x", 1, 2.0)
    assert RecordStamp.from_plain(good.to_plain(), 2.0) == good
    for bad in (None, [], {"version": 0, "sha256": good.sha256},
                {"version": True, "sha256": good.sha256}, {"version": 1, "sha256": "ab"},
                {"version": 1, "sha256": 7}):
        assert RecordStamp.from_plain(bad, 2.0) is None
    assert RecordStamp.from_plain(good.to_plain(), "soon") is None
