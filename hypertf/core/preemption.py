"""Which running jobs to preempt so that a waiting job fits: the keeper's pure decision.

Preemption is off unless the admin turns it on (``hypertf_preempt``); the keeper asks
``victims_for`` only then, for a job its admission pass left waiting. Nothing here writes:
the keeper turns a ``Preemption`` into notices (keeper-only, like grants), and the victims'
cells are freed only when the agents report the tasks dead, as for any ended job.

**Who may be a victim** of a waiting job W (tiers are priorities capped by the admin,
``limits.UserLimits.priority``: a record's own priority is only a wish). A running job R is a
candidate when all of these hold:

- R is preemptible (only the admin's ``--no-preempt-ok`` for R's user makes it not);
- R has run at least ``exempt_for(R.preemptions, min_runtime)`` since its latest start, by
  the keeper's clock: the minimum runtime, doubled for every earlier preemption of the job;
- R's tier is strictly lower than W's; or, with fair share on, the same tier, R's user is
  above their share and W's user below theirs (``Standing``, each past a margin), and W's
  user is not in ``R.displaced`` (below).

**Which victims.** W must fit, gang: the scheduler places all its tasks on the free cells
plus the victims' cells, or there is no preemption. Among the sets that make it fit: touch no
tier higher than needed (the lowest tier ceiling with which it fits), then the fewest GPUs,
then the most recently started. Found greedily (by tier and age for the ceiling, by size for
the fewest GPUs), then pruned until no victim can be spared: minimal, not always minimum.

**No cycles.** The job admitted by a preemption records ``displaced``: its victims' users and
their own ``displaced`` sets (the keeper keeps it with the grant). Claim: no job of a
victim's user preempts the preemptor, nor any job that preempted it in turn, unless that job
is of a strictly higher tier than the one it preempts. Proof: along a chain of preemptions
V -> P1 -> ... -> Pk (each preempting the one before) tiers never fall, and every Pi has
user(V) in displaced(Pi), by induction. A job of user(V) preempting Pi needs a tier above
Pi's (a strictly more urgent job: V itself, its tier fixed, cannot) or the same tier, which
``displaced`` forbids. So a chain back to a user must climb a tier, tiers are finite, and no
two jobs take the same GPUs from each other in turn. The margin keeps fair share's noise
out; ``exempt_for`` bounds how often one job pays.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from enum import StrEnum

from hypertf.core.admission import Waiting
from hypertf.core.layout import owner_of
from hypertf.core.matrix import FREE, Matrix, holder
from hypertf.core.placement import Request
from hypertf.core.scheduler import OFFLOAD, NoFit, Placement, schedule

# A job preempted n times is exempt for min_runtime * 2**n (at least BACKOFF_BASE_S * 2**n
# once it has been preempted), never longer than BACKOFF_MAX_S beyond the minimum runtime.
BACKOFF_BASE_S = 60.0
BACKOFF_MAX_S = 8 * 3600.0
# A requeued victim waits 5, 10, 20 ... s (at most 5 minutes) before its next attempt starts.
REQUEUE_BASE_S = 5.0
REQUEUE_MAX_S = 300.0


class Reason(StrEnum):
    """Why a victim may be preempted (the ``reason`` of hypertf_preemptions_total)."""

    PRIORITY = "priority"  # a strictly lower tier
    FAIRSHARE = "fairshare"  # the same tier, its user above their share


@dataclass(frozen=True)
class Running:
    """One running job as the keeper knows it from its grant and the admin's limits."""

    task_key: str
    priority: int  # its tier: the priority capped by the admin
    started: float  # the keeper's clock when this attempt was granted
    gpus: Mapping[str, tuple[int, ...]]  # the cells it holds, per host
    preemptible: bool = True  # False only by the admin's --no-preempt-ok for its user
    preemptions: int = 0  # earlier attempts of the job that were preempted
    displaced: frozenset[str] = frozenset()  # users it (or the chain before it) preempted

    @functools.cached_property
    def user(self) -> str:
        return owner_of(self.task_key)

    @functools.cached_property
    def gpu_count(self) -> int:
        return sum(map(len, self.gpus.values()))


