"""GPUs and ports in the matrix: planning (read-only), release, sync, drain, kill.

There is one way to take GPUs: a job is a request in its owner's folder, and the keeper
admits it (hypertf.store.waitqueue). Users never write the matrix (its ACL lets only the agents
and the admin), so nothing here that a user runs writes it either:

- ``release`` (the launcher, at the end) records how the job ended and on which hosts it saw
  the tasks dead (``stopped_on``), and drops the lease, in one transaction;
- ``sync_matrix`` (the keeper, on every change) frees the cells of an ended job on the
  hosts its launcher confirmed, turns its other cells ``draining`` (and a job whose lease
  vanished without a release ``lost``), and gives running jobs back any granted cell that
  someone else's write took (``restored``);
- ``confirm_drained`` (each node's agent) frees its own host's draining cells once it has
  seen the job's processes dead there. A host whose agent is down keeps its draining cells.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError
from kazoo.retry import ForceRetryError

from hypertf.core.errors import InsufficientResources, NotAllowed, StoreError, UsageError
from hypertf.core.jobrecord import ENDED_BY_OTHERS, LIVE_STATES, JobState
from hypertf.core.matrix import Held, Matrix, restored, same, synced
from hypertf.core.placement import Request, cannot_place
from hypertf.core.scheduler import Placement, schedule
from hypertf.store import (
    AgentRecord,
    Store,
    decode,
    encode,
    owner_of,
    until_committed,
)
from hypertf.store.jobs import mark_lost, read_job

log = logging.getLogger(__name__)


class RootMissing(StoreError):
    """The root is gone (ZooKeeper lost its data) until the admin secures it again."""


def check_registered(store: Store, user: str) -> None:
    """Asked only after a refused request: a user without parents cannot hold a job."""
    if store.client.exists(store.layout.user_leases(user)) is None:
        raise StoreError(f"user {user!r} is not registered in ZooKeeper root {store.layout.root}: "
                         f"the cluster admin runs 'hypertf auth add-user {user}'")


def owner_info() -> dict[str, Any]:
    """Who holds the lease: shown by status, useful when a job is left behind."""
    return {"user": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid(),
            "since": time.time()}


def read_matrix(store: Store) -> tuple[Matrix, int]:
    """The stored matrix and its version (the admin's ``auth init`` creates it)."""
    try:
        data, stat = store.client.get(store.layout.matrix)
    except NoNodeError:
        raise RootMissing(f"ZooKeeper has no matrix under {store.layout.root}: run 'hypertf auth "
                         f"init -i INVENTORY' as the admin") from None
    return Matrix.from_json(data), stat.version


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
            stopped_on: Sequence[str] | None = None, wait_s: float = 10.0) -> bool:
    """Give back what ``task_key`` holds; idempotent. True if its lease was still there.

    Records the end (``state``, ``extra``) and ``stopped_on`` (the hosts where the caller
    has seen the job's processes dead; None: every host, nothing ran) and drops the lease,
    in one transaction. The keeper frees the cells on those hosts and drains the others
    for their agents to confirm; this waits up to ``wait_s`` for the keeper to have done
    so, so that a command that ends here leaves the matrix as it says."""
    def attempt(_retries: int) -> bool:
        lease_stat = store.client.exists(store.layout.lease(task_key))
        try:
            data, job_stat = store.client.get(store.layout.job(task_key))
        except NoNodeError:
            data, job_stat = b"", None
        if lease_stat is None and job_stat is None:
            return False
        tx = store.client.transaction()
        if job_stat is not None:
            job = decode(data, "job record")
            ended = job.get("state") if job.get("state") in ENDED_BY_OTHERS else state
            job.update({"released": time.time(), **(extra or {}), "state": ended})
            if lease_stat is not None:  # after a kill the agents confirm every host
                job["stopped_on"] = "all" if stopped_on is None else sorted(stopped_on)
            tx.set_data(store.layout.job(task_key), encode(job), version=job_stat.version)
        if lease_stat is not None:
            tx.delete(store.layout.lease(task_key))
        try:
            if _commit_or_conflict(tx):
                return lease_stat is not None
        except StoreError:
            pass  # the lease or the job vanished between the reads: read again
        raise ForceRetryError()

    released = until_committed(attempt, f"releasing {task_key}")
    if released and wait_s > 0:
        wait_settled(store, task_key, wait_s)
    return released


