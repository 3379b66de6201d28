"""Fair share inside a priority tier: which user's waiting job goes next (pure).

Priority tiers stay strict (the admin caps them). Within a tier the next job is the one of
the user with the largest factor, as in Slurm's classic fair share::

    F = 2 ** (-U / S)     U = the user's effective usage / every user's
                          S = the user's share / every user's share

F is 1 for a user who used nothing, 0.5 for one exactly at their share, and falls towards
0 past it. A user's *effective usage* is their decayed GPU-seconds (each second of a GPU
counts half after ``half_life_s``, a quarter after two; running attempts count up to now)
plus an *entry charge* for each GPU they hold now of their *expected run time* (the
average time their recent attempts held GPUs; the cluster's for a new user; an hour before
any attempt ended): a job is charged its expected usage the moment it is admitted, so a
user with 50 waiting jobs gets the next free GPUs only while they are below their share,
not until the statistics of their running jobs catch up (Kueue's entry penalty). The
charge scales with the jobs: 10-second jobs are charged seconds, 10-hour jobs hours.
Since U and S are fractions of the same totals for everyone, ordering by F is ordering by
``effective usage / share``, which changes only for the user whose job was just admitted:
the pass keeps one heap entry per user (``ordered``), not a sort per admission.
Ties (a new cluster, users without usage) go by submission order, so a queue of one user,
or with fair share off (``half_life_s`` 0), is ordered exactly as before: priority, then
first come first served.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from hypertf.core.limits import DEFAULT_SHARE

LN2 = math.log(2.0)
DAY_S = 86400.0
DEFAULT_HALF_LIFE_DAYS = 7.0  # Slurm's PriorityDecayHalfLife
DEFAULT_EXPECTED_S = 3600.0  # a job's expected run time before any attempt has ended


def decay(value: float, elapsed_s: float, half_life_s: float) -> float:
    """``value`` after ``elapsed_s`` seconds of decay (none with fair share off, none
    backwards: a clock that stepped back decays nothing)."""
    if half_life_s <= 0 or elapsed_s <= 0:
        return value
    return value * math.exp2(-elapsed_s / half_life_s)


def accrued(gpus: float, start: float, now: float, half_life_s: float) -> float:
    """The decayed GPU-seconds, as of ``now``, of ``gpus`` held since ``start``: the
    integral of ``gpus * 2^-(now-t)/h`` over the run (h/ln 2 per GPU at most, however long
    it runs). Without decay, plain GPU-seconds."""
    span = max(0.0, now - start)
    if half_life_s <= 0:
        return gpus * span
    return gpus * half_life_s / LN2 * (1.0 - math.exp2(-span / half_life_s))


class Queued(Protocol):
    """What the ordering reads of a waiting job (hypertf.core.admission.Waiting)."""

    @property
    def user(self) -> str: ...

    @property
    def priority(self) -> int: ...

    def sort_key(self) -> tuple[int, int, str]: ...


Job = TypeVar("Job", bound=Queued)


@dataclass
class Fairshare:
    """Each user's standing for one pass: ``usage`` their decayed GPU-seconds as of the
    keeper's clock (ended attempts and the running ones so far), ``held`` the GPUs they hold
    now, ``expected`` their expected run time (seconds; ``default_expected_s`` for users
    without one): each held GPU is charged that much (the entry charge). ``shares``: the
    admin's share of a user. ``admitted`` charges a job's GPUs at once, so the pass's next
    choice sees them."""

    half_life_s: float
    usage: dict[str, float] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)
    shares: Callable[[str], float] = lambda _user: DEFAULT_SHARE
    expected: Mapping[str, float] = field(default_factory=dict)
    default_expected_s: float = DEFAULT_EXPECTED_S

    @property
    def on(self) -> bool:
        return self.half_life_s > 0

    def charge(self, user: str) -> float:
        """The entry charge of one GPU of ``user`` (GPU-seconds)."""
        return self.expected.get(user, self.default_expected_s)

    def effective(self, user: str) -> float:
        """Decayed usage plus the entry charge of the GPUs held now (GPU-seconds)."""
        return self.usage.get(user, 0.0) + self.held.get(user, 0) * self.charge(user)

    def key(self, user: str) -> float:
        """Effective usage per share: the smaller, the sooner (F's order)."""
        return self.effective(user) / max(self.shares(user), 1e-9)

    def admitted(self, user: str, gpus: int) -> None:
        """The entry charge of a job admitted in this pass."""
        if gpus:
            self.held[user] = self.held.get(user, 0) + gpus

    def factors(self, users: Iterable[str]) -> dict[str, float]:
        """F = 2^(-U/S) for each of ``users``, U and S their fractions of the totals over
        those users (hypertf queue --shares)."""
        named = sorted(set(users))
        total_usage = sum(self.effective(u) for u in named)
        total_share = sum(self.shares(u) for u in named) or 1.0
        factors = {}
        for user in named:
            fraction = self.effective(user) / total_usage if total_usage > 0 else 0.0
            share = self.shares(user) / total_share
            factors[user] = math.exp2(-fraction / share) if share > 0 else 0.0
        return factors


def ordered(jobs: Sequence[Job], fair: Fairshare | None) -> Iterator[Job]:
    """``jobs`` in the order a pass decides them: priority first (strict tiers), then the
    user with the smallest effective usage per share (largest F), then submission order.
    Lazily: the caller charges an admitted job (``fair.admitted``) before asking for the
    next, and the user's next job is placed by their key at that moment. Without fair
    share, the plain order (priority, then first come first served)."""
    if fair is None or not fair.on:
        yield from sorted(jobs, key=lambda job: job.sort_key())
        return
    per_user: dict[str, list[Job]] = {}
    for job in jobs:
        per_user.setdefault(job.user, []).append(job)
    queues = {user: iter(sorted(own, key=lambda job: job.sort_key()))
              for user, own in per_user.items()}
    heap: list[tuple[int, float, tuple[int, int, str], int, str]] = []
    heads: dict[str, Job] = {}

    def push(user: str) -> None:
        job = next(queues[user], None)
        if job is not None:
            heads[user] = job
            order = job.sort_key()
            heapq.heappush(heap, (order[0], fair.key(user), order, len(heap), user))

    for user in queues:
        push(user)
    while heap:
        *_, user = heapq.heappop(heap)
        yield heads[user]
        push(user)  # after the caller charged (or not) the job just given


def factor_table(fair: Fairshare, users: Iterable[str], month: Mapping[str, float]
                 ) -> list[dict[str, float | str]]:
    """``hypertf queue --shares``' rows: each user's share, decayed usage (GPU-hours), the
    GPUs charged, the factor and this month's GPU-hours."""
    named = sorted(set(users))
    factors = fair.factors(named)
    return [{"user": user, "share": fair.shares(user),
             "usage_gpu_hours": round(fair.usage.get(user, 0.0) / 3600.0, 4),
             "usage_gpu_seconds": round(fair.usage.get(user, 0.0), 1),
             "held_gpus": fair.held.get(user, 0),
             "expected_hours": round(fair.charge(user) / 3600.0, 3),
             "factor": round(factors[user], 4),
             "month_gpu_hours": round(month.get(user, 0.0) / 3600.0, 3)} for user in named]
