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
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError
from kazoo.protocol.states import EventType, WatchedEvent
from kazoo.retry import ForceRetryError

from hypertf.core import jobtransitions as transitions
from hypertf.core.errors import InsufficientResources, NotAllowed, StoreError, UsageError
from hypertf.core.layout import owner_of
from hypertf.core.matrix import synced
from hypertf.core.placement import Request, cannot_place
from hypertf.core.records import AgentRecord, decode, encode
from hypertf.core.scheduler import Placement, schedule
from hypertf.store.knownrecords import KnownRecords
from hypertf.store.matrixshards import RootMissing, ShardedMatrix, commit_or_conflict
from hypertf.store.retry import until_committed
from hypertf.store.zkstore import StoreReads

__all__ = ["GrantWatch", "StoredMatrix", "owner_info"]


def owner_info() -> dict[str, Any]:
    """Who holds the lease: shown by status, useful when a job is left behind."""
    return {"user": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid(),
            "since": time.time()}


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


GRANT_WATCHES_KEPT = 1024  # per session: a watch nobody waits on is forgotten past this


def _setter(event: threading.Event) -> Callable[[Any], None]:
    return lambda _watched: event.set()


class StoredMatrix(ShardedMatrix):
    """``Store.matrix``: the session's matrix (``ShardedMatrix``) and what launchers,
    agents and tools do with it: plan, release, kill, report drained jobs. The grant
    watches its launcher's reads set are the session's (at most GRANT_WATCHES_KEPT)."""

    def __init__(self, store: StoreReads, known: KnownRecords) -> None:
        super().__init__(store)
        self.known = known
        self._grant_watches: dict[str, GrantWatch] = {}
        self._grant_watches_lock = threading.Lock()

    def plan(self, request: Request) -> list[Placement]:
        """Where the request would go now (writes nothing): the launcher preflights only the
        hosts a job needs; InsufficientResources when it does not fit now."""
        if not request.slots:
            raise UsageError("a job needs at least one task")
        matrix, _ = self.read()
        records = self.store.records(only=request.hosts)
        current = synced(matrix, records, self.store.leases())
        live = [host for host in request.hosts if host in records]
        why = cannot_place(request, current, live)
        if why:
            raise InsufficientResources(why)
        return schedule({host: current.free(host) for host in live}, request.slots,
                        request.policy, cpu_hosts=live)

    def release(self, task_key: str, state: str = "released",
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
        guess = self.known.take(task_key)

        def attempt(_retries: int) -> tuple[bool, list[str] | None]:
            nonlocal lease_gone, guess
            job: dict[str, Any] | None = None
            if guess is not None:
                job, version, guess = guess.record, guess.version, None
            else:
                try:
                    data, job_stat = self.client.get(self.layout.job(task_key))
                    job, version = decode(data, "job record"), job_stat.version
                except NoNodeError:
                    pass
            if lease_gone and job is None:
                return False, None
            tx = self.client.transaction()
            hosts = None
            if job is not None:
                hosts = sorted({str(p.get("host")) for p in job.get("placements") or ()
                                if isinstance(p, dict)})
                ended = transitions.released(job, state, extra or {}, stopped_on, lease_gone,
                                             time.time())
                tx.set_data(self.layout.job(task_key), encode(ended), version=version)
            if not lease_gone:
                tx.delete(self.layout.lease(task_key))
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
                self.wait_settled(task_key, wait_s, hosts)
        return released

    def wait_settled(self, task_key: str, timeout: float,
                     hosts: Sequence[str] | None = None) -> bool:
        """Wait until the matrix no longer shows ``task_key`` holding anything (the keeper has
        freed or drained its cells): with ``hosts`` (where it ran), their shards only, read
        once and again when the watch on them fires. False after ``timeout`` (no keeper yet:
        it will)."""
        deadline = time.monotonic() + timeout
        if self._grant_dropped(task_key, timeout):
            return True
        while True:
            changed = threading.Event()
            try:
                matrix = self.read_shards(hosts, watch=_setter(changed))
            except RootMissing:
                return True
            if task_key not in matrix.task_keys():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            changed.wait(min(left, 1.0))

    def watch_grant(self, task_key: str) -> GrantWatch:
        """A watch to set on the read of ``task_key``'s grant, kept for this client's
        ``release`` (``JobQueue.wait_for_admission`` reads the grant with it);
        ``forget_grant_watch`` when the read found no grant (no watch was set then)."""
        watch = GrantWatch()
        with self._grant_watches_lock:
            kept = self._grant_watches
            kept.pop(task_key, None)
            kept[task_key] = watch
            while len(kept) > GRANT_WATCHES_KEPT:
                del kept[next(iter(kept))]  # the oldest: its release asks ZooKeeper instead
        return watch

    def forget_grant_watch(self, task_key: str) -> GrantWatch | None:
        with self._grant_watches_lock:
            return self._grant_watches.pop(task_key, None)

    def _grant_dropped(self, task_key: str, timeout: float) -> bool:
        """Whether the keeper dropped the job's grant within ``timeout``: it does so only in
        the pass whose sync freed or drained every cell of the job, so a grant that existed
        and went says the matrix is settled, with a watch on this job's znode alone (a watch
        on the shards fired for every client at every admission): the watch its launcher set
        when it read the grant (``watch_grant``), else one set here. False when there was none
        (never admitted, or dropped before): the matrix is read then."""
        known = self.forget_grant_watch(task_key)
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
            if self.client.exists(self.layout.grant(task_key), watch=deleted) is None:
                return False
        except NoAuthError:
            return False  # a root secured before grants existed
        return gone.wait(timeout)

    def report_drained(self, host: str, task_keys: Iterable[str]) -> None:
        """What ``host``'s agent reports once it has seen these ended jobs' processes dead there:
        their keys in its own record's ``drained`` (the keeper frees their draining cells on
        ``host`` at its next sync). Written with the client's credential: the host's agent's,
        or the admin's for hosts that are records a test or a bench publishes itself."""
        def attempt(_retries: int) -> None:
            path = self.layout.resource(host)
            data, stat = self.client.get(path)
            record = AgentRecord.from_json(data)
            keys = sorted(set(record.drained) | set(task_keys))
            try:
                self.client.set(path, replace(record, drained=keys).to_json(),
                                version=stat.version)
            except BadVersionError as err:
                raise ForceRetryError() from err

        until_committed(attempt, f"reporting drained jobs of {host}")

    def kill(self, task_key: str, command: str = "hypertf kill") -> bool:
        """End a job from anywhere: record who killed it and by which ``command`` (``cancelled``
        while it waits in the queue) and drop its lease, in one transaction. Its cells turn
        draining; the agents stop its tasks and free them; its launcher sees the lease gone
        and exits. False if it was neither running nor waiting.

        Only the job's owner and the admin may: ZooKeeper enforces it (DELETE on
        ``leases/<owner>``); the check here only makes the message clear."""
        identity = self.store.credential.identity
        owner = owner_of(task_key)
        if identity not in ("admin", f"user.{owner}"):
            raise NotAllowed(
                f"job {task_key} belongs to {owner}: only {owner} or the cluster admin may end "
                f"it (the admin: HYPERTF_ZK_IDENTITY=admin hypertf kill {task_key})")
        def attempt(_retries: int) -> bool:
            try:
                data, stat = self.client.get(self.layout.job(task_key))
            except NoNodeError:
                raise UsageError(f"no job {task_key!r}; list them with 'hypertf jobs'") from None
            if self.client.exists(self.layout.lease(task_key)) is None:
                return False
            job = transitions.ended_by(decode(data, "job record"),
                                       {**owner_info(), "identity": identity,
                                        "command": command}, time.time())
            tx = self.client.transaction()
            tx.set_data(self.layout.job(task_key), encode(job), version=stat.version)
            tx.delete(self.layout.lease(task_key))
            try:
                if commit_or_conflict(tx):
                    return True
            except NotAllowed as err:
                raise NotAllowed(f"ZooKeeper refused to let {identity} end job {task_key} of "
                                 f"{owner}") from err
            except StoreError:
                pass  # the lease went meanwhile: read again
            raise ForceRetryError()

        if not until_committed(attempt, f"killing job {task_key}"):
            return False
        self.wait_settled(task_key, 5.0)  # the keeper drains its cells; the agents stop it
        return True
