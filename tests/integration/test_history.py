"""History is per user (docs/queue.md, step 7): each attack is made as bob, with bob's own
valid credential, against a real ZooKeeper and the real keeper (an agent process, or the
keeper's pass in a thread).

- bob's thousands of finished records dated 2096 prune only bob's history, never alice's:
  the bound is per user and goes by the znode's mtime (ZooKeeper's clock), not by dates
  bob writes;
- junk in bob's jobs folder (not JSON, wrong types, names that are not task keys) is
  skipped and counted by ``hypertf jobs`` and the dashboard, for everyone, and a junk
  record of an ended job does not stop the keeper's sync;
- thousands of junk records being read and pruned never hold up an admission > 1 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kazoo.client import KazooClient

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.core.placement import PortRanges, Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.store import Layout, Store, encode
from hypertf.store.zkclient import pipelined
from tests.conftest import wait_for

HOST = "node1"
FAR_FUTURE = 3_980_000_000.0  # 2096


def one_gpu(host: str, ports: tuple[int, int] = (20000, 20999)) -> Request:
    return Request((TaskSlot("worker", 0, 1),), (host,),
                   port_ranges=PortRanges((host,), ports))


def finished(key: str, when: float) -> dict[str, Any]:
    """A released job's record, dated ``when`` (what its owner may write)."""
    return {"task_key": key, "state": "released", "created": when - 60, "admitted": when - 50,
            "released": when, "stopped_on": "all", "owner": {"user": key.partition(".")[2],
                                                             "host": "h", "pid": 1}}


def create_many(client: KazooClient, layout: Layout, records: dict[str, bytes]) -> None:
    """What bob's own code can do: async creates, 1,000 a round trip, in his folder."""
    acl = store.acls(client).job()
    for user in {key.partition(".")[2] for key in records}:
        client.ensure_path(layout.user_jobs(user))
    items = list(records.items())
    for start in range(0, len(items), 1000):
        with pipelined(client):
            pending = [client.create_async(layout.job(key), data, acl=acl)
                       for key, data in items[start:start + 1000]]
        for result in pending:
            result.get(timeout=30)


def folder(client: KazooClient, layout: Layout, user: str) -> list[str]:
    return client.get_children(layout.user_jobs(user))


@pytest.fixture
def lab(zk_server, tmp_path) -> Iterator[Callable[..., tuple[Path, dict[str, KazooClient]]]]:
    """``lab(**vars)``: an inventory of one local node (2 static GPUs) with ``vars``, its
    root secured for alice and bob (a client each); ``lab.agent()`` starts its agent (the
    keeper). Everything is closed and killed whatever the test did."""
    clients: list[KazooClient] = []
    agents: list[subprocess.Popen[str]] = []
    made: dict[str, Path] = {}

    def make(**extra: Any) -> tuple[Path, dict[str, KazooClient]]:
        gpus = tmp_path / "gpus.json"
        gpus.write_text(json.dumps([{}, {}]))
        path = tmp_path / "inventory.yml"
        path.write_text(yaml.safe_dump({"all": {
            "vars": {"hypertf_zookeeper_hosts": zk_server.hosts,
                     "hypertf_zk_root": f"/history-{tmp_path.name}", "hypertf_gpu_confine": "off",
                     "hypertf_agent_interval": 0.3, "hypertf_zk_session_timeout": 2,
                     "hypertf_gpu_source": "static", "hypertf_venv": sys.prefix,
                     "hypertf_keeper_prune_interval": 1, **extra},
            "children": {"gpu_nodes": {"hosts": {HOST: {
                "ansible_connection": "local", "ansible_host": "127.0.0.2",
                "hypertf_static_gpus": str(gpus), "hypertf_workdir": str(tmp_path / HOST)}}}},
        }}))
        cluster = load_inventory(path).cluster
        store.secure_cluster(cluster, [HOST], users=["alice", "bob"])
        made["path"] = path
        users = {name: store.connect(cluster, identity=f"user.{name}")
                 for name in ("alice", "bob")}
        clients.extend(users.values())
        return path, users

    def agent() -> None:
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "hypertf.cli", "agent", "-i", str(made["path"]),
             "--host", HOST], stderr=subprocess.DEVNULL, text=True))
        layout = Layout(load_inventory(made["path"]).cluster.zk_root)
        reader = clients[0]
        wait_for(lambda: reader.exists(layout.matrix) and Store(reader, layout).matrix.read()[
            0].gpus.get(HOST) == [1, 1], 60, "the agent's row")

    make.agent = agent  # type: ignore[attr-defined]
    yield make
    for process in agents:  # by PID, whatever the test did
        if process.poll() is None:
            process.kill()
        process.wait()
    for client in clients:
        store.close(client)


