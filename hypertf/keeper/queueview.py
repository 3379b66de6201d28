"""``hypertf queue``: the waiting jobs as the admitter sees them, like squeue.

With a keeper it reads the keeper's view (``collect_view``: one read and two listings);
without one, or with ``--direct``, it runs the keeper's own admission pass
(hypertf.core.admission) read-only on what ZooKeeper holds now (``collect``), so it says
the same as the keeper will: one matrix read, one listing of the live hosts, the waiting
jobs' records (in parallel).
"""

from __future__ import annotations

import time
from typing import Any

from kazoo.exceptions import NoNodeError

from hypertf.core.admission import Decision, admission_pass, clamped
from hypertf.core.fairshare import DAY_S, DEFAULT_HALF_LIFE_DAYS, factor_table
from hypertf.core.jobrecord import JobState
from hypertf.core.layout import owner_of
from hypertf.core.records import plain_text
from hypertf.keeper.admitter import SCRIPT_SHOWN
from hypertf.keeper.ledger import Ledger
from hypertf.keeper.preempter import Preempter, PreemptSettings
from hypertf.keeper.reader import QueueReader, read_limits
from hypertf.keeper.screen import INVALID, Screen
from hypertf.store import Store

STARTING = "Starting"  # fits now: the keeper admits it at its next pass
NEW = "New"  # queued after the keeper's last pass: it has not decided on it yet


def collect_view(store: Store) -> list[dict[str, Any]] | None:
    """``collect`` from what the keeper publishes (``keeper/queue``: each waiting job's
    position, reason, priority, shape, script and creation) instead of running its pass
    here: at 25,000 hosts the pass's reads (the matrix, the live hosts, every record) were
    most of the command. A job whose lease is newer than the keeper's last pass shows as
    ``New`` after the others (its record read). None when there is no whole view (no keeper
    now, an older one, or a queue too long for its znode): then ``collect``."""
    view = store.queue.read_queue_view()
    entries = view.get("waiting")
    if not isinstance(entries, list) or "truncated" in view or not all(
            isinstance(e, dict) and {"shape", "script", "created"} <= e.keys()
            for e in entries):
        return None
    try:
        grants = set(store.client.get_children(store.layout.grants))
    except NoNodeError:
        grants = set()
    seen = {str(e.get("task_key")) for e in entries}
    new = sorted(store.leases() - seen - grants)
    now = time.time()
    rows: list[dict[str, Any]] = []
    for entry in entries:
        created = entry["created"] if type(entry["created"]) in (int, float) else now
        rows.append(_row(len(rows) + 1, str(entry["task_key"]), entry.get("priority", 0),
                         str(entry["shape"]), entry.get("gpus", 0),
                         plain_text(entry["script"], SCRIPT_SHOWN), created, now,
                         str(entry.get("reason", ""))))
    for key, record in sorted(store.jobs.read_many(new).items()):
        if record.get("state") != JobState.QUEUED:
            continue  # admitted, refused or ended since the listing
        stamp, asked = record.get("created"), record.get("queue")
        priority = asked.get("priority", 0) if isinstance(asked, dict) else 0
        rows.append(_row(len(rows) + 1, key, priority if type(priority) is int else 0, "", 0,
                         plain_text(record.get("script", ""), SCRIPT_SHOWN),
                         float(stamp) if isinstance(stamp, (int, float)) else now, now, NEW))
    return rows


def _row(position: int, key: str, priority: Any, shape: str, gpus: Any, script: Any,
         created: float, now: float, reason: str, **more: str) -> dict[str, Any]:
    """One waiting job as ``hypertf queue`` lists it (``--json``'s fields)."""
    return {"position": position, "task_key": key, "user": owner_of(key),
            "priority": priority, "shape": shape, "gpus": gpus, "script": script,
            "queued": created, "waiting_s": round(now - created, 1), "reason": reason,
            **more}


