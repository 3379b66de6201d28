"""A kazoo client that rides out a ZooKeeper blip.

A connection loss shorter than the session timeout loses nothing: the session, its
ephemeral nodes (leases, agent records) and its watches survive, and kazoo reconnects by
itself. What fails is the request that was in flight when the connection dropped: kazoo
raises ``ConnectionLoss`` for it. Our long-lived clients (a waiting or running launcher,
the sweep driver, ``logs -f``, the agents and the keeper) must not die of that, so every
synchronous operation of ``PatientClient`` waits for the connection to come back and tries
again in the same session. Only an expired session or ``patience_s`` spent ends the wait
(the caller then sees ``SessionExpiredError`` or the ``ConnectionLoss``): an expired
session's ephemerals are gone, which the caller must learn, not paper over, and a server
that lost its data refuses the session forever without expiring it.

A retried write may already have been applied when its answer was lost; every write of
HyperTF is version-checked or idempotent (a create that finds its node, a delete that finds
none), so the retry reports the conflict instead of doing it twice.

What kazoo lacks (batching, multi-reads, persistent watches) reaches inside kazoo only
through ``hypertf.store.kazooprivate.KazooPrivate``, whose pins name every member it touches.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient, KazooState, TransactionRequest
from kazoo.exceptions import (
    EXCEPTIONS,
    ConnectionLoss,
    KazooException,
    OperationTimeoutError,
    SessionExpiredError,
    UnimplementedError,
)
from kazoo.protocol.serialization import (
    GetChildren,
    GetData,
    MultiHeader,
    int_struct,
    multiheader_struct,
    read_buffer,
    read_string,
    stat_struct,
    write_string,
)
from kazoo.protocol.states import KeeperState, ZnodeStat

from hypertf.store.kazooprivate import KazooPrivate
from hypertf.store.pollhandler import PollHandler

if TYPE_CHECKING:  # a client keeps whom it logged in as; auth needs no client here
    from hypertf.store.credentials import Credential

RIDDEN_OUT = (ConnectionLoss, OperationTimeoutError)


def private(client: KazooClient) -> KazooPrivate:
    """The client's own door into kazoo (a plain KazooClient, a test's: a new one)."""
    return client.kazoo if isinstance(client, PatientClient) else KazooPrivate(client)


class PatientClient(KazooClient):  # type: ignore[misc]  # kazoo has no type hints
    """KazooClient whose synchronous calls wait out a connection loss (see the module)."""

    def __init__(self, *args: Any, patience_s: float | None = None,
                 on_pause: Callable[[str], None] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("handler", PollHandler())  # a poll per wait, not an epoll's life
        super().__init__(*args, **kwargs)
        self.patience_s = patience_s
        self.on_pause = on_pause
        self._connected = threading.Event()
        self._paused = False
        self._batch = threading.local()
        self.kazoo = KazooPrivate(self)  # our marks on this client live there
        self.credential: Credential | None = None  # whom it logged in as: connect() says
        self.kazoo.divert_calls(self._batched)
        self.add_listener(self._note_state)

    @contextlib.contextmanager
    def pipelined(self) -> Iterator[None]:
        """Asynchronous requests made in this block (by this thread) wake kazoo's connection
        thread once at its end, not once each: kazoo writes one byte to a socket pair per
        request, and that hand-over costs about 200 us on a busy machine, 2 s for the
        10,000 reads of ``hypertf status`` at 10,000 hosts. The connection thread still
        sends one request per byte, in order."""
        if getattr(self._batch, "queued", None) is not None:
            yield  # nested: the outer block wakes it
            return
        self._batch.queued = 0
        try:
            yield
        finally:
            queued, self._batch.queued = self._batch.queued, None
            self.kazoo.wake(queued)  # closed meanwhile: nothing, the gets time out

    def _batched(self, request: Any, async_object: Any) -> bool:
        """Every request of this client comes here first: inside ``pipelined`` it is queued
        for the block's one wake-up. Outside one, or for a client that cannot send, False:
        kazoo's own call sends it (or answers it at once with kazoo's error)."""
        queued = getattr(self._batch, "queued", None)
        if queued is None or self.client_state in (
                KeeperState.AUTH_FAILED, KeeperState.CLOSED, KeeperState.EXPIRED_SESSION):
            return False
        self.kazoo.enqueue(request, async_object)
        self._batch.queued = queued + 1
        return True

    def _note_state(self, state: str) -> None:
        """Listeners must not block: note the state, say an outage once and its end."""
        if state == KazooState.CONNECTED:
            self._connected.set()
            if self._paused and self.on_pause:
                self.on_pause("ZooKeeper answers again: going on")
            self._paused = False
            return
        self._connected.clear()
        if state == KazooState.SUSPENDED and not self._paused and not self.kazoo.stopped:
            self._paused = True
            if self.on_pause:
                self.on_pause("ZooKeeper is unreachable: waiting for it (nothing is lost "
                              "unless the session expires)")

    def patiently(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs).get()`` for an asynchronous kazoo call, sent again after
        each connection loss within the same session. A request made while disconnected
        waits in kazoo's queue, and kazoo's own ``get()`` would wait for it forever: here
        every wait ends with ``patience_s`` (``ConnectionLoss``). An expired session
        raises ``SessionExpiredError``."""
        session = self.kazoo.session_id
        deadline = None if self.patience_s is None else time.monotonic() + self.patience_s
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return call(*args, **kwargs).get(timeout=left)
            except self.handler.timeout_exception as err:
                raise ConnectionLoss(f"ZooKeeper did not answer within {self.patience_s:.0f} s"
                                     ) from err
            except RIDDEN_OUT as err:
                if self.kazoo.stopped or left == 0.0:
                    raise
                self._connected.wait(0.5 if left is None else min(0.5, left))
                if self.connected and self.kazoo.session_id != session:
                    raise SessionExpiredError() from err

    def get(self, path: str, watch: Callable[..., Any] | None = None) -> Any:
        return self.patiently(self.get_async, path, watch=watch)

    def exists(self, path: str, watch: Callable[..., Any] | None = None) -> Any:
        return self.patiently(self.exists_async, path, watch=watch)

    def get_children(self, path: str, watch: Callable[..., Any] | None = None,
                     include_data: bool = False) -> Any:
        return self.patiently(self.get_children_async, path, watch=watch,
                              include_data=include_data)

    def set(self, path: str, value: bytes, version: int = -1) -> Any:
        return self.patiently(self.set_async, path, value, version=version)

    def create(self, path: str, value: bytes = b"", acl: Any = None, ephemeral: bool = False,
               sequence: bool = False, makepath: bool = False, include_data: bool = False,
               ) -> Any:
        return self.patiently(self.create_async, path, value, acl=acl, ephemeral=ephemeral,
                              sequence=sequence, makepath=makepath, include_data=include_data)

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> Any:
        if recursive:  # kazoo walks the tree with synchronous calls, each of them patient
            return super().delete(path, version=version, recursive=True)
        return self.patiently(self.delete_async, path, version=version)

    def ensure_path(self, path: str, acl: Any = None) -> Any:
        return self.patiently(self.ensure_path_async, path, acl=acl)

    def get_acls(self, path: str) -> Any:
        return self.patiently(self.get_acls_async, path)

    def set_acls(self, path: str, acls: Any, version: int = -1) -> Any:
        return self.patiently(self.set_acls_async, path, acls, version=version)

    def transaction(self) -> TransactionRequest:
        return PatientTransaction(self)


