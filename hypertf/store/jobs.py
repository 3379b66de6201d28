"""Job records (``jobs/<user>/<task key>``): read, update, list, mark lost (``Store.jobs``,
a ``JobRecords`` per session, with the records it knows: hypertf.store.knownrecords).

A record is written by its launcher and, when its launcher died, by whoever syncs the matrix
first (``lost``) or by ``hypertf kill`` (``killed``); a state recorded by someone else is
never overwritten by the launcher's own release. The keeper prunes finished records
(hypertf.keeper.prune).

Every record is its owner's writing, so hostile input: a reader checks its name (a task key
of the folder's user), its JSON (size, depth, ``format``) and the types of the fields it
shows or decides on (``job_problem``). One that fails is *unreadable*: skipped and counted
(``JobList.notes``), never an error that stops ``hypertf jobs``, the dashboard or the keeper
for every user.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError
from kazoo.protocol.states import WatchedEvent, ZnodeStat
from kazoo.retry import ForceRetryError

from hypertf.core import jobtransitions as transitions
from hypertf.core.errors import StoreError
from hypertf.core.jobrecord import LIVE_STATES, JobRecord, JobState
from hypertf.core.layout import is_task_key
from hypertf.core.records import decode, encode
from hypertf.store.knownrecords import KnownRecords
from hypertf.store.retry import until_committed
from hypertf.store.zkclient import get_many
from hypertf.store.zkstore import StoreReads

READ_CHUNK = 1024  # records one read round trip asks for (4 multi-reads): see read_folder

_TIMES = ("created", "admitted", "waited_s", "refused", "released", "killed", "cancelled",
          "lost")
_TEXTS = ("state", "script", "inventory", "job_id", "policy", "refused_reason",
          "refused_kind")
_OBJECTS = ("queue", "summary", "killed_by", "cancelled_by")


TIME_MAX = 1e11  # seconds since 1970 (the year 5138): time.localtime fails far beyond


def _number(value: object) -> bool:
    return (type(value) in (int, float) and math.isfinite(cast(float, value))
            and abs(cast(float, value)) < TIME_MAX)


def _placement_problem(placement: object) -> str | None:
    if not isinstance(placement, dict):
        return "a placement that is not an object"
    if not isinstance(placement.get("role"), str) or not isinstance(placement.get("host"), str):
        return "a placement without a role or host"
    if any(type(placement.get(k)) is not int for k in ("index", "port")):
        return "a placement whose index or port is not an integer"
    gpus = placement.get("gpus")
    if not isinstance(gpus, list) or any(type(g) is not int for g in gpus):
        return "a placement whose gpus are not integers"
    return None


def job_problem(job: Mapping[str, Any], task_key: str) -> str | None:
    """Why a decoded record cannot be shown or decided on (None: it can): the fields a
    reader uses (``hypertf jobs``, the dashboard, the keeper's sync) have their types, and
    its ``task_key`` is its own name (a record in bob's folder cannot pass for root's job)."""
    if job.get("task_key", task_key) != task_key:
        return "its task_key is not its name"
    for name in _TIMES:
        if name in job and not _number(job[name]):
            return f"{name} is not a number"
    for name in _TEXTS:
        if name in job and not isinstance(job[name], str):
            return f"{name} is not text"
    for name in _OBJECTS:
        if name in job and not isinstance(job[name], dict):
            return f"{name} is not an object"
    if "attempt" in job and (type(job["attempt"]) is not int
                             or (job["attempt"] > 1 and "job_id" not in job)):
        return "attempt is not an integer, or a later one names no job_id"
    tasks = job.get("summary", {}).get("tasks", [])
    if not isinstance(tasks, list) or any(not isinstance(t, dict) for t in tasks):
        return "summary's tasks are not a list of objects"
    owner = job.get("owner", {})
    if not isinstance(owner, dict) or any(
            not isinstance(owner.get(k, ""), str) for k in ("user", "host")):
        return "owner is not an object of texts"
    args = job.get("args", [])
    if not isinstance(args, list) or any(not isinstance(a, str) for a in args):
        return "args are not texts"
    stopped = job.get("stopped_on", "all")
    if stopped != "all" and (not isinstance(stopped, list)
                             or any(not isinstance(h, str) for h in stopped)):
        return "stopped_on is neither 'all' nor host names"
    placements = job.get("placements", [])
    if placements is None:
        placements = []
    if not isinstance(placements, list):
        return "placements is not a list"
    for placement in placements:
        problem = _placement_problem(placement)
        if problem:
            return problem
    return None


def readable(data: bytes, task_key: str) -> JobRecord | str:
    """The record in ``data``, or why it is unreadable (never an exception: see the
    module)."""
    try:
        job = decode(data, "job record")
    except StoreError as err:
        return str(err)
    problem = job_problem(job, task_key)
    if problem:
        return f"ZooKeeper holds an unreadable job record: {problem}"
    job.setdefault("task_key", task_key)
    return cast(JobRecord, job)


@dataclass
class Folder:
    """One user's records as read now: each readable record with its znode's stat, and the
    names of those that are not (with why)."""

    user: str
    records: list[tuple[str, JobRecord, ZnodeStat]] = field(default_factory=list)
    unreadable: dict[str, tuple[str, ZnodeStat | None]] = field(default_factory=dict)


@dataclass
class JobList:
    """``JobRecords.collect``'s answer: the readable records, newest first, and per user how many
    records were skipped as unreadable."""

    jobs: list[JobRecord]
    unreadable: dict[str, int]

    def notes(self) -> list[str]:
        """One line per folder with unreadable records, for people."""
        return [f"{count} unreadable record{'s' if count > 1 else ''} skipped in jobs/{user}"
                for user, count in sorted(self.unreadable.items())]


class JobRecords:
    """``Store.jobs``: one session's reads and writes of job records, and the records it
    knows (``known``: what it last wrote, so its next write needs no read)."""

    def __init__(self, store: StoreReads, known: KnownRecords) -> None:
        self.store = store
        self.client, self.layout = store.client, store.layout
        self.known = known

    def mark_lost(self, task_key: str) -> None:
        """A job whose lease vanished without a release or a kill: its launcher died."""
        with contextlib.suppress(NoNodeError, BadVersionError, StoreError, NoAuthError):
            data, stat = self.client.get(self.layout.job(task_key))
            job = transitions.lost(decode(data, "job record"), time.time())
            if job is not None:
                self.client.set(self.layout.job(task_key), encode(job), version=stat.version)

    def read(self, task_key: str,
             watch: Callable[[WatchedEvent], Any] | None = None) -> JobRecord | None:
        """The record, None if there is none; ``watch``: a one-shot watch on it (on a missing
        record too: its creation fires it)."""
        try:
            data, _ = self.client.get(self.layout.job(task_key), watch=watch)
        except NoNodeError:
            if watch is not None and self.client.exists(self.layout.job(task_key), watch=watch):
                return self.read(task_key, watch)  # created in between
            return None
        return cast(JobRecord, decode(data, "job record"))

    def read_many(self, task_keys: Iterable[str]) -> dict[str, JobRecord]:
        """The readable records of ``task_keys`` that exist, in multi-reads (the keeper's sync
        reads every ended job's record in one round trip, not one each). An unreadable one is
        left out, as if there were none (its job counts as lost): one user's junk must not stop
        the keeper's sync for everyone."""
        keys = list(task_keys)
        found: dict[str, JobRecord] = {}
        for key, answer in zip(keys, get_many(self.client, [self.layout.job(k) for k in keys]),
                               strict=True):
            if isinstance(answer, NoNodeError):
                continue
            if isinstance(answer, Exception):
                raise answer
            job = readable(answer[0], key)
            if not isinstance(job, str):
                found[key] = job
        return found

    def update(self, task_key: str, **changes: Any) -> None:
        """Merge ``changes`` into the job record, version-checked; a state recorded by someone
        else (``killed``, ``lost``) is never overwritten."""
        # the record as this client last wrote it (knownrecords): the first try needs no read
        guess = self.known.take(task_key)

        def attempt(_retries: int) -> None:
            nonlocal guess
            if guess is not None:
                record, version, guess = guess.record, guess.version, None
            else:
                data, stat = self.client.get(self.layout.job(task_key))
                record, version = decode(data, "job record"), stat.version
            job = transitions.changed(record, changes)
            try:
                written = self.client.set(self.layout.job(task_key), encode(job),
                                          version=version)
            except BadVersionError as err:
                raise ForceRetryError() from err
            self.known.remember(task_key, dict(job), written.version)

        until_committed(attempt, f"updating job {task_key}")

    def users(self) -> list[str]:
        """The users with a jobs folder."""
        return self.store.users(self.layout.jobs)

    def read_folder(self, user: str, pause: Callable[[], object] = lambda: None,
                    ) -> Folder:
        """Every record in ``jobs/<user>``, read READ_CHUNK at a time in multi-reads, calling
        ``pause`` between chunks. One round trip per chunk, not all at once: a client's requests
        are answered in order, so 400 multi-reads queued ahead of the keeper's admitting
        transaction on the same session would make it wait for all of them. A name that is not
        a task key of ``user`` is unreadable without a read (its stat: None)."""
        folder = Folder(user)
        try:
            names = self.client.get_children(self.layout.user_jobs(user))
        except NoNodeError:
            return folder
        keys = []
        for name in names:
            if is_task_key(name, owner=user):
                keys.append(name)
            else:
                folder.unreadable[name] = ("not a task key of its folder's user", None)
        for start in range(0, len(keys), READ_CHUNK):
            if start:
                pause()
            chunk = keys[start:start + READ_CHUNK]
            for key, answer in zip(chunk, get_many(self.client,
                                                   [self.layout.job(k) for k in chunk]),
                                   strict=True):
                if isinstance(answer, NoNodeError):
                    continue  # deleted meanwhile
                if isinstance(answer, Exception):
                    raise answer
                data, stat = answer
                job = readable(data, key)
                if isinstance(job, str):
                    folder.unreadable[key] = (job, stat)
                else:
                    folder.records.append((key, job, stat))
        return folder

    def collect(self) -> JobList:
        """Every readable job record, newest first (by when ZooKeeper created it, not by a
        date or a key its owner chose: a user's future-dated keys cannot push the others'
        jobs off ``hypertf jobs``), with ``alive`` telling whether its lease exists; the
        unreadable ones counted per user."""
        folders = [self.read_folder(user) for user in self.users()]
        leases = self.store.leases()
        found: list[tuple[int, JobRecord]] = []
        for folder in folders:
            for key, job, stat in folder.records:
                job["alive"] = key in leases
                found.append((stat.czxid, job))
        found.sort(key=lambda pair: pair[0], reverse=True)
        return JobList([job for _, job in found],
                       {f.user: len(f.unreadable) for f in folders if f.unreadable})

    def listing(self) -> list[JobRecord]:
        """``collect``'s records alone."""
        return self.collect().jobs


def job_state(job: JobRecord) -> str:
    """queued / running while the lease lives; the recorded end state after (``lost`` for a
    live state whose launcher is gone). ``job`` is a ``listing`` entry (it has ``alive``)."""
    state = job.get("state", "?")
    if job.get("alive"):
        return JobState.QUEUED if state == JobState.QUEUED else JobState.RUNNING
    return JobState.LOST if state in LIVE_STATES else state
