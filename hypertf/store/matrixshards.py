"""The sharded GPU matrix as one session reads, writes and watches it (``ShardedMatrix``,
the base of ``Store.matrix``): the shard count and the last parse of each shard are the
session's, so a reconnect (a new session) starts them afresh. Only the keeper's identity
and the admin write the matrix (its ACL); what a launcher or an agent does with it is
hypertf.store.allocation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError
from kazoo.protocol.states import KazooState
from kazoo.retry import ForceRetryError

from hypertf.core.errors import NotAllowed, StoreError
from hypertf.core.layout import Layout
from hypertf.core.matrix import Matrix, MatrixIndex, changed_shards, joined, shard_of
from hypertf.store import bootstrap
from hypertf.store.retry import until_committed
from hypertf.store.zkclient import pipelined, unwatch_tree, watch_tree
from hypertf.store.zkstore import StoreReads

__all__ = ["TRANSACTION_BYTES", "MatrixDamaged", "MatrixVersion", "MatrixWatch", "RootMissing",
           "ShardCache", "ShardedMatrix", "commit_or_conflict", "damaged_message",
           "matrix_writes"]


class RootMissing(StoreError):
    """The root is gone (ZooKeeper lost its data) until the admin secures it again."""


class MatrixDamaged(StoreError):
    """A shard or the index holds what no keeper wrote: the keeper rewrites it from its own
    state at its next pass; until then every command says so, naming the admin's repair."""


def damaged_message(root: str, what: str) -> str:
    return (f"the GPU matrix under {root} is damaged ({what}): the keeper rewrites it within "
            f"seconds; if this stays, the cluster admin runs 'hypertf auth init -i "
            f"INVENTORY' (it rewrites a damaged index or shard; running jobs keep their GPUs)")


@dataclass(frozen=True)
class MatrixVersion:
    """What a read of the matrix saw, for a version-checked write of what it changed."""

    index: int  # the parent's version: it changes only when ``auth init`` reshards
    shards: int  # how many shards there are
    versions: Mapping[int, int]  # the version of each shard read


class ShardCache:
    """The keeper's shards between passes: a read with it gets the index and only the
    shards the matrix's watch named since the last read (``changed``), every shard after
    a (re)connect (``invalidate``), a reshard or while it is not ``enabled`` (no persistent
    watch). At 25,000 hosts that is one or two shards a pass instead of 196 (~40 ms).

    The matrix handed out shares its rows with the shards kept here: no caller changes a
    row in place (every Matrix method copies the rows it changes)."""

    def __init__(self) -> None:
        self.enabled = False  # set by the keeper once its persistent watch is on
        self.parts: dict[int, tuple[Matrix, int]] = {}  # shard -> (content, version)
        self._dirty: set[int] = set()
        self._whole = True
        self._lock = threading.Lock()

    def changed(self, path: str) -> None:
        """The watch's event (kazoo's thread): the shard it names is read again."""
        tail = path.rpartition("/")[2]
        with self._lock:
            if tail.isdigit():
                self._dirty.add(int(tail))
            else:
                self._whole = True  # the index (a reshard), or the folder itself

    def invalidate(self) -> None:
        """Every shard read again at the next read (a reconnect: events were lost)."""
        with self._lock:
            self._whole = True

    def wanted(self, count: int) -> list[int]:
        """The shards to read now (the others are as kept)."""
        with self._lock:
            whole, dirty = self._whole or not self.enabled, self._dirty
            self._dirty = set()
            if self.enabled:  # not before the watch is on: its first read is whole
                self._whole = False
        if whole or any(i not in self.parts for i in range(count)):
            self.parts = {i: kept for i, kept in self.parts.items() if i < count}
            return list(range(count))
        return sorted(i for i in dirty if i < count)


