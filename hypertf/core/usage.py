"""The usage ledger's records (``usage`` and ``usage/<day>.<n>``, written by the keeper
alone): each ended attempt, GPU-seconds per user, day and GPU model, and each user's
decayed usage. Pure: the keeper writes them (hypertf.keeper.ledger), ``hypertf usage``
and ``hypertf queue --shares`` read them.

- ``Summary`` (the ``usage`` znode's data): per user the decayed GPU-seconds and when they
  were decayed to, and their expected run time (fair share's entry charge), and this
  month's GPU-seconds (budgets). One entry per user.
- ``Chunk`` (``usage/<YYYY-MM-DD>.<n>``): the attempts that ended that day and their
  GPU-seconds per day (an attempt over midnight counts in each day it held GPUs), user and
  model: one closing writes one chunk. A chunk is closed at CHUNK_BYTES (about 110
  attempts) and the next one opened; ``compacted`` folds a day's chunks into one of totals
  alone once the day is DETAIL_DAYS old, so a year of 1,000 jobs a day is 365 small day
  znodes plus DETAIL_DAYS days of detail (docs/queue.md, "The ledger").

An attempt is counted once, for the time its grant lived (admitted to lease gone, by the
keeper's clock): a restart is a new attempt with its own key and grant, counted on its own.
Every value is decoded with bounds: the keeper wrote it, but a reader trusts nothing.
"""

from __future__ import annotations

import calendar
import functools
import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from hypertf.core.errors import StoreError
from hypertf.core.fairshare import DAY_S, accrued, decay
from hypertf.core.layout import is_task_key, owner_of
from hypertf.core.records import MAX_ZNODE_BYTES, decode, encode, plain_text

# A day's chunk is closed past this: each attempt's end rewrites the open chunk, so it is
# kept small (about 110 attempts; ZooKeeper's limit is 1 MiB).
CHUNK_BYTES = 32 * 1024
READ_BYTES = 512 * 1024  # the most a reader takes of one ledger znode
DETAIL_DAYS = 35  # a day's attempts are kept this long, then only its totals
MAX_HOSTS_LISTED = 16  # an attempt names this many hosts, and counts the rest
MAX_MODEL = 64  # characters of a GPU model's name
MAX_USERS = 100_000  # entries of a summary or a day's totals
MAX_ATTEMPTS = 8192  # attempts in one chunk
MAX_DAYS = 4096  # days one chunk's totals name
FORGOTTEN_GPU_S = 1.0  # a user's decayed usage below this is dropped from the summary
EXPECTED_WEIGHT = 0.3  # each ended attempt's share of a user's expected run time (an EMA)
MIN_EXPECTED_S = 1.0  # an expected run time is at least this
UNKNOWN_MODEL = "unknown"


def day_of(when: float) -> str:
    """The UTC day of an epoch time, ``YYYY-MM-DD``."""
    return time.strftime("%Y-%m-%d", time.gmtime(when))


def month_of(when: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(when))


def day_start(day: str) -> float:
    """Epoch seconds of a day's 00:00 UTC (ValueError for a malformed day)."""
    return float(calendar.timegm(time.strptime(day, "%Y-%m-%d")))


def month_start(when: float) -> float:
    return day_start(time.strftime("%Y-%m-01", time.gmtime(when)))


def split_days(start: float, end: float) -> list[tuple[str, float]]:
    """The seconds of ``[start, end)`` in each UTC day it touches."""
    parts = []
    t = start
    while t < end:
        nxt = min(end, day_start(day_of(t)) + DAY_S)
        parts.append((day_of(t), nxt - t))
        t = nxt
    return parts


def model_name(name: object) -> str:
    """A GPU model as the ledger keeps it: printable text, at most MAX_MODEL characters (an
    agent reports it: a hostile one must not put an escape sequence in everyone's report)."""
    if not isinstance(name, str) or not name.strip():
        return UNKNOWN_MODEL
    return plain_text(name.strip(), instead="?")[:MAX_MODEL]


