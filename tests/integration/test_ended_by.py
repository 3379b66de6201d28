"""The command that ended a job is in its record, and its launcher names it (issue 54
item 8: a running job ``hypertf cancel`` ended was blamed on ``hypertf kill``)."""

from __future__ import annotations

from hypertf import store
from hypertf.core.placement import Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.launch.lease import StoreLease
from hypertf.store import Store, credentials


def test_the_record_and_the_launcher_name_the_command_that_ended_the_job(secured, layout):
    client = store.connect(secured)
    try:
        user = Store(client, layout)
        lease = StoreLease(user, print)
        for command in ("hypertf cancel", "hypertf kill", "hypertf sweep cancel"):
            key = new_task_key(credentials.login_user())
            user.queue.enqueue(key, Request((TaskSlot("worker", 0, 0),), ("n1",)), {})
            assert user.matrix.kill(key, command)
            by = (user.jobs.read(key) or {})["cancelled_by"]
            assert by["command"] == command and by["identity"] == user.credential.identity
            assert lease.ended_by(key) == (f"{command} by {by['identity']} from "
                                           f"{by['host']}")
        assert lease.ended_by(new_task_key(credentials.login_user())) == "hypertf kill or cancel"
        key = new_task_key(credentials.login_user())  # the killer's own text: printed plain
        user.queue.enqueue(key, Request((TaskSlot("worker", 0, 0),), ("n1",)), {})
        assert user.matrix.kill(key, "hypertf kill\x1b]0;owned\x07")
        assert lease.ended_by(key).startswith("hypertf kill]0;owned by ")
    finally:
        store.close(client)
