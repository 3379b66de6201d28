"""Authority comes from the admin (docs/zookeeper-layout.md, "Trust"): each attack is made
with the attacker's own valid credential against a real ZooKeeper and the real keeper pass.

mallory is a registered user, alice the victim. Every test checks that no GPU is booked
twice (the matrix and the grants agree, one job per cell), that the attack's refusal says
why, and that alice's jobs are admitted meanwhile.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from hypertf import store
from hypertf.config.settings import ClusterSettings
from hypertf.core.errors import InsufficientResources, NotAllowed, UsageError
from hypertf.core.grants import grant_from_json
from hypertf.core.matrix import DRAINING, holder
from hypertf.core.placement import PortRanges, Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.keeper.queueview import collect
from hypertf.store import Layout, Store, encode
from hypertf.store.matrixshards import MatrixDamaged
from hypertf.store.waitqueue import request_to_json
from tests.conftest import wait_for

HOSTS = {"n1": 2, "n2": 2}


@pytest.fixture
def users(secured: ClusterSettings, fake_agents) -> Iterator[dict[str, KazooClient]]:
    """alice and mallory, registered, with a client each; two hosts of 2 GPUs."""
    store.secure_cluster(secured, list(HOSTS), users=["alice", "mallory"])
    fake_agents(HOSTS)
    clients = {name: store.connect(secured, identity=f"user.{name}")
               for name in ("alice", "mallory")}
    yield clients
    for client in clients.values():
        store.close(client)


def one_gpu(host: str = "n1", tasks: int = 1) -> Request:
    """``tasks`` workers of one GPU each, on ``host`` ("": any)."""
    hosts = (host,) if host else tuple(HOSTS)
    return Request(tuple(TaskSlot("worker", i, 1) for i in range(tasks)), hosts,
                   port_ranges=PortRanges(hosts, (20000, 20999)))


def no_double_booking(zk: KazooClient, layout: Layout) -> dict[str, str]:
    """Every held cell's job has a grant naming exactly that cell; returns cell -> job."""
    matrix, _ = Store(zk, layout).matrix.read()
    cells = {f"{h}:{i}": key for h, row in matrix.gpus.items()
             for i, c in enumerate(row) if (key := holder(c))}
    for key in set(cells.values()):
        grant = grant_from_json(zk.get(layout.grant(key))[0], key)
        granted = {f"{p.host}:{g}" for p in grant.placements for g in p.gpus}
        assert granted == {c for c, k in cells.items() if k == key}, (key, granted, cells)
    return cells


def forge(client: KazooClient, layout: Layout, key: str, queue: dict, **record: object) -> None:
    """What a hostile user's own code writes: its lease and a record of its choosing."""
    tx = client.transaction()
    acls = store.acls(client)
    tx.create(layout.lease(key), b"{}", acl=acls.lease(), ephemeral=True)
    tx.create(layout.job(key), encode({"task_key": key, "state": "queued",
                                       "created": time.time(), "queue": queue, **record}),
              acl=acls.job())
    assert not [r for r in tx.commit() if isinstance(r, Exception)]


def test_a_users_own_record_admits_nothing_and_the_keeper_adopts_nothing(
        users, zk, layout, keeper):
    keeper()
    alice, mallory = users["alice"], users["mallory"]
    victim = Store(alice, layout).queue.submit(one_gpu(), new_task_key("alice"))
    taken = victim.placements[0]
    # 1. mallory's waiting job rewritten to "allocated" on alice's GPU: his launcher's
    #    wait refuses to start (no grant), the matrix never shows it
    key = new_task_key("mallory")
    Store(mallory, layout).queue.enqueue(key, one_gpu("n1", 2), {})
    record = json.loads(mallory.get(layout.job(key))[0])
    mallory.set(layout.job(key), encode({**record, "state": "allocated", "placements": [
        {"role": "worker", "index": 0, "host": taken.host, "gpus": list(taken.gpus),
         "port": 20500}]}))
    with pytest.raises(NotAllowed, match="granted it nothing"):
        Store(mallory, layout).queue.wait_for_admission(key, lambda _line: None, threading.Event())
    # 2. a lease and a record "allocated" from the start on every free GPU: adopted by no
    #    keeper pass (mallory's GPU limit is irrelevant: nothing is his)
    forged = new_task_key("mallory")
    free = [{"role": "worker", "index": i, "host": h, "gpus": [g], "port": 20600 + i}
            for i, (h, g) in enumerate([("n1", 1), ("n2", 0), ("n2", 1)])]
    forge(mallory, layout, forged, request_to_json(one_gpu(), 0), state="allocated",
          placements=free)
    time.sleep(1.0)  # several keeper passes
    cells = no_double_booking(zk, layout)
    assert forged not in cells.values() and key not in cells.values()
    assert zk.exists(layout.grant(forged)) is None
    # alice's --no-wait job takes the GPUs mallory's record named
    other = Store(alice, layout).queue.submit(one_gpu("", 3), new_task_key("alice"), wait=False)
    assert sum(len(p.gpus) for p in other.placements) == 3
    assert set(no_double_booking(zk, layout).values()) == {victim.task_key, other.task_key}


