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

from collections.abc import Callable

from hypertf.core.layout import is_task_key
from hypertf.keeper.treefollow import CREATED, DELETED, TreeFollow
from hypertf.store.session import Store

__all__ = ["LeaseCache"]


class LeaseCache(TreeFollow):
    """Live lease keys of every user (as ``Store.leases()``). ``changed()``, when given,
    is called from kazoo's connection thread for each lease that comes or goes; it must
    only take note."""

    def __init__(self, store: Store, changed: Callable[[], object] | None = None) -> None:
        super().__init__(store, store.layout.leases)
        self.changed = changed
        self._keys: set[str] = set()
        self._journal: list[tuple[int, str]] | None = None  # events during a full listing

    def leases(self) -> set[str]:
        """The live lease keys: from the watch's events, or one listing of every folder
        when the watch was just set (or the server has none)."""
        with self._lock:
            if self._following and self._watching:
                return set(self._keys)
        if not self._following or self._unsupported or not self._set_watch():
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

    def known(self) -> set[str] | None:
        """The live lease keys when the watch keeps them; None when ``leases()`` would
        list the folders (the keeper then reads nothing ahead of its pass)."""
        with self._lock:
            return set(self._keys) if self._following and self._watching else None

    def _on_event(self, kind: int, path: str) -> None:
        user, _, key = path[len(self._prefix):].partition("/")
        if not key or "/" in key or kind not in (CREATED, DELETED):
            return  # a user's folder, or a lease's data (a launcher's keep-alive)
        if not is_task_key(key, owner=user):
            return  # junk: never a key, whatever its owner does with it
        with self._lock:
            _apply(self._keys, kind, key)
            if self._journal is not None:
                self._journal.append((kind, key))
        if self.changed is not None:
            self.changed()


def _apply(keys: set[str], kind: int, key: str) -> None:
    if kind == CREATED:
        keys.add(key)
    else:
        keys.discard(key)
