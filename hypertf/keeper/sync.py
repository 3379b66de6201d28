"""The keeper's sync and repair of the matrix: the stored matrix brought in line with the
agents' records, their reports (``drained``), the leases and the ended jobs' releases;
a damaged shard or index rewritten from the keeper's last good read; running jobs given
back granted cells another write took. Written only on change, skipped when nothing it
goes by moved (``SyncMemo``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.retry import ForceRetryError

from hypertf.core.jobrecord import LIVE_STATES
from hypertf.core.matrix import (
    Held,
    Matrix,
    restored,
    same,
    synced,
)
from hypertf.keeper.recordcache import RecordCache
from hypertf.store import AgentRecord, Store, bootstrap, until_committed
from hypertf.store.matrixshards import MatrixDamaged, MatrixVersion, ShardCache

log = logging.getLogger(__name__)


def ended_job_hosts(job: Mapping[str, Any] | None) -> tuple[bool, list[str] | None]:
    """From an ended job's record: whether its launcher released it, and the hosts where it
    saw its tasks dead (None: every host). (False, None) when nobody confirmed anything (a
    lost launcher, a kill)."""
    if not job or job.get("state") in LIVE_STATES or "stopped_on" not in job:
        return False, None
    hosts = job["stopped_on"]
    return True, None if hosts == "all" else [str(h) for h in hosts]


@dataclass(frozen=True)
class Synced:
    """What a sync left: the matrix as stored now and the versions it is stored at, the
    records it read, and the leases it went by."""

    matrix: Matrix
    version: MatrixVersion
    records: dict[str, AgentRecord]
    leases: set[str]
    ended: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # records it read


@dataclass
class SyncMemo:
    """The inputs of the last sync that found the stored matrix already in line with them:
    a pass whose inputs are the same (the matrix at the same versions, no record's content
    changed, the same hosts registered, no job without a lease, the same live grants)
    would compute the same matrix again, so it does not (25,000 hosts with every GPU held:
    ~0.7 s a pass). Only with a ``RecordCache``, whose ``generation`` says a record moved."""

    key: tuple[Any, ...] | None = None

    def admitted(self, read: MatrixVersion, written: MatrixVersion, keys: Iterable[str]
                 ) -> None:
        """The keeper's admission turned the matrix read at ``read`` (in line, if the memo
        says so) into ``written``: what it added are cells of live grants, so the matrix
        stays in line once those grants count."""
        if self.key is not None and self.key[0] == read:
            self.key = (written, self.key[1], self.key[2], self.key[3] | frozenset(keys))
        else:
            self.key = None


def sync_matrix(store: Store, grants: Mapping[str, Held] | None = None,
                cache: RecordCache | None = None) -> tuple[Matrix, dict[str, AgentRecord]]:
    """Bring the stored matrix in line with the records, the leases and the ended jobs'
    releases; write only on change (the keeper, or the admin). Jobs found without a lease
    and without a release are recorded as ``lost`` (unless killed) as their cells turn
    draining. ``grants`` (the keeper's admissions): running jobs get back granted cells that
    another write took. ``cache``: the keeper's records, read again only where changed."""
    done = sync(store, grants, cache)
    return done.matrix, done.records


def sync(store: Store, grants: Mapping[str, Held] | None = None,
         cache: RecordCache | None = None, last_good: Matrix | None = None,
         repair: bool = False, memo: SyncMemo | None = None,
         registered_hosts: Callable[[], list[str]] | None = None,
         live_leases: Callable[[], set[str]] | None = None,
         drain: Collection[str] = (),
         mark: Callable[[str], None] | None = None,
         shards: ShardCache | None = None) -> Synced:
    """``sync_matrix``, saying also the stored versions and the leases read (after the
    matrix: a job admitted in between is in both), which the keeper's admission goes by.
    Cells an agent reported drained (its record's ``drained``: it saw the job's processes
    dead on its host) are freed on that host only. A damaged shard or index is rewritten
    first when ``repair`` (the keeper's ``last_good`` read fills it; its running grants are
    restored); else MatrixDamaged is raised. ``memo`` (with ``cache``): skip the work
    when nothing it goes by changed since a sync found the matrix in line.
    ``registered_hosts``: the registered hosts as a watch keeps them (the keeper's),
    instead of a listing; ``live_leases``: the leases likewise (``LeaseCache``).
    ``drain``: live jobs whose cells turn draining all the same (preempted ones past their
    notice's deadline: hypertf.keeper.preempter; leave them out of ``grants``, or they are
    restored); ``mark``: how a job found without its lease and release is recorded
    (default ``lost``); ``shards``: the keeper's shards kept between passes (only those
    that changed are read)."""
    def attempt(_retries: int) -> tuple[Synced, set[str]]:
        try:
            matrix, version = store.matrix.read(cache=shards)
        except MatrixDamaged as err:
            if not repair:
                raise
            log.error("%s: rewriting it", err)
            bootstrap.ensure_matrix(store.client, store.layout, store.acls.matrix(), 0,
                                    fallback=last_good)
            raise ForceRetryError() from None
        registered = registered_hosts() if registered_hosts else store.hosts()
        records = cache.records(registered) if cache else store.records(only=registered)
        leases = live_leases() if live_leases else store.leases()
        dead = matrix.task_keys() - leases
        inputs = None
        if memo is not None and cache is not None:
            live_grants = frozenset(k for k in grants or () if k in leases)
            inputs = (version, cache.seen_generation, registered, live_grants)
            if not dead and memo.key == inputs:
                return Synced(matrix, version, records, leases), set()
        current = synced(matrix, records, leases, registered=registered)
        if drain:
            current = current.drain(set(drain))
        current = freed_by_reports(current, records)
        lost = set()
        ended = store.jobs.read_many(dead)  # one round trip for every ended job
        for key in dead:
            released, hosts = ended_job_hosts(ended.get(key))
            if not released:
                lost.add(key)
            else:
                current = current.release({key}, records, hosts=hosts)
        if grants:
            current, repairs = restored(current, grants, leases)
            for line in repairs:
                log.warning("matrix repaired: %s", line)
        if same(matrix, current):
            if memo is not None:
                memo.key = None if dead else inputs
            return Synced(current, version, records, leases, ended), set()
        written = store.matrix.written_version(matrix, current, version)
        if written is None:
            raise ForceRetryError()
        if memo is not None and inputs is not None:  # what it wrote is in line with them
            memo.key = (written, *inputs[1:])  # (a dead job's cells: drained or freed now)
        return Synced(current, written, records, leases, ended), lost

    done, lost = until_committed(attempt, "syncing the matrix")
    for task_key in lost:
        if mark is not None:
            mark(task_key)
        else:
            store.jobs.mark_lost(task_key)
    return done


def freed_by_reports(matrix: Matrix, records: Mapping[str, AgentRecord]) -> Matrix:
    """Free each host's draining cells of the jobs its own agent reported dead there: an
    agent's report counts for its own host only (its credential writes only its record)."""
    result = matrix
    for host, record in records.items():
        if not record.drained:
            continue
        keys = set(record.drained) & result.draining_on(host)
        if keys:
            result = result.release(keys, records, hosts=[host])
    return result