def test_a_lease_under_another_users_folder_keeps_nothing_alive(users, zk, layout, keeper,
                                                                secured):
    keeper()
    alice = store.connect(secured, identity="user.alice")
    grant = Store(alice, layout).queue.submit(one_gpu(), new_task_key("alice"))
    mallory = users["mallory"]
    mallory.create(f"{layout.user_leases('mallory')}/{grant.task_key}", b"{}",
                   acl=store.acls(mallory).lease(), ephemeral=True)
    store.close(alice)  # her launcher SIGKILLed: its session, and so its lease, is gone
    host, gpu = grant.placements[0].host, grant.placements[0].gpus[0]
    wait_for(lambda: Store(zk, layout).matrix.read()[0].gpus[host][gpu]
             == f"{DRAINING}{grant.task_key}", 20, "alice's cell draining")
    # the record is written just after the matrix's transaction: wait for it, not a race
    wait_for(lambda: Store(zk, layout).jobs.read(grant.task_key)["state"] == "lost", 10,
             "alice's record marked lost")
    # a job that ends normally is freed too, whatever mallory's forged lease says
    ended = Store(users["alice"], layout).queue.submit(one_gpu("n2"), new_task_key("alice"))
    mallory.create(f"{layout.user_leases('mallory')}/{ended.task_key}", b"{}",
                   acl=store.acls(mallory).lease(), ephemeral=True)
    Store(users["alice"], layout).matrix.release(ended.task_key, stopped_on=["n2"])
    wait_for(lambda: ended.task_key not in Store(zk, layout).matrix.read()[0].task_keys(), 10,
             "the ended job's cell freed")
    wait_for(lambda: zk.exists(layout.grant(ended.task_key)) is None, 10, "its grant gone")


BAD = {
    "Infinity priority": ({"priority": float("inf")}, "priority is Infinity"),
    "a string GPU count": ({"slots": [["worker", 0, "2"]]}, "GPU count is '2'"),
    "negative GPUs": ({"slots": [["worker", 0, 2], ["worker", 1, 2], ["worker", 2, -4]]},
                      "worker:2's GPU count -4 is outside"),
    "an unknown field": ({"grant": True}, "unknown request field(s) grant"),
    "a host name with a slash": ({"hosts": ["../x"]}, "is not a host name"),
}


