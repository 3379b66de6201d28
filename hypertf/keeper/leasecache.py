"""The keeper's set of live leases (``LeaseCache``), kept by one watch instead of listings.

A user writes any name it likes in its own ``leases/<user>`` (only the count is bounded, by
the quota ``auth init`` sets; a name may be up to ``jute.maxbuffer``, 1 MiB). A keeper that
listed every user's folder at each pass, and a children watch per folder that lists it
again at each change, made ZooKeeper serialise a user's whole folder many times a second
while that user flooded it with long names: hundreds of MB a second, which is how one
user's folder took ZooKeeper down. Once ``follow`` is called (the keeper's role does, for
its term), one persistent recursive watch on ``leases/`` (ZooKeeper 3.6+) names each lease
created or deleted, once; the set is kept from those events and every folder is listed
only once per connection. A name that is not a task key of its folder's owner
(``layout.is_task_key``) is dropped as its event arrives. Events come on the session in
order with the answers to reads, so a pass that read the matrix has seen, here, the lease
of every job whose cells it read. A server without the watch is listed at every call, as
before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kazoo.protocol.states import KazooState

from hypertf.core.layout import is_task_key
from hypertf.store.zkclient import unwatch_tree, watch_tree
from hypertf.store.zkstore import Store

__all__ = ["LeaseCache"]

_CREATED, _DELETED = 1, 2  # ZooKeeper's event types (kazoo's protocol codes)


class LeaseCache:
    """Live lease keys of every user (as ``Store.leases()``). ``changed()``, when given,
    is called from kazoo's connection thread for each lease that comes or goes; it must
    only take note."""

    def __init__(self, store: Store, changed: Callable[[], object] | None = None) -> None:
        self.store = store
        self.changed = changed
        self._lock = threading.Lock()
        self._keys: set[str] = set()
        self._journal: list[tuple[int, str]] | None = None  # events during a full listing
        self._following = False
        self._watching = False  # the watch is set on the current connection
        self._unsupported = False  # the server has no persistent watches
        self._prefix = f"{store.layout.leases}/"

    def follow(self) -> None:
        """Keep the set by the watch from the next ``leases`` call on."""
        with self._lock:
            if self._following:
                return
            self._following = True
        self.store.client.add_listener(self._on_state)

    def forget(self) -> None:
        """Stop keeping the set (the keeper's term ended)."""
        with self._lock:
            following, self._following, self._watching = self._following, False, False
        if following:
            self.store.client.remove_listener(self._on_state)
            unwatch_tree(self.store.client, self.store.layout.leases)

    def leases(self) -> set[str]:
        """The live lease keys: from the watch's events, or one listing of every folder
        when the watch was just set (or the server has none)."""
        with self._lock:
            watched = self._following and self._watching
            if watched:
                return set(self._keys)
        if not self._following or self._unsupported or not self._watch():
            return self.store.leases()
        with self._lock:
            self._journal = []
        listed = self.store.leases()  # after the watch: nothing between is missed
        with self._lock:
            journal, self._journal = self._journal or [], None
            for kind, key in journal:  # what came meanwhile, again: idempotent, in order
                _apply(listed, kind, key)
            self._keys = listed
            return set(listed)

    def _watch(self) -> bool:
        watching = watch_tree(self.store.client, self.store.layout.leases, self._on_event)
        with self._lock:
            self._unsupported = not watching
            self._watching = watching and self._following
        return watching

    def _on_event(self, kind: int, path: str) -> None:
        user, _, key = path[len(self._prefix):].partition("/")
        if not key or "/" in key or kind not in (_CREATED, _DELETED):
            return  # a user's folder, or a lease's data (a launcher's keep-alive)
        if not is_task_key(key, owner=user):
            return  # junk: never a key, whatever its owner does with it
        with self._lock:
            _apply(self._keys, kind, key)
            if self._journal is not None:
                self._journal.append((kind, key))
        if self.changed is not None:
            self.changed()

    def _on_state(self, state: str) -> None:
        """The watch went with the connection: set it again and list once more."""
        if state != KazooState.CONNECTED:
            with self._lock:
                self._watching = False


def _apply(keys: set[str], kind: int, key: str) -> None:
    if kind == _CREATED:
        keys.add(key)
    else:
        keys.discard(key)