class ShardedMatrix:
    """The matrix of one session's store: reads (pipelined, one round trip once the shard
    count is known), version-checked writes and watches. The session keeps the shard
    count (the parent's, read with the shards; a stale guess reads again): a new session
    reads it again with its first read."""

    def __init__(self, store: StoreReads) -> None:
        self.store = store
        self.client, self.layout = store.client, store.layout
        self._shard_count: int | None = None

    def read(self, hosts: Iterable[str] | None = None,
             watch: Callable[..., Any] | None = None,
             cache: ShardCache | None = None) -> tuple[Matrix, MatrixVersion]:
        """The stored matrix (the admin's ``auth init`` creates it) and the versions it was read
        at: the parent and every shard (with ``hosts``, only their shards: the matrix returned
        then holds the rows of those shards, the others' are left out), pipelined, in one
        round trip once this client knows the shard count. ``watch``: set on each shard read.
        ``cache`` (the keeper's): only the shards that changed are read."""
        try:
            return self._read(hosts, watch, cache)
        except BaseException:
            if cache is not None:
                cache.invalidate()  # a shard it should have read may not have been kept
            raise

    def _read(self, hosts: Iterable[str] | None,
              watch: Callable[..., Any] | None,
              cache: ShardCache | None) -> tuple[Matrix, MatrixVersion]:
        client, layout = self.client, self.layout
        count = self._shard_count
        for _ in range(5):
            wanted: Iterable[int] = [] if count is None else (
                cache.wanted(count) if cache is not None and hosts is None else
                range(count) if hosts is None else sorted({shard_of(h, count) for h in hosts}))
            with pipelined(client):
                index_read = client.get_async(layout.matrix)
                pending = [(i, client.get_async(layout.matrix_shard(i), watch=watch))
                           for i in wanted]
            try:
                data, stat = index_read.get(timeout=30)
            except NoNodeError:
                raise RootMissing(f"ZooKeeper has no matrix under {layout.root}: run 'hypertf "
                                  f"auth init -i INVENTORY' as the admin") from None
            index = _index_of(data, layout.root)
            if index.shards != count:
                count = self._shard_count = index.shards
                if cache is not None:
                    cache.invalidate()
                continue  # a first read, or resharded meanwhile: read the shards it names
            parts, versions = [], {}
            for i, result in pending:
                try:
                    part, part_stat = result.get(timeout=30)
                except NoNodeError:
                    continue  # resharded between the two reads: the next try sees it
                parts.append(_shard(part, i, layout.root))
                versions[i] = part_stat.version
                if cache is not None:
                    cache.parts[i] = (parts[-1], part_stat.version)
            if len(versions) < len(pending):
                count = None
                if cache is not None:
                    cache.invalidate()
                continue
            if cache is not None and hosts is None:
                parts = [cache.parts[i][0] for i in range(count)]
                versions = {i: cache.parts[i][1] for i in range(count)}
            return joined(parts), MatrixVersion(stat.version, count, versions)
        raise MatrixDamaged(damaged_message(layout.root, "shards its index names are missing"))

    def write(self, old: Matrix, new: Matrix, version: MatrixVersion) -> bool:
        return self.written_version(old, new, version) is not None

    def written_version(self, old: Matrix, new: Matrix,
                        version: MatrixVersion) -> MatrixVersion | None:
        """Store ``new`` over ``old`` (read at ``version``): the changed shards, each against
        the version it was read at, with a check of the index, in transactions of at most
        512 KB (one, usually; every row of 10,000 busy hosts changing at once is 2.4 MB, and a
        larger request makes ZooKeeper drop the connection). Not atomic across those: for the
        sync, the drains and tools, whose writes converge (a later pass finishes what a lost
        race left). False when another writer changed a shard (read again, decide again).
        ``written_version``: the versions the matrix has once written (each shard set once),
        None on a conflict, so the keeper's admission need not read it again."""
        batches: list[list[tuple[int, bytes]]] = [[]]
        size = 0
        for i, part in changed_shards(old, new, version.shards).items():
            if i not in version.versions:
                raise ValueError(f"matrix shard {i} changed but was not read")
            data = part.to_json()
            if batches[-1] and size + len(data) > TRANSACTION_BYTES:
                batches.append([])
                size = 0
            batches[-1].append((i, data))
            size += len(data)
        for batch in batches:
            if not batch:
                continue
            tx = self.client.transaction()
            tx.check(self.layout.matrix, version.index)
            for i, data in batch:
                tx.set_data(self.layout.matrix_shard(i), data, version=version.versions[i])
            if not commit_or_conflict(tx):
                return None
        versions = dict(version.versions)
        for batch in batches:
            for i, _ in batch:
                versions[i] += 1
        return MatrixVersion(version.index, version.shards, versions)

    def overwrite(self, matrix: Matrix) -> None:
        """Make the stored matrix ``matrix``, whatever it holds (an agent's or the admin's
        credential: benches and tests standing in for a damaged or forged matrix)."""
        def attempt(_retries: int) -> None:
            old, version = self.read()
            if not self.write(old, matrix, version):
                raise ForceRetryError()

        until_committed(attempt, "writing the matrix")

    def watch(self, wake: Callable[..., Any],
              shards: ShardCache | None = None) -> None:
        """Call ``wake`` whenever a shard of the matrix changes, until it returns False: one
        persistent recursive watch on the matrix (``MatrixWatch``), so a change costs no read;
        on a server without them (before ZooKeeper 3.6), a DataWatch on each shard, which
        reads the shard again at each change. ``shards`` (the keeper's cache) learns which
        shard changed, and is enabled only with the persistent watch."""
        if MatrixWatch(self.store, wake, shards).start():
            if shards is not None:
                shards.enabled = True
            return
        _, version = self.read(hosts=())
        for i in range(version.shards):
            self.client.DataWatch(self.layout.matrix_shard(i), wake)

    def watch_shard_of(self, host: str, wake: Callable[..., Any]) -> None:
        """Call ``wake`` whenever the shard holding ``host``'s row changes: its agent learns at
        once that the keeper marked cells of its host draining (a reshard: at its next sweep)."""
        _, version = self.read(hosts=())
        shard = self.layout.matrix_shard(shard_of(host, version.shards))
        self.client.DataWatch(shard, wake)

    def read_shards(self, hosts: Sequence[str] | None,
                    watch: Callable[..., Any] | None = None) -> Matrix:
        """The rows of ``hosts`` (every row: None), for reading only: once this client knows
        the shard count, just their shards, without the index (a reshard between two reads is
        an admin's rare act; a shard gone sends it to ``read``)."""
        count = self._shard_count
        if not hosts or count is None:
            return self.read(hosts, watch=watch)[0]
        wanted = sorted({shard_of(h, count) for h in hosts})
        with pipelined(self.client):
            pending = [self.client.get_async(self.layout.matrix_shard(i), watch=watch)
                       for i in wanted]
        parts = []
        for i, result in zip(wanted, pending, strict=True):
            try:
                parts.append(_shard(result.get(timeout=30)[0], i, self.layout.root))
            except NoNodeError:
                self._shard_count = None
                return self.read(hosts, watch=watch)[0]
        return joined(parts)


