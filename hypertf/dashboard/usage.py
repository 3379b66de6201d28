"""GPU usage for the dashboard: the usage ledger's day totals and the running grants, read
incrementally, for the page's GPU-hours chart (``/api/usage``) and the Prometheus counter
``hypertf_user_gpu_seconds_total`` (hypertf.dashboard.metrics).

The ledger is the keeper's alone (docs/queue.md, "The ledger"); this only reads it, with the
same readers' bounds (hypertf.core.usage). Ended attempts come from its chunks, running
ones from their grants (admitted until now), exactly as ``hypertf usage`` counts them.

A page polls every 2 s and Prometheus scrapes every 15-60 s, so nothing is read twice that
did not change: the keeper rewrites the summary (``usage``) in every transaction that
writes a chunk (an attempt's end, a day's compaction), so while the summary's ``mzxid``
stands still no chunk is read at all. When it moved, the chunks read again are those not
read before, those of a day whose set of chunks changed (compacted), and the last chunk of
the two newest days (the one the keeper's clock adds to). Grants never change once
written: only new ones are read. A year of the ledger is about 12 MiB (docs/queue.md): the
first read takes it whole, every later one a chunk or two.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import NoNodeError

from hypertf.core.errors import StoreError
from hypertf.core.fairshare import DAY_S
from hypertf.core.grants import grant_from_json, held_of_grant
from hypertf.core.layout import is_task_key, owner_of
from hypertf.core.usage import (
    Attempt,
    Chunk,
    attempt_of,
    day_of,
    day_start,
    model_name,
    parse_chunk_name,
)
from hypertf.keeper.reader import granted_at
from hypertf.store import Store
from hypertf.store.zkclient import get_many

OTHERS = "(others)"  # the label of every user (or model) past a cap, or not the viewer's
CHART_DAYS = 30
CHART_USERS = 12  # users drawn by name in the chart; the rest are stacked as OTHERS
MODEL_TTL_S = 600.0  # a host's GPU models are read again after this (they rarely change)
RECENT_DAYS = 2  # the newest days whose last chunk is read again whenever the ledger moved
Row = tuple[str, str, str, float]  # (day, user, GPU model, GPU-seconds)


def viewer_of(identity: str) -> str:
    """Whose usage a dashboard shows by name: a user's credential (``user.bob``) their own,
    any other (the admin) everyone's: ``hypertf usage``'s rule (the rest are one total)."""
    kind, _, name = identity.partition(".")
    return name if kind == "user" else ""


@dataclass
class _Grant:
    user: str
    start: float
    placements: list[tuple[str, tuple[int, ...]]]


class UsageReader:
    """The ledger's day totals and the running grants of one root, kept between reads
    (one lock: the dashboard's threads share them). ``clock``: the chart's "now"."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store, self.clock = store, clock
        self._lock = threading.Lock()
        self._mzxid = -1  # the summary's, when the chunks were last read
        self._chunks: dict[str, list[Row]] = {}  # name -> its totals
        self._names: dict[str, set[str]] = {}  # day -> its chunks' names
        self._damaged: set[str] = set()  # chunks' names, left out
        self._grants: dict[str, _Grant | None] = {}  # None: unreadable, counted as nothing
        self._models: dict[str, tuple[float, dict[int, str]]] = {}  # host -> (read, models)

    # -- ended attempts ------------------------------------------------------------------
    def ended(self) -> list[Row]:
        """Every day total of the ledger (ended attempts), read again only where changed."""
        with self._lock:
            self._refresh_chunks()
            return [row for rows in self._chunks.values() for row in rows]

    def _refresh_chunks(self) -> None:
        client, layout = self.store.client, self.store.layout
        stat = client.exists(layout.usage)
        if stat is None:  # a root without a ledger: no usage is kept
            self._mzxid, self._chunks, self._names = -1, {}, {}
            return
        if stat.mzxid == self._mzxid:
            return
        try:
            names = set(client.get_children(layout.usage))
        except NoNodeError:
            return
        days: dict[str, set[str]] = defaultdict(set)
        last: dict[str, tuple[int, str]] = {}
        for name in names:
            parsed = parse_chunk_name(name)
            if parsed is None:
                continue
            days[parsed[0]].add(name)
            if parsed[1] >= last.get(parsed[0], (-1, ""))[0]:
                last[parsed[0]] = (parsed[1], name)
        stale = {name for day, named in days.items() if self._names.get(day) != named
                 for name in named}
        stale |= {last[day][1] for day in sorted(days)[-RECENT_DAYS:]}
        for name in [n for n in self._chunks if n not in names]:
            del self._chunks[name]
            self._damaged.discard(name)
        wanted = sorted(stale)
        answers = get_many(client, [layout.usage_chunk(n) for n in wanted])
        for name, answer in zip(wanted, answers, strict=True):
            if isinstance(answer, NoNodeError):
                self._chunks.pop(name, None)
                continue
            if isinstance(answer, Exception):
                raise answer
            try:
                self._chunks[name] = list(Chunk.from_json(answer[0], name).rows())
                self._damaged.discard(name)
            except StoreError:
                self._chunks[name] = []
                self._damaged.add(name)
        self._names = dict(days)
        self._mzxid = stat.mzxid  # read before the chunks: a write between is read next time

    # -- running attempts ----------------------------------------------------------------
    def running(self) -> list[Attempt]:
        """The running attempts (their grants), each with its GPUs' models."""
        with self._lock:
            grants = self._refresh_grants()
            models = self._host_models({host for g in grants.values() for host, _ in g.placements})
        model_of = {(host, index): name for host, names in models.items()
                    for index, name in names.items()}
        found = [attempt_of(key, grant.placements, grant.start, model_of)
                 for key, grant in grants.items()]
        return found

    def _refresh_grants(self) -> dict[str, _Grant]:
        client, layout = self.store.client, self.store.layout
        try:
            keys = {k for k in client.get_children(layout.grants) if is_task_key(k)}
        except NoNodeError:
            keys = set()
        for gone in [k for k in self._grants if k not in keys]:
            del self._grants[gone]
        new = sorted(keys - set(self._grants))
        for key, answer in zip(new, get_many(client, [layout.grant(k) for k in new]),
                               strict=True):
            if isinstance(answer, NoNodeError):
                continue
            if isinstance(answer, Exception):
                raise answer
            try:
                held = held_of_grant(grant_from_json(answer[0], key))
            except ValueError:
                self._grants[key] = None  # counted as nothing, as the keeper does
                continue
            self._grants[key] = _Grant(owner_of(key), granted_at(answer[0],
                                                                 answer[1].ctime / 1000),
                                       [(h, tuple(c)) for h, c in held.gpus.items()])
        return {k: g for k, g in self._grants.items() if g is not None}

    def _host_models(self, hosts: set[str]) -> dict[str, dict[int, str]]:
        """Each host's GPU models (index -> model) as its agent reports them, cached."""
        now = time.monotonic()
        due = sorted(h for h in hosts if now - self._models.get(h, (-math.inf, {}))[0]
                     > MODEL_TTL_S)
        if due:
            records = self.store.records(only=due)
            for host in due:
                record = records.get(host)
                self._models[host] = (now, {g.index: model_name(g.name)
                                            for g in (record.gpus if record else ())})
        for host in [h for h in self._models if h not in hosts]:
            del self._models[host]
        return {h: self._models[h][1] for h in hosts if h in self._models}

    # -- what the page and the metrics show ----------------------------------------------
    def rows(self, since: float = -math.inf, until: float = math.inf) -> list[Row]:
        """(day, user, model, GPU-seconds): ended attempts' day totals of days in
        ``[since, until)`` and the running attempts' part in it, up to now."""
        now = self.clock()
        first = day_of(since) if since > 0 else ""
        last = day_of(until - 1) if until < math.inf else "9999"
        found = [row for row in self.ended() if first <= row[0] <= last]
        for attempt in self.running():
            found += attempt.per_day(now, since, min(until, now))
        return found

    def chart(self, viewer: str, days: int = CHART_DAYS) -> dict[str, Any]:
        """``/api/usage``: GPU-hours per user per day over the last ``days`` (UTC) days."""
        now = self.clock()
        end = day_start(day_of(now)) + DAY_S
        return daily_chart(self.rows(end - days * DAY_S, end), viewer, day_of(now), days,
                           len(self._damaged))


def daily_chart(rows: Iterable[Row], viewer: str, today: str, days: int = CHART_DAYS,
                skipped: int = 0, users_max: int = CHART_USERS) -> dict[str, Any]:
    """GPU-hours per user and day, for a stacked bar chart: the last ``days`` days to
    ``today``, one series per user (``viewer`` a user's name: theirs alone, everyone else
    as OTHERS, as ``hypertf usage`` shows them), the ``users_max`` largest by name and
    the rest stacked as OTHERS, largest first."""
    last = day_start(today)
    labels = [day_of(last - (days - 1 - i) * DAY_S) for i in range(days)]
    column = {day: i for i, day in enumerate(labels)}
    per_user: dict[str, list[float]] = {}
    total = 0.0
    for day, user, _model, gpu_s in rows:
        if day not in column:
            continue
        total += gpu_s
        name = user if not viewer or user == viewer else OTHERS
        per_user.setdefault(name, [0.0] * days)[column[day]] += gpu_s / 3600
    ranked = sorted((u for u in per_user if u != OTHERS), key=lambda u: -sum(per_user[u]))
    shown, folded = ranked[:users_max], ranked[users_max:]
    others = per_user.get(OTHERS, [0.0] * days)
    for user in folded:
        others = [a + b for a, b in zip(others, per_user[user], strict=True)]
    series = [{"user": u, "gpu_hours": [round(v, 4) for v in per_user[u]]} for u in shown]
    if any(others):
        series.append({"user": OTHERS, "gpu_hours": [round(v, 4) for v in others]})
    return {"days": labels, "series": series, "viewer": viewer or "admin",
            "total_gpu_hours": round(total / 3600, 4), "skipped": skipped}


def totals(rows: Iterable[Row]) -> dict[tuple[str, str], float]:
    """GPU-seconds per (user, model) over every row."""
    found: dict[tuple[str, str], float] = defaultdict(float)
    for _day, user, model, gpu_s in rows:
        found[(user, model)] += gpu_s
    return dict(found)


def waiting_counts(view: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """Waiting jobs per (user, reason) in the keeper's queue view (entries whose key is not
    a task key are left out)."""
    found: dict[tuple[str, str], int] = defaultdict(int)
    for entry in view:
        key, reason = entry.get("task_key"), entry.get("reason")
        if isinstance(key, str) and is_task_key(key):
            found[(owner_of(key), reason if isinstance(reason, str) else "")] += 1
    return dict(found)