@dataclass(frozen=True)
class Attempt:
    """One attempt as the keeper saw it: its grant's GPUs (per model) and hosts, from its
    admission to its lease's end (``end`` None: still running); ``ended`` is how its record
    says it ended (only words for people: never a number that counts)."""

    task_key: str
    user: str
    gpus: int
    models: Mapping[str, int]
    hosts: tuple[str, ...]
    start: float
    end: float | None = None
    ended: str = ""
    job_id: str = ""
    attempt: int = 0
    hosts_n: int = 0  # how many hosts in all (``hosts`` lists at most MAX_HOSTS_LISTED)

    def held_s(self, now: float) -> float:
        return max(0.0, (self.end if self.end is not None else now) - self.start)

    def gpu_seconds(self, now: float) -> float:
        return self.gpus * self.held_s(now)

    def per_day(self, now: float, since: float = -math.inf, until: float = math.inf,
                ) -> list[tuple[str, str, str, float]]:
        """(day, user, model, GPU-seconds) of the part of the attempt in ``[since, until)``."""
        end = self.end if self.end is not None else now
        begin, finish = max(self.start, since), min(end, until)
        rows = []
        for day, seconds in split_days(begin, finish):
            for model, count in sorted(self.models.items()):
                rows.append((day, self.user, model, count * seconds))
        return rows

    def to_json(self) -> dict[str, Any]:
        return {"key": self.task_key, "job": self.job_id, "attempt": self.attempt,
                "user": self.user, "gpus": self.gpus, "models": dict(self.models),
                "hosts": list(self.hosts), "hosts_n": self.hosts_n or len(self.hosts),
                "start": round(self.start, 3),
                "end": None if self.end is None else round(self.end, 3), "ended": self.ended}

    @functools.cached_property
    def text(self) -> str:
        """``to_json`` as compact JSON, made once: the keeper writes the day's chunk with
        every one of its attempts at each close (hypertf.keeper.ledger)."""
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, value: object) -> Attempt:
        """An attempt as stored; ValueError when any field is out of its bounds."""
        if not isinstance(value, dict):
            raise ValueError("an attempt is not an object")
        key = value.get("key")
        if not isinstance(key, str) or not is_task_key(key):
            raise ValueError("an attempt without a task key")
        user = owner_of(key)
        gpus = value.get("gpus")
        start, end = value.get("start"), value.get("end")
        models = value.get("models")
        hosts = value.get("hosts")
        if not _count(gpus) or not _time(start) or not (end is None or _time(end)) \
                or not isinstance(models, dict) or len(models) > 64 \
                or not isinstance(hosts, list) or len(hosts) > MAX_HOSTS_LISTED:
            raise ValueError(f"attempt {key}: a field out of bounds")
        if not all(isinstance(m, str) and _count(c) for m, c in models.items()):
            raise ValueError(f"attempt {key}: its GPU models are damaged")
        if not all(isinstance(h, str) and len(h) <= 255 for h in hosts):
            raise ValueError(f"attempt {key}: its hosts are damaged")
        attempt, hosts_n = value.get("attempt", 0), value.get("hosts_n", len(hosts))
        return cls(key, user, int(gpus), {model_name(m): int(c) for m, c in models.items()},
                   tuple(hosts), float(start), None if end is None else float(end),
                   _words(value.get("ended", "")), _words(value.get("job", "")),
                   int(attempt) if _count(attempt) else 0,
                   int(hosts_n) if _count(hosts_n) else len(hosts))


def attempt_of(task_key: str, placements: Iterable[tuple[str, tuple[int, ...]]],
               start: float, model_of: Mapping[tuple[str, int], str],
               record: Mapping[str, Any] | None = None) -> Attempt:
    """An attempt from its grant (``placements``: each task's host and GPU indices, which
    only the keeper wrote), its admission time, the GPU models the hosts' agents report
    (``model_of``) and, for people only, its record's attempt number and job id."""
    models: dict[str, int] = {}
    hosts: list[str] = []
    for host, gpus in placements:
        if host not in hosts:
            hosts.append(host)
        for index in gpus:
            model = model_of.get((host, index), UNKNOWN_MODEL)
            models[model] = models.get(model, 0) + 1
    record = record or {}
    number = record.get("attempt")
    job_id = record.get("job_id")
    return Attempt(task_key, owner_of(task_key), sum(models.values()), models,
                   tuple(hosts[:MAX_HOSTS_LISTED]), start,
                   attempt=int(number) if _count(number) and number < 1_000_000 else 0,
                   job_id=job_id if isinstance(job_id, str) and is_task_key(job_id) else "",
                   hosts_n=len(hosts))


