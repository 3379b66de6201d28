"""Bounded per-user folders (docs/zookeeper-layout.md, "Bounds"), tried as the thief would:
bob's own valid credential and a raw kazoo client (and a raw socket), against a real
ZooKeeper started as HyperTF starts it (hypertf.ops.zkserver: ``zookeeper.enforceQuota``,
HyperTF's provider) and the real keeper pass.

The server refuses bob's names over 255 characters and his creates past the quota
``auth init`` set on his folders, his requests in flight counted (one multi, pipelined);
his data stays within one request of its bound; a reader that never reads its answers is
cut off; floods of the longest names, most znodes and most data he may make (one user,
then three at once) leave ZooKeeper answering ``ruok`` 5 s and 15 s after, root's status
read and her job admitted within 10 s, with the server's peak heap beside the bound the
docs compute; names that are not task keys reach no reader.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError, QuotaExceededError
from kazoo.protocol.serialization import Auth, Connect, GetChildren, int_struct
from kazoo.protocol.states import WatchedEvent
from kazoo.security import OPEN_ACL_UNSAFE

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.config.settings import ClusterSettings
from hypertf.core.errors import StoreError
from hypertf.core.layout import is_task_key
from hypertf.core.placement import PortRanges, Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.keeper.queueview import collect
from hypertf.ops.zkbounds import NAME_MAX
from hypertf.ops.zkserver import ZooKeeperServer
from hypertf.store import Layout, Store, encode, status
from hypertf.store.credentials import Credential
from hypertf.store.fourletter import four_letter
from hypertf.store.quotas import QUOTA_ROOT, UserQuotas, folder_use
from hypertf.store.waitqueue import request_to_json
from tests.conftest import wait_for

HOSTS = {"n1": 2, "n2": 2}
QUEUE, RECORDS, RECORDS_MB = 4, 10, 1  # small settings: the quotas below follow from them
QUOTAS = UserQuotas.of(QUEUE, RECORDS, RECORDS_MB)
LONG = 100_000  # the finding's 100 KB names (refused now)
HEAP_MB = 512


@pytest.fixture(scope="module")
def zk_server(state_home, request: pytest.FixtureRequest) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of this module's own (the conftest's, overridden): the floods below are
    the attack, and if one took its server down, no other module's test may go with it."""
    from hypertf.ops.zkserver import free_port

    server = ZooKeeperServer("127.0.0.1", free_port(), state_home / "zookeeper-bounds")
    # 512 MB, not the conftest's 256: every reader of bob's folder (he too, for as long
    # as he likes) is sent all of its names; the role's heap is 2g for this (docs: Bounds)
    server.start(heap=f"{HEAP_MB}m", tick_ms=500)
    yield server
    if request.session.testsfailed:
        print("\n--- ZooKeeper log (last lines) ---\n"
              + "\n".join(server.logfile.read_text(errors="replace").splitlines()[-30:]))
    server.stop()


@pytest.fixture
def bounded(secured: ClusterSettings) -> ClusterSettings:
    return dataclasses.replace(secured, user_queue_limit=QUEUE, job_records_max=RECORDS,
                               user_records_mb=RECORDS_MB)


@pytest.fixture
def bob(bounded: ClusterSettings, fake_agents) -> Iterator[KazooClient]:
    """bob (the thief: a registered user) with his own client; root registered too; two
    hosts of 2 GPUs with (fake) agents."""
    fake_agents(HOSTS)  # registers the hosts with the default settings' quotas: first
    store.secure_cluster(bounded, list(HOSTS), users=["bob", "root", *THIEVES])
    client = store.connect(bounded, identity="user.bob")
    yield client
    store.close(client)


def write_inventory(directory: Path, bounded: ClusterSettings) -> Path:
    """An inventory of HOSTS on the test's ZooKeeper root (for ``status``)."""
    path = directory / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": bounded.zookeeper_hosts,
                 "hypertf_zk_root": bounded.zk_root, "hypertf_zk_session_timeout": 2},
        "children": {"gpu_nodes": {"hosts": {h: {"ansible_connection": "local"}
                                             for h in HOSTS}}}}}))
    return path


