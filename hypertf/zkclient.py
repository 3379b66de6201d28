"""A kazoo client that rides out a ZooKeeper blip.

A connection loss shorter than the session timeout loses nothing: the session, its
ephemeral nodes (leases, agent records) and its watches survive, and kazoo reconnects by
itself. What fails is the request that was in flight when the connection dropped: kazoo
raises ``ConnectionLoss`` for it. Our long-lived clients (a waiting or running launcher,
the sweep driver, ``logs -f``, the agents and the keeper) must not die of that, so every
synchronous operation of ``PatientClient`` waits for the connection to come back and tries
again in the same session. Only an expired session (or ``patience_s`` spent, for one-shot
commands) ends the wait: the session's ephemerals are then gone, which the caller must
learn (``SessionExpiredError``), not paper over.

A retried write may already have been applied when its answer was lost; every write of
HyperTF is version-checked or idempotent (a create that finds its node, a delete that finds
none), so the retry reports the conflict instead of doing it twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState, TransactionRequest
from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError

T = TypeVar("T")
RIDDEN_OUT = (ConnectionLoss, OperationTimeoutError)


class PatientClient(KazooClient):
    """KazooClient whose synchronous calls wait out a connection loss (see the module)."""

    def __init__(self, *args: Any, patience_s: float | None = None,
                 on_pause: Callable[[str], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.patience_s = patience_s
        self.on_pause = on_pause
        self._connected = threading.Event()
        self._paused = False
        self.add_listener(self._note_state)

    def _note_state(self, state: str) -> None:
        """Listeners must not block: note the state, say an outage once and its end."""
        if state == KazooState.CONNECTED:
            self._connected.set()
            if self._paused and self.on_pause:
                self.on_pause("ZooKeeper answers again: going on")
            self._paused = False
            return
        self._connected.clear()
        if state == KazooState.SUSPENDED and not self._paused and not self._stopped.is_set():
            self._paused = True
            if self.on_pause:
                self.on_pause("ZooKeeper is unreachable: waiting for it (nothing is lost "
                              "unless the session expires)")

    def patiently(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call(*args, **kwargs)``, tried again after each connection loss within the same
        session; an expired session raises ``SessionExpiredError``."""
        session = self._session_id
        paused_at: float | None = None
        while True:
            try:
                return call(*args, **kwargs)
            except RIDDEN_OUT:
                if self._stopped.is_set():
                    raise
                now = time.monotonic()
                paused_at = paused_at if paused_at is not None else now
                if self.patience_s is not None and now - paused_at > self.patience_s:
                    raise
                self._connected.wait(0.5)
                if self.connected and self._session_id != session:
                    raise SessionExpiredError() from None

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return self.patiently(super().get, *args, **kwargs)

    def set(self, *args: Any, **kwargs: Any) -> Any:
        return self.patiently(super().set, *args, **kwargs)

    def create(self, *args: Any, **kwargs: Any) -> Any:
        return self.patiently(super().create, *args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        return self.patiently(super().delete, *args, **kwargs)

    def exists(self, *args: Any, **kwargs: Any) -> Any:
        return self.patiently(super().exists, *args, **kwargs)

    def get_children(self, *args: Any, **kwargs: Any) -> Any:
        return self.patiently(super().get_children, *args, **kwargs)

    def ensure_path(self, *args: Any, **kwargs: Any) -> Any:
        return self.patiently(super().ensure_path, *args, **kwargs)

    def get_acls(self, *args: Any, **kwargs: Any) -> Any:
        return self.patiently(super().get_acls, *args, **kwargs)

    def set_acls(self, *args: Any, **kwargs: Any) -> Any:
        return self.patiently(super().set_acls, *args, **kwargs)

    def transaction(self) -> TransactionRequest:
        return PatientTransaction(self)


class PatientTransaction(TransactionRequest):
    """A multi-op whose commit waits out a connection loss like the client's calls."""

    client: PatientClient

    def commit(self) -> list[Any]:
        def once() -> list[Any]:
            self.committed = False  # a commit lost with the connection may be sent again
            return TransactionRequest.commit(self)

        return self.client.patiently(once)