def test_malformed_records_are_refused_with_their_reason_and_stop_nobody(users, zk, layout,
                                                                         keeper):
    keeper()
    mallory = users["mallory"]
    keys = {}
    for name, (change, _) in BAD.items():
        key = keys[name] = new_task_key("mallory")
        forge(mallory, layout, key, {**request_to_json(one_gpu(), 0), **change})
    never = new_task_key("mallory")  # 100 GPUs on a 4-GPU cluster: refused, reserves nothing
    forge(mallory, layout, never, request_to_json(one_gpu("", 100), 0))
    alice = Store(users["alice"], layout).queue.submit(one_gpu("n2"), new_task_key("alice"))
    assert alice.placements  # admitted meanwhile
    loud = new_task_key("mallory")  # priority 10^9: capped, and shown capped
    forge(mallory, layout, loud, request_to_json(one_gpu("", 4), 10**9))
    for name, (_, reason) in BAD.items():
        record = wait_for(lambda k=keys[name]: (r := Store(zk, layout).jobs.read(k))
                          and r["state"] == "refused" and r, 10, f"{name} refused")
        assert reason in record["refused_reason"], (name, record["refused_reason"])
        assert record.get("refused_kind") == "invalid"
    refused = wait_for(lambda: (r := Store(zk, layout).jobs.read(never))
                       and r["state"] == "refused" and r, 10, "100 GPUs refused")
    assert "more than the cluster's hosts can ever hold" in refused["refused_reason"]
    rows = {row["task_key"]: row for row in collect(Store(mallory, layout))}
    assert rows[loud]["priority"] == 10
    view = json.loads(zk.get(layout.queue_view)[0])
    assert [w["priority"] for w in view["waiting"] if w["task_key"] == loud] == [10]
    no_double_booking(zk, layout)
    # the launcher's side: an invalid request is a usage error with the keeper's reason
    key = new_task_key("mallory")
    with pytest.raises(UsageError, match="outside"):
        Store(mallory, layout).queue.submit(Request((TaskSlot("worker", 0, 2),
                                                     TaskSlot("worker", 1, 2),
                                                     TaskSlot("worker", 2, -4)), ("n1", "n2")),
                                            key)
    with pytest.raises(InsufficientResources, match="can ever hold"):
        Store(mallory, layout).queue.submit(one_gpu("", 100), new_task_key("mallory"))


def _admission_s(client: KazooClient, layout: Layout) -> float:
    started = time.monotonic()
    grant = Store(client, layout).queue.submit(one_gpu("n2"), new_task_key("alice"))
    took = time.monotonic() - started
    Store(client, layout).matrix.release(grant.task_key, stopped_on=["n2"])
    return took


def test_a_flood_of_waiting_requests_does_not_slow_another_users_admission(
        users, zk, layout, keeper):
    """500 requests of one user: past hypertf_user_queue_limit the newest are refused, the
    oldest 200 wait, and another user's jobs are admitted meanwhile; past the leases
    folder's quota (hypertf.store.quotas.UserQuotas: 457 znodes) ZooKeeper itself refuses
    more. How much slower the others are is measured, not asserted here: bench/flood.py
    (docs/benchmarks.md)."""
    keeper(user_queue_limit=200)
    alice, mallory = users["alice"], users["mallory"]
    idle = statistics.median(_admission_s(alice, layout) for _ in range(7))
    blocker = Store(mallory, layout).queue.submit(one_gpu("n1", 2), new_task_key("mallory"))
    stamp = new_task_key("mallory").partition(".")[0]
    flood = [f"{stamp}-{i:04d}.mallory" for i in range(500)]
    tx_at = time.monotonic()
    made: list[str] = []
    for start in range(0, len(flood), 100):  # 100 lease+record pairs a transaction
        tx = mallory.transaction()
        for key in flood[start:start + 100]:
            tx.create(layout.lease(key), b"{}", acl=store.acls(mallory).lease(),
                      ephemeral=True)
            tx.create(layout.job(key), encode({"task_key": key, "state": "queued",
                                               "created": time.time(),
                                               "queue": request_to_json(one_gpu("n1"), 5)}),
                      acl=store.acls(mallory).job())
        if not [r for r in tx.commit() if isinstance(r, Exception)]:
            made += flood[start:start + 100]
    # HyperTF's provider counts the transaction's own creates: the one that would pass the
    # quota (1 folder + 1 blocker + 500 > 457) is refused whole (ZooKeeper's own check let
    # it through: it counts only what is committed)
    assert len(made) == 400
    wait_for(lambda: Store(zk, layout).jobs.read(made[-1])["state"] == "refused", 60,
             "the flood past the queue limit refused")
    settled_s = time.monotonic() - tx_at
    flooded = statistics.median(_admission_s(alice, layout) for _ in range(7))
    print(f"\nsubmit -> granted: idle {idle * 1000:.1f} ms, with 500 of mallory's requests "
          f"{flooded * 1000:.1f} ms ({flooded / idle:.2f}x); flood settled in {settled_s:.1f} s")
    assert "hypertf_user_queue_limit" in Store(zk, layout).jobs.read(made[-1])["refused_reason"]
    waiting = [k for k in flood[:300] if Store(zk, layout).jobs.read(k)["state"] == "queued"]
    assert len(waiting) == 200
    Store(mallory, layout).matrix.release(blocker.task_key)


