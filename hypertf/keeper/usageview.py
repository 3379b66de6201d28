"""``hypertf usage``: GPU-hours per user, day or GPU model, from the keeper's ledger.

Ended attempts come from the ledger's day chunks (hypertf.core.usage), running ones from
their grants (admitted until now): each attempt counts once, for the time it held GPUs, so a
job restarted three times is three attempts. The admin sees every user; a user sees their
own rows and the cluster's total (the ledger is readable by every member, as job records
are: this is a view, not a secret).
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import NoNodeError

from hypertf.core.errors import StoreError, UsageError
from hypertf.core.fairshare import DAY_S
from hypertf.core.usage import (
    Chunk,
    attempt_of,
    day_of,
    day_start,
    month_start,
    parse_chunk_name,
)
from hypertf.keeper.ledger import gpu_models
from hypertf.keeper.reader import QueueReader
from hypertf.store import Store
from hypertf.store.zkclient import get_many

BY = ("user", "day", "gpu_model")
TOTAL = "(all users)"


def parse_day(text: str | None, option: str, default: float) -> float:
    """``--since``/``--until``'s YYYY-MM-DD as the epoch of that day's start (UTC)."""
    if not text:
        return default
    try:
        return day_start(text)
    except ValueError:
        raise UsageError(f"{option} {text[:40]!r}: give a date as YYYY-MM-DD "
                         f"(e.g. {day_of(time.time())})") from None


@dataclass(frozen=True)
class Report:
    """What ``hypertf usage`` prints: GPU-seconds per key (a user, day or model), the
    viewer's own when ``viewer`` is a user, and everyone's ``total``."""

    by: str
    since: str
    until: str
    viewer: str  # "" for the admin (every user)
    rows: dict[str, float]
    total: float
    skipped: int = 0  # damaged chunks, left out

    def to_json(self) -> dict[str, Any]:
        return {"by": self.by, "since": self.since, "until": self.until,
                "viewer": self.viewer or "admin",
                "rows": [{self.by: key, "gpu_hours": round(s / 3600, 4),
                          "gpu_seconds": round(s, 1)} for key, s in sorted(self.rows.items())],
                "total": {"gpu_hours": round(self.total / 3600, 4),
                          "gpu_seconds": round(self.total, 1)}}

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([self.by, "gpu_hours", "gpu_seconds"])
        for key, seconds in sorted(self.rows.items()):
            writer.writerow([key, f"{seconds / 3600:.4f}", f"{seconds:.1f}"])
        writer.writerow([TOTAL, f"{self.total / 3600:.4f}", f"{self.total:.1f}"])
        return out.getvalue()

    def render(self) -> str:
        whose = f"{self.viewer}'s" if self.viewer else "every user's"
        lines = [f"GPU-hours from {self.since} to {self.until} (UTC), {whose}, by {self.by}:",
                 f"{self.by.upper():<24} {'GPU-HOURS':>12}"]
        for key, seconds in sorted(self.rows.items()):
            lines.append(f"{key:<24} {seconds / 3600:>12.2f}")
        lines.append(f"{TOTAL:<24} {self.total / 3600:>12.2f}")
        if self.skipped:
            lines.append(f"({self.skipped} damaged ledger chunks left out)")
        return "\n".join(lines)


def collect(store: Store, by: str = "user", since: str | None = None,
            until: str | None = None, viewer: str = "", now: float | None = None) -> Report:
    """GPU-seconds in ``[since, until]`` (whole UTC days; default: this month up to today)
    by ``by``; ``viewer`` a user's name: only their rows (the total stays everyone's)."""
    if by not in BY:
        raise UsageError(f"--by {by[:40]!r}: give one of {', '.join(BY)}")
    now = time.time() if now is None else now
    begin = parse_day(since, "--since", month_start(now))
    end = parse_day(until, "--until", day_start(day_of(now))) + DAY_S
    if end <= begin:
        raise UsageError(f"--until {until} is before --since {since}: give an --until on or "
                         f"after --since")
    first, last = day_of(begin), day_of(end - 1)
    seconds: list[tuple[str, str, str, float]] = []
    chunks, skipped = _chunks(store, first)
    for chunk in chunks:
        seconds += [row for row in chunk.rows() if first <= row[0] <= last]
    seconds += list(_running(store, now, begin, end))
    rows: dict[str, float] = {}
    total = 0.0
    for day, user, model, gpu_s in seconds:
        total += gpu_s
        if viewer and user != viewer:
            continue
        key = {"user": user, "day": day, "gpu_model": model}[by]
        rows[key] = rows.get(key, 0.0) + gpu_s
    return Report(by, first, last, viewer, rows, total, skipped)


def _chunks(store: Store, first: str) -> tuple[list[Chunk], int]:
    """The ledger's chunks of days from ``first`` on (a total for a day is in the chunk
    of the day its attempt ended: that day or a later one)."""
    try:
        names = store.client.get_children(store.layout.usage)
    except NoNodeError:
        return [], 0
    wanted = sorted(n for n in names if (p := parse_chunk_name(n)) and p[0] >= first)
    chunks, skipped = [], 0
    for name, answer in zip(wanted, get_many(store.client,
                                             [store.layout.usage_chunk(n) for n in wanted]),
                            strict=True):
        if isinstance(answer, Exception):
            continue
        try:
            chunks.append(Chunk.from_json(answer[0], name))
        except StoreError:
            skipped += 1
    return chunks, skipped


def _running(store: Store, now: float, begin: float, end: float,
             ) -> Iterable[tuple[str, str, str, float]]:
    """The running attempts' part in ``[begin, end)``, from their grants (the keeper's)."""
    reader = QueueReader(store, writes=False)
    reader.load_grants()
    hosts = {host for held in reader.grants.values() for host in held.gpus}
    records = store.records(only=sorted(hosts)) if hosts else {}
    for key, held in reader.grants.items():
        start = reader.granted.get(key, now)
        attempt = attempt_of(key, list(held.gpus.items()), start, gpu_models(records, held))
        yield from attempt.per_day(now, begin, min(end, now))
