"""The keeper's usage ledger (``usage``, docs/queue.md "The ledger"): only the keeper writes
it, and it writes an attempt's end in the same transaction that deletes the attempt's grant.

An attempt runs from its admission (the grant's ``granted``, the keeper's clock) to the
pass that finds its lease gone; while it runs, its grant is the ledger's record of it (only
the keeper writes grants). Ending it is one ZooKeeper transaction: the grant deleted, the
summary (each user's decayed usage, this month's GPU-seconds) and the day's chunk (the
attempt, its GPU-seconds per day, user and model) written, both version-checked. So a
keeper that dies before the commit counted nothing and its successor, which still finds
the grant, counts it; one that dies after it counted it once and left no grant: nothing is
counted twice across a failover, and ZooKeeper keeps it all across its own restarts. A
grant someone else deleted (the admin by hand) is not counted at all: never twice.

The keeper's clock is injectable (``clock``); the arithmetic is hypertf.core.fairshare and
hypertf.core.usage (pure).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import NoAuthError, NoNodeError

from hypertf.core.errors import StoreError
from hypertf.core.fairshare import DAY_S, DEFAULT_EXPECTED_S, LN2, Fairshare, accrued
from hypertf.core.jobrecord import LIVE_STATES, JobState
from hypertf.core.limits import UserLimits
from hypertf.core.matrix import Held
from hypertf.core.records import AgentRecord, decode
from hypertf.core.usage import (
    CHUNK_BYTES,
    DETAIL_DAYS,
    READ_BYTES,
    Attempt,
    Chunk,
    Summary,
    attempt_of,
    compacted,
    day_of,
    model_name,
    month_start,
    parse_chunk_name,
)
from hypertf.store import Store
from hypertf.store.zkclient import get_many

log = logging.getLogger(__name__)
CLOSE_BATCH = 100  # attempts ended per transaction
MAINTAIN_S = 3600.0  # how often the keeper looks for days to compact
ENDED_WORDS = {state.value for state in JobState if state not in LIVE_STATES}


@dataclass
class _Running:
    """One user's running attempts, summed so a pass costs O(users), not O(attempts):
    ``gpus`` held and ``weight`` = sum of gpus * 2^((start - t0)/h), from which the decayed
    GPU-seconds so far follow (h/ln2 * (gpus - 2^-(now-t0)/h * weight))."""

    gpus: int = 0
    weight: float = 0.0
    keys: set[str] = field(default_factory=set)


class RunningAttempts:
    """The running attempts as the ledger counts them until they end: each one's user, start
    and cells, and per user their sums (``_Running``), so a pass reads a user's decayed
    usage in O(1). Weights are relative to ``t0`` (the ledger's start, kept across a
    reload so a reload changes no sum)."""

    def __init__(self, half_life_s: float, t0: float) -> None:
        self.half_life_s = half_life_s
        self.t0 = t0
        self.attempts: dict[str, tuple[str, float, Held]] = {}  # key -> (user, start, held)
        self._users: dict[str, _Running] = {}

    def __contains__(self, task_key: str) -> bool:
        return task_key in self.attempts

    def opened(self, task_key: str, start: float, held: Held) -> None:
        """An attempt admitted at ``start`` (its grant written then)."""
        if task_key in self.attempts:
            return
        user = task_key.partition(".")[2]
        gpus = sum(len(cells) for cells in held.gpus.values())
        self.attempts[task_key] = (user, start, held)
        mine = self._users.setdefault(user, _Running())
        mine.gpus += gpus
        mine.weight += gpus * self._weight(start)
        mine.keys.add(task_key)

    def _weight(self, start: float) -> float:
        if self.half_life_s <= 0:
            return 0.0
        return math.exp2(max(-1000.0, min(1000.0, (start - self.t0) / self.half_life_s)))

    def forget(self, task_key: str) -> None:
        """``task_key``'s attempt ended (counted, or never to be)."""
        user, start, held = self.attempts.pop(task_key)
        gpus = sum(len(cells) for cells in held.gpus.values())
        mine = self._users[user]
        mine.gpus -= gpus
        mine.weight -= gpus * self._weight(start)
        mine.keys.discard(task_key)
        if not mine.keys:
            del self._users[user]

    def cleared(self) -> dict[str, tuple[str, float, Held]]:
        """Forget every attempt; returns them (opened again after the ledger's reload)."""
        running = dict(self.attempts)
        self.attempts, self._users = {}, {}
        return running

    def usage(self, user: str, now: float) -> float:
        """Decayed GPU-seconds of ``user``'s running attempts so far."""
        mine = self._users.get(user)
        if mine is None:
            return 0.0
        if self.half_life_s <= 0:
            return sum(accrued(self._gpus(key), self.attempts[key][1], now, 0)
                       for key in mine.keys)
        decayed = math.exp2(-(now - self.t0) / self.half_life_s) * mine.weight
        return max(0.0, self.half_life_s / LN2 * (mine.gpus - decayed))

    def month_used(self, user: str, now: float) -> float:
        """GPU-seconds of ``user``'s running attempts in ``now``'s month."""
        begin = month_start(now)
        mine = self._users.get(user)
        return sum(self._gpus(key) * max(0.0, now - max(self.attempts[key][1], begin))
                   for key in (mine.keys if mine else ()))

    def _gpus(self, task_key: str) -> int:
        return sum(len(cells) for cells in self.attempts[task_key][2].gpus.values())


