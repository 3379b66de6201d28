"""``hypertf jobs``' table: a header over its columns, and the reason a job failed or who
killed it in its note."""

from __future__ import annotations

import time

from hypertf.cli import jobtable


def record(key: str, state: str, **more: object) -> dict:
    now = time.time()
    return {"task_key": key, "state": state, "alive": False, "created": now - 60,
            "admitted": now - 50, "released": now - 10, "script": "train.py",
            "owner": {"user": "alice", "host": "ws1"},
            "placements": [{"role": "worker", "index": 0, "host": "h1", "gpus": [0],
                            "port": 20000}], **more}


def test_jobs_has_a_header_and_says_why_a_job_failed() -> None:
    failed = record("20261127-050000-aaaaaa.alice", "failed", summary={
        "result": "failed", "message": "worker:0 exited 1: ValueError: bad lr\nlast lines..."})
    killed = record("20261127-050100-bbbbbb.alice", "killed", killed=time.time() - 10,
                    killed_by={"identity": "user.alice", "host": "ws1"})
    done = record("20261127-050200-cccccc.alice", "succeeded",
                  summary={"result": "succeeded", "message": "all finishers exited 0"})
    header, *rows = jobtable.job_table([failed, killed, done])
    assert header.split() == ["TASK", "KEY", "STATE", "OWNER", "SUBMITTED", "WAITED", "RAN",
                              "SCRIPT", "TASKS", "NOTE"]
    assert header.index("STATE") == rows[0].index("failed") == rows[1].index("killed")
    assert rows[0].endswith("worker:0 exited 1: ValueError: bad lr"), rows[0]
    assert "killed by user.alice from ws1" in rows[1]
    assert "all finishers" not in rows[2], "a success needs no reason"
