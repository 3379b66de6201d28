"""The one door into kazoo's private members (docs/code-style.md, "Fencing
what a library lacks").

HyperTF needs three things kazoo has no public API for: sending a request kazoo has no
method for (ZooKeeper's multi-read, addWatch, removeWatches), batching many requests behind
one wake-up of kazoo's connection thread (``zkclient.PatientClient.pipelined``), and hearing
the events of a persistent recursive watch (kazoo drops a watch event it set no watcher
for). Each needs kazoo's private members. ``KazooPrivate`` is the only code that touches
them, and ``KazooPrivate.NAMES`` lists every one it touches, as data:
tests/integration/test_kazoo_pins.py checks each against the installed kazoo (there, of
that kind, with that signature), so an upgrade that moves one fails there, naming it,
instead of silently losing requests or watch events.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from kazoo.client import KazooClient
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.serialization import Watch

__all__ = ["KazooPrivate", "PrivateName", "WatchEventTap"]

# Told a watch event's type code and path, from kazoo's connection thread, before kazoo
# handles it: it must only note the event.
WatchEventTap = Callable[[int, str], None]


@dataclass(frozen=True)
class PrivateName:
    """One private member of kazoo that ``KazooPrivate`` touches: on which class, what it
    is (a method with these parameters, or an attribute whose value on a client built but
    never started is one of ``types``) and what HyperTF uses it for."""

    owner: type
    name: str
    parameters: tuple[str, ...] | None = None  # a method's, ``self`` included
    types: tuple[type, ...] = ()  # an attribute's, on a client never started
    use: str = ""

    @property
    def is_method(self) -> bool:
        return self.parameters is not None


class KazooPrivate:
    """Everything HyperTF does inside one kazoo client, by public names. ``NAMES``: what it
    touches (kazoo 2.11, pinned by tests/integration/test_kazoo_pins.py)."""

    NAMES: ClassVar[tuple[PrivateName, ...]] = (
        PrivateName(KazooClient, "_call", parameters=("self", "request", "async_object"),
                    use="send a request object: kazoo's state checks, its queue, one wake-up "
                    "byte; replaced per client by a batching one (divert_calls)"),
        PrivateName(KazooClient, "_queue", types=(collections.deque,),
                    use="a batched request's (request, async_object) pair, as _call appends it"),
        PrivateName(KazooClient, "_stopped", types=(threading.Event,),
                    use="whether stop() was called: a patient call gives up then"),
        PrivateName(KazooClient, "_session_id", types=(int, type(None)),
                    use="the session a patient call began in, kept while disconnected "
                    "(client_id is None then): another one means it expired"),
        PrivateName(KazooClient, "_connection", types=(ConnectionHandler,),
                    use="the connection thread's handler, for the two names below"),
        PrivateName(ConnectionHandler, "_write_sock", types=(socket.socket, type(None)),
                    use="the socket pair's end whose bytes wake the connection thread, one "
                    "per queued request"),
        PrivateName(ConnectionHandler, "_read_watch_event",
                    parameters=("self", "buffer", "offset"),
                    use="replaced per connection to tap every watch event before kazoo "
                    "handles it (persistent watches' events have no kazoo watcher)"),
    )

    def __init__(self, client: KazooClient) -> None:
        """One per client, made with it (``zkclient.PatientClient.kazoo``): our own marks on
        the client (its taps, whether its server lacks the multi-read) live here, as long
        as the client, rather than as attributes set on kazoo's objects."""
        self.client = client
        self.no_multi_read = False  # its server refused ZooKeeper's multi-read (before 3.6)
        self._taps: dict[str, WatchEventTap] | None = None
        self._lock = threading.Lock()

    # requests

    def call(self, request: Any, async_object: Any) -> None:
        """Send ``request`` (any object with kazoo's ``type``, ``serialize`` and
        ``deserialize``); its answer or error goes to ``async_object``. A batching client
        (``divert_calls``) queues it instead while a batch is open."""
        self.client._call(request, async_object)

    def divert_calls(self, divert: Callable[[Any, Any], bool]) -> None:
        """Every request of this client goes to ``divert(request, async_object)`` first;
        when it returns False, kazoo's own ``_call`` sends it as usual."""
        plain = self.client._call

        def call(request: Any, async_object: Any) -> Any:
            if divert(request, async_object):
                return None
            return plain(request, async_object)

        self.client._call = call

    def enqueue(self, request: Any, async_object: Any) -> None:
        """Queue a request as kazoo's ``_call`` does, without waking the connection thread:
        ``wake`` does, once for a batch."""
        self.client._queue.append((request, async_object))

    def wake(self, count: int) -> None:
        """Wake the connection thread for ``count`` queued requests (it sends one request per
        byte it reads). A connection closed meanwhile: nothing (the requests time out)."""
        write_sock = self.client._connection._write_sock
        if count and write_sock is not None:
            with contextlib.suppress(OSError):
                write_sock.sendall(b"\0" * count)

    # the session

    @property
    def stopped(self) -> bool:
        """Whether ``stop()`` was called on the client."""
        return bool(self.client._stopped.is_set())

    @property
    def session_id(self) -> int | None:
        """The current or last session's id, kept while the connection is down (kazoo's
        public ``client_id`` is None then)."""
        session: int | None = self.client._session_id
        return session

    # watch events

    def tap_watch_events(self, prefix: str, tap: WatchEventTap) -> None:
        """``tap(type, path)`` for every watch event of a path starting with ``prefix``,
        before kazoo handles it, until ``untap_watch_events(prefix)``."""
        with self._lock:
            if self._taps is None:
                self._taps = {}
                self._route_watch_events(self._taps)
            self._taps[prefix] = tap

    def untap_watch_events(self, prefix: str) -> None:
        with self._lock:
            if self._taps is not None:
                self._taps.pop(prefix, None)

    def _route_watch_events(self, taps: dict[str, WatchEventTap]) -> None:
        connection = self.client._connection
        plain = connection._read_watch_event

        def read_watch_event(buffer: bytes, offset: int) -> Any:
            watch, _ = Watch.deserialize(buffer, offset)
            for prefix, tap in list(taps.items()):
                if watch.path and watch.path.startswith(prefix):  # None: a session event
                    tap(watch.type, watch.path)
            return plain(buffer, offset)

        connection._read_watch_event = read_watch_event