def test_future_dated_records_of_one_user_prune_only_their_own(lab):
    """bob's 2,000 finished records dated 2096, over a per-user bound of 1,000: the keeper
    prunes bob's oldest (by when ZooKeeper wrote them) down to 1,000 and keeps every one of
    alice's records, although hers are dated before his."""
    path, users = lab(hypertf_job_records_max=1000)
    alice, bob = users["alice"], users["bob"]
    layout = Layout(load_inventory(path).cluster.zk_root)
    now = time.time()
    hers = [f"20250101-00000{i}-a1b2c3.alice" for i in range(5)]
    create_many(alice, layout, {k: encode(finished(k, now - 3600 + i))
                                for i, k in enumerate(hers)})
    stamp = new_task_key("bob").partition(".")[0]
    his = [f"{stamp}-{i:04d}.bob" for i in range(2000)]
    create_many(bob, layout, {k: encode(finished(k, FAR_FUTURE + i)) for i, k in enumerate(his)})
    lab.agent()
    wait_for(lambda: len(folder(alice, layout, "bob")) <= 1000, 60,
             "the keeper to prune bob's records down to his bound")
    time.sleep(1.5)  # another prune run (every 1 s here) changes nothing
    assert sorted(folder(alice, layout, "alice")) == hers
    kept = sorted(folder(alice, layout, "bob"))
    assert kept == his[1000:]  # his oldest written went, not those with the oldest dates


def test_prune_goes_by_when_zookeeper_wrote_a_record_never_running_ones(zk, layout):
    """Retention and the per-user bound by the znode's mtime/mzxid, whatever the dates
    inside (moved from test_allocation, where the dates decided)."""
    from hypertf.keeper.prune import prune_jobs

    day = 86400.0
    records = {"a-dated-long-ago.root": finished("a-dated-long-ago.root", time.time() - 40 * day),
               "b-running.root": {"task_key": "b-running.root", "created": 0.0},
               "c-dated-2096.root": finished("c-dated-2096.root", FAR_FUTURE),
               "d-unreadable.root": None,
               "e-other-user.alice": finished("e-other-user.alice", time.time())}
    for key, job in records.items():
        zk.create(layout.job(key), b"{junk" if job is None else encode(job), makepath=True)
    zk.create(layout.lease("b-running.root"), b"{}", ephemeral=True, makepath=True)
    # written just now: nothing is past 30 days, whatever the records say
    assert prune_jobs(Store(zk, layout), 30 * day, 100).total == 0
    # over root's bound of 2 (its running job counts): root's oldest written go, alice's stay
    assert prune_jobs(Store(zk, layout), 30 * day, 2).deleted == {"root": 2}
    assert sorted(folder(zk, layout, "root")) == ["b-running.root", "d-unreadable.root"]
    # 31 days on: every finished record goes (the unreadable one too), the running one stays
    later = time.time() + 31 * day
    assert prune_jobs(Store(zk, layout), 30 * day, 100, now=later).deleted == {
        "root": 1, "alice": 1}
    assert folder(zk, layout, "root") == ["b-running.root"]
    assert folder(zk, layout, "alice") == []


def test_a_prune_run_is_bounded_per_user(zk, layout):
    """At most ``max_deletes`` per user per run, and it says a backlog is left."""
    from hypertf.keeper.prune import prune_jobs

    create_many(zk, layout, {f"k-{i:03d}.bob": b"junk" for i in range(50)})
    first = prune_jobs(Store(zk, layout), 1.0, 10, max_deletes=30)
    assert (first.deleted, first.backlog) == ({"bob": 30}, True)
    assert sorted(folder(zk, layout, "bob")) == [f"k-{i:03d}.bob" for i in range(30, 50)]
    second = prune_jobs(Store(zk, layout), 1.0, 10, max_deletes=30)
    assert (second.deleted, second.backlog) == ({"bob": 10}, False)


