"""Bounded per-user folders (docs/zookeeper-layout.md, "Bounds"), tried as the thief would:
bob's own valid credential and a raw kazoo client, against a real ZooKeeper started with
``zookeeper.enforceQuota`` (hypertf.ops.zkserver) and the real keeper pass.

ZooKeeper itself refuses bob's creates past the quota ``auth init`` set on his folders;
a flood of long names up to it leaves ZooKeeper serving and root's jobs admitted; names
that are not task keys reach no reader (the queue, status, the keeper).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import pytest
import yaml
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, QuotaExceededError
from kazoo.protocol.states import WatchedEvent
from kazoo.security import OPEN_ACL_UNSAFE

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.config.settings import ClusterSettings
from hypertf.core.layout import is_task_key
from hypertf.core.placement import PortRanges, Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.keeper.queueview import collect
from hypertf.ops.zkserver import ZooKeeperServer
from hypertf.store import Layout, Store, encode, status
from hypertf.store.quotas import QUOTA_ROOT, UserQuotas
from hypertf.store.waitqueue import request_to_json
from tests.conftest import wait_for

HOSTS = {"n1": 2, "n2": 2}
QUEUE, RECORDS = 4, 10  # small settings: the quotas below follow from them
QUOTAS = UserQuotas.of(QUEUE, RECORDS)
LONG = 100_000  # the finding's 100 KB names


@pytest.fixture(scope="module")
def zk_server(state_home, request: pytest.FixtureRequest) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of this module's own (the conftest's, overridden): the floods below are
    the attack, and if one took its server down, no other module's test may go with it."""
    from hypertf.ops.zkserver import free_port

    server = ZooKeeperServer("127.0.0.1", free_port(), state_home / "zookeeper-bounds")
    # 512 MB, not the conftest's 256: every reader of bob's folder (he too, for as long
    # as he likes) is sent all of its names; the role's heap is 2g for this (docs: Bounds)
    server.start(heap="512m", tick_ms=500)
    yield server
    if request.session.testsfailed:
        print("\n--- ZooKeeper log (last lines) ---\n"
              + "\n".join(server.logfile.read_text(errors="replace").splitlines()[-30:]))
    server.stop()


@pytest.fixture
def bounded(secured: ClusterSettings) -> ClusterSettings:
    return dataclasses.replace(secured, user_queue_limit=QUEUE, job_records_max=RECORDS)


@pytest.fixture
def bob(bounded: ClusterSettings, fake_agents) -> Iterator[KazooClient]:
    """bob (the thief: a registered user) with his own client; root registered too; two
    hosts of 2 GPUs with (fake) agents."""
    fake_agents(HOSTS)  # registers the hosts with the default settings' quotas: first
    store.secure_cluster(bounded, list(HOSTS), users=["bob", "root"])
    client = store.connect(bounded, identity="user.bob")
    yield client
    store.close(client)


def one_gpu() -> Request:
    return Request((TaskSlot("worker", 0, 1),), tuple(HOSTS),
                   port_ranges=PortRanges(tuple(HOSTS), (20000, 20999)))


def flood(client: KazooClient, parent: str, names: list[str], ephemeral: bool) -> int:
    """Create every name, one after the other; how many ZooKeeper took. Every refusal must
    be the quota's. (Pipelined creates overshoot it: ZooKeeper checks a quota against the
    committed tree, not the requests in flight; docs/zookeeper-layout.md, "Bounds".)"""
    made = 0
    for name in names:
        try:
            client.create(f"{parent}/{name}", b"", ephemeral=ephemeral)
            made += 1
        except QuotaExceededError:
            pass
    return made


