"""Job records (``jobs/<user>/<task key>``): read, update, list, mark lost, prune.

A record is written by its launcher and, when its launcher died, by whoever syncs the matrix
first (``lost``) or by ``hypertf kill`` (``killed``); a state recorded by someone else is
never overwritten by the launcher's own release. The keeper prunes finished records.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError
from kazoo.protocol.states import WatchedEvent
from kazoo.retry import ForceRetryError

from hypertf.core import jobtransitions as transitions
from hypertf.core.errors import StoreError
from hypertf.core.jobrecord import LIVE_STATES, JobRecord, JobState
from hypertf.store import Store, decode, encode, until_committed
from hypertf.store.zkclient import get_many


def mark_lost(store: Store, task_key: str) -> None:
    """A job whose lease vanished without a release or a kill: its launcher died."""
    with contextlib.suppress(NoNodeError, BadVersionError, StoreError, NoAuthError):
        data, stat = store.client.get(store.layout.job(task_key))
        job = transitions.lost(decode(data, "job record"), time.time())
        if job is not None:
            store.client.set(store.layout.job(task_key), encode(job), version=stat.version)


def read_job(store: Store, task_key: str,
             watch: Callable[[WatchedEvent], Any] | None = None) -> JobRecord | None:
    """The record, None if there is none; ``watch``: a one-shot watch on it (on a missing
    record too: its creation fires it)."""
    try:
        data, _ = store.client.get(store.layout.job(task_key), watch=watch)
    except NoNodeError:
        if watch is not None and store.client.exists(store.layout.job(task_key), watch=watch):
            return read_job(store, task_key, watch)  # created in between
        return None
    return cast(JobRecord, decode(data, "job record"))


def read_jobs(store: Store, task_keys: Iterable[str]) -> dict[str, JobRecord]:
    """The records of ``task_keys`` that exist, in multi-reads (the keeper's sync reads
    every ended job's record in one round trip, not one each)."""
    keys = list(task_keys)
    found: dict[str, JobRecord] = {}
    for key, answer in zip(keys, get_many(store.client, [store.layout.job(k) for k in keys]),
                           strict=True):
        if isinstance(answer, NoNodeError):
            continue
        if isinstance(answer, Exception):
            raise answer
        found[key] = cast(JobRecord, decode(answer[0], "job record"))
    return found


def update_job(store: Store, task_key: str, **changes: Any) -> None:
    """Merge ``changes`` into the job record, version-checked; a state recorded by someone
    else (``killed``, ``lost``) is never overwritten."""
    def attempt(_retries: int) -> None:
        data, stat = store.client.get(store.layout.job(task_key))
        job = transitions.changed(decode(data, "job record"), changes)
        try:
            store.client.set(store.layout.job(task_key), encode(job), version=stat.version)
        except BadVersionError:
            raise ForceRetryError() from None

    until_committed(attempt, f"updating job {task_key}")


def list_jobs(store: Store) -> list[JobRecord]:
    """Every job record, newest first, with ``alive`` telling whether its lease exists."""
    leases = store.leases()
    jobs = []
    for key in sorted(store.job_keys(), reverse=True):
        job = read_job(store, key)
        if job is not None:
            job["alive"] = key in leases
            jobs.append(job)
    return jobs


def _ended_at(job: JobRecord) -> float:
    times = [job.get(k) for k in ("created", "released", "killed", "lost")]
    return max((float(t) for t in times if isinstance(t, (int, float))), default=0.0)


def prune_jobs(store: Store, max_age_s: float, max_records: int,
               now: float | None = None) -> int:
    """Delete the records of finished jobs (no lease) that ended more than ``max_age_s`` ago,
    and the oldest finished ones beyond ``max_records``; running jobs are never pruned.
    Returns how many were deleted."""
    now = time.time() if now is None else now
    keys = store.job_keys()
    leases = store.leases()  # after the list: a listed job without one is over
    finished = []
    for key in keys:
        if key in leases:
            continue
        try:
            job = read_job(store, key)
        except StoreError:
            job = None  # another format or damaged: left for a person to look at
        if job is None:
            continue
        if job.get("state") in LIVE_STATES:
            mark_lost(store, key)  # missed when its cells drained
        finished.append((_ended_at(job), key))
    finished.sort()
    excess = max(0, len(finished) + len(leases) - max_records)
    doomed = [key for i, (ended, key) in enumerate(finished)
              if i < excess or now - ended > max_age_s]
    for key in doomed:
        with contextlib.suppress(NoNodeError, NoAuthError):
            store.client.delete(store.layout.job(key))
    return len(doomed)


def job_state(job: JobRecord) -> str:
    """queued / running while the lease lives; the recorded end state after (``lost`` for a
    live state whose launcher is gone). ``job`` is a list_jobs entry (it has ``alive``)."""
    state = job.get("state", "?")
    if job.get("alive"):
        return JobState.QUEUED if state == JobState.QUEUED else JobState.RUNNING
    return "lost" if state in LIVE_STATES else state