def test_junk_in_one_folder_is_skipped_and_counted_for_everyone(lab, capsys):
    """One non-JSON record, one of the wrong types, one posing as alice's job, a name that
    is not a task key, one nested 20,000 deep and one dated 1e300 in bob's folder:
    ``hypertf jobs`` and the dashboard still list alice's job for everyone (no exit 3), and
    say what they skipped."""
    from hypertf.cli import commands
    from hypertf.dashboard.source import ClusterSource

    path, users = lab()
    alice, bob = users["alice"], users["bob"]
    layout = Layout(load_inventory(path).cluster.zk_root)
    mine = new_task_key("alice")
    create_many(alice, layout, {mine: encode(finished(mine, time.time()))})
    stamp = new_task_key("bob").partition(".")[0]
    acl = store.acls(bob).job()
    bob.create(layout.job(f"{stamp}-1.bob"), b"{not json", acl=acl)
    bob.create(layout.job(f"{stamp}-2.bob"), encode({"task_key": f"{stamp}-2.bob",
                                                     "placements": "everything",
                                                     "owner": ["root"], "created": "soon"}),
               acl=acl)
    bob.create(layout.job(f"{stamp}-3.bob"), encode(finished(mine, time.time())), acl=acl)
    bob.create(f"{layout.user_jobs('bob')}/not-a-task-key", b"{}", acl=acl)
    bob.create(layout.job(f"{stamp}-4.bob"), b'{"format": 1, "args": ' + b"[" * 20_000
               + b"]" * 20_000 + b"}", acl=acl)  # 40 KB, nested 20,000 deep
    bob.create(layout.job(f"{stamp}-5.bob"), encode(finished(f"{stamp}-5.bob", 1e300)),
               acl=acl)

    listed = Store(alice, layout).jobs.listing()
    assert [job["task_key"] for job in listed] == [mine]
    assert commands.jobs(str(path)) == 0
    out, err = capsys.readouterr()
    assert mine in out and "bob" not in out
    assert "6 unreadable records skipped in jobs/bob" in err
    assert commands.jobs(str(path), as_json=True) == 0
    out, err = capsys.readouterr()
    assert [job["task_key"] for job in json.loads(out)] == [mine]
    assert "6 unreadable records skipped in jobs/bob" in err
    rows = ClusterSource(load_inventory(path), Store(alice, layout)).jobs()
    assert [row.get("task_key") for row in rows if not row.get("skipped")] == [mine]
    assert [row["note"] for row in rows if row.get("skipped")] == [
        "6 unreadable records skipped in jobs/bob"]


def test_a_junk_record_of_an_ended_job_does_not_stop_the_keepers_sync(
        secured, zk, layout, fake_agents, keeper):
    """bob's admitted job, its record rewritten with a ``stopped_on`` of the wrong type, its
    lease dropped: the keeper's sync treats the record as none (the job is lost, its GPU
    drains) and goes on admitting alice."""
    store.secure_cluster(secured, ["n1", "n2"], users=["alice", "bob"])
    fake_agents({"n1": 1, "n2": 1})
    keeper()
    alice = store.connect(secured, identity="user.alice")
    bob = store.connect(secured, identity="user.bob")
    try:
        grant = Store(bob, layout).queue.submit(one_gpu("n1"), new_task_key("bob"))
        key = grant.task_key
        bob.set(layout.job(key), encode({**finished(key, time.time()), "stopped_on": 5}))
        bob.delete(layout.lease(key))
        theirs = new_task_key("alice")
        Store(alice, layout).queue.enqueue(theirs, one_gpu("n2"), {})
        wait_for(lambda: json.loads(alice.get(layout.job(theirs))[0])["state"] == "allocated",
                 15, "the keeper to admit alice's job despite bob's junk record")
        Store(alice, layout).matrix.release(theirs, stopped_on=["n2"])
    finally:
        store.close(alice)
        store.close(bob)


JUNK = 10_000


def test_thousands_of_junk_records_never_stall_an_admission(lab):
    """bob's 10,000 junk records (not JSON), past their retention (1 s here): while the
    keeper reads and prunes them (every 1 s here), each of alice's admissions on an idle
    GPU takes < 1 s, and bob's junk is gone in the end."""
    path, users = lab(hypertf_job_retention_days=1 / 86400)
    alice, bob = users["alice"], users["bob"]
    layout = Layout(load_inventory(path).cluster.zk_root)
    stamp = new_task_key("bob").partition(".")[0]
    made = time.monotonic()
    create_many(bob, layout, {f"{stamp}-{i:05d}.bob": b"\x00junk" for i in range(JUNK)})
    made_s = time.monotonic() - made
    lab.agent()
    waits: list[float] = []
    started = time.monotonic()
    while time.monotonic() - started < 30:
        key = new_task_key("alice")
        asked = time.monotonic()
        Store(alice, layout).queue.submit(one_gpu(HOST), key)
        waits.append(time.monotonic() - asked)
        Store(alice, layout).matrix.release(key, stopped_on=[HOST])
        if not folder(alice, layout, "bob") and time.monotonic() - started > 3:
            break
    left = len(folder(alice, layout, "bob"))
    took = time.monotonic() - started
    print(f"\n{JUNK:,} junk records made in {made_s:.1f} s; {len(waits)} admissions while "
          f"pruned ({took:.1f} s, {left} left): max {max(waits) * 1000:.0f} ms, median "
          f"{sorted(waits)[len(waits) // 2] * 1000:.0f} ms, the first {waits[0] * 1000:.0f} ms")
    assert max(waits) < 1.0
    assert left == 0
