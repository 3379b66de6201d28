"""The keeper's pruning of finished job records: each user's history bounded on its own.

``hypertf_job_records_max`` bounds *each user's* records (a user's excess prunes only that
user's oldest finished ones), so do three quarters of ``hypertf_user_records_mb`` (their
data: the user's quota is never what refuses their next job for old history), and
``hypertf_job_retention_days`` drops a finished record that nobody changed for that long.
Both go by the znode's ``mtime``: the ZooKeeper server's clock when the record was last
written (by its launcher, ``kill``, or the keeper marking it lost), never a date inside the
record, which its owner writes (bob's records dated 2096 once made the keeper delete every
other user's history). A running job's record
(its lease lives) is never pruned.

An *unreadable* record (hypertf.store.jobs: not JSON, too deep, wrong types) of a finished
job is the user's own junk: it counts in that user's bound and goes like any finished
record, by mtime. A name that is not a task key of its folder's user is left alone and
counted (``hypertf jobs`` says so; the folder's quota bounds them; the admin deletes them).

The prune runs in its own thread (``Pruner``), never in the keeper's admitting loop, reads
a folder in multi-reads a chunk at a time, and deletes at most ``max_deletes`` records per
user per run, a batch per round trip: 100,000 junk records cost the keeper's admissions no
more than a chunk's wait (the session answers its requests in order).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kazoo.exceptions import BadVersionError, KazooException, NoAuthError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from hypertf.core.errors import StoreError
from hypertf.core.jobrecord import LIVE_STATES
from hypertf.store import Store
from hypertf.store.jobs import Folder
from hypertf.store.zkclient import pipelined

log = logging.getLogger(__name__)

PRUNE_AT = 0.75  # of a user's records quota: the oldest finished go past it
DELETES_PER_USER = 2000  # records one run deletes (or marks lost) per user at most
DELETE_BATCH = 200  # deletes sent before their answers are awaited
YIELD_S = 0.005  # the thread's breath between chunks: the keeper's thread gets the GIL
BACKLOG_PAUSE_S = 5.0  # a run that hit its bound runs again this soon (not an interval)


@dataclass
class Pruned:
    """What one run did: records deleted per user, and whether a user had more to go."""

    deleted: dict[str, int] = field(default_factory=dict)
    backlog: bool = False

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


def doomed(folder: Folder, leases: set[str], max_age_s: float, max_records: int,
           now: float, max_bytes: int = 0) -> tuple[list[tuple[str, int]], list[str]]:
    """From one user's folder: the records to delete, oldest written first (name, version),
    and the finished records still in a live state (to mark lost). Only this user's
    records count towards this user's bounds: ``max_records``, and ``max_bytes`` of data
    (0: none), past which the oldest finished go too, so that the user's quota
    (hypertf_user_records_mb) is not what refuses his next job."""
    finished: list[tuple[int, float, str, int]] = []  # (mzxid, mtime in s, name, version)
    live = 0
    stale: list[str] = []
    sizes: dict[str, int] = {}
    for key, job, stat in folder.records:
        sizes[key] = stat.dataLength
        if key in leases:
            live += 1
            continue
        if job.get("state") in LIVE_STATES:
            stale.append(key)  # missed when its cells drained
        finished.append((stat.mzxid, stat.mtime / 1000, key, stat.version))
    for name, (_, stat) in folder.unreadable.items():
        if stat is None:
            continue  # not a task key: never read, left alone (see the module)
        sizes[name] = stat.dataLength
        if name in leases:
            live += 1
            continue
        finished.append((stat.mzxid, stat.mtime / 1000, name, stat.version))
    finished.sort()  # by the zxid of the last write: ZooKeeper's order, no ties
    excess = max(0, len(finished) + live - max_records)
    chosen = [(key, version) for i, (_, written, key, version) in enumerate(finished)
              if i < excess or now - written > max_age_s]
    if max_bytes:
        held = sum(sizes.values()) - sum(sizes[key] for key, _ in chosen)
        going = {key for key, _ in chosen}
        for _, _, key, version in finished:
            if held <= max_bytes:
                break
            if key not in going:
                chosen.append((key, version))
                held -= sizes[key]
    return chosen, stale


def _leases(store: Store, user: str) -> set[str]:
    """The user's live task keys: one listing of its leases folder (bounded by its quota),
    not an ``exists`` per record (100,000 of them queued on the keeper's session would hold
    up its admissions)."""
    return set(store.keys_of(store.layout.leases, user))


def _delete(store: Store, user: str, victims: list[tuple[str, int]]) -> int:
    """Delete ``victims`` (version-checked: a record written meanwhile stays), a batch per
    round trip; how many went."""
    deleted = 0
    for start in range(0, len(victims), DELETE_BATCH):
        batch = victims[start:start + DELETE_BATCH]
        with pipelined(store.client):
            pending = [store.client.delete_async(f"{store.layout.user_jobs(user)}/{name}",
                                                 version=version) for name, version in batch]
        for result in pending:
            with contextlib.suppress(NoNodeError, BadVersionError, NoAuthError):
                result.get(timeout=30)
                deleted += 1
    return deleted


def prune_jobs(store: Store, max_age_s: float, max_records: int, now: float | None = None,
               max_deletes: int = DELETES_PER_USER,
               pause: Callable[[], object] = lambda: None, max_bytes: int = 0) -> Pruned:
    """One run over every user's folder (see the module); ``now`` in the ZooKeeper
    server's epoch seconds (the local clock by default: a skew of minutes is nothing
    against days of retention); ``pause`` is called between chunks of reads."""
    now = time.time() if now is None else now
    done = Pruned()
    for user in store.jobs.users():
        folder = store.jobs.read_folder(user, pause)
        leases = _leases(store, user)  # after the records: a listed one without one is over
        victims, stale = doomed(folder, leases, max_age_s, max_records, now, max_bytes)
        going = {key for key, _ in victims}
        stale = [key for key in stale if key not in going]  # deleted anyway
        if len(victims) + len(stale) > max_deletes:
            done.backlog = True
        victims = victims[:max_deletes]
        for key in stale[:max_deletes - len(victims)]:
            store.jobs.mark_lost(key)
        deleted = _delete(store, user, victims)
        if deleted:
            done.deleted[user] = deleted
        pause()
    return done


class _Deposed(Exception):
    """The term ended during a run: the run stops at its next pause."""


class Pruner:
    """The keeper's prune, in a thread of its own for one keeper term: a run at once and
    every ``interval_s`` while ``active()`` (sooner while a user's backlog lasts)."""

    def __init__(self, store: Store, max_age_s: float, max_records: int, interval_s: float,
                 active: Callable[[], bool], max_bytes: int = 0) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.max_age_s, self.max_records, self.interval_s = max_age_s, max_records, interval_s
        self.active = active
        self.runs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="prune")

    def start(self) -> Pruner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _running(self) -> bool:
        return not self._stop.is_set() and self.active()

    def _breathe(self) -> None:
        """Between chunks: let the keeper's thread have the interpreter; stop a run whose
        term has ended (a deposed keeper deletes nothing more)."""
        self._stop.wait(YIELD_S)
        if not self._running():
            raise _Deposed()

    def _run(self) -> None:
        while self._running():
            pause = self.interval_s
            try:
                pruned = prune_jobs(self.store, self.max_age_s, self.max_records,
                                    pause=self._breathe, max_bytes=self.max_bytes)
                if pruned.total:
                    log.info("pruned %d finished job records (%s)", pruned.total, ", ".join(
                        f"{user}: {n}" for user, n in sorted(pruned.deleted.items())))
                if pruned.backlog:
                    pause = min(pause, BACKLOG_PAUSE_S)
            except _Deposed:
                break
            except (KazooException, KazooTimeoutError, StoreError) as err:
                log.warning("pruning job records failed (%s); trying again later", err)
            except Exception:  # a bug must not end pruning for the term: log, go on
                log.exception("pruning job records failed unexpectedly")
            self.runs += 1
            deadline = time.monotonic() + pause
            while self._running() and time.monotonic() < deadline:
                self._stop.wait(min(1.0, max(0.0, deadline - time.monotonic())))