def wait_settled(store: Store, task_key: str, timeout: float) -> bool:
    """Wait until the matrix no longer shows ``task_key`` holding anything (the keeper has
    freed or drained its cells). False after ``timeout`` (no keeper yet: it will)."""
    deadline = time.monotonic() + timeout
    while True:
        changed = threading.Event()
        try:
            data, _ = store.client.get(store.layout.matrix, watch=_setter(changed))
        except NoNodeError:
            return True
        if task_key not in Matrix.from_json(data).task_keys():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        changed.wait(min(left, 1.0))


def _setter(event: threading.Event) -> Callable[[Any], None]:
    return lambda _watched: event.set()


def ended_job_hosts(job: Mapping[str, Any] | None) -> tuple[bool, list[str] | None]:
    """From an ended job's record: whether its launcher released it, and the hosts where it
    saw its tasks dead (None: every host). (False, None) when nobody confirmed anything (a
    lost launcher, a kill)."""
    if not job or job.get("state") in LIVE_STATES or "stopped_on" not in job:
        return False, None
    hosts = job["stopped_on"]
    return True, None if hosts == "all" else [str(h) for h in hosts]


def sync_matrix(store: Store, grants: Mapping[str, Held] | None = None,
                ) -> tuple[Matrix, dict[str, AgentRecord]]:
    """Bring the stored matrix in line with the records, the leases and the ended jobs'
    releases; write only on change (the keeper, or the admin). Jobs found without a lease
    and without a release are recorded as ``lost`` (unless killed) as their cells turn
    draining. ``grants`` (the keeper's admissions): running jobs get back granted cells that
    another write took."""
    def attempt(_retries: int) -> tuple[Matrix, dict[str, AgentRecord], set[str]]:
        matrix, version = read_matrix(store)
        registered = store.hosts()
        records = store.records(only=registered)
        leases = store.leases()
        current = synced(matrix, records, leases, registered=registered)
        dead = matrix.task_keys() - leases
        lost = set()
        for key in dead:
            released, hosts = ended_job_hosts(read_job(store, key))
            if not released:
                lost.add(key)
            else:
                current = current.release({key}, records, hosts=hosts)
        if grants:
            current, repairs = restored(current, grants, leases)
            for line in repairs:
                log.warning("matrix repaired: %s", line)
        if same(matrix, current):
            return current, records, set()
        try:
            store.client.set(store.layout.matrix, current.to_json(), version=version)
        except BadVersionError:
            raise ForceRetryError() from None
        return current, records, lost

    current, records, lost = until_committed(attempt, "syncing the matrix")
    for task_key in lost:
        mark_lost(store, task_key)
    return current, records


def confirm_drained(store: Store, host: str,
                    task_keys: set[str]) -> bool:
    """The agent of ``host`` has seen these jobs' processes dead there: free their cells
    and ports on ``host`` (only). True if something was freed."""
    def attempt(_retries: int) -> bool:
        matrix, version = read_matrix(store)
        records = store.records(only=[host])
        freed = matrix.release(task_keys & matrix.draining_on(host), records, hosts=[host])
        if same(matrix, freed):
            return False
        try:
            store.client.set(store.layout.matrix, freed.to_json(), version=version)
        except BadVersionError:
            raise ForceRetryError() from None
        return True

    return until_committed(attempt, f"freeing drained GPUs on {host}")


def kill(store: Store, task_key: str) -> bool:
    """End a job from anywhere: record who killed it (``cancelled`` while it waits in the
    queue) and drop its lease, in one transaction. Its cells turn draining; the agents stop
    its tasks and free them; its launcher sees the lease gone and exits. False if it was
    neither running nor waiting.

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
        job = decode(data, "job record")
        ended = JobState.CANCELLED if job.get("state") == JobState.QUEUED else JobState.KILLED
        job.update({"state": ended, ended: time.time(),
                    f"{ended}_by": {**owner_info(), "identity": identity}})
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