@dataclass(frozen=True)
class Summary:
    """The ``usage`` znode: per user the decayed GPU-seconds as of a time, and this month's
    GPU-seconds of ended attempts (the running ones are added by whoever reads it)."""

    users: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    month: str = ""
    month_users: Mapping[str, float] = field(default_factory=dict)
    compacted: str = ""  # every day up to this one is compacted (a YYYY-MM-DD, or "")
    expected: Mapping[str, float] = field(default_factory=dict)  # run time, seconds

    def default_expected(self, fallback: float) -> float:
        """A new user's expected run time: the mean of the others', else ``fallback``."""
        known = list(self.expected.values())
        return sum(known) / len(known) if known else fallback

    def month_used(self, user: str, now: float) -> float:
        """GPU-seconds of ``user``'s ended attempts in ``now``'s month."""
        return self.month_users.get(user, 0.0) if self.month == month_of(now) else 0.0

    def decayed(self, user: str, now: float, half_life_s: float) -> float:
        value, at = self.users.get(user, (0.0, now))
        return decay(value, now - at, half_life_s)

    def closed(self, attempts: Iterable[Attempt], now: float, half_life_s: float,
               ) -> Summary:
        """The summary once ``attempts`` ended (at their ``end``): each one's decayed
        GPU-seconds added to its user's, decayed to ``now``; its part in ``now``'s month
        added to the month's (a new month starts from nothing)."""
        users = dict(self.users)
        expected = dict(self.expected)
        month = month_of(now)
        month_users = dict(self.month_users) if self.month == month else {}
        begin = month_start(now)
        for a in attempts:
            end = a.end if a.end is not None else now
            value, at = users.get(a.user, (0.0, now))
            users[a.user] = (decay(value, now - at, half_life_s)
                             + decay(accrued(a.gpus, a.start, end, half_life_s), now - end,
                                     half_life_s), now)
            inside = max(0.0, end - max(a.start, begin)) * a.gpus
            month_users[a.user] = month_users.get(a.user, 0.0) + inside
            if a.gpus:
                held = max(MIN_EXPECTED_S, end - a.start)
                before = expected.get(a.user)
                expected[a.user] = held if before is None else \
                    (1 - EXPECTED_WEIGHT) * before + EXPECTED_WEIGHT * held
        forgotten = [u for u, (v, at) in users.items()
                     if decay(v, now - at, half_life_s) < FORGOTTEN_GPU_S and u not in month_users]
        for user in forgotten:  # long gone: the summary stays as small as the active users
            del users[user]
            expected.pop(user, None)
        return Summary(users, month, month_users, self.compacted, expected)

    def to_json(self) -> bytes:
        return encode({"users": {u: [round(v, 3), round(at, 3),
                                     round(self.expected.get(u, 0.0), 3)]
                                 for u, (v, at) in sorted(self.users.items())},
                       "month": self.month,
                       "month_users": {u: round(v, 3)
                                       for u, v in sorted(self.month_users.items())},
                       "compacted": self.compacted})

    @classmethod
    def from_json(cls, data: bytes | None) -> Summary:
        """The stored summary (empty for an empty znode); StoreError when damaged."""
        if not data:
            return cls()
        payload = decode(data, "usage summary", limit=READ_BYTES)
        users, month_users = payload.get("users", {}), payload.get("month_users", {})
        month, compacted = payload.get("month", ""), payload.get("compacted", "")
        if not isinstance(users, dict) or not isinstance(month_users, dict) \
                or len(users) > MAX_USERS or len(month_users) > MAX_USERS \
                or not isinstance(month, str) or len(month) > 7 \
                or not isinstance(compacted, str) or len(compacted) > 10:
            raise StoreError("ZooKeeper holds a damaged usage summary")
        read: dict[str, tuple[float, float]] = {}
        expected: dict[str, float] = {}
        for user, entry in users.items():
            if isinstance(entry, list) and len(entry) == 3 and _amount(entry[0]) \
                    and _time(entry[1]) and _amount(entry[2]):
                read[str(user)] = (float(entry[0]), float(entry[1]))
                if entry[2] >= MIN_EXPECTED_S:
                    expected[str(user)] = float(entry[2])
        month_read = {str(u): float(v) for u, v in month_users.items() if _amount(v)}
        return cls(read, month, month_read, compacted, expected)