def one_gpu() -> Request:
    return Request((TaskSlot("worker", 0, 1),), tuple(HOSTS),
                   port_ranges=PortRanges(tuple(HOSTS), (20000, 20999)))


THIEVES = ("carol", "dave")  # two more users, for three floods at once


def flood(client: KazooClient, parent: str, names: list[str], ephemeral: bool,
          data: bytes = b"") -> int:
    """Create every name, one after the other; how many the server took. Every refusal
    must be the bound's: HyperTF's provider (NoAuth) or ZooKeeper's quota."""
    made = 0
    acl = store.acls(client).job()  # a leaf's (kazoo's default, world-writable, is refused)
    for name in names:
        try:
            client.create(f"{parent}/{name}", data, acl=acl, ephemeral=ephemeral)
            made += 1
        except (NoAuthError, QuotaExceededError):
            pass
    return made


def pipelined(client: KazooClient, calls: list[Callable[[], object]]) -> int:
    """Send every call at once (kazoo's async calls), then count those the server did."""
    pending = [call() for call in calls]
    done = 0
    for result in pending:
        try:
            result.get(timeout=60)  # type: ignore[attr-defined]
            done += 1
        except (NoAuthError, QuotaExceededError):
            pass
    return done


def name_of(i: int, user: str = "bob") -> str:
    """A junk name of exactly NAME_MAX characters, the longest the server takes."""
    head = f"{i:07d}"
    return head + "x" * (NAME_MAX - len(head) - len(user) - 1) + "." + user


def test_bobs_raw_client_cannot_pass_the_quota_of_his_folders(bob, zk, bounded):
    layout = Layout(bounded.zk_root)
    leases, jobs = layout.user_leases("bob"), layout.user_jobs("bob")
    # the quota counts the folder itself: count - 1 children
    assert flood(bob, leases, [f"x{i}" for i in range(QUOTAS.leases.count + 20)],
                 ephemeral=True) == QUOTAS.leases.count - 1
    assert flood(bob, jobs, [f"x{i}" for i in range(QUOTAS.jobs.count + 20)],
                 ephemeral=False) == QUOTAS.jobs.count - 1
    with pytest.raises(NoAuthError):  # HyperTF's provider, before ZooKeeper's own check
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
    with pytest.raises((NoAuthError, QuotaExceededError)):
        bob.create(f"{leases}/20261122-085000-a1b2c3.bob",
                   b"x" * (QUOTAS.leases.data_bytes + 1), ephemeral=True)
    # the admin's own folders have none: root's are untouched by bob's
    assert zk.exists(f"{QUOTA_ROOT}{layout.user_leases('root')}/zookeeper_limits")


def test_no_name_longer_than_the_bound_and_no_folder_below_his_records(bob, zk, bounded):
    """Names: 255 characters are taken, 256 (or the finding's 100 KB) refused, wherever a
    credential may create. And bob's records stay leaves: a record whose ACL lets him (or
    the world) create below it, or change its ACL, is refused."""
    layout = Layout(bounded.zk_root)
    jobs = layout.user_jobs("bob")
    bob.create(f"{jobs}/{'a' * NAME_MAX}", b"", acl=store.acls(bob).job())
    for length in (NAME_MAX + 1, LONG):
        with pytest.raises(NoAuthError):
            bob.create(f"{jobs}/{'b' * length}", b"", acl=store.acls(bob).job())
    with pytest.raises(NoAuthError):  # the admin too: no name HyperTF makes is that long
        zk.create(f"{layout.root}/{'c' * (NAME_MAX + 1)}", b"")
    acls = store.acls(bob)
    mine = acls.job()
    for extra in (ACL_CREATE_BOB(acls), OPEN_ACL_UNSAFE[0]):
        with pytest.raises(NoAuthError):
            bob.create(f"{jobs}/20261122-085000-a1b2c4.bob", b"{}", acl=[*mine, extra])
    bob.create(f"{jobs}/20261122-085000-a1b2c4.bob", b"{}", acl=mine)


