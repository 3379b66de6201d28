"""What each user may ask of the keeper: a maximum priority, a GPU limit, a fair share, a
monthly GPU-hour budget and whether their jobs are exempt from preemption, set by the admin.

Kept in ``<root>/limits`` (docs/zookeeper-layout.md), which only the admin may write: a job
record is its owner's to write, so a priority read from it is only a wish. The keeper clamps
it to the owner's maximum, admits no job that would take its owner past the GPU limit, orders
a priority tier by each owner's share against their usage (hypertf.core.fairshare) and keeps
new jobs of an owner past their budget waiting. A share or a budget in a job record is
never read, and neither is a wish not to be preempted: only the admin's ``no_preempt_ok``
exempts a user's running jobs (hypertf.core.preemption). Pure: the store reads and writes
the znode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hypertf.core.errors import UsageError
from hypertf.core.records import decode, encode

DEFAULT_MAX_PRIORITY = 10  # a user the admin said nothing about: --priority up to 10
DEFAULT_SHARE = 1.0  # every user's share unless the admin says otherwise
MAX_SHARE = 1_000_000.0  # a share past this is a typo, not a policy
MAX_BUDGET_HOURS = 1e9  # GPU-hours a month: more than any cluster has


@dataclass(frozen=True)
class UserLimit:
    """One user's ceiling: ``gpu_limit`` 0 means the cluster's hypertf_user_gpu_limit;
    ``share`` weighs the user in their priority tier (hypertf.core.fairshare);
    ``gpu_hours_per_month`` 0 means no budget; ``no_preempt_ok``: the user's running jobs
    are never preemption victims (``hypertf auth limits --no-preempt-ok``)."""

    max_priority: int = DEFAULT_MAX_PRIORITY
    gpu_limit: int = 0
    share: float = DEFAULT_SHARE
    gpu_hours_per_month: float = 0.0
    no_preempt_ok: bool = False


@dataclass(frozen=True)
class UserLimits:
    """Every user's ceiling; users not named get ``default``."""

    default: UserLimit = field(default_factory=UserLimit)
    users: Mapping[str, UserLimit] = field(default_factory=dict)

    def of(self, user: str) -> UserLimit:
        return self.users.get(user, self.default)

    def priority(self, user: str, asked: int) -> int:
        """The priority that counts: what the job asks, at most the owner's maximum."""
        return min(asked, self.of(user).max_priority)

    def gpu_limit(self, user: str, cluster_limit: int) -> int:
        """GPUs the user may hold at once (0: no limit)."""
        return self.of(user).gpu_limit or cluster_limit

    def share(self, user: str) -> float:
        """The user's fair share (default 1): their weight against the others' usage."""
        return self.of(user).share

    def budget_s(self, user: str) -> float:
        """The user's monthly budget in GPU-seconds (0: none)."""
        return self.of(user).gpu_hours_per_month * 3600.0

    def preemptible(self, user: str) -> bool:
        """Whether the user's running jobs may be preempted: yes unless the admin said
        ``--no-preempt-ok`` for them (nothing a user writes can say otherwise)."""
        return not self.of(user).no_preempt_ok

    def with_user(self, user: str, max_priority: int | None, gpu_limit: int | None,
                  share: float | None = None,
                  gpu_hours_per_month: float | None = None,
                  no_preempt_ok: bool | None = None) -> UserLimits:
        """A copy where ``user`` has the given ceilings (None keeps what was there)."""
        old = self.of(user)
        if gpu_limit is not None and gpu_limit < 0:
            raise UsageError(f"--gpu-limit {gpu_limit}: give 0 (the cluster's limit) or more")
        if share is not None and not 0 < share <= MAX_SHARE:
            raise UsageError(f"--share {share:g}: give a number above 0 and at most "
                             f"{MAX_SHARE:,.0f} (1 is everyone's default)")
        if gpu_hours_per_month is not None and not 0 <= gpu_hours_per_month <= MAX_BUDGET_HOURS:
            raise UsageError(f"--gpu-hours-per-month {gpu_hours_per_month:g}: give 0 (no "
                             f"budget) or a number of GPU-hours up to {MAX_BUDGET_HOURS:g}")
        new = UserLimit(old.max_priority if max_priority is None else max_priority,
                        old.gpu_limit if gpu_limit is None else gpu_limit,
                        old.share if share is None else float(share),
                        old.gpu_hours_per_month if gpu_hours_per_month is None
                        else float(gpu_hours_per_month),
                        old.no_preempt_ok if no_preempt_ok is None else bool(no_preempt_ok))
        return UserLimits(self.default, {**self.users, user: new})

    def to_json(self) -> bytes:
        return encode({"default": _plain(self.default),
                       "users": {u: _plain(limit) for u, limit in sorted(self.users.items())}})

    @classmethod
    def from_json(cls, data: bytes | None) -> UserLimits:
        if not data:
            return cls()
        payload = decode(data, "user limits")
        return cls(_limit(payload.get("default", {})),
                   {str(u): _limit(v) for u, v in payload.get("users", {}).items()})


def _plain(limit: UserLimit) -> dict[str, float | bool]:
    plain: dict[str, float | bool] = {"max_priority": limit.max_priority,
                               "gpu_limit": limit.gpu_limit}
    if limit.share != DEFAULT_SHARE:  # written only when set: older readers see the same
        plain["share"] = limit.share
    if limit.gpu_hours_per_month:
        plain["gpu_hours_per_month"] = limit.gpu_hours_per_month
    if limit.no_preempt_ok:
        plain["no_preempt_ok"] = True
    return plain


def _bounded(value: object, low: float, high: float, default: float) -> float:
    """A number the admin wrote, within its range, else the default (never a crash: one
    damaged entry must not stop the keeper's passes)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    number = float(value)
    return number if low <= number <= high else default


def _limit(value: Mapping[str, Any]) -> UserLimit:
    return UserLimit(int(value.get("max_priority", DEFAULT_MAX_PRIORITY)),
                     int(value.get("gpu_limit", 0)),
                     _bounded(value.get("share", DEFAULT_SHARE), 1e-9, MAX_SHARE,
                              DEFAULT_SHARE),
                     _bounded(value.get("gpu_hours_per_month", 0.0), 0.0, MAX_BUDGET_HOURS,
                              0.0),
                     value.get("no_preempt_ok") is True)  # anything but true: preemptible
