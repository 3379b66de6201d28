"""Allocate and release GPUs and ports as version-checked ZooKeeper transactions.

An allocation writes, in one transaction: the matrix (checked against the version it was
computed from), an ephemeral lease ``leases/<task_key>`` tied to the launcher's session,
and the job record. Two allocators that read the same matrix cannot both win; the loser
re-reads and tries again.

A GPU is free only when its node has confirmed the job's processes dead. The launcher's
own release frees the cells of the hosts where it stopped the tasks itself. If instead the
lease vanishes (the launcher died, or ``hypertf kill``), whoever next syncs the matrix marks
the job ``lost`` (unless it was killed) and its cells ``draining``; the agent of each host
then stops the job's process groups there and frees its own host's cells
(``confirm_drained``). A host whose agent is down keeps its draining cells.
"""

from __future__ import annotations

import getpass
import os
import secrets
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError
from kazoo.retry import ForceRetryError

from hypertf.errors import InsufficientResources, NotAllowed, StoreError, UsageError
from hypertf.jobs import ENDED_BY_OTHERS, mark_lost
from hypertf.matrix import Matrix, same, synced
from hypertf.scheduler import NoFit, Placement, TaskSlot, schedule
from hypertf.store import (
    AgentRecord,
    Store,
    decode,
    encode,
    owner_of,
    until_committed,
)


class RootMissing(StoreError):
    """The root is gone (ZooKeeper lost its data) until the admin secures it again."""


class PortsExhausted(InsufficientResources):
    """A host's port range is used up: planning again elsewhere does not help."""


class OverUserLimit(InsufficientResources):
    """The owner's running jobs plus this one would hold more than hypertf_user_gpu_limit."""