def ACL_CREATE_BOB(acls: store.Acls):
    from kazoo.security import ACL, Id, Permissions
    return ACL(Permissions.CREATE | Permissions.READ, Id("digest", acls.credential.digest_id))


def test_one_multi_or_pipelined_creates_cannot_pass_the_quota(bob, bounded):
    """ZooKeeper checks a quota against the committed tree: one multi of 2,000 creates put
    all of them in, pipelined ones overshot by hundreds. The provider counts what is in
    flight: not one znode past the count quota, data within one request of its bound."""
    layout = Layout(bounded.zk_root)
    leases, jobs = layout.user_leases("bob"), layout.user_jobs("bob")
    acl = store.acls(bob).job()
    tx = bob.transaction()
    for i in range(2000):
        tx.create(f"{leases}/m{i}", b"", acl=acl, ephemeral=True)
    results = tx.commit()
    assert isinstance(results[-1], Exception) and not bob.get_children(leases)
    txs = []  # three multis at once, each one quota large
    for batch in range(3):
        tx = bob.transaction()
        for i in range(QUOTAS.leases.count):
            tx.create(f"{leases}/b{batch}-{i}", b"", acl=acl, ephemeral=True)
        txs.append(tx.commit_async())
    made = sum(1 for t in txs if not isinstance(t.get(timeout=30)[-1], Exception))
    assert made == 0 and not bob.get_children(leases)  # each one over by itself
    count = QUOTAS.jobs.count + 2000
    took = pipelined(bob, [lambda i=i: bob.create_async(f"{jobs}/p{i}", b"", acl=acl)
                           for i in range(count)])
    assert took == QUOTAS.jobs.count - 1 == len(bob.get_children(jobs))
    use = folder_use(bob, jobs)
    assert use is not None and use.count == QUOTAS.jobs.count
    # data: pipelined writes of 64 KiB to every record stop within one request of the
    # user's bound (the soft limit; the hard one above it is the keeper's room)
    chunk = 64 << 10
    pipelined(bob, [lambda i=i: bob.set_async(f"{jobs}/p{i}", b"d" * chunk)
                    for i in range(QUOTAS.jobs.count - 1)])
    use = folder_use(bob, jobs)
    assert use is not None
    print(f"\ncount {use.count} of {QUOTAS.jobs.count}; data {use.data_bytes:,} bytes, "
          f"bound {QUOTAS.jobs.user_bytes:,} + one request")
    assert QUOTAS.jobs.user_bytes - chunk < use.data_bytes <= QUOTAS.jobs.user_bytes + chunk


def test_a_reader_that_never_reads_its_answers_is_cut_off(bob, bounded, zk_server):
    """ZooKeeper queues answers without a bound: 2,500 listings of a 3 MB folder sent and
    never read took a 512 MB server down. The provider disconnects that client once 32 MiB
    wait for it; the server serves on."""
    layout = Layout(bounded.zk_root)
    jobs = layout.user_jobs("bob")
    acl = store.acls(bob).job()
    pipelined(bob, [lambda i=i: bob.create_async(f"{jobs}/{name_of(i)}", b"", acl=acl)
                    for i in range(QUOTAS.jobs.count - 1)])
    assert slow_reader(zk_server, store.credential_of(bob), jobs, 3000)
    assert four_letter(zk_server.address, zk_server.port, "ruok") == "imok"
    assert bob.get_children(jobs)  # bob's own session lives on