@dataclass(frozen=True)
class Chunk:
    """One znode of a day: the attempts that ended in it (none once compacted) and their
    GPU-seconds per day they held GPUs, user and model."""

    day: str
    index: int = 0
    totals: Mapping[str, Mapping[str, Mapping[str, float]]] = field(default_factory=dict)
    attempts: tuple[Attempt, ...] = ()

    @property
    def name(self) -> str:
        return chunk_name(self.day, self.index)

    def added(self, seconds: Iterable[tuple[str, str, str, float]],
              attempt: Attempt | None = None) -> Chunk:
        """With ``(day, user, model, GPU-seconds)`` added to the totals, and ``attempt``."""
        totals = {d: {u: dict(models) for u, models in users.items()}
                  for d, users in self.totals.items()}
        for day, user, model, gpu_s in seconds:
            per_model = totals.setdefault(day, {}).setdefault(user, {})
            per_model[model] = per_model.get(model, 0.0) + gpu_s
        attempts = self.attempts + ((attempt,) if attempt is not None else ())
        return Chunk(self.day, self.index, totals, attempts)

    def grown_by(self, attempt: Attempt, rows: int) -> int:
        """About how many bytes ``attempt`` and its ``rows`` of totals add when encoded."""
        return len(attempt.text) + 48 * rows

    def rows(self) -> Iterable[tuple[str, str, str, float]]:
        """(day, user, model, GPU-seconds) of every total."""
        for day, users in self.totals.items():
            for user, models in users.items():
                for model, gpu_s in models.items():
                    yield day, user, model, gpu_s

    def to_json(self) -> bytes:
        return self.encoded

    @functools.cached_property
    def encoded(self) -> bytes:
        """The chunk's bytes, made once per chunk (the ledger sizes the chunk it adds to
        and then writes it), with each attempt's kept ``text``: a close re-encodes only
        the totals. The same bytes as ``encode`` of the whole."""
        totals = {d: {u: {m: round(v, 3) for m, v in sorted(models.items())}
                      for u, models in sorted(users.items())}
                  for d, users in sorted(self.totals.items())}
        head = encode({"day": self.day, "totals": totals, "attempts": []})
        data = b"%s%s]}" % (head[:-2], ",".join(a.text for a in self.attempts).encode())
        if len(data) > MAX_ZNODE_BYTES:  # refused as encode refuses it (CHUNK_BYTES is far)
            return encode({"day": self.day, "totals": totals,
                           "attempts": [a.to_json() for a in self.attempts]})
        return data

    @classmethod
    def from_json(cls, data: bytes, name: str) -> Chunk:
        """A stored chunk (``name`` its znode's); StoreError when damaged."""
        parsed = parse_chunk_name(name)
        if parsed is None:
            raise StoreError(f"{name!r} is not a usage chunk's name")
        payload = decode(data, "usage chunk", limit=READ_BYTES)
        totals, attempts = payload.get("totals", {}), payload.get("attempts", [])
        damaged = StoreError(f"ZooKeeper holds a damaged usage chunk {name}")
        if payload.get("day") != parsed[0] or not isinstance(totals, dict) \
                or len(totals) > MAX_DAYS or not isinstance(attempts, list) \
                or len(attempts) > MAX_ATTEMPTS:
            raise damaged
        read: dict[str, dict[str, dict[str, float]]] = {}
        for day, users in totals.items():
            if not isinstance(users, dict) or len(users) > MAX_USERS or len(day) != 10:
                raise damaged
            for user, models in users.items():
                if not isinstance(models, dict) or len(models) > 64:
                    raise damaged
                read.setdefault(day, {})[str(user)] = {
                    model_name(m): float(v) for m, v in models.items() if _amount(v)}
        try:
            parsed_attempts = tuple(Attempt.from_json(a) for a in attempts)
        except (ValueError, TypeError) as err:
            raise StoreError(f"ZooKeeper holds a damaged usage chunk {name}: {err}") from err
        return cls(parsed[0], parsed[1], read, parsed_attempts)


def chunk_name(day: str, index: int) -> str:
    return f"{day}.{index}"


def parse_chunk_name(name: str) -> tuple[str, int] | None:
    """(day, index) of a chunk's znode name, None for anything else."""
    day, _, index = name.partition(".")
    if len(name) > 32 or not index.isdigit() or len(index) > 6:
        return None
    try:
        day_start(day)
    except ValueError:
        return None
    return day, int(index)


def compacted(chunks: Iterable[Chunk]) -> Chunk:
    """A day's chunks folded into one (index 0) of totals alone."""
    chunks = list(chunks)
    merged = Chunk(chunks[0].day)
    for chunk in chunks:
        merged = merged.added(chunk.rows())
    return merged


def _count(value: object) -> TypeGuard[int]:
    return type(value) is int and 0 <= value <= 1_000_000_000


def _amount(value: object) -> TypeGuard[float]:
    """A stored number of GPU-seconds: finite, not negative, not absurd."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and 0 <= value <= 1e15


def _time(value: object) -> TypeGuard[float]:
    """An epoch time in seconds, before the year 5000."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and 0 <= value <= 1e11


def _words(value: object) -> str:
    """Text for people from a record its owner writes: printable, short."""
    return plain_text(value, 64, instead="?")
