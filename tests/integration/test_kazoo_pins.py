"""What HyperTF takes from inside kazoo, pinned (issue 39 item 16, issue 49 item 4).

Every touch of a kazoo private member goes through ``hypertf.store.kazooprivate.
KazooPrivate``, whose ``NAMES`` lists them: ``PatientClient`` batches requests by diverting
kazoo's private ``KazooClient._call`` (its queue of ``(request, async_object)`` pairs and
the one byte per request that wakes the connection thread through
``_connection._write_sock``), ``watch_tree`` taps ``ConnectionHandler._read_watch_event``
for a persistent watch's events, and ``MultiRead`` speaks ZooKeeper's multi-read with
kazoo's serialization helpers. None of that is kazoo's public API: a 2.x release may rename
or reshape it and our code would break silently (requests queued and never sent, watch
events lost). These tests fail loudly, naming the member, when that happens; check that no
other module of hypertf reaches inside kazoo; and check on a real ZooKeeper that kazoo's
closed-socket check still answers a closed client at once (our batching hands such a call
to kazoo's own ``_call``) and that a tapped watch event still reaches kazoo's watchers.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import socket
import threading
import time
from importlib.metadata import version
from pathlib import Path

import pytest
from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import EXCEPTIONS, ConnectionClosedError, NoNodeError
from kazoo.protocol import connection, serialization
from kazoo.protocol.connection import CHANGED_EVENT, CREATED_EVENT
from kazoo.protocol.states import KeeperState

import hypertf
from hypertf import store
from hypertf.config.settings import ClusterSettings
from hypertf.store import kazooprivate, zkclient
from hypertf.store.kazooprivate import KazooPrivate
from tests.conftest import wait_for

# The kazoo releases whose private members (KazooPrivate.NAMES) were read against
# kazooprivate.py and zkclient.py. A new one: read kazoo's KazooClient._call,
# ConnectionHandler (its socket pair, _read_watch_event) and serialization.py again, run
# these tests, then add it here.
CHECKED_KAZOO = ("2.11.0",)


def named(pin: kazooprivate.PrivateName) -> str:
    return f"{pin.owner.__name__}.{pin.name}"


def test_kazoo_is_a_release_kazooprivate_was_checked_against() -> None:
    assert version("kazoo") in CHECKED_KAZOO, (
        f"kazoo {version('kazoo')} is installed; hypertf/store/kazooprivate.py reaches into "
        f"kazoo {' and '.join(CHECKED_KAZOO)} "
        f"({', '.join(named(pin) for pin in KazooPrivate.NAMES)}, and "
        f"kazoo.protocol.serialization): check them against this release, then add it to "
        f"CHECKED_KAZOO")


@pytest.mark.parametrize("pin", KazooPrivate.NAMES, ids=named)
def test_every_private_name_kazooprivate_touches_is_there_as_it_expects(
        pin: kazooprivate.PrivateName) -> None:
    """Each entry of KazooPrivate.NAMES: a method of that signature, or an attribute that a
    client built but never started holds with a value of that type."""
    assert pin.name.startswith("_") and pin.use, named(pin)
    if pin.is_method:
        member = getattr(pin.owner, pin.name, None)
        assert inspect.isfunction(member), f"kazoo's {named(pin)} is no longer a method"
        assert tuple(inspect.signature(member).parameters) == pin.parameters, (
            f"kazoo's {named(pin)}{inspect.signature(member)} is not "
            f"({', '.join(pin.parameters or ())})")
        return
    client = KazooClient(hosts="127.0.0.1:1")  # never started: no network
    owner = {KazooClient: client, connection.ConnectionHandler: client._connection}[pin.owner]
    assert hasattr(owner, pin.name), f"kazoo's {named(pin)} is gone"
    value = getattr(owner, pin.name)
    assert isinstance(value, pin.types), (
        f"kazoo's {named(pin)} is a {type(value).__name__}, not one of "
        f"{[t.__name__ for t in pin.types]}")


def test_kazoo_reads_watch_events_through_the_member_kazooprivate_replaces() -> None:
    """The tap replaces _read_watch_event on the connection handler's instance: kazoo's
    reader must call it through ``self`` (an instance attribute wins), with a buffer and an
    offset, and read the event's type and path with serialization.Watch."""
    reader = inspect.getsource(connection.ConnectionHandler)
    assert "self._read_watch_event(buffer, offset)" in reader
    assert serialization.Watch._fields == ("type", "state", "path")