def slow_reader(server: ZooKeeperServer, credential: Credential, path: str,
                requests: int) -> bool:
    """A raw client that authenticates with ``credential`` and sends ``requests`` listings
    of ``path`` without reading an answer; then reads: True when the server had cut it off
    (what it had sent, then the end of the stream, within 30 s)."""
    sock = socket.create_connection((server.address, server.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

    def send(request: object, xid: int | None) -> None:
        body = bytearray()
        if xid is not None:
            body += int_struct.pack(xid) + int_struct.pack(request.type)  # type: ignore
        body += request.serialize()  # type: ignore[attr-defined]
        sock.sendall(int_struct.pack(len(body)) + body)

    try:
        send(Connect(0, 0, 10000, 0, b"\x00" * 16, False), None)
        time.sleep(0.3)
        for scheme, auth in credential.auth_data():
            send(Auth(0, scheme, auth), -4)
        sock.settimeout(10)
        for xid in range(1, requests + 1):
            send(GetChildren(path, False), xid)
        time.sleep(2)  # the server's queue for it fills
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not sock.recv(1 << 20):
                return True
        return False
    except OSError:
        return True  # reset: cut off
    finally:
        sock.close()


class HeapWatch:
    """The server's heap in use, polled (``jcmd GC.heap_info``) in a thread: its peak."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_mb = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def used_mb(self) -> float:
        out = subprocess.run(["jcmd", str(self.pid), "GC.heap_info"], capture_output=True,
                             text=True, check=False).stdout
        found = re.search(r"used (\d+)K", out)
        return int(found.group(1)) / 1024 if found else 0.0

    def __enter__(self) -> HeapWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak_mb = max(self.peak_mb, self.used_mb())


def worst_flood(client: KazooClient, layout: Layout, user: str) -> None:
    """Everything ``user`` may make the server hold, as fast as he can: the longest names,
    as many as the quotas let, in both folders (pipelined), the data bound of his records
    filled, and a reader that never reads."""
    leases, jobs = layout.user_leases(user), layout.user_jobs(user)
    acl = store.acls(client).job()
    pipelined(client, [lambda i=i: client.create_async(f"{leases}/{name_of(i, user)}", b"l",
                                                       acl=acl, ephemeral=True)
                       for i in range(QUOTAS.leases.count + 100)])
    pipelined(client, [lambda i=i: client.create_async(f"{jobs}/{name_of(i, user)}", b"",
                                                       acl=acl)
                       for i in range(QUOTAS.jobs.count + 100)])
    chunk = 256 << 10
    pipelined(client, [lambda i=i: client.set_async(f"{jobs}/{name_of(i, user)}",
                                                    b"d" * chunk)
                       for i in range(QUOTAS.jobs.user_bytes // chunk + 20)])
    with contextlib.suppress(KazooException):
        for _ in range(4):
            client.get_children(jobs)


def test_the_worst_floods_leave_zookeeper_serving_and_roots_job_admitted(
        bob, zk, bounded, keeper, zk_server: ZooKeeperServer, tmp_path):
    """The measure of docs/zookeeper-layout.md ("Bounds"): bob's worst, then three users'
    at once. ZooKeeper answers ruok 5 s and 15 s after, root's status reads and her
    1-GPU job is admitted within 10 s; the peak heap stays within the bound computed
    from the same arithmetic the role sizes its heap with."""
    layout = Layout(bounded.zk_root)
    thread = keeper(bounded, user_queue_limit=QUEUE)
    root = store.connect(bounded, identity="user.root")
    thieves = [bob, *(store.connect(bounded, identity=f"user.{u}") for u in THIEVES)]
    inventory = write_inventory(tmp_path, bounded)
    pid = zk_server.pid()
    assert pid is not None
    try:
        for users in ([("bob", bob)], list(zip(("bob", *THIEVES), thieves, strict=True))):
            watch = HeapWatch(pid)
            base = watch.used_mb()
            with watch:
                started = time.monotonic()
                floods = [threading.Thread(target=worst_flood, args=(c, layout, u))
                          for u, c in users]
                for t in floods:
                    t.start()
                for t in floods:
                    t.join()
                flooded = time.monotonic()
                cut = slow_reader(zk_server, store.credential_of(users[0][1]),
                                  layout.user_jobs(users[0][0]), 3000)
                began = time.monotonic()
                grant = Store(root, layout).queue.submit(one_gpu(), new_task_key("root"))
                admitted = time.monotonic() - began
                view = status.collect(zk, load_inventory(inventory))
                Store(root, layout).matrix.release(grant.task_key, stopped_on=list(HOSTS))
                answers = []
                for after in (5, 15):
                    time.sleep(max(0.0, flooded + after - time.monotonic()))
                    answers.append(four_letter(zk_server.address, zk_server.port, "ruok"))
            bound_mb = base + len(users) * QUOTAS.worst_heap() / 2**20
            print(f"\n{len(users)} user(s): flood {flooded - started:.1f} s, slow reader "
                  f"cut off: {cut}; root's job admitted in {admitted:.2f} s; "
                  f"ruok at 5/15 s: {answers}; heap {base:.0f} MB before, peak "
                  f"{watch.peak_mb:.0f} MB, bound {bound_mb:.0f} MB "
                  f"({QUOTAS.worst_heap() / 2**20:.1f} MB a user)")
            assert answers == ["imok", "imok"] and cut
            assert admitted < 10.0
            assert view["jobs"] is not None
            assert thread.role.stopped is False
            assert watch.peak_mb < HEAP_MB * 0.8  # in use, garbage included: the bound is live
            for user, _ in users:
                for folder in (layout.user_leases(user), layout.user_jobs(user)):
                    use = folder_use(zk, folder)
                    assert use is not None and use.count <= (
                        QUOTAS.leases.count if "leases" in folder else QUOTAS.jobs.count)
    finally:
        store.close(root)
        for client in thieves[1:]:
            store.close(client)


def test_a_server_of_its_own_takes_no_create_from_the_world(bounded, zk_server, zk):
    """ZooKeeper's ``/`` and ``/zookeeper/quota`` are world-writable, and a create the
    world may make never reaches the provider: on a server that is the cluster's own
    ``auth init`` makes both the admin's (anyone still reads)."""
    store.secure_cluster(bounded, [], own_server=True)
    anonymous = KazooClient(zk_server.hosts)
    anonymous.start()
    try:
        for parent in ("", QUOTA_ROOT):
            with pytest.raises(NoAuthError):
                anonymous.create(f"{parent}/{'x' * 200}", b"")
        assert anonymous.get_children("/")
    finally:
        anonymous.stop()
        anonymous.close()
        zk.set_acls("/", OPEN_ACL_UNSAFE)  # other tests' roots on this server
        zk.set_acls(QUOTA_ROOT, OPEN_ACL_UNSAFE)


def test_names_that_are_not_task_keys_reach_no_reader(bob, zk, bounded, tmp_path):
    """Junk in bob's folders (a 255-character name, a name without an owner, another user's key,
    an empty stamp, a 200-character stamp, a space) is skipped by every listing: the
    keeper's, ``hypertf queue``'s, ``status``'s, ``hypertf jobs``'s. bob's one real
    request still shows."""
    layout = Layout(bounded.zk_root)
    acls = store.acls(bob)
    real = "20261122-085000-a1b2c3.bob"
    junk = [f"{'x' * (NAME_MAX - 4)}.bob", "no-owner", "20261122-085000-a1b2c3.root", ".bob",
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
    path = write_inventory(tmp_path, bounded)
    view = status.collect(zk, load_inventory(path))
    assert view["jobs"] == [real]
    assert len(str(view)) < 20 * NAME_MAX


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
        junk = [f"2026112208500{i:02d}{'x' * (NAME_MAX - 20)}.bob" for i in range(50)]
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


def test_a_job_refused_for_a_full_folder_says_which_and_what_to_do(bob, bounded):
    """bob's leases folder at its quota (his own junk): his next job is refused naming the
    folder, the count, and what to do, not a raw ZooKeeper error."""
    layout = Layout(bounded.zk_root)
    flood(bob, layout.user_leases("bob"), [f"x{i}" for i in range(QUOTAS.leases.count)],
          ephemeral=True)
    with pytest.raises(StoreError, match=r"bob's waiting and running jobs are at their quota "
                                         r"in ZooKeeper \(260 of 260 znodes.*hypertf kill"):
        Store(bob, layout).queue.submit(one_gpu(), new_task_key("bob"))
