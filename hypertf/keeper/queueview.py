"""``hypertf queue``: the waiting jobs as the admitter sees them, like squeue.

It runs the keeper's own admission pass (hypertf.core.admission) read-only on what ZooKeeper
holds now, so it needs no keeper to answer and says the same as the keeper will: one
matrix read, one listing of the live hosts, the waiting jobs' records (in parallel).
"""

from __future__ import annotations

import time
from typing import Any

from hypertf.core.admission import Decision, admission_pass, clamped
from hypertf.keeper.reader import QueueReader, read_limits
from hypertf.keeper.screen import INVALID, Screen
from hypertf.store import Store
from hypertf.store.allocation import read_matrix

STARTING = "Starting"  # fits now: the keeper admits it at its next pass


def collect(store: Store, user_gpu_limit: int = 0,
            user_queue_limit: int = 0) -> list[dict[str, Any]]:
    """Every waiting job as the keeper's next pass would see it: the admin's limits cap
    each priority (the priority shown is the one that counts), and requests the keeper
    refuses before its pass (invalid, past a limit, never fitting) show as ``Invalid``
    with the reason."""
    matrix, _ = read_matrix(store)
    reader = QueueReader(store, writes=False)
    limits = read_limits(store)
    read = clamped(reader.waiting(), limits)
    versions = {key: v for key, (_, v) in reader.records.items()}
    waiting, refused = Screen(user_gpu_limit, user_queue_limit)(read, versions, matrix,
                                                                limits)
    decisions = admission_pass(matrix, store.live_hosts(), waiting, user_gpu_limit, limits)
    decisions += [Decision(key, len(decisions) + i, INVALID) for i, key in
                  enumerate(sorted(refused), start=1)]
    by_key = {w.task_key: w for w in read}
    now = time.time()
    rows = []
    for decision in decisions:
        job = by_key[decision.task_key]
        record, _ = reader.records[decision.task_key]
        created = float(record.get("created", now))
        rows.append({"position": decision.position, "task_key": job.task_key,
                     "user": job.user, "priority": job.priority,
                     "shape": job.request.describe(), "gpus": job.request.gpus,
                     "script": record.get("script", ""), "queued": created,
                     "waiting_s": round(now - created, 1),
                     "reason": decision.reason or STARTING,
                     **({"refused": refused[job.task_key]} if job.task_key in refused else {})})
    now_rows = len(rows)
    for i, (key, (_, _, why)) in enumerate(sorted(reader.rejected.items()), start=1):
        rows.append({"position": now_rows + i, "task_key": key, "user": key.partition(".")[2],
                     "priority": 0, "shape": "", "gpus": 0, "script": "", "queued": now,
                     "waiting_s": 0.0, "reason": INVALID, "refused": why})
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no job is waiting"
    header = f"{'POS':>3}  {'TASK KEY':<34} {'USER':<10} {'PRIO':>4}  {'WAITING':>8}  " \
             f"{'REASON':<9}  SHAPE"
    lines = [header]
    for row in rows:
        wait = int(row["waiting_s"])
        lines.append(f"{row['position']:>3}  {row['task_key']:<34} {row['user']:<10} "
                     f"{row['priority']:>4}  {wait // 60:>5}:{wait % 60:02d}  "
                     f"{row['reason']:<9}  {row['shape']}  {row['script']}")
    return "\n".join(lines)
