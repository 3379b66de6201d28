"""hypertf.core.jobtransitions: each arrow of a job record's life, and its rules."""

from __future__ import annotations

from hypertf.core import jobtransitions as t
from hypertf.core.jobrecord import JobState, Owner
from hypertf.core.scheduler import Placement

OWNER = Owner(user="alice", host="h", pid=1, since=0.0)
KEY = "20261125-120000-abcdef.alice"


def test_every_state_has_one_named_writer() -> None:
    assert set(t.WRITERS) == set(JobState)
    assert t.WRITERS[JobState.ALLOCATED] is t.Writer.KEEPER
    assert t.WRITERS[JobState.LOST] is t.Writer.SYNC


def test_a_record_goes_queued_admitted_starting_released() -> None:
    record = t.queued(KEY, OWNER, {"priority": 0, "held": False}, "round_robin",
                      {"script": "x.py"}, now=100.0)
    assert record["state"] == JobState.QUEUED and record["script"] == "x.py"
    assert record["placements"] == []
    assert t.held(record, True)["queue"]["held"] is True
    assert record["queue"]["held"] is False  # a new record, the read one untouched
    record = t.admitted(record, [Placement("worker", 0, "n1", (3,))], {"worker:0": 2222},
                        now=102.5)
    assert record["state"] == JobState.ALLOCATED and record["waited_s"] == 2.5
    assert record["placements"] == [{"role": "worker", "index": 0, "host": "n1",
                                     "gpus": [3], "port": 2222}]
    record = t.changed(record, {"state": JobState.STARTING})
    assert record["state"] == JobState.STARTING
    ended = t.released(record, JobState.SUCCEEDED, {"summary": {}}, ["n1"], False, 200.0)
    assert ended["state"] == JobState.SUCCEEDED and ended["stopped_on"] == ["n1"]
    assert t.released(record, JobState.FAILED, {}, None, False, 200.0)["stopped_on"] == "all"
    assert t.lost(ended, 300.0) is None  # not live: nothing to write


def test_an_end_recorded_by_someone_else_is_kept() -> None:
    record = t.queued(KEY, OWNER, {}, "pack", {}, now=1.0)
    cancelled = t.ended_by(record, {"identity": "admin"}, now=2.0)
    assert cancelled["state"] == JobState.CANCELLED
    assert cancelled["cancelled_by"] == {"identity": "admin"}
    killed = t.ended_by(t.admitted(record, [], {}, 1.5), {"identity": "user.alice"}, 2.0)
    assert killed["state"] == JobState.KILLED and "killed" in killed
    assert t.changed(killed, {"state": JobState.RUNNING, "x": 1})["state"] == JobState.KILLED
    after = t.released(killed, JobState.SUCCEEDED, {}, None, lease_gone=True, now=3.0)
    assert after["state"] == JobState.KILLED and "stopped_on" not in after
    assert t.lost(record, 4.0)["state"] == JobState.LOST  # type: ignore[index]


def test_a_refused_unreadable_record_keeps_only_its_key() -> None:
    refused = t.refused(None, KEY, "invalid request: x", invalid=True, now=5.0)
    assert refused == {"task_key": KEY, "state": JobState.REFUSED, "refused": 5.0,
                       "refused_reason": "invalid request: x", "refused_kind": "invalid"}
    whole = t.refused({"task_key": KEY, "script": "s"}, KEY, "busy", invalid=False, now=5.0)
    assert whole["script"] == "s" and "refused_kind" not in whole


def test_only_a_waiting_job_is_held() -> None:
    admitted = t.admitted(t.queued(KEY, OWNER, {}, "pack", {}, 1.0), [], {}, 2.0)
    try:
        t.held(admitted, True)
    except ValueError as err:
        assert str(err) == JobState.ALLOCATED
    else:
        raise AssertionError("an admitted job was held")
