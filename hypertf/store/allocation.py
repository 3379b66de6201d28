"""GPUs and ports in the matrix: planning (read-only), release, sync, drain, kill.

There is one way to take GPUs: a job is a request in its owner's folder, and the keeper
admits it (hypertf.store.waitqueue). Only the keeper's identity and the admin write the
matrix (its ACL), so nothing here that a user or an agent runs writes it either:

- ``release`` (the launcher, at the end) records how the job ended and on which hosts it saw
  the tasks dead (``stopped_on``), and drops the lease, in one transaction;
- ``sync_matrix`` (the keeper, on every change) frees the cells of an ended job on the
  hosts its launcher confirmed, turns its other cells ``draining`` (and a job whose lease
  vanished without a release ``lost``), and gives running jobs back any granted cell that
  someone else's write took (``restored``);
- each node's agent reports, in its own record (``drained``; ``report_drained`` writes the
  same for hosts a test publishes), the ended jobs it has seen dead there, and the keeper's
  sync frees their draining cells on that host only (``freed_by_reports``). A host whose
  agent is down keeps its draining cells.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent
from kazoo.retry import ForceRetryError

from hypertf.core import jobtransitions as transitions
from hypertf.core.errors import InsufficientResources, NotAllowed, StoreError, UsageError
from hypertf.core.matrix import (
    Matrix,
    MatrixIndex,
    changed_shards,
    joined,
    shard_of,
    synced,
)
from hypertf.core.placement import Request, cannot_place
from hypertf.core.scheduler import Placement, schedule
from hypertf.store import (
    AgentRecord,
    Layout,
    Store,
    auth,
    decode,
    encode,
    knownrecords,
    owner_of,
    until_committed,
)
from hypertf.store.zkclient import pipelined, unwatch_tree, watch_tree

log = logging.getLogger(__name__)


class RootMissing(StoreError):
    """The root is gone (ZooKeeper lost its data) until the admin secures it again."""


class MatrixDamaged(StoreError):
    """A shard or the index holds what no keeper wrote: the keeper rewrites it from its own
    state at its next pass; until then every command says so, naming the admin's repair."""


def damaged_message(root: str, what: str) -> str:
    return (f"the GPU matrix under {root} is damaged ({what}): the keeper rewrites it within "
            f"seconds; if this stays, the cluster admin runs 'hypertf auth init -i "
            f"INVENTORY' (it rewrites a damaged index or shard; running jobs keep their GPUs)")


def check_registered(store: Store, user: str) -> None:
    """Asked only after a refused request: a user without parents cannot hold a job."""
    if store.client.exists(store.layout.user_leases(user)) is None:
        raise StoreError(f"user {user!r} is not registered in ZooKeeper root {store.layout.root}: "
                         f"the cluster admin runs 'hypertf auth add-user {user}'")


def owner_info() -> dict[str, Any]:
    """Who holds the lease: shown by status, useful when a job is left behind."""
    return {"user": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid(),
            "since": time.time()}


@dataclass(frozen=True)
class MatrixVersion:
    """What a read of the matrix saw, for a version-checked write of what it changed."""

    index: int  # the parent's version: it changes only when ``auth init`` reshards
    shards: int  # how many shards there are
    versions: Mapping[int, int]  # the version of each shard read


# Shards per client (the parent's count, read with the shards in one round trip; a client
# whose guess is stale reads again): every reader knows the count after its first read.
_shard_counts: weakref.WeakKeyDictionary[KazooClient, int] = weakref.WeakKeyDictionary()


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


def read_matrix(store: Store, hosts: Iterable[str] | None = None,
                watch: Callable[..., Any] | None = None,
                cache: ShardCache | None = None) -> tuple[Matrix, MatrixVersion]:
    """The stored matrix (the admin's ``auth init`` creates it) and the versions it was read
    at: the parent and every shard (with ``hosts``, only their shards: the matrix returned
    then holds the rows of those shards, the others' are left out), pipelined, in one
    round trip once this client knows the shard count. ``watch``: set on each shard read.
    ``cache`` (the keeper's): only the shards that changed are read."""
    try:
        return _read_matrix(store, hosts, watch, cache)
    except BaseException:
        if cache is not None:
            cache.invalidate()  # a shard it should have read may not have been kept
        raise


def _read_matrix(store: Store, hosts: Iterable[str] | None,
                 watch: Callable[..., Any] | None,
                 cache: ShardCache | None) -> tuple[Matrix, MatrixVersion]:
    client, layout = store.client, store.layout
    count = _shard_counts.get(client)
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
            count = _shard_counts[client] = index.shards
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