class DayChunks:
    """The chunks of the ledger's days as the keeper knows them: each day's highest chunk
    index (from the names read at load, then the keeper's own writes) and the chunk that
    takes the next attempts, so an ended attempt costs no listing and at most one read."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.days: dict[str, int] = {}  # day -> the highest chunk index stored
        self.open_chunks: dict[str, tuple[Chunk, int]] = {}  # day -> its open chunk, version

    def named(self, names: Iterable[str]) -> None:
        """The chunks' names as listed under ``usage``."""
        for name in names:
            parsed = parse_chunk_name(name)
            if parsed is not None:
                self.days[parsed[0]] = max(self.days.get(parsed[0], 0), parsed[1])

    def open(self, day: str) -> tuple[Chunk, int]:
        """The chunk of ``day`` that takes the next attempts, and its version (-1: new)."""
        known = self.open_chunks.get(day)
        if known is not None:
            return known
        if day not in self.days:
            return Chunk(day, 0), -1
        index = self.days[day]
        name = f"{day}.{index}"
        try:
            data, stat = self.store.client.get(self.store.layout.usage_chunk(name))
            return Chunk.from_json(data, name), stat.version
        except NoNodeError:
            return Chunk(day, index), -1
        except StoreError as err:
            log.error("%s: the next attempts go into a new chunk", err)
            return Chunk(day, index + 1), -1

    def wrote(self, chunk: Chunk, version: int) -> None:
        """``chunk`` committed at ``version``: the one open chunk now."""
        self.open_chunks = {chunk.day: (chunk, version)}
        self.days[chunk.day] = max(self.days.get(chunk.day, 0), chunk.index)

    def forget_open(self) -> None:
        """Read the open chunks again when next needed (the ledger changed under us)."""
        self.open_chunks = {}

    def compacted(self, day: str) -> None:
        """``day``'s chunks were folded into its first."""
        self.days[day] = 0
        self.open_chunks.pop(day, None)