class PatientTransaction(TransactionRequest):  # type: ignore[misc]
    """A multi-op whose commit waits out a connection loss like the client's calls."""

    client: PatientClient

    def commit(self) -> list[Any]:
        def send() -> Any:
            self.committed = False  # a commit lost with the connection may be sent again
            return self.commit_async()

        return self.client.patiently(send)  # type: ignore[no-any-return]


def pipelined(client: KazooClient) -> contextlib.AbstractContextManager[None]:
    """``PatientClient.pipelined`` for any client (a plain KazooClient: no batching)."""
    batch = getattr(client, "pipelined", None)
    return batch() if batch is not None else contextlib.nullcontext()


def answer(client: KazooClient, result: Any, again: Callable[[], Any]) -> Any:
    """The answer to an asynchronous request sent in a ``pipelined`` block, as patient as
    the client's synchronous calls: after a connection loss (or no answer within the
    client's ``patience_s``) the request is made again by ``again``, the synchronous call
    (which waits out the outage in the same session). A write made again may find itself
    applied: every HyperTF write is version-checked or idempotent (see the module)."""
    patience = getattr(client, "patience_s", None)
    try:
        return result.get(timeout=patience)
    except (*RIDDEN_OUT, client.handler.timeout_exception):
        return again()


class MultiRead:
    """ZooKeeper's multi-read (opcode 22, ZooKeeper 3.6 and later), which kazoo lacks: many
    getData (or, with ``children``, getChildren) in one request and one answer, each its
    data and stat (its children's names) or its error. Reads are not atomic together (each
    is as of when the server reached it)."""

    type = 22

    def __init__(self, paths: list[str], children: bool = False) -> None:
        self.paths = paths
        self.op = GetChildren.type if children else GetData.type

    def serialize(self) -> bytes:
        body = bytearray()
        for path in self.paths:
            body.extend(MultiHeader(self.op, False, -1).serialize())
            body.extend(GetData(path, None).serialize())  # getChildren's request is the same
        return bytes(body + multiheader_struct.pack(-1, True, -1))

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[Any]:
        results: list[Any] = []
        header, offset = MultiHeader.deserialize(data, offset)
        while not header.done:
            if header.type == GetData.type:
                value, offset = read_buffer(data, offset)
                results.append((value, ZnodeStat._make(stat_struct.unpack_from(data, offset))))
                offset += stat_struct.size
            elif header.type == GetChildren.type:
                count = int_struct.unpack_from(data, offset)[0]
                offset += int_struct.size
                names = []
                for _ in range(max(count, 0)):
                    name, offset = read_string(data, offset)
                    names.append(name)
                results.append(names)
            else:  # an error: its code
                code = int_struct.unpack_from(data, offset)[0]
                offset += int_struct.size
                results.append(EXCEPTIONS[code]())
            header, offset = MultiHeader.deserialize(data, offset)
        return results


