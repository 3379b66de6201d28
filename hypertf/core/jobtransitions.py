"""Every change of a job record, and who makes it: the one place a record is built.

A record (``jobs/<user>/<task key>``, hypertf.core.jobrecord) goes

    queued --keeper--> allocated --launcher--> starting --launcher--> its end
       |                   \\                                   (succeeded, failed, ...)
       +--keeper--> refused  +--kill--> killed      +--sync--> lost (launcher gone)
       +--cancel--> cancelled

and each arrow is a function here, named after it, taking the record as read and returning
the record to write. Pure: the store reads, version-checks and writes (waitqueue: queued,
held, admitted, refused; allocation: released, ended_by; jobs: lost, changed), so the
rules (an end recorded by someone else is never overwritten; a refused record that was
unreadable keeps only its key; only a live job is marked lost) live in one module.
Who may write what is ZooKeeper's ACLs' business (docs/zookeeper-layout.md); ``WRITERS``
names, per target state, the party whose credential writes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, cast

from hypertf.core.jobrecord import (
    ENDED_BY_OTHERS,
    LIVE_STATES,
    JobRecord,
    JobState,
    Owner,
    RefusedKind,
    placements_json,
)
from hypertf.core.scheduler import Placement


class Writer(StrEnum):
    """Who writes a transition (with its own credential)."""

    LAUNCHER = "launcher"  # the job's owner: queues it, starts it, records its end
    KEEPER = "keeper"  # admits or refuses it (with the grant, in one transaction)
    KILL = "kill"  # ``hypertf kill``/``cancel``: the owner or the admin
    SYNC = "sync"  # the keeper's sync, finding a live job without its lease


WRITERS: Mapping[JobState, Writer] = {
    JobState.QUEUED: Writer.LAUNCHER,
    JobState.ALLOCATED: Writer.KEEPER,
    JobState.REFUSED: Writer.KEEPER,
    JobState.STARTING: Writer.LAUNCHER,
    JobState.RUNNING: Writer.LAUNCHER,
    JobState.SUCCEEDED: Writer.LAUNCHER,
    JobState.FAILED: Writer.LAUNCHER,
    JobState.INTERRUPTED: Writer.LAUNCHER,
    JobState.RETRIED: Writer.LAUNCHER,
    JobState.RELEASED: Writer.LAUNCHER,
    JobState.KILLED: Writer.KILL,
    JobState.CANCELLED: Writer.KILL,
    JobState.LOST: Writer.SYNC,
    # on the keeper's notice (its launcher's release; the sync's ``preempted`` when the
    # launcher went away first)
    JobState.PREEMPTED: Writer.LAUNCHER,
}


def queued(task_key: str, owner: Owner, queue: Mapping[str, Any], policy: str,
           extra: Mapping[str, Any], now: float) -> JobRecord:
    """The launcher's new record: its request (``queue``, waitqueue.request_to_json) and
    what it says about itself (``extra``: script, arguments, inventory...)."""
    record = {"task_key": task_key, "state": JobState.QUEUED, "created": now,
              "owner": owner, "policy": policy, "placements": [], "queue": dict(queue),
              **extra}
    return cast(JobRecord, record)


def held(record: Mapping[str, Any], hold: bool) -> JobRecord:
    """``hypertf hold``/``unhold`` (the launcher's owner): only a waiting job; ValueError
    names its state otherwise."""
    if record.get("state") != JobState.QUEUED or not isinstance(record.get("queue"), dict):
        raise ValueError(str(record.get("state")))
    return cast(JobRecord, {**record, "queue": {**record["queue"], "held": hold}})


def admitted(record: Mapping[str, Any] | None, placements: Sequence[Placement],
             ports: Mapping[str, int], now: float) -> JobRecord:
    """The keeper's admission: where each task runs (the grant says the same, and is what
    a launcher starts on) and how long it waited."""
    base = dict(record or {})
    created = base.get("created", now)
    waited = now - float(created) if isinstance(created, (int, float)) else 0.0
    return cast(JobRecord, {**base, "state": JobState.ALLOCATED, "admitted": now,
                            "waited_s": round(waited, 3),
                            "placements": placements_json(placements, ports)})


def refused(record: Mapping[str, Any] | None, task_key: str, why: str, invalid: bool,
            now: float) -> JobRecord:
    """The keeper's refusal, with the reason its owner reads. A record that could not be
    read or checked (None) keeps only its key: its request is what was wrong."""
    base: dict[str, Any] = {"task_key": task_key} if record is None else dict(record)
    return cast(JobRecord, {**base, "state": JobState.REFUSED, "refused": now,
                            "refused_reason": why,
                            **({"refused_kind": RefusedKind.INVALID} if invalid else {})})


def changed(record: Mapping[str, Any], changes: Mapping[str, Any]) -> JobRecord:
    """The launcher's own changes (``starting``, its summary...): merged, except that an
    end someone else recorded (killed, cancelled, lost, refused) keeps its state."""
    kept = ({k: v for k, v in changes.items() if k != "state"}
            if record.get("state") in ENDED_BY_OTHERS else changes)
    return cast(JobRecord, {**record, **kept})


def released(record: Mapping[str, Any], state: str, extra: Mapping[str, Any],
             stopped_on: Sequence[str] | None, lease_gone: bool, now: float) -> JobRecord:
    """The launcher's end: how it ended and where it saw its tasks dead (``stopped_on``;
    None: every host, "all"). After a kill (``lease_gone``) nothing is confirmed: the
    agents confirm every host."""
    ended = record.get("state") if record.get("state") in ENDED_BY_OTHERS else state
    result = {**record, "released": now, **extra, "state": ended}
    if not lease_gone:
        result["stopped_on"] = "all" if stopped_on is None else sorted(stopped_on)
    return cast(JobRecord, result)


def ended_by(record: Mapping[str, Any], by: Mapping[str, Any], now: float) -> JobRecord:
    """``kill``/``cancel``: ``cancelled`` while it waits, ``killed`` after, with who."""
    ended = JobState.CANCELLED if record.get("state") == JobState.QUEUED else JobState.KILLED
    return cast(JobRecord, {**record, "state": ended, ended.value: now,
                            f"{ended.value}_by": dict(by)})


def lost(record: Mapping[str, Any], now: float) -> JobRecord | None:
    """The sync's: a live job whose lease went without a release or a kill (its launcher
    died); None when it is not live (nothing to write)."""
    if record.get("state") not in LIVE_STATES:
        return None
    return cast(JobRecord, {**record, "state": JobState.LOST, "lost": now})


def preempted(record: Mapping[str, Any], by: str, at: float, now: float) -> JobRecord | None:
    """The sync's, instead of ``lost``: a live job the keeper preempted (its notice: by
    ``by`` at ``at``) whose lease went without a release: it ends ``preempted``, and with
    its launcher gone nobody requeues it. None when it is not live."""
    if record.get("state") not in LIVE_STATES:
        return None
    summary = record.get("summary")
    note = {"message": f"preempted by {by}; its launcher went away before requeueing it"}
    return cast(JobRecord, {**record, "state": JobState.PREEMPTED, "preempted": now,
                            "preempted_by": by, "preempted_at": at,
                            **({} if isinstance(summary, dict) else {"summary": note})})