def test_a_damaged_shard_is_refused_in_one_line_then_rewritten_by_the_keeper(
        users, zk, layout, keeper):
    thread = keeper()
    grant = Store(users["alice"], layout).queue.submit(one_gpu(), new_task_key("alice"))
    thread.stop()
    _, version = Store(zk, layout).matrix.read()
    for shard in version.versions:
        zk.set(layout.matrix_shard(shard), b'{"format": 1, "gpus": {"n1": "garbage"}}')
    with pytest.raises(MatrixDamaged, match="'hypertf auth init -i INVENTORY'"):
        Store(users["alice"], layout).matrix.read()
    keeper()
    wait_for(lambda: _readable(users["alice"], layout), 20, "the matrix rewritten")
    host, gpu = grant.placements[0].host, grant.placements[0].gpus[0]
    # rewritten empty first (a new keeper has no good read), then its grant restored
    wait_for(lambda: Store(zk, layout).matrix.read()[0].gpus.get(host, [None] * 4)[gpu]
             == grant.task_key, 20, "the running job's cell restored from its grant")
    zk.set(layout.matrix, b"garbage")  # the index too
    wait_for(lambda: _readable(users["alice"], layout), 20, "the index rewritten")
    no_double_booking(zk, layout)


def _readable(client: KazooClient, layout: Layout) -> bool:
    try:
        Store(client, layout).matrix.read()
    except MatrixDamaged:
        return False
    return True


def test_a_record_that_shuts_the_keeper_out_waits_alone(users, zk, layout, keeper):
    """mallory's record with an ACL the keeper may not write: it is left out, others are
    admitted (before, every pass failed on its transaction)."""
    keeper()
    mallory = users["mallory"]
    key = new_task_key("mallory")
    acls = store.acls(mallory)
    mine_only = [a for a in acls.job() if a.id.id != store.credential_of(mallory).keeper_id]
    tx = mallory.transaction()
    tx.create(layout.lease(key), b"{}", acl=acls.lease(), ephemeral=True)
    tx.create(layout.job(key), encode({"task_key": key, "state": "queued",
                                       "created": time.time(),
                                       "queue": request_to_json(one_gpu(), 0)}), acl=mine_only)
    tx.commit()
    done = threading.Event()
    alice = Store(users["alice"], layout)
    threading.Thread(target=lambda: (alice.queue.submit(one_gpu("n2"), new_task_key("alice")),
                                     done.set()),
                     daemon=True).start()
    assert done.wait(10), "alice was not admitted"
    no_double_booking(zk, layout)


def test_auth_init_rewrites_a_damaged_index_and_shard(users, zk, layout, secured):
    """The admin's repair, with no keeper running: 'hypertf auth init' (secure_cluster)."""
    zk.set(layout.matrix_shard(0), b"not json")
    zk.set(layout.matrix, b'{"format": 2, "shards": -3}')
    with pytest.raises(MatrixDamaged):
        Store(users["alice"], layout).matrix.read()
    store.secure_cluster(secured, list(HOSTS))
    assert _readable(users["alice"], layout)


def test_a_users_own_record_cannot_write_to_another_users_terminal(users, zk, layout):
    """mallory's own job record (her folder, her credential) carries terminal escape
    sequences in what ``hypertf jobs`` prints (the script, the failure's reason, her host):
    alice's listing shows them as '?', never as control characters."""
    from hypertf.cli.jobtable import job_table

    mallory = users["mallory"]
    key = new_task_key("mallory")
    clear, title = "\x1b[2J\x1b[H", "\x1b]0;pwned\x07"
    mallory.create(layout.job(key), encode({
        "task_key": key, "state": "failed", "created": time.time(), "released": time.time(),
        "script": f"train.py{clear}", "owner": {"user": "mallory", "host": f"ws{title}"},
        "summary": {"message": f"worker:0 exited 1{clear}{title}fake: all good"}}),
                   acl=store.acls(mallory).job())
    lines = job_table(Store(users["alice"], layout).jobs.collect().jobs)
    mine = next(line for line in lines if key in line)
    assert "\x1b" not in "\n".join(lines) and "\x07" not in "\n".join(lines)
    assert "train.py?[2J?[H" in mine and "worker:0 exited 1?[2J" in mine
