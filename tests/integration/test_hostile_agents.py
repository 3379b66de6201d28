"""A stolen node credential (``agent.n3``) writes its own record: whatever it writes, its
host counts as down with the reason logged, and nobody else's admission, command or job
stops (docs/zookeeper-layout.md, "Trust"). Real ZooKeeper, the real keeper pass."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from hypertf import store
from hypertf.config.settings import ClusterSettings
from hypertf.core.errors import InsufficientResources
from hypertf.core.placement import PortRanges, Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.store import AgentRecord, Store
from tests.integration.test_trust import no_double_booking

HOSTS = {"n1": 2, "n2": 2}
THIEF = "n3"
EVERY = (*HOSTS, THIEF)


@pytest.fixture
def thief(secured: ClusterSettings, fake_agents) -> Iterator[tuple[KazooClient, KazooClient]]:
    """n3's agent credential (the thief's) and alice's; n1 and n2 honest with 2 GPUs each."""
    store.secure_cluster(secured, list(EVERY), users=["alice"])
    fake_agents(HOSTS)
    agent = store.connect(secured, identity=f"agent.{THIEF}")
    alice = store.connect(secured, identity="user.alice")
    yield agent, alice
    store.close(agent)
    store.close(alice)


def record(**changes: object) -> bytes:
    payload = json.loads(AgentRecord(
        host=THIEF, mgmt_addr="127.0.0.9", data_addr="127.0.0.9", port=20000, gpu=2,
        gpu_avail_list=[0, 1], heartbeat=time.time()).to_json())
    payload.update(changes)
    return json.dumps(payload).encode()


HOSTILE = {
    "gpu as text": record(gpu="2"),
    "gpu 2.5": record(gpu=2.5),
    "gpu 600000": record(gpu=600_000, gpu_avail_list=[]),
    "1000 GPUs": record(gpu=1000, gpu_avail_list=list(range(1000))),
    "nested": b'{"format":1,"host":"n3","gpus":' + b"[" * 20_000 + b"]" * 20_000 + b"}",
}


def workers(count: int) -> Request:
    return Request(tuple(TaskSlot("worker", i, 1) for i in range(count)), EVERY,
                   port_ranges=PortRanges(EVERY, (20000, 20999)))


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_agent_record_counts_its_host_down_and_stops_nobody(thief, zk, layout,
                                                                      keeper, name):
    agent, alice = thief
    agent.create(layout.resource(THIEF), HOSTILE[name], ephemeral=True)
    keeper()
    grant = Store(alice, layout).queue.submit(workers(4), new_task_key("alice"))
    assert {p.host for p in grant.placements} == set(HOSTS)  # admitted, not on n3
    matrix, _ = Store(zk, layout).matrix.read()
    assert not any(matrix.gpus.get(THIEF, []))  # no cell of n3 (none, or unavailable)
    no_double_booking(zk, layout)
    # the cluster is what the honest hosts hold: a 5-GPU job can never fit
    with pytest.raises(InsufficientResources):
        Store(alice, layout).queue.submit(workers(5), new_task_key("alice"), wait=False)
    # every reader of the records goes on: without n3's unreadable one (1,000 GPUs reads,
    # and only the keeper's hypertf_host_gpus_max refuses it)
    readable = set(Store(alice, layout).records())
    assert readable == (set(EVERY) if name == "1000 GPUs" else set(HOSTS))
