"""Fair share and the usage ledger against a real ZooKeeper and the real keeper pass (the
fake agents' hosts: two of 2 GPUs): the order of two users' jobs read from the grants'
times, with and without a share; the ledger across a keeper failover, each attempt once,
``hypertf usage``'s figures; and the thief's own credentials (a user's, an agent's) against
the ledger, the shares and the budgets."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from hypertf import store
from hypertf.config.settings import ClusterSettings
from hypertf.core.errors import StoreError
from hypertf.core.placement import PortRanges, Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.core.usage import Chunk, Summary, parse_chunk_name
from hypertf.keeper import queueview, usageview
from hypertf.store import Layout, Store
from hypertf.store.bootstrap import set_user_limits
from hypertf.store.zkclient import get_many
from tests.conftest import wait_for

HOSTS = {"n1": 2, "n2": 2}


@pytest.fixture
def users(secured: ClusterSettings, fake_agents) -> Iterator[dict[str, KazooClient]]:
    """bob and alice, registered, with a client each, and agent n1's client."""
    store.secure_cluster(secured, list(HOSTS), users=["bob", "alice"])
    fake_agents(HOSTS)
    clients = {name: store.connect(secured, identity=f"user.{name}")
               for name in ("bob", "alice")}
    clients["agent"] = store.connect(secured, identity="agent.n1")
    yield clients
    for client in clients.values():
        store.close(client)


def one_gpu() -> Request:
    hosts = tuple(HOSTS)
    return Request((TaskSlot("worker", 0, 1),), hosts, port_ranges=PortRanges(hosts,
                                                                              (20000, 20999)))


def granted(zk: KazooClient, layout: Layout, key: str) -> float | None:
    data = zk.exists(layout.grant(key)) and zk.get(layout.grant(key))[0]
    return float(json.loads(data)["granted"]) if data else None


def chunks(zk: KazooClient, layout: Layout) -> list[Chunk]:
    names = [n for n in zk.get_children(layout.usage) if parse_chunk_name(n)]
    return [Chunk.from_json(zk.get(layout.usage_chunk(n))[0], n) for n in names]


@pytest.mark.parametrize("bob_share", [None, 3.0], ids=["equal shares", "bob share 3"])
def test_alice_goes_before_bobs_remaining_jobs_unless_bob_has_the_share(
        users, zk, layout, secured, keeper, bob_share) -> None:
    """bob submits 6 one-GPU jobs (4 run), then alice 3; bob's jobs end one by one. With
    equal shares alice's 3 are admitted before bob's remaining 2 (bob's show Fairshare
    meanwhile); with share 3 for bob, alice gets 2 and bob's 2 come before her last. The
    order is read from the grants' times. bob's records claim a share and no usage: ignored."""
    if bob_share:
        set_user_limits(zk, secured.zk_root, "bob", None, None, share=bob_share)
    keeper()
    bob, alice = Store(users["bob"], layout), Store(users["alice"], layout)
    bobs = [new_task_key("bob") for _ in range(6)]
    for key in bobs:
        bob.queue.enqueue(key, one_gpu(), {"share": 1000, "usage": 0, "gpu_seconds": 0})
    wait_for(lambda: sum(1 for k in bobs if granted(zk, layout, k)) == 4, 10, "bob's 4 jobs")
    running = [k for k in bobs if granted(zk, layout, k)]
    time.sleep(1.5)  # bob's usage grows
    alices = [new_task_key("alice") for _ in range(3)]
    for key in alices:
        alice.queue.enqueue(key, one_gpu(), {})
    view = wait_for(lambda: len(Store(zk, layout).queue.read_view()) == 5 and
                    Store(zk, layout).queue.read_view(), 10, "5 jobs in the keeper's view")
    if not bob_share:
        assert {e["reason"] for e in view if e["task_key"].endswith(".bob")} == {"Fairshare"}
    for key in running:  # one at a time: each freed GPU is one decision
        before = {k for k in bobs + alices if granted(zk, layout, k)}
        bob.matrix.release(key)
        wait_for(lambda seen=before: len({k for k in bobs + alices
                                          if granted(zk, layout, k)} - seen) == 1,
                 10, "the next admission")
    times = {k: t for k in bobs + alices if k not in running
             and (t := granted(zk, layout, k)) is not None}
    order = [k.rpartition(".")[2] for k in sorted(times, key=times.__getitem__)]
    assert order == (["alice", "alice", "bob", "bob"] if bob_share else
                     ["alice", "alice", "alice", "bob"]), order
    rows = {r["user"]: r for r in queueview.shares(Store(zk, layout))}
    assert rows["bob"]["share"] == (bob_share or 1.0) and rows["alice"]["share"] == 1.0
    assert rows["bob"]["usage_gpu_seconds"] > rows["alice"]["usage_gpu_seconds"] > 0
    assert rows["bob"]["held_gpus"] + rows["alice"]["held_gpus"] == 4


