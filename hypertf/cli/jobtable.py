"""``hypertf jobs``' table: a row per job record, when it was submitted, how long it
waited and ran, and a note (who ended it, its attempt, why it failed); every cell made safe
for a terminal (another user's record is printed)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hypertf.core.jobrecord import JobRecord


def _clock(stamp: Any) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(stamp)) \
        if isinstance(stamp, (int, float)) else "-"


def _span(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


JOB_COLUMNS = ("TASK KEY", "STATE", "OWNER", "SUBMITTED", "WAITED", "RAN", "SCRIPT", "TASKS",
               "NOTE")
REASON_WIDTH = 100  # a failure's reason in the NOTE column: its first line, cut here


def _reason(job: JobRecord, state: str) -> str:
    """Why a job that did not succeed ended: its summary's first line (or the keeper's
    refusal), short; the whole text is in ``hypertf jobs --json`` and summary.json."""
    from hypertf.core.jobrecord import JobState

    if state not in (JobState.FAILED, JobState.INTERRUPTED, JobState.LOST, JobState.REFUSED,
                     JobState.RETRIED, JobState.PREEMPTED):  # 'preempted by <key> at <time>'
        return ""
    summary = job.get("summary")
    text = str((summary.get("message") if isinstance(summary, dict) else None)
               or job.get("refused_reason") or
               ("its launcher went away without releasing it" if state == JobState.LOST else ""))
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= REASON_WIDTH else line[:REASON_WIDTH - 3] + "..."


def _job_row(job: JobRecord) -> tuple[str, ...]:
    """A job as JOB_COLUMNS' cells: when it was submitted, how long it waited and ran, and
    a note (who ended it, its attempt, why it failed)."""
    from hypertf.core.jobrecord import JobState, task_hosts
    from hypertf.store.jobs import job_state

    owner = job.get("owner", {})
    tasks = ", ".join(f"{name}@{host}" for name, host in task_hosts(job))
    state = job_state(job)
    notes = []
    for how, by, when in ((JobState.KILLED, job.get("killed_by"), job.get("killed")),
                          (JobState.CANCELLED, job.get("cancelled_by"), job.get("cancelled"))):
        if state == how and by:
            who = by.get("identity") or by.get("user", "?")
            command = f" ({by['command']})" if isinstance(by.get("command"), str) else ""
            notes.append(f"{how} by {who}{command} from {by.get('host', '?')} at "
                         f"{_clock(when)}")
    if job.get("attempt", 1) > 1:
        notes.append(f"attempt {job['attempt']} of {job['job_id']}")
    reason = _reason(job, state)
    if reason:
        notes.append(reason)
    created = job.get("created")
    started = job.get("admitted", created) if state != JobState.QUEUED else None
    ends = [job.get(k) for k in ("released", "killed", "cancelled", "lost", "refused")]
    end = max((t for t in ends if isinstance(t, (int, float))), default=None)
    waited = job.get("waited_s") if state != JobState.QUEUED else \
        (time.time() - created if isinstance(created, (int, float)) else None)
    if state != JobState.QUEUED and isinstance(waited, (int, float)) and waited < 1.0:
        waited = None  # admitted at once (every job passes the keeper): it did not wait
    ran = (end or time.time()) - started if isinstance(started, (int, float)) and \
        state not in (JobState.QUEUED, JobState.CANCELLED, JobState.REFUSED) else None
    return (str(job["task_key"]), state, f"{owner.get('user', '?')}@{owner.get('host', '?')}",
            _clock(created), _span(waited), _span(ran), str(job.get("script", "")),
            tasks or "-", "; ".join(notes))


def printable(text: str) -> str:
    """A cell as it may reach a terminal: every record is written by its owner (or their
    launcher), and another user's ``hypertf jobs`` prints it, so a control character (an
    escape sequence that retitles, clears or rewrites the terminal) shows as '?'."""
    from hypertf.core.records import plain_text

    return plain_text(text, instead="?")


def job_table(found: list[JobRecord]) -> list[str]:
    """``hypertf jobs``' lines: a header, then a row per job, columns as wide as their
    widest cell (the last, the note, is not padded)."""
    rows = [JOB_COLUMNS, *(tuple(map(printable, _job_row(job))) for job in found)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(JOB_COLUMNS) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)),
                       row[-1]]).rstrip() for row in rows]