@dataclass(frozen=True)
class Standing:
    """Each user's fair-share standing as preemption reads it: a factor per user, higher for
    the more deserving (``fairshare.Fairshare.factors``, Slurm's ``2^(-U/S)``: 1 unused,
    ``at_share`` exactly at one's share). A user the factors do not name is at their share:
    neither a victim nor a preemptor by it."""

    factors: Mapping[str, float] | Callable[[str], float]
    at_share: float = 0.5
    margin: float = 0.05  # hysteresis: a factor near at_share is neither above nor below

    def factor(self, user: str) -> float:
        if isinstance(self.factors, Mapping):
            return float(self.factors.get(user, self.at_share))
        return float(self.factors(user))

    def below_share(self, user: str) -> bool:
        return self.factor(user) > self.at_share + self.margin

    def above_share(self, user: str) -> bool:
        return self.factor(user) < self.at_share - self.margin


@dataclass(frozen=True)
class Preemption:
    """The decision for one waiting job: the victims to notify (none: it fits already),
    why each, and where the job fits once their cells are free."""

    task_key: str
    victims: tuple[str, ...]
    reasons: Mapping[str, Reason] = field(default_factory=dict)
    gpus: int = 0  # GPUs the victims hold in all (on every host, not only the useful ones)
    placements: tuple[Placement, ...] = ()
    displaced: frozenset[str] = frozenset()  # to keep with the preemptor's grant


def exempt_for(preemptions: int, min_runtime: float) -> float:
    """Seconds after its latest start during which a job is no victim: the minimum runtime,
    doubled for each earlier preemption (from a 60 s floor when the minimum is 0), so a job
    that keeps being chosen runs longer each time and always gets somewhere."""
    if preemptions <= 0:
        return max(min_runtime, 0.0)
    grown = max(min_runtime, BACKOFF_BASE_S) * 2.0 ** min(preemptions, 30)
    return max(min_runtime, min(grown, max(min_runtime, 0.0) + BACKOFF_MAX_S))


def requeue_delay(preemptions: int) -> float:
    """Seconds a victim's next attempt waits once its GPUs are free: 0 the first time, then
    5, 10, 20 ... s, at most 5 minutes, so a job preempted again and again does not pay its
    start-up (TensorFlow's import, the checkpoint's restore) over and over in a burst."""
    if preemptions <= 1:
        return 0.0
    return min(REQUEUE_BASE_S * 2.0 ** min(preemptions - 2, 30), REQUEUE_MAX_S)


def held_cells(matrix: Matrix) -> dict[str, dict[str, tuple[int, ...]]]:
    """Each job's held cells per host, in one pass over the matrix (rows without a job are
    skipped at C speed): ``Running.gpus`` for every job at once."""
    jobs: dict[str, dict[str, list[int]]] = {}
    for host, row in matrix.gpus.items():
        if str not in map(type, row):
            continue
        for i, cell in enumerate(row):
            key = holder(cell)
            if key:
                jobs.setdefault(key, {}).setdefault(host, []).append(i)
    return {key: {h: tuple(c) for h, c in hosts.items()} for key, hosts in jobs.items()}