# The last parse of each shard, by its bytes: a keeper's pass over 25,000 hosts reads 196
# shards of which an admission changed one or two; parsing (and checking) all of them
# again took ~1 s. A memo of a pure function of the bytes, so it is the process's, not a
# session's: what it holds is right for every session. A copy is handed out, so no reader
# changes what is kept.
_parsed_shards: dict[tuple[str, int], tuple[bytes, Matrix]] = {}
_parsed_lock = threading.Lock()


def _shard(data: bytes, i: int, root: str) -> Matrix:
    with _parsed_lock:
        known = _parsed_shards.get((root, i))
    if known is not None and known[0] == data:
        return known[1].copy()
    try:
        part = Matrix.from_json(data)
    except (StoreError, ValueError) as err:
        raise MatrixDamaged(damaged_message(root, f"shard {i}: {str(err)[:120]}")) from err
    with _parsed_lock:
        _parsed_shards[(root, i)] = (data, part.copy())
    return part


def _index_of(data: bytes, root: str) -> MatrixIndex:
    try:
        index = MatrixIndex.from_json(data)
    except (ValueError, StoreError) as err:
        raise MatrixDamaged(damaged_message(root, f"its index: {str(err)[:120]}")) from err
    if index is None:
        raise StoreError(bootstrap.previous_layout_message(root))
    return index


