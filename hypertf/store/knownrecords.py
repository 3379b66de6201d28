"""Job records this client knows as ZooKeeper holds them, with their znode's version, so
that the owner's next write to one needs no read first.

A launcher writes its job's record three times (``enqueue`` creates it, ``starting`` and the
release update it), and the keeper's admission writes it once between. Each update was a
read and a version-checked write; at 32 submitters the release's read was one request in
seven of an admission cycle (docs/benchmarks.md, issue 55). What this client created or
wrote itself it knows; the admission's write it learns from the grant's ``RecordStamp``
(the version and digest of what the keeper wrote), by rebuilding the record from its own
queued one and believing it only when the digest matches.

A known record is only a first guess: every write with it is version-checked, and a write
that fails (a kill, a cancel, the keeper's ``lost``: anyone else's write) reads the record
and decides again, as before. Kept per session (``Store.jobs.known``), at most ``KEPT`` jobs
(the oldest go).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from hypertf.core import jobtransitions as transitions
from hypertf.core.grants import RecordStamp
from hypertf.core.placement import Grant
from hypertf.core.records import decode, encode

__all__ = ["Known", "KnownRecords"]

KEPT = 1024  # per session


@dataclass(frozen=True)
class Known:
    """A job record as this session last wrote (or verified) it, and its znode's version."""

    record: dict[str, Any]
    version: int


class KnownRecords:
    """The job records one session knows, oldest first (at most KEPT)."""

    def __init__(self) -> None:
        self._known: dict[str, Known] = {}
        self._lock = threading.Lock()

    def remember(self, task_key: str, record: dict[str, Any], version: int) -> None:
        """``record`` is what ``task_key``'s znode holds at ``version`` (this session wrote
        it)."""
        with self._lock:
            self._known.pop(task_key, None)
            self._known[task_key] = Known(record, version)
            while len(self._known) > KEPT:
                del self._known[next(iter(self._known))]

    def take(self, task_key: str) -> Known | None:
        """The known record of ``task_key``, forgotten here (the caller writes it, and
        remembers what it wrote)."""
        with self._lock:
            return self._known.pop(task_key, None)

    def admitted(self, task_key: str, grant: Grant, stamp: RecordStamp | None) -> None:
        """After the keeper's admission: the record it wrote, rebuilt from the queued one
        this session remembers, is remembered at the stamp's version if its digest is the
        stamp's; else nothing is (the next write reads the record)."""
        with self._lock:  # looked at, not taken: another read of the grant leaves it as it is
            known = self._known.get(task_key)
        if known is None or stamp is None or known.version != stamp.version - 1:
            return
        data = encode(transitions.admitted(known.record, grant.placements, grant.ports,
                                           stamp.admitted))
        if stamp.matches(data):
            self.remember(task_key, decode(data, "job record"), stamp.version)