def test_bobs_raw_client_cannot_pass_the_quota_of_his_folders(bob, zk, bounded):
    layout = Layout(bounded.zk_root)
    leases, jobs = layout.user_leases("bob"), layout.user_jobs("bob")
    # the quota counts the folder itself: count - 1 children
    assert flood(bob, leases, [f"x{i}" for i in range(QUOTAS.leases.count + 20)],
                 ephemeral=True) == QUOTAS.leases.count - 1
    assert flood(bob, jobs, [f"x{i}" for i in range(QUOTAS.jobs.count + 20)],
                 ephemeral=False) == QUOTAS.jobs.count - 1
    with pytest.raises(QuotaExceededError):
        bob.create(f"{jobs}/20261122-085000-a1b2c3.bob", b"{}")
    # nor can he lift it, nor can anyone without the admin's credential set one
    mirror = f"{QUOTA_ROOT}{leases}/zookeeper_limits"
    for attempt in (lambda: bob.delete(mirror), lambda: bob.set(mirror, b"count=-1"),
                    lambda: bob.set_acls(f"{QUOTA_ROOT}{layout.root}", OPEN_ACL_UNSAFE),
                    lambda: bob.create(f"{QUOTA_ROOT}{layout.grants}/zookeeper_limits",
                                       b"count=-1,bytes=-1=;countHardLimit=1",
                                       makepath=True)):
        with pytest.raises(NoAuthError):
            attempt()
    # the lease's data is bounded too (bytes)
    bob.delete(f"{leases}/x0")
    with pytest.raises(QuotaExceededError):
        bob.create(f"{leases}/20261122-085000-a1b2c3.bob",
                   b"x" * (QUOTAS.leases.data_bytes + 1), ephemeral=True)
    # the admin's own folders have none: root's are untouched by bob's
    assert zk.exists(f"{QUOTA_ROOT}{layout.user_leases('root')}/zookeeper_limits")


def test_a_flood_of_long_names_leaves_zookeeper_alive_and_roots_job_admitted(
        bob, zk, bounded, keeper, zk_server: ZooKeeperServer):
    """As many 100 KB names as the quota lets in bob's leases (the finding: 200 of them
    killed ZooKeeper within seconds), and 100 in his jobs: ZooKeeper still serves, the
    keeper keeps admitting, and root's job is admitted within seconds."""
    layout = Layout(bounded.zk_root)
    thread = keeper(bounded, user_queue_limit=QUEUE)
    root = store.connect(bounded, identity="user.root")
    try:
        stamp = "20261122-085000-a1b2c3"
        junk = [f"{stamp}{i:06d}{'x' * LONG}.bob" for i in range(QUOTAS.leases.count + 5)]
        started = time.monotonic()
        made = flood(bob, layout.user_leases("bob"), junk, ephemeral=True)
        made_jobs = flood(bob, layout.user_jobs("bob"), junk[:100], ephemeral=False)
        flooded_s = time.monotonic() - started
        assert made == QUOTAS.leases.count - 1 and made_jobs == 100
        assert zk_server.pid() is not None and zk_server.mode() is not None
        admitted = []
        for _ in range(3):
            began = time.monotonic()
            grant = Store(root, layout).queue.submit(one_gpu(), new_task_key("root"))
            admitted.append(time.monotonic() - began)
            Store(root, layout).matrix.release(grant.task_key, stopped_on=list(HOSTS))
        print(f"\n{made} lease names and {made_jobs} job names of {LONG} bytes "
              f"({(made + made_jobs) * LONG / 1e6:.0f} MB) in {flooded_s:.1f} s; root's "
              f"submit -> granted: {', '.join(f'{s * 1000:.0f} ms' for s in admitted)}")
        assert max(admitted) < 5.0
        assert zk_server.mode() is not None
        assert thread.role.stopped is False
        # the keeper's set, not a listing: a listing of bob's folder is itself 26 MB
        assert not any(stamp in key for key in thread.admitter.leases.leases())
    finally:
        store.close(root)


