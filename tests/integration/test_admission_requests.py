"""Fewer ZooKeeper requests and round trips per admission cycle (issue 55 item 1), against
a real ZooKeeper: the waiter's watch set with enqueue's transaction, the release told of
the grant's deletion by the watch the launcher's grant read set, the keeper's reads of new
records sent ahead of its read of the matrix, and one persistent watch on the matrix
instead of a read per change. Each keeps what it replaced: the grant is what a launcher
starts on, a change the keeper missed is read again, a watch that did not see the deletion
asks ZooKeeper."""

from __future__ import annotations

import socket
import threading
import time

from hypertf import store
from hypertf.core.matrix import FREE, Matrix
from hypertf.core.placement import new_task_key
from hypertf.keeper.reader import QueueReader
from hypertf.store import Store
from hypertf.store.matrixshards import MatrixWatch
from tests.conftest import wait_for
from tests.integration.zkspy import HOSTS, one_gpu, spy


def test_a_cycle_sets_no_watch_of_its_own(zk, layout, fake_agents, keeper):
    """The waiter's watch comes with enqueue's transaction and the release's with the
    grant's read: neither the record nor the grant is asked about with ``exists``; the
    release still returns once the keeper freed the GPU."""
    fake_agents({"n1": 1, "n2": 1})
    keeper()
    launcher = Store(zk, layout)
    asked = spy(zk, "exists")
    for _ in range(3):
        key = new_task_key("root")
        grant = launcher.queue.submit(one_gpu(), key)
        assert grant.placements[0].host in HOSTS
        assert launcher.matrix.release(key) is True
        matrix, _ = launcher.matrix.read()
        assert key not in matrix.task_keys()  # settled when release returned
        assert layout.job(key) not in asked and layout.grant(key) not in asked
    matrix, _ = launcher.matrix.read()
    assert all(cell == FREE for row in matrix.gpus.values() for cell in row)


def test_a_grant_watch_that_saw_no_deletion_asks_zookeeper(zk, layout):
    """A grant changed (never by the keeper; by hand) consumes the watch without a
    deletion: the release then asks ZooKeeper and waits for the deletion itself."""
    launcher = Store(zk, layout)
    key = new_task_key("root")
    path = layout.grant(key)
    zk.ensure_path(layout.grants)
    zk.create(path, b"{}")
    zk.get(path, watch=launcher.matrix.watch_grant(key))
    zk.set(path, b"{ }")  # fires the watch: changed, not deleted
    assert launcher.matrix._grant_dropped(key, 0.3) is False  # asked: it is still there
    zk.get(path, watch=launcher.matrix.watch_grant(key))
    threading.Timer(0.2, lambda: zk.delete(path)).start()
    assert launcher.matrix._grant_dropped(key, 5.0) is True


def test_a_record_changed_after_its_prefetch_is_read_again(zk, layout):
    """The keeper reads new records ahead of its pass (prefetch); one changed before the
    pass took the answer is read again, one that did not change is not."""
    user = Store(zk, layout)
    reader = QueueReader(user)
    first = new_task_key("root")
    user.queue.enqueue(first, one_gpu(), {})
    assert [w.task_key for w in reader.waiting()] == [first]  # the first, whole read
    second, third = new_task_key("root"), new_task_key("root")
    user.queue.enqueue(second, one_gpu(), {})
    user.queue.enqueue(third, one_gpu(), {})
    reader.prefetch(user.leases())
    assert set(reader._prefetched) == {second, third}
    reader._prefetched[second].get(timeout=5)
    user.queue.set_held(second, True)
    wait_for(lambda: second in reader._dirty, 5, "the watch the prefetch set to fire")
    reads = spy(zk, "get_async")
    waiting = {w.task_key: w for w in reader.waiting(user.leases())}
    assert set(waiting) == {first, second, third}
    assert waiting[second].held and not waiting[third].held
    assert reads == [layout.job(second)]  # the third's prefetched answer is used as it is


def test_the_matrix_watch_wakes_without_a_read_and_ends(zk, layout, fake_agents):
    """One persistent watch: a write of a shard wakes the keeper with no read of it (a
    DataWatch read it again); it ends when the wake says the keeper's term is over."""
    fake_agents({"n1": 2})
    admin = Store(zk, layout)
    woken = threading.Event()
    term = {"on": True}

    def wake(*_: object) -> bool:
        woken.set()
        return term["on"]

    reads = spy(zk, "get")
    watch = MatrixWatch(admin, wake)
    assert watch.start()
    admin.matrix.overwrite(Matrix(gpus={"n1": [new_task_key("root"), FREE]}))
    assert woken.wait(5)
    woken.clear()
    term["on"] = False
    admin.matrix.overwrite(Matrix(gpus={"n1": [FREE, FREE]}))
    assert woken.wait(5)
    wait_for(lambda: watch.ended, 5, "the watch to end")
    assert not [p for p in reads if p.startswith(layout.matrix + "/")]
    woken.clear()
    admin.matrix.overwrite(Matrix(gpus={"n1": [new_task_key("root"), FREE]}))
    time.sleep(0.3)
    assert not woken.is_set()


def test_watch_matrix_wakes_on_each_change(zk, layout, fake_agents):
    fake_agents({"n1": 1})
    admin = Store(zk, layout)
    woken: list[int] = []
    admin.matrix.watch(lambda *_: woken.append(1) or True)
    for cell in (new_task_key("root"), FREE):
        count = len(woken)
        admin.matrix.overwrite(Matrix(gpus={"n1": [cell]}))
        wait_for(lambda n=count: len(woken) > n, 5, "a wake")


def test_the_matrix_watch_is_set_again_after_a_reconnect(secured, zk, layout, fake_agents):
    """A persistent watch goes with the connection: after a blip it is set again (and the
    keeper told to look, since a change meanwhile went unnamed)."""
    fake_agents({"n1": 1})
    keeper_client = store.connect(secured, identity="admin")
    try:
        woken = threading.Event()
        watch = MatrixWatch(Store(keeper_client, layout), lambda *_: woken.set() or True)
        assert watch.start()
        states: list[str] = []
        keeper_client.add_listener(states.append)
        keeper_client._connection._socket.shutdown(socket.SHUT_RDWR)  # the server stays
        wait_for(lambda: keeper_client.connected and "SUSPENDED" in states, 20, "a reconnect")
        assert woken.wait(5)  # the watch set again, then told to look again
        woken.clear()
        Store(zk, layout).matrix.overwrite(Matrix(gpus={"n1": [new_task_key("root")]}))
        assert woken.wait(5)
    finally:
        store.close(keeper_client)