def collect(store: Store, user_gpu_limit: int = 0, user_queue_limit: int = 0,
            half_life_s: float = DEFAULT_HALF_LIFE_DAYS * DAY_S) -> list[dict[str, Any]]:
    """Every waiting job as the keeper's next pass would see it: the admin's limits cap
    each priority (the priority shown is the one that counts), fair share orders each
    tier from the keeper's ledger, and requests the keeper refuses before its pass
    (invalid, past a limit, never fitting) show as ``Invalid`` with the reason."""
    matrix, _ = store.matrix.read()
    reader = QueueReader(store, writes=False)
    limits = read_limits(store)
    read = clamped(reader.waiting(), limits)
    versions = {key: v for key, (_, v) in reader.records.items()}
    waiting, refused = Screen(user_gpu_limit, user_queue_limit)(read, versions, matrix,
                                                                limits)
    preempter = Preempter(store, PreemptSettings())
    preempter.load(reader.terms, writes=False)
    waiting = preempter.requeue(waiting, reader.grants)
    ledger = Ledger(store, half_life_s)
    ledger.load(reader.grants, reader.granted)
    now = ledger.clock()
    users = {w.user for w in waiting}
    fair = ledger.fairshare(users, limits, now) if half_life_s > 0 else None
    decisions = admission_pass(matrix, store.live_hosts(), waiting, user_gpu_limit, limits,
                               fair, ledger.over_budget(users, limits, now))
    preempter.note_busy(reader.grants, matrix)
    shown = preempter.reasons(decisions)
    decisions += [Decision(key, len(decisions) + i, INVALID) for i, key in
                  enumerate(sorted(refused), start=1)]
    by_key = {w.task_key: w for w in read}
    now = time.time()
    rows = []
    for decision in decisions:
        job = by_key[decision.task_key]
        record, _ = reader.records[decision.task_key]
        rows.append(_row(decision.position, job.task_key, job.priority, job.request.describe(),
                         job.request.gpus, record.get("script", ""),
                         float(record.get("created", now)), now,
                         shown.get(job.task_key, decision.reason or STARTING),
                         **({"refused": refused[job.task_key]} if job.task_key in refused
                            else {})))
    now_rows = len(rows)
    for i, (key, (_, _, why)) in enumerate(sorted(reader.rejected.items()), start=1):
        rows.append(_row(now_rows + i, key, 0, "", 0, "", now, now, INVALID, refused=why))
    return rows


def shares(store: Store, half_life_s: float = DEFAULT_HALF_LIFE_DAYS * DAY_S,
           ) -> list[dict[str, Any]]:
    """``hypertf queue --shares``: every user with usage, a running or a waiting job, or a
    share the admin set: their share, decayed usage (GPU-hours), the GPUs they hold, their
    factor F = 2^(-U/S) and this month's GPU-hours (with their budget, if any)."""
    matrix, _ = store.matrix.read()
    reader = QueueReader(store, writes=False)
    limits = read_limits(store)
    waiting = reader.waiting()
    ledger = Ledger(store, half_life_s)
    ledger.load(reader.grants, reader.granted)
    now = ledger.clock()
    held = matrix.held_per_user()
    users = {*ledger.summary.users, *held, *(w.user for w in waiting), *limits.users}
    fair = ledger.fairshare(users, limits, now)
    fair.held = dict(held)
    month = {user: ledger.month_used(user, now) for user in users}
    rows = factor_table(fair, users, month)
    for row in rows:
        row["waiting"] = sum(1 for w in waiting if w.user == row["user"])
        row["budget_gpu_hours"] = limits.of(str(row["user"])).gpu_hours_per_month
    return rows


def render_shares(rows: list[dict[str, Any]], half_life_s: float) -> str:
    if not rows:
        return "no user has used, holds or waits for GPUs"
    days = half_life_s / DAY_S
    lines = [f"fair share: F = 2^(-U/S), usage decayed with a half-life of {days:g} days "
             f"plus the GPUs held now" if half_life_s > 0 else
             "fair share is off (hypertf_fairshare_half_life: 0): priority, then first come",
             f"{'USER':<16} {'SHARE':>7} {'USAGE(GPU-h)':>13} {'HELD':>5} {'FACTOR':>7} "
             f"{'WAITING':>7} {'MONTH(GPU-h)':>13}  BUDGET"]
    for row in rows:
        budget = f"{row['budget_gpu_hours']:g}" if row["budget_gpu_hours"] else "-"
        lines.append(f"{row['user']:<16} {row['share']:>7g} {row['usage_gpu_hours']:>13.2f} "
                     f"{row['held_gpus']:>5} {row['factor']:>7.4f} {row['waiting']:>7} "
                     f"{row['month_gpu_hours']:>13.2f}  {budget}")
    return "\n".join(lines)


def render(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no job is waiting"
    header = f"{'POS':>3}  {'TASK KEY':<34} {'USER':<10} {'PRIO':>4}  {'WAITING':>8}  " \
             f"{'REASON':<10}  SHAPE"
    lines = [header]
    for row in rows:
        wait = int(row["waiting_s"])
        lines.append(f"{row['position']:>3}  {row['task_key']:<34} {row['user']:<10} "
                     f"{row['priority']:>4}  {wait // 60:>5}:{wait % 60:02d}  "
                     f"{row['reason']:<10}  {row['shape']}  {row['script']}")
    return "\n".join(lines)
