"""A preemption notice: what the keeper writes when it preempts a running job, and what the
victim's launcher, its nodes and the requeued attempt read (docs/queue.md, "Preemption").

It lives at ``<root>/preempts/<victim's task key>`` (``Layout.preempt``), which only the
keeper writes (like grants): a user cannot write one, cancel one or mark his job exempt,
and an agent cannot preempt anyone. Everyone who reads it still checks it: a notice is
believed only for the key it is stored under, with times and counts in range. Pure.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from hypertf.core.layout import is_task_key
from hypertf.core.records import decode, encode

MAX_NOTICE_BYTES = 4096


@dataclass(frozen=True)
class Notice:
    """The keeper's decision that ``victim`` gives its GPUs to ``by``: every task gets
    SIGTERM (the preemption file written first), SIGKILL at ``deadline``; the victim's next
    attempt keeps ``order``, its place in the queue."""

    victim: str  # the preempted attempt's task key (the znode's name)
    by: str  # the preemptor's task key
    at: float  # when the keeper decided (epoch seconds, its clock)
    deadline: float  # SIGKILL then (epoch seconds): at + hypertf_preempt_grace_s
    reason: str  # 'priority' (a lower tier) or 'fairshare' (above its share, same tier)
    order: int = 0  # the victim job's place in the queue, kept by its next attempt
    count: int = 1  # how often this job has been preempted (its back-off grows with it)

    def to_json(self) -> bytes:
        return encode(asdict(self))

    @classmethod
    def from_json(cls, data: bytes, victim: str) -> Notice:
        """The notice stored under ``victim``; ValueError for anything else (wrong shapes,
        a notice naming another victim, times that are not times)."""
        raw: Any = decode(data, "preemption notice", limit=MAX_NOTICE_BYTES)
        try:
            notice = cls(victim=str(raw["victim"]), by=str(raw["by"]), at=float(raw["at"]),
                         deadline=float(raw["deadline"]), reason=str(raw["reason"]),
                         order=int(raw.get("order", 0)), count=int(raw.get("count", 1)))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"preemption notice of {victim}: unreadable ({err})") from err
        if notice.victim != victim or not is_task_key(notice.by) or not (
                math.isfinite(notice.at) and math.isfinite(notice.deadline)
                and notice.at <= notice.deadline) or not 1 <= notice.count <= 10_000 \
                or notice.reason not in ("priority", "fairshare") or notice.order < 0:
            raise ValueError(f"preemption notice of {victim}: out of range")
        return notice

    def grace_left(self, now: float) -> float:
        """Seconds from ``now`` to the SIGKILL (0 once the deadline passed)."""
        return max(0.0, self.deadline - now)
