"""``hypertf queue`` from the keeper's view (issue 55): the same rows as the keeper's own
pass run here, a job queued after the keeper's last pass still shown (``New``), and the
pass run here whenever the view is not whole."""

from __future__ import annotations

import json

from hypertf import store
from hypertf.core.placement import Request, new_task_key
from hypertf.core.records import encode
from hypertf.core.scheduler import TaskSlot
from hypertf.keeper import queueview
from hypertf.keeper.admitter import VIEW_BYTES_MAX, encode_view
from hypertf.store import Store, credentials
from tests.conftest import wait_for

SHOWN = ("task_key", "position", "user", "priority", "shape", "gpus", "script", "queued",
         "reason")


def gpus(count: int) -> Request:
    return Request(tuple(TaskSlot("worker", i, 1) for i in range(count)), ("n1", "n2"))


def test_the_view_shows_what_the_pass_here_shows(secured, layout, fake_agents, keeper, zk):
    fake_agents({"n1": 2, "n2": 2})
    keeper()
    user = Store(store.connect(secured), layout)
    try:
        holder = new_task_key(credentials.login_user())
        user.queue.enqueue(holder, gpus(2), {"script": "hold.py"})
        wait_for(lambda: user.queue.read_grant(holder), 10, "the holder admitted")
        keys = [new_task_key(credentials.login_user()) for _ in range(3)]
        for n, key in enumerate(keys):
            user.queue.enqueue(key, gpus(3 + n % 2), {"script": f"train{n}.py"}, priority=n % 2)
        wait_for(lambda: len(user.queue.read_queue_view().get("waiting", [])) == 3, 10,
                 "3 jobs in the keeper's view")
        view = queueview.collect_view(user)
        here = queueview.collect(user)
        assert view is not None
        assert [{k: r[k] for k in SHOWN} for r in view] == \
            [{k: r[k] for k in SHOWN} for r in here]
        assert [r["script"] for r in view] == ["train1.py", "train0.py", "train2.py"]
        assert all(r["shape"].endswith("GPUs in all") for r in view)
    finally:
        store.close(user.client)


def test_a_job_the_keeper_has_not_seen_shows_as_new_after_the_others(secured, layout,
                                                                     fake_agents, zk):
    """No keeper runs; the admin writes a view that knows one job of two (as a keeper's
    last pass before the second was queued)."""
    fake_agents({"n1": 2})
    user = Store(store.connect(secured), layout)
    try:
        seen, new = (new_task_key(credentials.login_user()) for _ in range(2))
        user.queue.enqueue(seen, gpus(3), {"script": "a.py"})
        user.queue.enqueue(new, gpus(1), {"script": "b\x1b[2J.py"}, priority=2)
        entry = {"task_key": seen, "position": 1, "reason": "Resources", "priority": 0,
                 "gpus": 3, "shape": "3 worker (1 GPU each): 3 GPUs in all",
                 "script": "a.py", "created": 1.0}
        zk.create(layout.queue_view, encode({"waiting": [entry]}), ephemeral=True)
        rows = queueview.collect_view(user)
        assert rows is not None
        assert [(r["task_key"], r["position"], r["reason"]) for r in rows] == \
            [(seen, 1, "Resources"), (new, 2, queueview.NEW)]
        assert rows[1]["script"] == "b[2J.py", "a user's escape sequence is not printed"
        assert rows[1]["priority"] == 2

        # An older keeper's view (no shapes), or one cut short: the pass runs here.
        zk.set(layout.queue_view, encode({"waiting": [{"task_key": seen, "position": 1}]}))
        assert queueview.collect_view(user) is None
        zk.set(layout.queue_view, encode({"waiting": [entry], "truncated": 5000}))
        assert queueview.collect_view(user) is None
        zk.delete(layout.queue_view)
        assert queueview.collect_view(user) is None  # no keeper now
    finally:
        store.close(user.client)


def test_a_queue_too_long_for_one_znode_is_cut_never_failing_the_pass() -> None:
    entries = [{"task_key": f"20261127-000000-{i:06x}.alice", "position": i + 1,
                "reason": "Resources", "priority": 0, "gpus": 1, "shape": "x" * 100,
                "script": "y" * 200, "created": 1.0} for i in range(20_000)]
    data = encode_view({"waiting": entries})
    view = json.loads(data)
    assert len(data) <= VIEW_BYTES_MAX
    assert view["truncated"] == 20_000 and 0 < len(view["waiting"]) < 20_000
    assert view["waiting"][0] == entries[0]
    assert json.loads(encode_view({"waiting": entries[:3]})) == {"format": 1,
                                                                 "waiting": entries[:3]}