# The last parse of each shard, by its bytes: a keeper's pass over 25,000 hosts reads 196
# shards of which an admission changed one or two; parsing (and checking) all of them
# again took ~1 s. A copy is handed out, so no reader changes what is kept.
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
        raise MatrixDamaged(damaged_message(root, f"shard {i}: {str(err)[:120]}")) from None
    with _parsed_lock:
        _parsed_shards[(root, i)] = (data, part.copy())
    return part


def _index_of(data: bytes, root: str) -> MatrixIndex:
    try:
        index = MatrixIndex.from_json(data)
    except (ValueError, StoreError) as err:
        raise MatrixDamaged(damaged_message(root, f"its index: {str(err)[:120]}")) from None
    if index is None:
        raise StoreError(auth.previous_layout_message(root))
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


def write_matrix(store: Store, old: Matrix, new: Matrix, version: MatrixVersion) -> bool:
    return written_version(store, old, new, version) is not None


def written_version(store: Store, old: Matrix, new: Matrix,
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
        tx = store.client.transaction()
        tx.check(store.layout.matrix, version.index)
        for i, data in batch:
            tx.set_data(store.layout.matrix_shard(i), data, version=version.versions[i])
        if not _commit_or_conflict(tx):
            return None
    versions = dict(version.versions)
    for batch in batches:
        for i, _ in batch:
            versions[i] += 1
    return MatrixVersion(version.index, version.shards, versions)


def overwrite_matrix(store: Store, matrix: Matrix) -> None:
    """Make the stored matrix ``matrix``, whatever it holds (an agent's or the admin's
    credential: benches and tests standing in for a damaged or forged matrix)."""
    def attempt(_retries: int) -> None:
        old, version = read_matrix(store)
        if not write_matrix(store, old, matrix, version):
            raise ForceRetryError()

    until_committed(attempt, "writing the matrix")


def watch_matrix(store: Store, wake: Callable[..., Any],
                 shards: ShardCache | None = None) -> None:
    """Call ``wake`` whenever a shard of the matrix changes, until it returns False: one
    persistent recursive watch on the matrix (``MatrixWatch``), so a change costs no read;
    on a server without them (before ZooKeeper 3.6), a DataWatch on each shard, which
    reads the shard again at each change. ``shards`` (the keeper's cache) learns which
    shard changed, and is enabled only with the persistent watch."""
    if MatrixWatch(store, wake, shards).start():
        if shards is not None:
            shards.enabled = True
        return
    _, version = read_matrix(store, hosts=())
    for i in range(version.shards):
        store.client.DataWatch(store.layout.matrix_shard(i), wake)


class MatrixWatch:
    """``watch_matrix``'s persistent recursive watch on the matrix's folder. The keeper's
    own admissions and syncs change a shard or two at every pass, and a DataWatch read the
    shard again each time (~1.7 reads a pass at 32 submitters, in kazoo's callback
    thread, ahead of the record watches' callbacks). The watch lives on the connection:
    after a reconnect it is set again and ``wake`` called (a change meanwhile is not
    named). It ends when ``wake`` returns False (the keeper's term ended)."""

    def __init__(self, store: Store, wake: Callable[..., Any],
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


def watch_shard_of(store: Store, host: str, wake: Callable[..., Any]) -> None:
    """Call ``wake`` whenever the shard holding ``host``'s row changes: its agent learns at
    once that the keeper marked cells of its host draining (a reshard: at its next sweep)."""
    _, version = read_matrix(store, hosts=())
    store.client.DataWatch(store.layout.matrix_shard(shard_of(host, version.shards)), wake)


def _commit_or_conflict(transaction: Any) -> bool:
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


def plan(store: Store, request: Request) -> list[Placement]:
    """Where the request would go now (writes nothing): the launcher preflights only the
    hosts a job needs; InsufficientResources when it does not fit now."""
    if not request.slots:
        raise UsageError("a job needs at least one task")
    matrix, _ = read_matrix(store)
    records = store.records(only=request.hosts)
    current = synced(matrix, records, store.leases())
    live = [host for host in request.hosts if host in records]
    why = cannot_place(request, current, live)
    if why:
        raise InsufficientResources(why)
    return schedule({host: current.free(host) for host in live}, request.slots,
                    request.policy, cpu_hosts=live)


def release(store: Store, task_key: str, state: str = "released",
            extra: Mapping[str, Any] | None = None,
            stopped_on: Sequence[str] | None = None, wait_s: float = 10.0,
            meanwhile: Callable[[], object] | None = None) -> bool:
    """Give back what ``task_key`` holds; idempotent. True if its lease was still there.

    Records the end (``state``, ``extra``) and ``stopped_on`` (the hosts where the caller
    has seen the job's processes dead; None: every host, nothing ran) and drops the lease,
    in one transaction. The keeper frees the cells on those hosts and drains the others
    for their agents to confirm; this waits up to ``wait_s`` for the keeper to have done
    so, so that a command that ends here leaves the matrix as it says. ``meanwhile`` (the
    launcher's log collection) runs between the transaction and that wait, while the
    keeper works; it runs even if the wait is not made."""
    lease_gone = False  # learnt from a transaction that failed on its delete
    # the record as this client last wrote it (knownrecords): the first try needs no read
    guess = knownrecords.take(store, task_key)

    def attempt(_retries: int) -> tuple[bool, list[str] | None]:
        nonlocal lease_gone, guess
        job: dict[str, Any] | None = None
        if guess is not None:
            job, version, guess = guess.record, guess.version, None
        else:
            try:
                data, job_stat = store.client.get(store.layout.job(task_key))
                job, version = decode(data, "job record"), job_stat.version
            except NoNodeError:
                pass
        if lease_gone and job is None:
            return False, None
        tx = store.client.transaction()
        hosts = None
        if job is not None:
            hosts = sorted({str(p.get("host")) for p in job.get("placements") or ()
                            if isinstance(p, dict)})
            ended = transitions.released(job, state, extra or {}, stopped_on, lease_gone,
                                         time.time())
            tx.set_data(store.layout.job(task_key), encode(ended), version=version)
        if not lease_gone:
            tx.delete(store.layout.lease(task_key))
        results = tx.commit()
        if not any(isinstance(r, Exception) for r in results):
            return not lease_gone, hosts
        if not lease_gone and isinstance(results[-1], NoNodeError):
            lease_gone = True  # killed, lost or released already: record the end only
        raise ForceRetryError()  # or the record changed between the read and the write

    released, hosts = until_committed(attempt, f"releasing {task_key}")
    try:
        if meanwhile is not None:
            meanwhile()
    finally:
        if released and wait_s > 0:
            wait_settled(store, task_key, wait_s, hosts)
    return released


def wait_settled(store: Store, task_key: str, timeout: float,
                 hosts: Sequence[str] | None = None) -> bool:
    """Wait until the matrix no longer shows ``task_key`` holding anything (the keeper has
    freed or drained its cells): with ``hosts`` (where it ran), their shards only, read
    once and again when the watch on them fires. False after ``timeout`` (no keeper yet:
    it will)."""
    deadline = time.monotonic() + timeout
    if _grant_dropped(store, task_key, timeout):
        return True
    while True:
        changed = threading.Event()
        try:
            matrix = read_shards(store, hosts, watch=_setter(changed))
        except RootMissing:
            return True
        if task_key not in matrix.task_keys():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        changed.wait(min(left, 1.0))


class GrantWatch:
    """A watch on a job's grant, set by the launcher's read of it (``watch_grant``): the
    keeper's deletion of the grant sets ``gone``; any other event (the grant changed, the
    session expired) makes it ``unknown``, and ``wait_settled`` then asks ZooKeeper as if
    there were none. Saves the release a request and a round trip: the watch is set by the
    read the launcher makes anyway, when it is admitted."""

    def __init__(self) -> None:
        self.gone = threading.Event()
        self.unknown = False

    def __call__(self, event: WatchedEvent) -> None:
        if event.type != EventType.DELETED:
            self.unknown = True
        self.gone.set()


GRANT_WATCHES_KEPT = 1024  # per client: a watch nobody waits on is forgotten past this
_grant_watches: weakref.WeakKeyDictionary[KazooClient, dict[str, GrantWatch]] = \
    weakref.WeakKeyDictionary()
_grant_watches_lock = threading.Lock()


def watch_grant(store: Store, task_key: str) -> GrantWatch:
    """A watch to set on the read of ``task_key``'s grant, kept for this client's
    ``release`` (hypertf.store.waitqueue.wait_for_admission reads the grant with it);
    ``forget_grant_watch`` when the read found no grant (no watch was set then)."""
    watch = GrantWatch()
    with _grant_watches_lock:
        kept = _grant_watches.setdefault(store.client, {})
        kept.pop(task_key, None)
        kept[task_key] = watch
        while len(kept) > GRANT_WATCHES_KEPT:
            del kept[next(iter(kept))]  # the oldest: its release asks ZooKeeper instead
    return watch


def forget_grant_watch(store: Store, task_key: str) -> GrantWatch | None:
    with _grant_watches_lock:
        return _grant_watches.get(store.client, {}).pop(task_key, None)


def _grant_dropped(store: Store, task_key: str, timeout: float) -> bool:
    """Whether the keeper dropped the job's grant within ``timeout``: it does so only in
    the pass whose sync freed or drained every cell of the job, so a grant that existed
    and went says the matrix is settled, with a watch on this job's znode alone (a watch
    on the shards fired for every client at every admission): the watch its launcher set
    when it read the grant (``watch_grant``), else one set here. False when there was none
    (never admitted, or dropped before): the matrix is read then."""
    known = forget_grant_watch(store, task_key)
    if known is not None and not known.unknown:
        if known.gone.wait(timeout):
            if not known.unknown:
                return True
        else:
            return False
    gone = threading.Event()

    def deleted(event: WatchedEvent) -> None:
        if event.type == EventType.DELETED:
            gone.set()

    try:
        if store.client.exists(store.layout.grant(task_key), watch=deleted) is None:
            return False
    except NoAuthError:
        return False  # a root secured before grants existed
    return gone.wait(timeout)


def read_shards(store: Store, hosts: Sequence[str] | None,
                watch: Callable[..., Any] | None = None) -> Matrix:
    """The rows of ``hosts`` (every row: None), for reading only: once this client knows
    the shard count, just their shards, without the index (a reshard between two reads is
    an admin's rare act; a shard gone sends it to ``read_matrix``)."""
    count = _shard_counts.get(store.client)
    if not hosts or count is None:
        return read_matrix(store, hosts, watch=watch)[0]
    wanted = sorted({shard_of(h, count) for h in hosts})
    with pipelined(store.client):
        pending = [store.client.get_async(store.layout.matrix_shard(i), watch=watch)
                   for i in wanted]
    parts = []
    for i, result in zip(wanted, pending, strict=True):
        try:
            parts.append(_shard(result.get(timeout=30)[0], i, store.layout.root))
        except NoNodeError:
            _shard_counts.pop(store.client, None)
            return read_matrix(store, hosts, watch=watch)[0]
    return joined(parts)


def _setter(event: threading.Event) -> Callable[[Any], None]:
    return lambda _watched: event.set()


def report_drained(store: Store, host: str, task_keys: Iterable[str]) -> None:
    """What ``host``'s agent reports once it has seen these ended jobs' processes dead there:
    their keys in its own record's ``drained`` (the keeper frees their draining cells on
    ``host`` at its next sync). Written with the client's credential: the host's agent's,
    or the admin's for hosts that are records a test or a bench publishes itself."""
    def attempt(_retries: int) -> None:
        path = store.layout.resource(host)
        data, stat = store.client.get(path)
        record = AgentRecord.from_json(data)
        keys = sorted(set(record.drained) | set(task_keys))
        try:
            store.client.set(path, replace(record, drained=keys).to_json(),
                             version=stat.version)
        except BadVersionError:
            raise ForceRetryError() from None

    until_committed(attempt, f"reporting drained jobs of {host}")


def kill(store: Store, task_key: str, command: str = "hypertf kill") -> bool:
    """End a job from anywhere: record who killed it and by which ``command`` (``cancelled``
    while it waits in the queue) and drop its lease, in one transaction. Its cells turn
    draining; the agents stop its tasks and free them; its launcher sees the lease gone
    and exits. False if it was neither running nor waiting.

    Only the job's owner and the admin may: ZooKeeper enforces it (DELETE on
    ``leases/<owner>``); the check here only makes the message clear."""
    identity = store.credential.identity
    owner = owner_of(task_key)
    if identity not in ("admin", f"user.{owner}"):
        raise NotAllowed(
            f"job {task_key} belongs to {owner}: only {owner} or the cluster admin may end "
            f"it (the admin: HYPERTF_ZK_IDENTITY=admin hypertf kill {task_key})")
    def attempt(_retries: int) -> bool:
        try:
            data, stat = store.client.get(store.layout.job(task_key))
        except NoNodeError:
            raise UsageError(f"no job {task_key!r}; list them with 'hypertf jobs'") from None
        if store.client.exists(store.layout.lease(task_key)) is None:
            return False
        job = transitions.ended_by(decode(data, "job record"),
                                   {**owner_info(), "identity": identity,
                                    "command": command}, time.time())
        tx = store.client.transaction()
        tx.set_data(store.layout.job(task_key), encode(job), version=stat.version)
        tx.delete(store.layout.lease(task_key))
        try:
            if _commit_or_conflict(tx):
                return True
        except NotAllowed:
            raise NotAllowed(f"ZooKeeper refused to let {identity} end job {task_key} of "
                             f"{owner}") from None
        except StoreError:
            pass  # the lease went meanwhile: read again
        raise ForceRetryError()

    if not until_committed(attempt, f"killing job {task_key}"):
        return False
    wait_settled(store, task_key, 5.0)  # the keeper drains its cells; the agents stop it
    return True