def victims_for(job: Waiting, running: Sequence[Running], matrix: Matrix,
                live: Collection[str], now: float, min_runtime: float,
                fair_share: Standing | None = None,
                free: Mapping[str, Sequence[int]] | None = None) -> Preemption | None:
    """The running jobs to preempt so that ``job`` fits (its ``priority`` the capped tier),
    or None when preemption cannot make it fit. ``running`` is every running job not
    already being preempted; ``fair_share`` None means tiers alone; ``free`` the free
    cells per live host if the caller has them (the admission pass does), else read from
    ``matrix``. Cheap when nothing can be a victim (one look at each running job);
    otherwise about linear in the candidates' cells plus one pass over the hosts."""
    request = job.request
    if request.gpus <= 0 or not running:
        return None  # GPU-less tasks compete for nothing preemption frees
    candidates = _candidates(job, running, now, min_runtime, fair_share)
    if not candidates:
        return None
    alive = live if isinstance(live, set | frozenset) else set(live)
    usable = alive.intersection(request.hosts)  # at C speed: 25,000 hosts cost ~1 ms
    useful: dict[str, dict[str, tuple[int, ...]]] = {}
    reachable = 0  # the GPUs the job could have: the free ones and every candidate's
    for victim in candidates:
        cells = {h: c for h, c in victim.gpus.items() if h in usable and c}
        if cells:
            useful[victim.task_key] = cells
            reachable += sum(map(len, cells.values()))
    candidates = [v for v in candidates if v.task_key in useful]
    if not candidates:
        return None
    if free is None:  # the hosts with a free cell, found at C speed (a full cluster: few)
        rows = matrix.gpus
        with_free = itertools.compress(rows, map(operator.contains, rows.values(),
                                                 itertools.repeat(FREE)))
        free = {host: [i for i, cell in enumerate(rows[host]) if cell == FREE]
                for host in with_free}
    base = {host: tuple(cells) for host, cells in free.items() if cells and host in usable}
    reachable += sum(map(len, base.values()))
    if reachable < request.gpus:
        return None
    pool = _Pool(request, usable, base, useful)
    if pool.fits():
        return _decision(job, [], pool)
    # The tier ceiling: the lowest tiers first, most recently started first within one.
    by_tier = sorted(candidates, key=lambda v: (v.priority, -v.started, v.task_key))
    if not _fill(pool, by_tier):
        return None
    ceiling = max(v.priority for v in pool.chosen.values())
    tried = [_pruned(pool)]
    # The fewest GPUs under that ceiling: the smallest first, then again lower tier, newer.
    small = _Pool(request, usable, base, useful)
    by_size = sorted((v for v in candidates if v.priority <= ceiling),
                     key=lambda v: (v.gpu_count, v.priority, -v.started, v.task_key))
    if _fill(small, by_size):
        tried.append(_pruned(small))
    best = min(tried, key=_cost)
    return _decision(job, _ranked(best.chosen.values()), best)


def _candidates(job: Waiting, running: Sequence[Running], now: float, min_runtime: float,
                fair_share: Standing | None) -> list[Running]:
    """The running jobs that may be victims of ``job`` (the rules of the module's doc)."""
    tier = job.priority
    within = fair_share is not None and fair_share.below_share(job.user)
    above: dict[str, bool] = {}  # per user, asked once
    found = []
    for victim in running:
        if victim.priority > tier or not victim.preemptible or victim.task_key == job.task_key:
            continue
        if victim.priority == tier:
            if not within or fair_share is None or job.user in victim.displaced:
                continue
            user = victim.user
            if user not in above:
                above[user] = fair_share.above_share(user)
            if not above[user]:
                continue
        if now - victim.started < exempt_for(victim.preemptions, min_runtime):
            continue
        found.append(victim)
    return found


