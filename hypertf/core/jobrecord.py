"""A job record (``jobs/<user>/<task key>``, docs/zookeeper-layout.md): its states, its
fields, its summary and the one codec of its placements. Pure: the store reads and writes
records (hypertf.store.jobs), the keeper admits them, the CLI and the dashboard show them.

A record is plain JSON, written by several parties (its launcher, the keeper, ``kill``);
``JobRecord`` names every field any of them writes, so a reader's typo is a type error.
Its states are StrEnum members: each equals its text, so a record read back from JSON
compares equal to them. A record is its owner's writing: the store checks the fields a
reader uses (hypertf.store.jobs ``job_problem``) before anyone trusts them.

``JobSummary`` is what ``summary.json`` holds (the launcher's local copy of a run) and the
record's ``summary`` (its launcher's release): the launcher builds one per attempt
(hypertf.launch.attempt ``summary_of``), the sweep driver reads a trial's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, NotRequired, TypedDict

from hypertf.core.matrix import Held
from hypertf.core.scheduler import Placement


class JobState(StrEnum):
    """Every state a job record holds; each equals its text, so records stay plain JSON and
    older readers keep working."""

    QUEUED = "queued"  # waiting for the keeper
    ALLOCATED = "allocated"  # admitted: placements and ports granted
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    RETRIED = "retried"  # a port clash or a restart: a new attempt has another key
    RELEASED = "released"
    KILLED = "killed"  # hypertf kill of a running job
    CANCELLED = "cancelled"  # hypertf cancel of a waiting one
    LOST = "lost"  # its launcher died without releasing it
    REFUSED = "refused"  # --no-wait and it could not start at once
    PREEMPTED = "preempted"  # the keeper gave its GPUs to another job: its next attempt waits


class RefusedKind(StrEnum):
    """A refused record's ``refused_kind``: why the keeper refused it, when its owner must
    act differently (absent: a ``--no-wait`` job that could not start at once)."""

    INVALID = "invalid"  # refused before the pass: its request is invalid (the launcher exits 2)


LIVE_STATES = (JobState.QUEUED, JobState.ALLOCATED, JobState.STARTING, JobState.RUNNING)
# states a launcher's own release does not overwrite
ENDED_BY_OTHERS = (JobState.KILLED, JobState.CANCELLED, JobState.LOST, JobState.REFUSED)


class Owner(TypedDict):
    """Who holds the lease (also the lease's own payload)."""

    user: str
    host: str
    pid: int
    since: float


class TaskPlacement(TypedDict):
    """One task of an admitted job: where it runs, its GPUs, its port."""

    role: str
    index: int
    host: str
    gpus: list[int]
    port: int


class TaskSummary(TypedDict):
    """One task of an attempt in its summary: where it ran and how it ended."""

    task: str  # "worker:0"
    host: str
    gpus: list[int]
    port: int
    exit_code: int | None
    killed: bool
    end: str  # how it ended, in words (hypertf.core.monitor TaskState.end)
    duration_s: float | None


class AttemptSummary(TypedDict):
    """One attempt of the job (a restart or a port retry is a new attempt with a new key)."""

    attempt: int
    task_key: str
    result: JobState
    message: str  # the first line of its message


class OffloadSummary(TypedDict):
    """The job's matmul offload over its hosts, summed over its tasks
    (hypertf.offload.taskspec ``summarize``)."""

    ops: int
    bytes: int
    fallbacks: int
    local: int
    restarts: int
    seconds: float
    hosts: list[str]
    failed: dict[str, str]  # task -> its last failure
    tasks: dict[str, dict[str, Any]]  # task -> the counts its runner reported


class JobSummary(TypedDict):
    """summary.json: the attempt's placement, ports and task ends, the job's attempts so far
    and its timeline; ``result`` and ``message`` are the job's once it ended."""

    task_key: str
    result: JobState
    message: str
    script: str
    args: list[str]
    inventory: str
    policy: str
    cpu_only: bool
    env: dict[str, list[str]]  # host -> the names of its tasks' --env (never the values)
    wall_s: float
    tasks: list[TaskSummary]
    attempts: list[AttemptSummary]
    timeline: list[dict[str, Any]]  # hypertf.core.timeline Timeline.to_json
    offload: NotRequired[OffloadSummary]  # only with offload hosts


class JobRecord(TypedDict, total=False):
    """Every field of a job record, by who writes it."""

    # the launcher, when it queues the job (JobQueue.enqueue)
    task_key: str
    state: JobState
    created: float
    owner: Owner
    policy: str
    queue: dict[str, Any]  # the request as the keeper reads it (waitqueue.request_to_json)
    script: str
    args: list[str]
    inventory: str
    job_id: str
    attempt: int
    # the keeper, when it admits or refuses it
    placements: list[TaskPlacement]
    admitted: float
    waited_s: float
    refused: float
    refused_reason: str
    refused_kind: RefusedKind
    # its end: the launcher's release, ``kill``/``cancel``, or the sync that finds it lost
    released: float
    summary: JobSummary  # what summary.json says (the launcher's release)
    stopped_on: list[str] | str  # hosts where its tasks were seen dead, or "all"
    killed: float
    killed_by: dict[str, Any]
    cancelled: float
    cancelled_by: dict[str, Any]
    lost: float
    # added by JobRecords.collect (not stored): whether its lease still exists
    alive: bool


def placements_json(placements: Sequence[Placement], ports: Mapping[str, int],
                    ) -> list[TaskPlacement]:
    """The record's ``placements``: each task with its port."""
    return [TaskPlacement(role=p.role, index=p.index, host=p.host, gpus=list(p.gpus),
                          port=ports[p.name]) for p in placements]


def placements_of(record: Mapping[str, Any]) -> tuple[Placement, ...]:
    return tuple(Placement(p["role"], int(p["index"]), p["host"], tuple(p["gpus"]))
                 for p in record.get("placements") or ())


def ports_of(record: Mapping[str, Any]) -> dict[str, int]:
    """Task name ("worker:0") -> port."""
    return {f"{p['role']}:{p['index']}": int(p["port"]) for p in record.get("placements") or ()}


def task_hosts(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(task name, host) of every placed task, in the record's order."""
    return [(f"{p['role']}:{p['index']}", p["host"]) for p in record.get("placements") or ()]


def held_of(record: Mapping[str, Any]) -> Held:
    """What an admitted job's record says it holds, per host (for a new keeper's repairs)."""
    return Held.of(placements_of(record), ports_of(record))