def kazoos_private_names() -> set[str]:
    """Every single-underscore name of kazoo's client, its connection handler, its threading
    handler and its transaction, as classes and on a client never started."""
    client = KazooClient(hosts="127.0.0.1:1")
    names: set[str] = set()
    for thing in (KazooClient, client, connection.ConnectionHandler, client._connection,
                  type(client.handler), client.handler, TransactionRequest,
                  TransactionRequest(client)):
        names |= {n for n in dir(thing) if n.startswith("_") and not n.startswith("__")}
    return names


KAZOO_SUBCLASSES = {"KazooClient", "PatientClient", "TransactionRequest"}


def test_nothing_but_kazooprivate_reaches_inside_kazoo() -> None:
    """No module of hypertf but kazooprivate.py reads, writes, calls or overrides a private
    member of kazoo's: not on another object (``client._call``), not on ``self`` in a
    subclass of kazoo's classes."""
    private = kazoos_private_names()
    fence = Path(kazooprivate.__file__).resolve()
    found = []
    for path in sorted(Path(hypertf.__file__).parent.rglob("*.py")):
        if path.resolve() == fence:
            continue
        tree = ast.parse(path.read_text(), str(path))
        inside_kazoo: set[int] = set()  # the ids of nodes inside a subclass of kazoo's
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef) and {ast.unparse(b).rpartition(".")[2]
                                                  for b in cls.bases} & KAZOO_SUBCLASSES:
                inside_kazoo |= {id(node) for node in ast.walk(cls)}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in private \
                    and id(node) in inside_kazoo:  # an override of kazoo's
                found.append(f"{path.name}:{node.lineno}: def {node.name}")
            if not isinstance(node, ast.Attribute) or node.attr not in private:
                continue
            on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
            if not on_self or id(node) in inside_kazoo:
                found.append(f"{path.relative_to(Path(hypertf.__file__).parent.parent)}:"
                             f"{node.lineno}: {ast.unparse(node)}")
    assert not found, f"kazoo's private members reached outside KazooPrivate: {found}"


def test_patient_clients_own_private_names_are_not_kazoos() -> None:
    """PatientClient keeps its state in attributes of its own: one that kazoo also used
    would silently overwrite kazoo's."""
    kazoos = set(vars(KazooClient(hosts="127.0.0.1:1")))
    ours = {n for n in (*vars(zkclient.PatientClient(hosts="127.0.0.1:1")),
                        *vars(zkclient.PatientClient))
            if n.startswith("_") and not n.startswith("__") and n not in kazoos}
    ours -= {"_call"}  # KazooPrivate.divert_calls's replacement of kazoo's, pinned above
    assert ours and not ours & kazoos_private_names(), ours & kazoos_private_names()


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


def test_the_public_members_zkclient_relies_on_are_there() -> None:
    client = KazooClient(hosts="127.0.0.1:1")  # never started: no network
    assert client.client_state == KeeperState.CLOSED  # kazoo's _state, by its public name
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



def test_a_tapped_persistent_watch_hears_below_its_path_and_kazoos_watchers_still_fire(
        patient: zkclient.PatientClient, secured: ClusterSettings) -> None:
    """watch_tree's tap sees a create and a change below its path; a plain kazoo watch set
    meanwhile on one of those nodes still fires (the tap hands every event on to kazoo);
    after unwatch_tree the tap hears nothing more."""
    top = f"{secured.zk_root}/tapped"
    heard: list[tuple[int, str]] = []
    fired = threading.Event()
    try:
        patient.create(top, b"")
        assert zkclient.watch_tree(patient, top, lambda kind, path: heard.append((kind, path)))
        patient.create(f"{top}/a", b"1")
        wait_for(lambda: (CREATED_EVENT, f"{top}/a") in heard, 10, "the create heard")
        patient.get(f"{top}/a", watch=lambda _event: fired.set())
        patient.set(f"{top}/a", b"2")
        wait_for(lambda: (CHANGED_EVENT, f"{top}/a") in heard, 10, "the change heard")
        assert fired.wait(10), "kazoo's own watcher did not fire behind the tap"
        zkclient.unwatch_tree(patient, top)
        before = len(heard)
        patient.set(f"{top}/a", b"3")
        time.sleep(0.3)
        assert len(heard) == before
    finally:
        store.close(patient)
