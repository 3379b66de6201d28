"""What hypertf.store.zkclient takes from inside kazoo, pinned (issue 39 item 16).

``PatientClient`` batches requests by re-implementing kazoo's private ``KazooClient._call``
(its queue of ``(request, async_object)`` pairs and the one byte per request that wakes
the connection thread through ``_connection._write_sock``), and ``MultiRead`` speaks
ZooKeeper's multi-read with kazoo's serialization helpers. None of that is kazoo's public
API: a 2.x release may rename or reshape it and our code would break silently (requests
queued and never sent). These tests fail loudly, naming the member, when that happens, and
check on a real ZooKeeper that kazoo's closed-socket check still answers a closed client at
once (our batching hands such a call to kazoo's own ``_call``).
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import socket
import threading
import time
from importlib.metadata import version

import pytest
from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import EXCEPTIONS, ConnectionClosedError, NoNodeError
from kazoo.protocol import connection, serialization
from kazoo.protocol.states import KeeperState

from hypertf import store
from hypertf.config.settings import ClusterSettings
from hypertf.store import zkclient

# The kazoo releases whose private members below were read against zkclient.py. A new one:
# read kazoo's KazooClient._call, ConnectionHandler (its socket pair) and serialization.py
# again, run these tests, then add it here.
CHECKED_KAZOO = ("2.11.0",)


def test_kazoo_is_a_release_zkclient_was_checked_against() -> None:
    assert version("kazoo") in CHECKED_KAZOO, (
        f"kazoo {version('kazoo')} is installed; hypertf/store/zkclient.py reaches into kazoo "
        f"{' and '.join(CHECKED_KAZOO)} (KazooClient._call, _queue, _state, _stopped, "
        f"_session_id, _connection._write_sock, kazoo.protocol.serialization): check them "
        f"against this release, then add it to CHECKED_KAZOO")


def test_kazoos_call_still_queues_a_pair_and_wakes_the_connection_with_a_byte() -> None:
    """zkclient's _call does kazoo's work for a batch: the same queue entry, the same wake-up
    (one byte per request, read one at a time by the connection thread), and for a client
    that cannot send, kazoo's own checks (closed state, closed socket)."""
    assert list(inspect.signature(KazooClient._call).parameters) == [
        "self", "request", "async_object"]
    source = inspect.getsource(KazooClient._call)
    for piece in ("self._queue.append((request, async_object))",
                  "write_sock = self._connection._write_sock",
                  "if write_sock is None:", 'write_sock.send(b"\\0")',
                  "KeeperState.AUTH_FAILED", "KeeperState.CLOSED",
                  "KeeperState.EXPIRED_SESSION", "ConnectionClosedError"):
        assert piece in source, f"kazoo's KazooClient._call no longer has {piece!r}"
    reader = inspect.getsource(connection.ConnectionHandler)
    assert "self._read_sock.recv(1)" in reader, "kazoo's connection thread no longer reads " \
        "one wake-up byte per request: PatientClient.pipelined's N bytes would be wrong"


def test_the_client_attributes_zkclient_reads_are_there() -> None:
    client = KazooClient(hosts="127.0.0.1:1")  # never started: no network
    assert isinstance(client._queue, collections.deque)
    assert client._state == KeeperState.CLOSED
    assert isinstance(client._stopped, threading.Event)
    assert hasattr(client, "_session_id")
    assert hasattr(client._connection, "_write_sock")
    assert client._connection._write_sock is None  # not started: kazoo's check's case
    for name in ("committed", "commit_async"):
        assert hasattr(TransactionRequest(client), name), f"TransactionRequest.{name}"


def test_the_serialization_helpers_of_the_multi_read_keep_their_shapes() -> None:
    """MultiRead writes and parses the wire format with these; a change of field or struct
    would misread every answer."""
    assert serialization.MultiHeader._fields == ("type", "done", "err")
    assert serialization.GetData._fields == ("path", "watcher")
    assert serialization.GetData.type == 4
    assert serialization.multiheader_struct.format == "!iBi"
    assert serialization.int_struct.format == "!i"
    assert serialization.stat_struct.size == 68
    data = serialization.int_struct.pack(3) + b"abc"
    assert serialization.read_buffer(data, 0) == (b"abc", 7)
    assert EXCEPTIONS[-101] is NoNodeError


@pytest.fixture
def patient(secured: ClusterSettings) -> zkclient.PatientClient:
    client = store.connect(secured, identity="admin")
    assert isinstance(client, zkclient.PatientClient)
    return client


def test_a_batch_on_a_real_zookeeper_is_sent_and_answered(
        patient: zkclient.PatientClient, secured: ClusterSettings) -> None:
    try:
        paths = [f"{secured.zk_root}/pin-{i}" for i in range(5)]
        for i, path in enumerate(paths):
            patient.create(path, str(i).encode())
        with zkclient.pipelined(patient):
            pending = [patient.get_async(path) for path in paths]
            assert len(patient._queue) >= len(pending)  # queued, not yet woken
        assert [r.get(timeout=10)[0] for r in pending] == [b"0", b"1", b"2", b"3", b"4"]
        got = zkclient.get_many(patient, [*paths, f"{secured.zk_root}/none"], timeout=10)
        assert [value for value, _ in got[:5]] == [b"0", b"1", b"2", b"3", b"4"]
        assert isinstance(got[5], NoNodeError)
    finally:
        store.close(patient)


def test_a_closed_client_is_answered_at_once_by_kazoos_check(
        patient: zkclient.PatientClient, secured: ClusterSettings) -> None:
    """Closed before a call, batched or not: ConnectionClosedError now, not a timeout."""
    store.close(patient)
    for batched in (False, True):
        started = time.monotonic()
        with zkclient.pipelined(patient) if batched else contextlib.nullcontext():
            result = patient.get_async(secured.zk_root)
        with pytest.raises(ConnectionClosedError):
            result.get(timeout=5)
        assert time.monotonic() - started < 1.0


def test_kazoos_closed_socket_check_answers_a_call_racing_close() -> None:
    """The race kazoo guards against: a client still CONNECTED whose wake-up socket is
    already gone. kazoo's _call answers it at once; PatientClient outside a batch goes
    through it."""
    client = zkclient.PatientClient(hosts="127.0.0.1:1")
    client._state = KeeperState.CONNECTED  # as between close()'s socket teardown and state
    client._connection._write_sock = None
    result = client.handler.async_result()
    client._call(object(), result)
    with pytest.raises(ConnectionClosedError):
        result.get(timeout=1)
    closed_a, closed_b = socket.socketpair()
    closed_a.close()
    closed_b.close()
    client._connection._write_sock = closed_a  # closed: send() raises
    result = client.handler.async_result()
    client._call(object(), result)
    with pytest.raises(ConnectionClosedError):
        result.get(timeout=1)

