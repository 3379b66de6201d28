"""One persistent recursive watch on a folder, kept across reconnects: the part the keeper's
record cache and lease cache share (hypertf.keeper.recordcache, .leasecache).

``follow()`` starts following (the watch is set by the next read, in the pass's thread),
``forget()`` ends it (the keeper's term ended); a lost connection takes the watch with it,
so the next read sets it again and reads the whole folder once more. A server without
persistent watches (before 3.6) is remembered: the caches then read every time.
"""

from __future__ import annotations

import threading

from kazoo.protocol.states import KazooState

from hypertf.store.session import Store
from hypertf.store.zkclient import unwatch_tree, watch_tree

CREATED, DELETED = 1, 2  # ZooKeeper's event types (kazoo's protocol codes)


class TreeFollow:
    """The watch's state on ``path``; subclasses handle ``_on_event(kind, path)`` (called
    from kazoo's connection thread: take note only) and may clear their own state in
    ``_forgotten()`` (under the lock)."""

    def __init__(self, store: Store, path: str) -> None:
        self.store = store
        self._path = path
        self._prefix = f"{path}/"
        self._lock = threading.Lock()
        self._following = False
        self._watching = False  # the watch is set on the current connection
        self._unsupported = False  # the server has no persistent watches

    def follow(self) -> None:
        """Keep the folder by the watch from the next read on."""
        with self._lock:
            if self._following:
                return
            self._following = True
        self.store.client.add_listener(self._on_state)

    def forget(self) -> None:
        """Stop following (the keeper's term ended)."""
        with self._lock:
            following, self._following, self._watching = self._following, False, False
            self._forgotten()
        if following:
            self.store.client.remove_listener(self._on_state)
            unwatch_tree(self.store.client, self._path)

    def _forgotten(self) -> None:
        """What a subclass drops when following ends (called under the lock)."""

    def _set_watch(self) -> bool:
        """Set the watch (the pass's thread, before its whole read): whether it is set."""
        watching = watch_tree(self.store.client, self._path, self._on_event)
        with self._lock:
            self._unsupported = not watching
            self._watching = watching and self._following
        return watching

    def _on_event(self, kind: int, path: str) -> None:
        raise NotImplementedError

    def _on_state(self, state: str) -> None:
        """The watch went with the connection: the next read sets it again, reading all."""
        if state != KazooState.CONNECTED:
            with self._lock:
                self._watching = False