def new_task_key(user: str, now: float | None = None) -> str:
    """Time-based (sortable, readable), random (unique across launchers), then the owner
    (whose ``leases/<user>`` and ``jobs/<user>`` hold the job)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(3)}.{user}"


def _check_registered(store: Store, user: str) -> None:
    """Asked only after a refused allocation: a user without parents cannot hold a job."""
    if store.client.exists(store.layout.user_leases(user)) is None:
        raise StoreError(f"user {user!r} is not registered in ZooKeeper root {store.layout.root}: "
                         f"the cluster admin runs 'hypertf auth add-user {user}'")


def owner_info() -> dict[str, Any]:
    """Who holds the lease: shown by status, useful when a job is left behind."""
    return {"user": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid(),
            "since": time.time()}


@dataclass(frozen=True)
class Request:
    """What a job asks for, on which hosts, with which policy."""

    slots: tuple[TaskSlot, ...]
    hosts: tuple[str, ...]
    policy: str = "round_robin"
    port_ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return sum(slot.gpus for slot in self.slots)

    def describe(self) -> str:
        groups: dict[tuple[str, int], int] = {}
        for slot in self.slots:
            groups[(slot.role, slot.gpus)] = groups.get((slot.role, slot.gpus), 0) + 1
        parts = []
        for (role, gpus), count in groups.items():
            need = f"{gpus} GPU{'s' if gpus != 1 else ''} each" if gpus else "no GPU"
            parts.append(f"{count} {role} ({need})")
        total = self.gpus
        return f"{', '.join(parts)}: {total} GPU{'s' if total != 1 else ''} in all"


@dataclass(frozen=True)
class Grant:
    """What a job got: where each task runs, its GPUs and its port."""

    task_key: str
    placements: tuple[Placement, ...]
    ports: Mapping[str, int]  # task name ("worker:0") -> port
    retries: int = 0

    def address(self, placement: Placement, addresses: Mapping[str, str]) -> str:
        return f"{addresses[placement.host]}:{self.ports[placement.name]}"


def describe_free(matrix: Matrix, records: Mapping[str, AgentRecord], hosts: Sequence[str]) -> str:
    """'h1: 1 of 4 free (GPU 3); h2: agent down' - what the user can ask for instead."""
    parts = []
    for host in hosts:
        if host not in records:
            parts.append(f"{host}: agent down")
            continue
        row = matrix.gpus.get(host, [])
        free = matrix.free(host)
        listed = f" (GPU {', '.join(map(str, free))})" if free else ""
        parts.append(f"{host}: {len(free)} of {len(row)} free{listed}")
    return "; ".join(parts) or "no hosts"


def read_matrix(store: Store) -> tuple[Matrix, int]:
    """The stored matrix and its version (the admin's ``auth init`` creates it)."""
    try:
        data, stat = store.client.get(store.layout.matrix)
    except NoNodeError:
        raise RootMissing(f"ZooKeeper has no matrix under {store.layout.root}: run 'hypertf auth "
                         f"init -i INVENTORY' as the admin") from None
    return Matrix.from_json(data), stat.version


def pick_ports(matrix: Matrix, placements: Sequence[Placement],
                ranges: Mapping[str, tuple[int, int]], exclude: Mapping[str, set[int]],
                ) -> dict[str, int]:
    """One port per task: the lowest in the host's range not reserved and not excluded.

    Predictable ports are easier to firewall and to read in logs; a port found in use by
    something else is excluded on the retry (see the launcher).
    """
    ports: dict[str, int] = {}
    used: dict[str, set[int]] = {}
    for placement in placements:
        host = placement.host
        taken = used.setdefault(host, matrix.reserved_ports(host) | exclude.get(host, set()))
        low, high = ranges.get(host, (20000, 20999))
        port = next((p for p in range(low, high + 1) if p not in taken), None)
        if port is None:
            raise PortsExhausted(
                f"no free port left on {host} in {low}-{high}: widen hypertf_port_range"
            )
        taken.add(port)
        ports[placement.name] = port
    return ports


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


def _place(store: Store, request: Request,
           ) -> tuple[Matrix, Matrix, int, list[Placement]]:
    """Read the matrix (as stored, and as it should be now) and schedule on it (writes
    nothing)."""
    matrix, version = read_matrix(store)
    records = store.records(only=request.hosts)
    current = synced(matrix, records, store.leases())
    live = [host for host in request.hosts if host in records]
    free = {host: current.free(host) for host in live}
    try:
        placements = schedule(free, request.slots, request.policy, cpu_hosts=live)
    except NoFit as err:
        gpus = err.slot.gpus
        need = f"{gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "a live host"
        raise InsufficientResources(
            f"cannot place {err.slot.name} ({need} on one host): asked for "
            f"{request.describe()}; "
            f"free now: {describe_free(current, records, request.hosts)}. "
            f"Ask for fewer tasks or GPUs, or wait for running jobs (hypertf status)."
        ) from None
    return matrix, current, version, placements


def plan(store: Store, request: Request) -> list[Placement]:
    """Where the request would go now: used to preflight only the hosts a job needs."""
    if not request.slots:
        raise UsageError("a job needs at least one task")
    return _place(store, request)[3]


def allocate(store: Store, request: Request, task_key: str,
             job: Mapping[str, Any] | None = None, deadline_s: float = 30.0,
             exclude_ports: Mapping[str, set[int]] | None = None,
             user_gpu_limit: int = 0) -> Grant:
    """Take GPUs and ports for ``request`` atomically, or raise InsufficientResources
    (OverUserLimit when the owner's GPUs would exceed ``user_gpu_limit``, 0: none)."""
    if not request.slots:
        raise UsageError("a job needs at least one task")
    acls = store.acls
    user = owner_of(task_key)

    def attempt(retries: int) -> Grant:
        before, current, version, placements = _place(store, request)
        held = current.held_per_user().get(user, 0)
        if user_gpu_limit and held + request.gpus > user_gpu_limit:
            raise OverUserLimit(f"{user} holds {held} GPUs; this job's {request.gpus} more "
                                f"would pass the limit of {user_gpu_limit} "
                                f"(hypertf_user_gpu_limit)")
        ports = pick_ports(current, placements, request.port_ranges, exclude_ports or {})
        gpus: dict[str, list[int]] = {}
        host_ports: dict[str, list[int]] = {}
        for p in placements:
            gpus.setdefault(p.host, []).extend(p.gpus)
            host_ports.setdefault(p.host, []).append(ports[p.name])
        taken = current.take(task_key, gpus, host_ports)
        owner = {**owner_info(), "user": owner_of(task_key)}
        record = {
            "task_key": task_key,
            "state": "allocated",
            "created": time.time(),
            "owner": owner,
            "policy": request.policy,
            "placements": [
                {"role": p.role, "index": p.index, "host": p.host, "gpus": list(p.gpus),
                 "port": ports[p.name]}
                for p in placements
            ],
            **(job or {}),
        }
        tx = store.client.transaction()
        tx.set_data(store.layout.matrix, taken.to_json(), version=version)
        tx.create(store.layout.lease(task_key), encode(owner), acl=acls.lease(),
                  ephemeral=True)
        tx.create(store.layout.job(task_key), encode(record), acl=acls.job())
        try:
            committed = _commit_or_conflict(tx)
        except StoreError:
            _check_registered(store, owner_of(task_key))  # the likely cause, named
            raise
        if not committed:
            raise ForceRetryError()
        for dead in current.draining_keys() - before.draining_keys():
            mark_lost(store, dead)  # this write drained them: record why
        return Grant(task_key, tuple(placements), ports, retries=retries)

    return until_committed(attempt, "allocating", deadline_s=deadline_s)





def release(store: Store, task_key: str, state: str = "released",
            extra: Mapping[str, Any] | None = None,
            stopped_on: Sequence[str] | None = None) -> bool:
    """Give back what ``task_key`` holds; idempotent. True if something was freed.

    ``stopped_on``: the hosts where the caller has seen the job's processes dead (default
    every host); the job's cells elsewhere turn draining, for their agents to confirm.
    """
    def attempt(_retries: int) -> bool:
        try:
            matrix, version = read_matrix(store)
        except RootMissing:
            return False  # ZooKeeper lost everything, this job's cells with it
        records = store.records(only=matrix.hosts_of(task_key))
        freed = matrix.release({task_key}, records, hosts=stopped_on)
        freed = freed.drain({task_key})  # what is still held: hosts not confirmed
        changed = not same(matrix, freed)
        lease_stat = store.client.exists(store.layout.lease(task_key))
        job_stat = store.client.exists(store.layout.job(task_key))
        tx = store.client.transaction()
        if changed:
            tx.set_data(store.layout.matrix, freed.to_json(), version=version)
        else:
            tx.check(store.layout.matrix, version)
        if lease_stat is not None:
            tx.delete(store.layout.lease(task_key))
        if job_stat is not None:
            data, _ = store.client.get(store.layout.job(task_key))
            job = decode(data, "job record")
            ended = job.get("state") if job.get("state") in ENDED_BY_OTHERS else state
            job.update({"released": time.time(), **(extra or {}), "state": ended})
            tx.set_data(store.layout.job(task_key), encode(job), version=job_stat.version)
        try:
            if _commit_or_conflict(tx):
                return changed or lease_stat is not None
        except StoreError:
            pass  # the lease or the job vanished between the reads: read again
        raise ForceRetryError()

    return until_committed(attempt, f"releasing {task_key}")


def sync_matrix(store: Store) -> tuple[Matrix, dict[str, AgentRecord]]:
    """Bring the stored matrix in line with the records and leases; write only on change.
    Jobs found without a lease are recorded as ``lost`` (unless killed) as their cells
    turn draining."""
    def attempt(_retries: int) -> tuple[Matrix, dict[str, AgentRecord], set[str]]:
        matrix, version = read_matrix(store)
        records = store.records()
        leases = store.leases()
        current = synced(matrix, records, leases)
        if same(matrix, current):
            return current, records, set()
        try:
            store.client.set(store.layout.matrix, current.to_json(), version=version)
        except BadVersionError:
            raise ForceRetryError() from None
        return current, records, matrix.task_keys() - leases

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
        ended = "cancelled" if job.get("state") == "queued" else "killed"
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
    sync_matrix(store)
    return True
