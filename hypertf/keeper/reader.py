"""The keeper's reading of the queue: the waiting jobs' records, each checked before a pass
uses it (its owner writes it), the grants running jobs hold, and the admin's limits.

Only the keeper reads the queue this way (``hypertf queue`` too, read-only, to show what
the keeper would decide); a launcher watches its own record alone
(hypertf.store.waitqueue).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import WatchedEvent

from hypertf.core.admission import (
    Waiting,
)
from hypertf.core.errors import StoreError
from hypertf.core.grants import GrantTerms, grant_from_json, held_of_grant, terms_of_grant
from hypertf.core.jobrecord import JobState
from hypertf.core.limits import UserLimits
from hypertf.core.matrix import Held
from hypertf.core.requestcheck import (
    MAX_RECORD_BYTES,
    InvalidRequest,
    waiting_from_record,
)
from hypertf.store import Store, decode
from hypertf.store.zkclient import get_many, pipelined

log = logging.getLogger(__name__)
QUEUED = JobState.QUEUED
FULL_READ_S = 10.0  # every waiting record read again at least this often (a lost watch)


# -- reading the queue -------------------------------------------------------------------
@dataclass
class QueueReader:
    """Reads the waiting jobs; remembers the keys it saw were not waiting (granted, ended,
    refused), so a pass reads only the records of waiting and new jobs, in parallel.

    Every record is its owner's to write, so each is checked (``requestcheck``) before a
    pass uses it; what fails is in ``rejected`` with the reason the keeper refuses it with.
    What running jobs hold (``grants``) comes only from ``grants/``, which only the keeper
    writes: a record's own placements or state never count (a new keeper reads the grants
    once, then keeps its own admissions)."""

    store: Store
    settled: set[str] = field(default_factory=set)
    records: dict[str, tuple[dict[str, Any], int]] = field(default_factory=dict)
    grants: dict[str, Held] = field(default_factory=dict)
    granted: dict[str, float] = field(default_factory=dict)  # when each grant was written
    terms: dict[str, GrantTerms] = field(default_factory=dict)  # the keeper's, for preemption
    rejected: dict[str, tuple[dict[str, Any] | None, int, str]] = field(default_factory=dict)
    writes: bool = True  # the keeper's reader marks lost waiters; ``hypertf queue``'s does not
    _known: dict[str, tuple[dict[str, Any] | None, int, Waiting | None, str]] = field(
        default_factory=dict)
    _dirty: set[str] = field(default_factory=set)
    _full_at: float = 0.0
    _prefetched: dict[str, Any] = field(default_factory=dict)  # reads ``prefetch`` sent

    read_once: bool = False  # a first read: the running jobs' grants come from grants/

    def load_grants(self) -> None:
        """Every grant the keeper's identity wrote: what running jobs hold."""
        client, layout = self.store.client, self.store.layout
        try:
            keys = sorted(client.get_children(layout.grants))
        except NoNodeError:
            return
        answers = get_many(client, [layout.grant(key) for key in keys])
        for key, answer in zip(keys, answers, strict=True):
            if isinstance(answer, NoNodeError):
                continue
            if isinstance(answer, Exception):
                raise answer
            try:
                self.grants[key] = held_of_grant(grant_from_json(answer[0], key))
            except ValueError as err:
                log.error("grant of %s unreadable (%s): it holds nothing", key, err)
                continue
            self.granted[key] = granted_at(answer[0], answer[1].ctime / 1000)
            terms = terms_of_grant(answer[0])
            if terms is not None:
                self.terms[key] = terms

    def prefetch(self, leases: set[str]) -> None:
        """Send now the reads that the next ``waiting`` would make of new and changed
        records among ``leases`` (without waiting for their answers), so that they share
        a round trip with what the pass reads next (the sync's read of the matrix: ZooKeeper
        answers a session's requests in order). ``waiting`` takes their answers, and reads
        again a record whose watch fired meanwhile; nothing else changes here."""
        if not self.writes or not self.read_once or time.monotonic() >= self._full_at:
            return  # a one-off reader, a first read or a full one: ``waiting`` reads
        keys = [key for key in sorted(leases - self.settled)
                if key not in self._prefetched and (key not in self._known
                                                   or key in self._dirty)]
        if not keys:
            return
        self._dirty.difference_update(keys)  # a watch that fires from now on: read again
        client, layout = self.store.client, self.store.layout
        with pipelined(client):
            for key in keys:
                self._prefetched[key] = client.get_async(layout.job(key), watch=self._changed)

    def waiting(self, leases: set[str] | None = None) -> list[Waiting]:
        """The waiting jobs among the ``leases`` (read here when not given).

        A record is read (with a one-shot watch) when its key is new or its watch fired;
        a waiting record nobody changed is neither read nor checked again: 2,000 of one
        user's requests cost a pass nothing. Every FULL_READ_S all are read again (a watch
        set in a session that expired never fires)."""
        leases = self.store.leases() if leases is None else leases
        if not self.read_once:
            self.load_grants()
            self.read_once = True
        self.settled &= leases
        self.settled |= set(self.grants) & leases  # granted: never waiting again
        gone = set(self.records) - leases
        if self.writes:
            for key in gone:  # a waiter whose lease went without a cancel: launcher gone
                self.store.jobs.mark_lost(key)
        keys = sorted(leases - self.settled)
        self._known = {key: known for key, known in self._known.items() if key in leases}
        now = time.monotonic()
        prefetched, self._prefetched = self._prefetched, {}
        if now >= self._full_at:
            self._full_at = now + FULL_READ_S
            fresh = keys
        else:
            fresh = [key for key in keys if key not in self._known or key in self._dirty
                     or key in prefetched]
        again = self._dirty.intersection(fresh)  # changed since it was prefetched, if it was
        self._dirty.difference_update(fresh)
        read = [key for key in fresh if key not in prefetched or key in again]
        answers = self._answers([(key, prefetched[key]) for key in fresh
                                 if key in prefetched and key not in again])
        for key, answer in answers + self._read(read):
            if isinstance(answer, NoNodeError):
                self._known.pop(key, None)
                continue  # not written yet (the launcher's transaction)
            if isinstance(answer, Exception):
                raise answer
            data, stat = answer
            self._known[key] = self._check(key, data, stat.version, stat.czxid)
        self.records, self.rejected = {}, {}
        found = []
        for key in keys:
            known = self._known.get(key)
            if known is None:
                continue
            record, version, job, why = known
            if why:
                self.rejected[key] = (record, version, why)
            elif job is None:
                self.settled.add(key)  # admitted, ended, or set "allocated" by hand
                self._known.pop(key, None)
            else:
                self.records[key] = (record or {}, version)
                found.append(job)
        return found

    def _read(self, keys: list[str]) -> list[tuple[str, Any]]:
        """Each key's record and stat (or the error). The keeper's reader reads each with
        a one-shot watch (the next pass reads only what changed); a one-off reader
        (``hypertf queue``) needs no watch, so it uses multi-reads: 4,000 single reads of
        a fresh process took ~6 s on a loaded machine."""
        client, layout = self.store.client, self.store.layout
        if not self.writes:
            return list(zip(keys, get_many(client, [layout.job(key) for key in keys]),
                            strict=True))
        with pipelined(client):
            pending = [(key, client.get_async(layout.job(key), watch=self._changed))
                       for key in keys]
        return self._answers(pending)

    def _answers(self, pending: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Each read's answer (a missing record: its NoNodeError); when one fails (the
        connection), every record of ``pending`` is read again by the next pass."""
        answers: list[tuple[str, Any]] = []
        for key, result in pending:
            try:
                answers.append((key, result.get(timeout=30)))
            except NoNodeError as err:
                answers.append((key, err))
            except Exception:
                self._dirty.update(key for key, _ in pending)
                raise
        return answers

    def forget(self, key: str) -> None:
        """A job decided (admitted or refused): not waiting any more."""
        self._known.pop(key, None)

    def _changed(self, event: WatchedEvent) -> None:
        if event.path:  # None: the session's own event (it expired); the next read sees all
            self._dirty.add(event.path.rpartition("/")[2])

    @staticmethod
    def _check(key: str, data: bytes, version: int, order: int,
               ) -> tuple[dict[str, Any] | None, int, Waiting | None, str]:
        """(record, version, the waiting job or None when it is not waiting, why it is
        refused or "")."""
        if len(data) > MAX_RECORD_BYTES:
            return None, version, None, (f"invalid request: its record is {len(data):,} "
                                         f"bytes (at most {MAX_RECORD_BYTES:,})")
        try:
            record = decode(data, "job record")
        except StoreError as err:
            return None, version, None, f"invalid request: {err}"
        if record.get("state") != QUEUED:
            # admitted, ended, or a record its owner set to "allocated" by hand: only the
            # keeper's grant admits, so it is never waiting again
            return record, version, None, ""
        try:
            return record, version, waiting_from_record(record, order, key), ""
        except InvalidRequest as err:
            return record, version, None, f"invalid request: {err}"



def granted_at(data: bytes, created: float) -> float:
    """When a grant was written: its ``granted`` (the keeper's clock) when it is a time
    no later than the znode's creation by ZooKeeper's clock (plus a minute of skew), else
    that creation (only the keeper writes grants, but a reader checks)."""
    try:
        value = decode(data, "grant").get("granted")
    except StoreError:
        return created
    if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and 0 < value <= created + 60:
        return float(value)
    return created


def read_limits(store: Store, watch: Callable[..., Any] | None = None) -> UserLimits:
    """The admin's per-user ceilings (defaults when the root has none yet); ``watch``:
    called once when they are set, created or deleted."""
    try:
        data, _ = store.client.get(store.layout.limits, watch=watch)
    except NoNodeError:
        if watch is not None and store.client.exists(store.layout.limits, watch=watch):
            return read_limits(store, watch)  # created in between: read it
        return UserLimits()
    try:
        return UserLimits.from_json(data)
    except (StoreError, TypeError, ValueError, AttributeError):
        return UserLimits()  # damaged: the defaults, never a user's wish