def matrix_writes(tx: Any, layout: Layout, old: Matrix, new: Matrix, version: MatrixVersion,
                  check_rest: bool = False) -> tuple[int, MatrixVersion]:
    """Add to ``tx`` what turns the stored ``old`` (read at ``version``) into ``new``: a
    check of the parent (a reshard in between fails it) and a set of each shard whose
    content changed, against the version it was read at; ``check_rest``: also a check of
    every other shard read (a decision that depended on all of them). Writers of different
    shards never conflict. Returns the bytes of the shards it sets (a transaction must
    stay below ZooKeeper's 1 MiB request: see ``TRANSACTION_BYTES``) and the versions the
    matrix has once ``tx`` committed."""
    tx.check(layout.matrix, version.index)
    changed = changed_shards(old, new, version.shards)
    written = 0
    for i, part in changed.items():
        if i not in version.versions:
            raise ValueError(f"matrix shard {i} changed but was not read")
        data = part.to_json()
        tx.set_data(layout.matrix_shard(i), data, version=version.versions[i])
        written += len(data)
    if check_rest:
        for i, shard_version in version.versions.items():
            if i not in changed:
                tx.check(layout.matrix_shard(i), shard_version)
    return written, replace(version, versions={
        i: v + (i in changed) for i, v in version.versions.items()})


TRANSACTION_BYTES = 512 * 1024  # far below ZooKeeper's 1 MiB request (jute.maxbuffer)


class MatrixWatch:
    """``ShardedMatrix.watch``'s persistent recursive watch on the matrix's folder. The keeper's
    own admissions and syncs change a shard or two at every pass, and a DataWatch read the
    shard again each time (~1.7 reads a pass at 32 submitters, in kazoo's callback
    thread, ahead of the record watches' callbacks). The watch lives on the connection:
    after a reconnect it is set again and ``wake`` called (a change meanwhile is not
    named). It ends when ``wake`` returns False (the keeper's term ended)."""

    def __init__(self, store: StoreReads, wake: Callable[..., Any],
                 shards: ShardCache | None = None) -> None:
        self.client = store.client
        self.path = store.layout.matrix
        self.wake = wake
        self.shards = shards
        self.ended = False

    def start(self) -> bool:
        """Set the watch; False when the server has no persistent watches."""
        if not watch_tree(self.client, self.path, self._changed):
            return False
        self.client.add_listener(self._state)
        return True

    def _changed(self, _kind: int, path: str) -> None:
        """From kazoo's connection thread: only the wake (it only takes note)."""
        if self.shards is not None:
            self.shards.changed(path)
        if not self.ended and self.wake() is False:
            self._end()

    def _end(self) -> None:
        self.ended = True
        if self.shards is not None:
            self.shards.enabled = False
        unwatch_tree(self.client, self.path)
        self.client.remove_listener(self._state)

    def _state(self, state: str) -> None:
        if state == KazooState.CONNECTED and not self.ended:
            self.client.handler.spawn(self._again)  # a listener must not block

    def _again(self) -> None:
        """After a reconnect: set it again, then look again (a change meanwhile went
        unnamed; one from now on is named)."""
        if self.ended:
            return
        watch_tree(self.client, self.path, self._changed)
        if self.shards is not None:
            self.shards.invalidate()  # changes while disconnected went unnamed
        if self.wake() is False:
            self._end()


def commit_or_conflict(transaction: Any) -> bool:
    """kazoo's commit() returns errors in its result list instead of raising."""
    results = transaction.commit()
    errors = [r for r in results if isinstance(r, Exception)]
    if not errors:
        return True
    if any(isinstance(e, BadVersionError) for e in errors):
        return False
    real = [e for e in errors if type(e).__name__ != "RolledBackError"]
    if any(isinstance(e, NoAuthError) for e in real):
        raise NotAllowed(f"ZooKeeper refused the transaction to this identity: {real}")
    raise StoreError(f"ZooKeeper refused the transaction: {real or errors}")