def test_the_ledger_counts_each_attempt_once_across_a_keeper_failover(
        users, zk, layout, secured, keeper) -> None:
    """A job admitted by one keeper, ended under the next: one attempt in the ledger, its
    GPU-seconds within 5% of GPUs x held time; a restart (a new attempt, a new key) counts
    on its own; a third keeper counts nothing again; hypertf usage says the same."""
    first = keeper()
    bob = Store(users["bob"], layout)
    two = Request((TaskSlot("worker", 0, 1), TaskSlot("worker", 1, 1)), tuple(HOSTS),
                  port_ranges=PortRanges(tuple(HOSTS), (20000, 20999)))
    key1 = new_task_key("bob")
    bob.queue.enqueue(key1, two, {"attempt": 1})
    wait_for(lambda: Store(zk, layout).queue.read_grant(key1), 10, "the first attempt's grant")
    start1 = time.time()
    first.stop()  # the keeper fails over mid-run
    time.sleep(1.0)
    keeper()
    bob.matrix.release(key1, state="retried")
    held1 = time.time() - start1
    key2 = new_task_key("bob")  # the restart: a new attempt
    bob.queue.enqueue(key2, two, {"attempt": 2, "job_id": key1})
    wait_for(lambda: Store(zk, layout).queue.read_grant(key2), 10, "the second attempt's grant")
    start2 = time.time()
    time.sleep(1.0)
    bob.matrix.release(key2, state="succeeded")
    held2 = time.time() - start2
    wait_for(lambda: not zk.exists(layout.grant(key2)), 10, "the second grant's end")
    keeper()  # a third keeper reads the ledger again: nothing counted twice
    time.sleep(0.5)
    attempts = [a for c in chunks(zk, layout) for a in c.attempts]
    assert sorted(a.task_key for a in attempts) == sorted([key1, key2])
    by_key = {a.task_key: a for a in attempts}
    assert by_key[key1].ended == "retried" and by_key[key2].attempt == 2
    assert by_key[key1].gpu_seconds(0) == pytest.approx(2 * held1, rel=0.05, abs=0.3)
    assert by_key[key2].gpu_seconds(0) == pytest.approx(2 * held2, rel=0.05, abs=0.3)
    summary = Summary.from_json(zk.get(layout.usage)[0])
    total = 2 * (held1 + held2)
    assert summary.month_used("bob", time.time()) == pytest.approx(total, rel=0.05, abs=0.6)
    report = usageview.collect(Store(zk, layout))
    assert report.rows["bob"] == pytest.approx(total, rel=0.05, abs=0.6)
    assert json.loads(json.dumps(report.to_json()))["rows"][0]["user"] == "bob"
    lines = list(csv.reader(io.StringIO(report.to_csv())))
    assert lines[0] == ["user", "gpu_hours", "gpu_seconds"] and lines[1][0] == "bob"
    assert usageview.collect(Store(zk, layout), viewer="alice").rows == {}
    by_model = usageview.collect(Store(zk, layout), by="gpu_model")
    assert sum(by_model.rows.values()) == pytest.approx(total, rel=0.05, abs=0.6)


def test_a_user_past_the_budget_waits_and_a_no_wait_job_is_refused(
        users, zk, layout, secured, keeper) -> None:
    """alice's budget is used up (a tiny one): her new job waits with reason Budget, her
    --no-wait job is refused naming the budget; her running job is not touched."""
    keeper()
    alice = Store(users["alice"], layout)
    running = new_task_key("alice")
    alice.queue.enqueue(running, one_gpu(), {})
    wait_for(lambda: Store(zk, layout).queue.read_grant(running), 10, "alice's first job")
    set_user_limits(zk, secured.zk_root, "alice", None, None, gpu_hours_per_month=0.0001)
    time.sleep(0.6)  # 0.36 GPU-seconds are used
    waiting, refused = new_task_key("alice"), new_task_key("alice")
    alice.queue.enqueue(waiting, one_gpu(), {})
    alice.queue.enqueue(refused, one_gpu(), {}, wait=False)
    wait_for(lambda: [e for e in Store(zk, layout).queue.read_view() if e["task_key"] == waiting
                      and e["reason"] == "Budget"], 10, "the Budget reason")
    record = wait_for(lambda: (r := json.loads(zk.get(layout.job(refused))[0]))["state"]
                      == "refused" and r, 10, "the refusal")
    assert "budget" in record["refused_reason"]  # type: ignore[index]
    assert Store(zk, layout).queue.read_grant(running) is not None


def test_the_thief_writes_no_usage_no_share_and_no_budget(users, zk, layout, secured,
                                                          keeper) -> None:
    """A user's and an agent's own valid credentials: the ledger's summary and chunks,
    and the limits (shares, budgets), refuse them."""
    keeper()
    key = new_task_key("bob")
    Store(users["bob"], layout).queue.enqueue(key, one_gpu(), {})
    wait_for(lambda: Store(zk, layout).queue.read_grant(key), 10, "bob's job")
    Store(users["bob"], layout).matrix.release(key)
    wait_for(lambda: chunks(zk, layout), 10, "a chunk of the ledger")
    chunk = chunks(zk, layout)[0].name
    for who in ("bob", "agent"):
        thief = users[who]
        acl = store.acls(thief).of("usage_chunk")
        for write in (
                lambda t=thief: t.set(layout.usage, Summary().to_json()),
                lambda t=thief: t.set(layout.usage_chunk(chunk), b"{}"),
                lambda t=thief: t.delete(layout.usage_chunk(chunk)),
                lambda t=thief, a=acl: t.create(layout.usage_chunk("2099-01-01.0"), b"{}",
                                                acl=a),
                lambda t=thief: t.set(layout.limits, b"{}")):
            with pytest.raises(NoAuthError):
                write()
        with pytest.raises(StoreError, match="only the cluster admin"):
            set_user_limits(thief, secured.zk_root, "bob", None, None, share=100.0,
                            gpu_hours_per_month=0)
    data = get_many(zk, [layout.usage])[0][0]
    assert "bob" in Summary.from_json(data).users  # the keeper's, untouched
