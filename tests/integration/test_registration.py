"""After ZooKeeper lost its data and the admin ran 'hypertf auth init', the agents are
running and re-register within their retry period: a launcher waits for them instead of
saying that no agent runs (issue 39, item 7)."""

from __future__ import annotations

import threading
import time

from hypertf import store
from hypertf.store import AgentRecord, Store


def _record(host: str) -> AgentRecord:
    return AgentRecord(host=host, mgmt_addr="127.0.0.2", data_addr="127.0.0.2", port=20000,
                       gpu=2, gpu_avail_list=[0, 1], heartbeat=time.time())


def test_a_launcher_waits_for_agents_of_a_root_just_secured(secured, layout):
    store.secure_cluster(secured, ["n1"])  # the hosts folder is a few ms old
    admin = store.connect(secured, identity="admin")
    said: list[str] = []
    try:
        timer = threading.Timer(1.5, lambda: admin.create(
            layout.resource("n1"), _record("n1").to_json(), ephemeral=True))
        timer.start()
        started = time.monotonic()
        found = Store(admin, layout).records_soon(["n1"], 20.0, said.append)
        assert list(found) == ["n1"] and 1.0 < time.monotonic() - started < 10
        assert "no agent has registered yet: waiting up to" in said[0]
    finally:
        store.close(admin)


def test_an_old_root_without_agents_is_answered_at_once(secured, layout):
    admin = store.connect(secured, identity="admin")
    try:
        started = time.monotonic()
        assert Store(admin, layout).records_soon(["n1"], 0.0) == {}
        assert time.monotonic() - started < 1.0
    finally:
        store.close(admin)