class _Pool:
    """The request's hosts' free GPUs as victims are added and removed, and whether the job
    fits. For every GPU size s of its tasks, how many tasks of at least s GPUs the free
    cells could hold (sum over hosts of free // s) is kept up to date per victim: short of
    what the tasks need, nothing fits (no scheduling); with one size only (and no offload
    host), enough means it fits, so the scheduler runs once, at the end."""

    def __init__(self, request: Request, usable: AbstractSet[str],
                 base: Mapping[str, tuple[int, ...]],
                 useful: Mapping[str, Mapping[str, tuple[int, ...]]]) -> None:
        self.request, self.usable, self.base, self.useful = request, usable, base, useful
        slots = request.slots
        self.sizes = sorted({slot.gpus for slot in slots if slot.gpus > 0})
        self.need = {size: sum(1 for slot in slots if slot.gpus >= size) for size in self.sizes}
        self.exact = len(self.sizes) == 1 and not any(s.role == OFFLOAD for s in slots)
        self.count = {host: len(cells) for host, cells in base.items()}
        self.room = {size: sum(n // size for n in self.count.values()) for size in self.sizes}
        self.chosen: dict[str, Running] = {}
        self.anywhere = any(s.gpus <= 0 or s.role == OFFLOAD for s in slots)  # CPU tasks
        self.hosts: list[str] | None = None  # the usable hosts in the request's order

    def _change(self, victim: Running, sign: int) -> None:
        count, room, sizes = self.count, self.room, self.sizes
        for host, cells in self.useful[victim.task_key].items():
            old = count.get(host, 0)
            new = count[host] = old + sign * len(cells)
            for size in sizes:
                room[size] += new // size - old // size

    def add(self, victim: Running) -> None:
        self.chosen[victim.task_key] = victim
        self._change(victim, 1)

    def remove(self, victim: Running) -> None:
        del self.chosen[victim.task_key]
        self._change(victim, -1)

    def enough(self) -> bool:
        return all(self.room[size] >= self.need[size] for size in self.sizes)

    def fits(self) -> bool:
        return self.enough() and (self.exact or self.place() is not None)

    def place(self) -> list[Placement] | None:
        """The scheduler's placement on the free cells and the chosen victims' cells."""
        if not self.enough():
            return None
        free = {host: list(cells) for host, cells in self.base.items()}
        for key in self.chosen:
            for host, cells in self.useful[key].items():
                free.setdefault(host, []).extend(cells)
        order = _positions(self.request.hosts)
        ordered = {host: sorted(free[host]) for host in sorted(free, key=order.__getitem__)}
        if self.hosts is None:  # GPU-less tasks go to any usable host: only then all of them
            self.hosts = ([host for host in self.request.hosts if host in self.usable]
                          if self.anywhere else [])
        try:
            return schedule(ordered, self.request.slots, self.request.policy,
                            cpu_hosts=self.hosts or list(ordered))
        except NoFit:
            return None


@functools.lru_cache(maxsize=16)
def _positions(hosts: tuple[str, ...]) -> dict[str, int]:
    """Each host's first place in a request's hosts: waiting jobs share one tuple of the
    inventory's hosts (``placement.expand_hosts``), so 25,000 hosts are indexed once."""
    return dict(zip(reversed(hosts), range(len(hosts) - 1, -1, -1), strict=True))


def _fill(pool: _Pool, order: Iterable[Running]) -> bool:
    """Add victims in ``order`` until the job fits; whether it does."""
    for victim in order:
        pool.add(victim)
        if pool.fits():
            return True
    return False


def _pruned(pool: _Pool) -> _Pool:
    """Spare every victim the job fits without: the biggest, highest tier, oldest first."""
    for victim in sorted(pool.chosen.values(),
                         key=lambda v: (-v.gpu_count, -v.priority, v.started, v.task_key)):
        if len(pool.chosen) == 1:
            break
        pool.remove(victim)
        if not pool.fits():
            pool.add(victim)
    return pool


def _cost(pool: _Pool) -> tuple[int, int, float]:
    """Fewest GPUs, then the lowest tier touched, then the newest oldest victim."""
    victims = pool.chosen.values()
    return (sum(v.gpu_count for v in victims), max(v.priority for v in victims),
            -min(v.started for v in victims))


def _ranked(victims: Iterable[Running]) -> list[Running]:
    return sorted(victims, key=lambda v: (v.priority, -v.started, v.task_key))


def _decision(job: Waiting, victims: list[Running], pool: _Pool) -> Preemption | None:
    placements = pool.place()
    if placements is None:  # the pool said it fits and the scheduler disagrees: a bug,
        return None  # but it costs this preemption only, never the keeper's pass
    reasons = {v.task_key: Reason.PRIORITY if v.priority < job.priority else Reason.FAIRSHARE
               for v in victims}
    displaced = frozenset({v.user for v in victims}.union(*(v.displaced for v in victims)))
    return Preemption(job.task_key, tuple(v.task_key for v in victims), reasons,
                      sum(v.gpu_count for v in victims), tuple(placements), displaced)