READS_PER_REQUEST = 256  # agent records of ~1.5 KB: answers of ~400 KB


def get_many(client: KazooClient, paths: list[str], timeout: float = 60.0,
             children: bool = False) -> list[Any]:
    """The data and stat of every path, in order (an exception instance where a read
    failed: ``NoNodeError`` for a missing one), in few round trips: ZooKeeper's multi-read
    in chunks, all sent before any answer is awaited. kazoo costs ~100-300 us per request
    on a busy machine, so 10,000 gets took 2-3 s here; 40 multi-reads take 0.1 s. No
    watches (the server sets none for a multi-read). A server without multi-read (before
    ZooKeeper 3.6) gets pipelined plain gets instead. With ``children``: each path's
    children's names instead (a host's folder: whether its agent's record exists, in a few
    bytes instead of the record's 1.5 KB)."""
    kazoo = private(client)
    if kazoo.no_multi_read:
        return _get_each(client, paths, timeout, children)
    chunks = [paths[i:i + READS_PER_REQUEST] for i in range(0, len(paths), READS_PER_REQUEST)]
    with pipelined(client):
        pending = []
        for chunk in chunks:
            result = client.handler.async_result()
            kazoo.call(MultiRead(chunk, children), result)
            pending.append(result)
    results: list[Any] = []
    try:
        for result in pending:
            results.extend(result.get(timeout=timeout))
    except UnimplementedError:
        kazoo.no_multi_read = True
        return _get_each(client, paths, timeout, children)
    return results


def _get_each(client: KazooClient, paths: list[str], timeout: float,
              children: bool = False) -> list[Any]:
    with pipelined(client):
        pending = [client.get_children_async(path) if children else client.get_async(path)
                   for path in paths]
    results: list[Any] = []
    for result in pending:
        try:
            results.append(result.get(timeout=timeout))
        except KazooException as err:
            results.append(err)
    return results


class _PathAndNumber:
    """A request that kazoo lacks, of a path and a number (ZooKeeper 3.6+), answered by
    its header alone."""

    type = 0

    def __init__(self, path: str, number: int) -> None:
        self.path = path
        self.number = number

    def serialize(self) -> bytes:
        return bytes(write_string(self.path) + int_struct.pack(self.number))

    @classmethod
    def deserialize(cls, _data: bytes, _offset: int) -> bool:
        return True


class AddWatch(_PathAndNumber):
    """ZooKeeper's addWatch (opcode 106): a watch that stays set after it fires; recursive
    (mode 1), it fires for every node below the path too (created, changed, deleted). One
    request instead of one per node and per change: 25,000 agents' keep-alives at ~930 a
    second cost kazoo ~300 us each to re-arm a plain watch, more than the keeper's pass."""

    type = 106
    PERSISTENT_RECURSIVE = 1


class RemoveWatches(_PathAndNumber):
    """ZooKeeper's removeWatches (opcode 18); watcher type 5: a persistent recursive one."""

    type = 18
    PERSISTENT_RECURSIVE = 5


TreeCallback = Callable[[int, str], None]  # (kazoo's event type code, path)


def watch_tree(client: KazooClient, path: str, callback: TreeCallback,
               timeout: float = 30.0) -> bool:
    """Set a persistent recursive watch on ``path``: ``callback(type, path)`` for every
    node created, changed or deleted below it, from kazoo's connection thread (it must
    only note the event), until ``unwatch_tree``. The watch lives on the connection: after
    a reconnect it must be set again (events in between are lost). False when the server
    is older than ZooKeeper 3.6 (or refused it): the caller reads instead."""
    kazoo = private(client)
    kazoo.tap_watch_events(f"{path}/", callback)
    result = client.handler.async_result()
    kazoo.call(AddWatch(path, AddWatch.PERSISTENT_RECURSIVE), result)
    try:
        result.get(timeout=timeout)
    except (UnimplementedError, KazooException, client.handler.timeout_exception):
        kazoo.untap_watch_events(f"{path}/")
        return False
    return True


def unwatch_tree(client: KazooClient, path: str) -> None:
    """End ``watch_tree``'s watch (its events are ignored from now on)."""
    kazoo = private(client)
    kazoo.untap_watch_events(f"{path}/")
    if client.connected:
        with contextlib.suppress(Exception):
            kazoo.call(RemoveWatches(path, RemoveWatches.PERSISTENT_RECURSIVE),
                       client.handler.async_result())