class Ledger:
    """The keeper's ledger for one term: loaded once (the summary, the running grants),
    then kept by the keeper's own admissions (``opened``) and ends (``close``)."""

    def __init__(self, store: Store, half_life_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.half_life_s = half_life_s
        self.clock = clock
        self.loaded = False
        self.writable = True  # False: a root without ``usage`` (auth init not run again)
        self.summary = Summary()
        self._version = -1
        self.running = RunningAttempts(half_life_s, clock())
        self.chunks = DayChunks(store)
        self._maintained = 0.0

    # -- loading, and what the keeper admits -------------------------------------------
    def load(self, grants: Mapping[str, Held], granted: Mapping[str, float]) -> None:
        """The summary and the running grants (a new keeper's first pass)."""
        now = self.clock()
        try:
            data, stat = self.store.client.get(self.store.layout.usage)
            names = self.store.client.get_children(self.store.layout.usage)
        except NoNodeError:
            log.warning("ZooKeeper root %s has no usage ledger: usage is not kept and fair "
                        "share sees only running jobs until the admin runs 'hypertf auth "
                        "init -i INVENTORY'", self.store.layout.root)
            self.writable = False
            data, stat, names = b"", None, []
        try:
            self.summary = Summary.from_json(data)
        except StoreError as err:
            log.error("%s: the ledger starts again from nothing", err)
            self.summary = Summary()
        self._version = stat.version if stat is not None else -1
        self.chunks.named(names)
        for key, held in grants.items():
            self.opened(key, granted.get(key, now), held)
        self.loaded = True

    def opened(self, task_key: str, start: float, held: Held) -> None:
        """An attempt admitted at ``start`` (its grant written then)."""
        self.running.opened(task_key, start, held)

    # -- what a pass reads ---------------------------------------------------------------
    def running_usage(self, user: str, now: float) -> float:
        """Decayed GPU-seconds of ``user``'s running attempts so far."""
        return self.running.usage(user, now)

    def fairshare(self, users: Iterable[str], limits: UserLimits, now: float) -> Fairshare:
        """Each of ``users``' decayed usage (ended and running attempts) and share."""
        usage = {user: self.summary.decayed(user, now, self.half_life_s)
                 + self.running.usage(user, now) for user in set(users)}
        return Fairshare(self.half_life_s, usage, shares=limits.share,
                         expected=self.summary.expected,
                         default_expected_s=self.summary.default_expected(DEFAULT_EXPECTED_S))

    def month_used(self, user: str, now: float) -> float:
        """GPU-seconds of ``user`` in ``now``'s month: ended attempts and running ones."""
        return self.summary.month_used(user, now) + self.running.month_used(user, now)

    def over_budget(self, users: Iterable[str], limits: UserLimits, now: float
                    ) -> frozenset[str]:
        """Those of ``users`` with a budget who used it up this month."""
        return frozenset(user for user in set(users) if (budget := limits.budget_s(user))
                         and self.month_used(user, now) >= budget)

    # -- ends ------------------------------------------------------------------------------
    def close(self, ended: list[str], grants: Mapping[str, Held],
              records: Mapping[str, AgentRecord],
              jobs: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
        """Delete the grants of ``ended`` jobs and count their attempts, CLOSE_BATCH per
        transaction; returns the keys whose grants are gone (counted, or deleted by someone
        else and so not counted). ``jobs``: their records as the sync read them (else
        read here)."""
        done: list[str] = []
        for start in range(0, len(ended), CLOSE_BATCH):
            done += self._close_batch(ended[start:start + CLOSE_BATCH], grants, records,
                                      jobs or {})
        self.maintain()
        return done

    def _close_batch(self, keys: list[str], grants: Mapping[str, Held],
                     records: Mapping[str, AgentRecord],
                     known: Mapping[str, Mapping[str, Any]]) -> list[str]:
        client, layout = self.store.client, self.store.layout
        now = self.clock()
        missing = [key for key in keys if key not in known]
        jobs = {**known, **(self._job_records(missing) if missing else {})}
        attempts = []
        for key in keys:
            if key not in self.running:  # a grant the ledger never saw start: from now
                self.opened(key, now, grants[key])
            _, start, held = self.running.attempts[key]
            placements = [(host, cells) for host, cells in held.gpus.items()]
            attempt = attempt_of(key, placements, start, gpu_models(records, held), jobs.get(key))
            attempts.append(Attempt(attempt.task_key, attempt.user, attempt.gpus,
                                    attempt.models, attempt.hosts, start, max(start, now),
                                    _ended(jobs.get(key)), attempt.job_id, attempt.attempt,
                                    attempt.hosts_n))
        summary = self.summary.closed(attempts, now, self.half_life_s)
        chunk, version = self.chunks.open(day_of(now))
        writes: list[tuple[Chunk, int]] = []  # full chunks this batch added to
        changed = False
        size = len(chunk.to_json())  # then estimated: no encoding per attempt
        for attempt in attempts:
            rows = attempt.per_day(now)
            extra = chunk.grown_by(attempt, len(rows))
            if chunk.attempts and size + extra > CHUNK_BYTES:
                if changed:
                    writes.append((chunk, version))
                chunk, version, size = Chunk(chunk.day, chunk.index + 1), -1, 64
            chunk, changed, size = chunk.added(rows, attempt), True, size + extra
        writes.append((chunk, version))
        tx = client.transaction()
        for key in keys:
            tx.delete(layout.grant(key))
        if self.writable:
            tx.set_data(layout.usage, summary.to_json(), version=self._version)
            for written, at in writes:
                path = layout.usage_chunk(written.name)
                if at >= 0:
                    tx.set_data(path, written.to_json(), version=at)
                else:
                    tx.create(path, written.to_json(), acl=self.store.acls.of("usage_chunk"))
        results = tx.commit()
        failed = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception)
                  and type(r).__name__ not in ("RolledBackError", "RuntimeInconsistency")]
        if not failed:
            for key in keys:
                self.running.forget(key)
            if self.writable:
                self.summary = summary
                self._version += 1
                self.chunks.wrote(chunk, version + 1 if version >= 0 else 0)
            return keys
        index, error = failed[0]
        if index < len(keys) and isinstance(error, NoNodeError):
            key = keys[index]  # deleted by someone else: never counted twice
            log.warning("the grant of %s was deleted by another hand: its usage is not "
                        "counted", key)
            self.running.forget(key)
            rest = [k for k in keys if k != key]
            return [key, *(self._close_batch(rest, grants, records, known) if rest else [])]
        if index >= len(keys) and isinstance(error, NoAuthError | NoNodeError):
            log.error("the keeper may not write the usage ledger (%s): usage is not kept "
                      "until the admin runs 'hypertf auth init -i INVENTORY'", error)
            self.writable = False
            return self._close_batch(keys, grants, records, known)
        log.info("the usage ledger changed under the keeper (%s): reading it again", error)
        self._reload()
        return []  # the grants stay: the next pass ends them

    def _job_records(self, keys: list[str]) -> dict[str, Mapping[str, Any]]:
        """The ended jobs' records, for words only (how it ended, the attempt number): a
        record is its owner's, so nothing in it is ever counted."""
        found: dict[str, Mapping[str, Any]] = {}
        answers = get_many(self.store.client, [self.store.layout.job(k) for k in keys])
        for key, answer in zip(keys, answers, strict=True):
            if isinstance(answer, Exception):
                continue
            try:
                found[key] = decode(answer[0], "job record", limit=READ_BYTES)
            except StoreError:
                continue
        return found

    def _reload(self) -> None:
        """Read the summary and the chunks' names again (after a conflict)."""
        running = self.running.cleared()
        self.chunks.forget_open()
        self.load({}, {})
        for key, (_, start, held) in running.items():
            self.opened(key, start, held)

    # -- compaction ---------------------------------------------------------------------
    def maintain(self, force: bool = False) -> int:
        """Fold the chunks of days older than DETAIL_DAYS into one of totals each (at most
        every MAINTAIN_S; a few days per run). Returns the days compacted."""
        now = self.clock()
        if not self.writable or (not force and now - self._maintained < MAINTAIN_S):
            return 0
        self._maintained = now
        limit = day_of(now - DETAIL_DAYS * DAY_S)
        due = sorted(d for d in self.chunks.days if self.summary.compacted < d < limit)
        done = 0
        for day in due[:30]:
            if not self._compact(day):
                break
            done += 1
        return done

    def _compact(self, day: str) -> bool:
        client, layout = self.store.client, self.store.layout
        names = [f"{day}.{i}" for i in range(self.chunks.days[day] + 1)]
        answers = get_many(client, [layout.usage_chunk(n) for n in names])
        chunks, versions = [], {}
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, Exception):
                continue
            try:
                chunks.append(Chunk.from_json(answer[0], name))
            except StoreError as err:
                log.error("%s: left out of the day's totals", err)
            versions[name] = answer[1].version
        summary = Summary(self.summary.users, self.summary.month, self.summary.month_users,
                          day, self.summary.expected)
        tx = client.transaction()
        if chunks:
            data = compacted(chunks).to_json()
            first = names[0]
            if first in versions:
                tx.set_data(layout.usage_chunk(first), data, version=versions[first])
            else:
                tx.create(layout.usage_chunk(first), data, acl=self.store.acls.of("usage_chunk"))
        for name in names[1:]:
            if name in versions:
                tx.delete(layout.usage_chunk(name), version=versions[name])
        tx.set_data(layout.usage, summary.to_json(), version=self._version)
        if any(isinstance(r, Exception) for r in tx.commit()):
            self._reload()
            return False
        self.summary, self._version = summary, self._version + 1
        self.chunks.compacted(day)
        return True


def gpu_models(records: Mapping[str, AgentRecord], held: Held) -> dict[tuple[str, int], str]:
    """(host, GPU index) -> the model its host's agent reports (a label, bounded): the
    ledger's and ``hypertf usage``'s running attempts'."""
    found = {}
    for host, cells in held.gpus.items():
        record = records.get(host)
        names = {gpu.index: gpu.name for gpu in record.gpus} if record else {}
        for index in cells:
            found[(host, index)] = model_name(names.get(index))
    return found


def _ended(record: Mapping[str, Any] | None) -> str:
    """How the attempt ended, in its record's words when they are an ended state (its owner
    writes them: words for people, never a number), else ``lost``."""
    state = (record or {}).get("state")
    return state if isinstance(state, str) and state in ENDED_WORDS else JobState.LOST.value