def test_names_that_are_not_task_keys_reach_no_reader(bob, zk, bounded, tmp_path):
    """Junk in bob's folders (a 100 KB name, a name without an owner, another user's key,
    an empty stamp, a 200-character stamp, a space) is skipped by every listing: the
    keeper's, ``hypertf queue``'s, ``status``'s, ``hypertf jobs``'s. bob's one real
    request still shows."""
    layout = Layout(bounded.zk_root)
    acls = store.acls(bob)
    real = "20261122-085000-a1b2c3.bob"
    junk = [f"{'x' * LONG}.bob", "no-owner", "20261122-085000-a1b2c3.root", ".bob",
            f"20261122-085000-{'f' * 200}.bob", "a b.bob"]
    tx = bob.transaction()
    tx.create(layout.lease(real), b"{}", acl=acls.lease(), ephemeral=True)
    tx.create(layout.job(real), encode({"task_key": real, "state": "queued",
                                        "created": time.time(),
                                        "queue": request_to_json(one_gpu(), 0)}),
              acl=acls.job())
    for name in junk:
        for parent in (layout.user_leases("bob"), layout.user_jobs("bob")):
            tx.create(f"{parent}/{name}", encode({"task_key": name, "state": "queued"}),
                      acl=acls.job())
    assert not [r for r in tx.commit() if isinstance(r, Exception)]
    assert [k for k in junk if is_task_key(k, owner="bob")] == []
    zkstore = Store(zk, layout)
    assert zkstore.leases() == {real}
    assert zkstore.job_keys() == [real]
    assert [row["task_key"] for row in collect(zkstore, user_queue_limit=QUEUE)] == [real]
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": bounded.zookeeper_hosts,
                 "hypertf_zk_root": bounded.zk_root, "hypertf_zk_session_timeout": 2},
        "children": {"gpu_nodes": {"hosts": {h: {"ansible_connection": "local"}
                                             for h in HOSTS}}}}}))
    view = status.collect(zk, load_inventory(path))
    assert view["jobs"] == [real]
    assert len(str(view)) < LONG


def test_an_agent_asks_about_its_own_keys_and_wakes_when_one_goes(bob, zk, bounded):
    """``Store.leases_of``: which of a few keys have a lease, by ``exists`` (no listing of
    a user's folder), and a data watch that fires when one goes."""
    layout = Layout(bounded.zk_root)
    keys = ["20261122-085000-a1b2c3.bob", "20261122-085000-d4e5f6.bob"]
    for key in keys:
        bob.create(layout.lease(key), b"{}", acl=store.acls(bob).lease(), ephemeral=True)
    gone = threading.Event()

    def woken(event: WatchedEvent) -> None:
        gone.set()

    zkstore = Store(zk, layout)
    asked = [*keys, "20261122-085000-000000.bob", f"{'x' * LONG}.bob"]
    assert zkstore.leases_of(asked, watch=woken) == set(keys)
    bob.delete(layout.lease(keys[0]))
    assert gone.wait(5)
    assert zkstore.leases_of(asked) == {keys[1]}


def test_the_keeper_follows_leases_by_their_events_and_never_lists_a_folder_again(
        bob, bounded, keeper):
    """The keeper lists each user's leases folder once per connection; after that, bob's
    flood of long names reaches it as one event each (junk dropped), not as listings of
    his whole folder at every change (what took ZooKeeper down)."""
    layout = Layout(bounded.zk_root)
    thread = keeper(bounded, user_queue_limit=QUEUE)
    root = store.connect(bounded, identity="user.root")
    try:
        first = Store(root, layout).queue.submit(one_gpu(), new_task_key("root"))
        Store(root, layout).matrix.release(first.task_key, stopped_on=list(HOSTS))
        listed: list[str] = []
        real = thread.client.get_children

        def counting(path: str, *args: object, **kwargs: object) -> object:
            listed.append(path)
            return real(path, *args, **kwargs)

        thread.client.get_children = counting  # type: ignore[method-assign]
        junk = [f"2026112208500{i:02d}{'x' * LONG}.bob" for i in range(50)]
        assert flood(bob, layout.user_leases("bob"), junk, ephemeral=True) == 50
        grant = Store(root, layout).queue.submit(one_gpu(), new_task_key("root"))
        assert grant.task_key in thread.admitter.leases.leases()
        assert not any(stamp.startswith("2026112208500")
                       for stamp in thread.admitter.leases.leases())
        Store(root, layout).matrix.release(grant.task_key, stopped_on=list(HOSTS))
        wait_for(lambda: grant.task_key not in thread.admitter.leases.leases(), 5,
                 "the released lease gone from the keeper's set")
        assert not [path for path in listed if path.startswith(layout.leases)], listed
    finally:
        store.close(root)
