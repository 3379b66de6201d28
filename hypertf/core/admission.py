"""Which waiting jobs start now: one pure pass over the queue, the matrix and the live hosts.

Order: higher ``priority`` first, then first come first served (the job record's creation
zxid: ZooKeeper's own 64-bit transaction order, so no sequence counter can wrap). Gang
admission: a job gets all its tasks placed or nothing.

**No starvation.** A job that cannot start for lack of GPUs *reserves* every host it could
ever use (a host of its request whose GPU count can hold its smallest GPU task). A later job
starts ahead of it only on hosts outside that reservation, so it never takes a GPU the
waiting job needs and cannot delay it, however long either runs (no runtime estimates are
needed, none are trusted). Jobs waiting for their owner's GPU limit (``UserLimit``) or put
on hold (``Held``) reserve nothing: they do not wait for GPUs.

**Fair share** (hypertf.core.fairshare): within a priority tier, the next job is the one of
the user furthest below their share (decayed usage plus the GPUs they hold, per share), then
the oldest; each admission charges its GPUs to its owner at once. Tiers stay strict, and the
reservations above apply to the order so made. With fair share off, or one user, the order
is the plain one.

Reasons, as squeue shows them: ``Resources`` (not enough free GPUs even if it were first),
``Priority`` (it would fit, but jobs ahead of it reserve what it needs), ``Fairshare`` (a
later job of another user at its priority went ahead: that user is further below their
share), ``UserLimit``, ``Budget`` (its owner used their monthly GPU-hours: it waits,
reserving nothing; running jobs are never stopped for it), ``Held``. The keeper's
preemption (hypertf.keeper.preempter) shows two more over these: ``Preempting`` (running
jobs were told to give it their GPUs: it waits for their grants to go) and ``Requeued``
(a preempted job's next attempt, waiting at the place its notice kept for it).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hypertf.core.fairshare import Fairshare, ordered
from hypertf.core.layout import owner_of
from hypertf.core.limits import UserLimits
from hypertf.core.matrix import FREE, Cell, Held, Matrix
from hypertf.core.placement import PortsExhausted, Request, pick_ports
from hypertf.core.scheduler import NoFit, Placement, TaskSlot, schedule

RESOURCES, PRIORITY, USER_LIMIT, HELD = "Resources", "Priority", "UserLimit", "Held"
FAIRSHARE, BUDGET = "Fairshare", "Budget"
PREEMPTING, REQUEUED = "Preempting", "Requeued"  # the keeper's preemption (not this pass)
BLOCKED = frozenset({RESOURCES, PRIORITY, FAIRSHARE})  # waiting for GPUs: it reserves hosts


@dataclass(frozen=True)
class Waiting:
    """One queued job as the admitter reads it from its job record."""

    task_key: str
    request: Request
    priority: int = 0
    order: int = 0  # the job record's czxid: FIFO within a priority
    held: bool = False
    exclude_ports: Mapping[str, frozenset[int]] = field(default_factory=dict)
    no_wait: bool = False  # --no-wait: admitted in the keeper's next pass, or refused
    resumes: str = ""  # the preempted attempt it continues: a wish, until the keeper's notice

    @functools.cached_property
    def user(self) -> str:
        return owner_of(self.task_key)

    def sort_key(self) -> tuple[int, int, str]:
        return (-self.priority, self.order, self.task_key)


@dataclass(frozen=True)
class Decision:
    """Where a waiting job stands after a pass: admitted (``placements`` and ``ports``) or
    waiting at ``position`` for ``reason``."""

    task_key: str
    position: int
    reason: str = ""  # "" when admitted
    placements: tuple[Placement, ...] = ()
    ports: Mapping[str, int] = field(default_factory=dict)
    refused: bool = False  # a --no-wait job that cannot start now: it leaves the queue

    @property
    def admitted(self) -> bool:
        return not self.reason


@functools.lru_cache(maxsize=1024)
def _free_cells(row: tuple[Cell, ...]) -> tuple[int, ...]:
    """The free cells' indices of a row (an idle cluster's rows are a few distinct ones)."""
    return tuple(i for i, cell in enumerate(row) if cell == FREE)


def usable_hosts(job: Waiting, matrix: Matrix, live: set[str]) -> set[str]:
    """Hosts ``job`` could ever use: live, in its request, with enough GPUs in all (busy
    or unavailable ones included: they may come back)."""
    smallest = min((slot.gpus for slot in job.request.slots if slot.gpus > 0), default=0)
    if smallest == 0:
        return set()  # GPU-less tasks need ports only: they compete for nothing scarce
    return {host for host in job.request.hosts
            if host in live and len(matrix.gpus.get(host, [])) >= smallest}


def _fits(job: Waiting, free: Mapping[str, Sequence[int]], live: set[str]
          ) -> list[Placement] | None:
    hosts = [host for host in job.request.hosts if host in live]  # the request's order
    try:
        return schedule({host: free.get(host, []) for host in hosts}, job.request.slots,
                        job.request.policy, cpu_hosts=hosts)
    except NoFit:
        return None


def clamped(waiting: Sequence[Waiting], limits: UserLimits) -> list[Waiting]:
    """The jobs with the priority that counts: a record is its owner's to write, so its
    priority is a wish, capped at the maximum the admin gave its owner."""
    capped = []
    for job in waiting:
        priority = limits.priority(job.user, job.priority)
        capped.append(job if priority == job.priority else replace(job, priority=priority))
    return capped


class _Overtaken:
    """Whether a later job of another user at the same priority was decided before a job:
    per priority, the two latest submissions seen so far of two different users."""

    def __init__(self) -> None:
        self._latest: dict[int, list[tuple[int, str]]] = {}

    def seen(self, job: Waiting) -> bool:
        """Note ``job``; True when a job of another user, submitted after it at its
        priority, came first (fair share put that user ahead)."""
        top = self._latest.setdefault(job.priority, [])
        overtaken = any(order > job.order and user != job.user for order, user in top)
        mine = [(o, u) for o, u in top if u == job.user]
        others = [(o, u) for o, u in top if u != job.user]
        best_mine = max([*mine, (job.order, job.user)])
        self._latest[job.priority] = sorted([best_mine, *others], reverse=True)[:2]
        return overtaken


def admission_pass(matrix: Matrix, live: Iterable[str], waiting: Sequence[Waiting],
                   user_gpu_limit: int = 0, limits: UserLimits | None = None,
                   fair: Fairshare | None = None,
                   over_budget: frozenset[str] = frozenset()) -> list[Decision]:
    """Decide every waiting job, in queue order, against ``matrix`` (as synced now) and
    the hosts with a live agent. Pure: nothing is written; the caller commits the admitted
    ones in one transaction. ``user_gpu_limit`` 0 means none; ``limits`` (the admin's, per
    user) cap each job's priority and its owner's GPUs. A ``no_wait`` job that cannot
    start now is refused and reserves nothing. ``fair``: each user's decayed usage (the
    keeper's ledger) and shares, which order a tier (the GPUs held now are read from
    ``matrix``; ``fair`` itself is not changed); ``over_budget``: users past their monthly
    GPU-hours, whose jobs wait (``Budget``)."""
    if not waiting:
        return []  # an idle pass over 25,000 hosts computes nothing
    limits = limits or UserLimits()
    live = set(live)
    taken = matrix  # each admission's take() is a new matrix: this one stays as it is
    rows = matrix.gpus  # the free cells of the hosts that have some (a full cluster: few)
    free: dict[str, Sequence[int]] = {host: _free_cells(tuple(row)) for host in live
                                      if (row := rows.get(host)) and FREE in row}
    free_total = sum(len(cells) for cells in free.values())
    used = matrix.held_per_user()
    if fair is not None and fair.on:  # this pass's own copy: its admissions charge it
        fair = Fairshare(fair.half_life_s, fair.usage, dict(used), fair.shares,
                         fair.expected, fair.default_expected_s)
    overtaken = _Overtaken()
    reserved: set[str] = set()  # always live hosts: once it is all of them, it stays so
    decisions = []
    # A request of the same shape as one that found no place, since nothing was admitted
    # or reserved, finds none either (free GPUs only shrink and reservations only grow in
    # a pass): one user's 2,000 identical requests cost one placement try, not 2,000.
    failed: dict[tuple[int, tuple[TaskSlot, ...], str, bool], str] = {}
    for position, job in enumerate(ordered(clamped(waiting, limits), fair), start=1):
        behind = fair is not None and overtaken.seen(job)
        if job.held:
            decisions.append(Decision(job.task_key, position, HELD, refused=job.no_wait))
            continue
        if job.user in over_budget and job.request.gpus > 0:
            decisions.append(Decision(job.task_key, position, BUDGET, refused=job.no_wait))
            continue
        cap = limits.gpu_limit(job.user, user_gpu_limit)
        if cap and used.get(job.user, 0) + job.request.gpus > cap:
            decisions.append(Decision(job.task_key, position, USER_LIMIT, refused=job.no_wait))
            continue
        # Shortcuts that decide the same, for 1,000 jobs over 10,000 hosts: fewer free GPUs
        # than the job needs fit nowhere; nothing open when every live host is reserved.
        shape = (id(job.request.hosts), job.request.slots, job.request.policy, job.no_wait)
        if shape in failed:
            decisions.append(Decision(job.task_key, position,
                                      FAIRSHARE if behind else failed[shape],
                                      refused=job.no_wait))
            continue
        everything_reserved = len(reserved) >= len(live)
        if job.request.gpus > free_total or (everything_reserved and job.request.gpus > 0):
            placements = None
        else:
            open_free = {host: cells for host, cells in free.items() if host not in reserved}
            placements = _fits(job, open_free, live)
        if placements is None:
            reason = PRIORITY if (reserved and job.request.gpus <= free_total
                                  and _fits(job, free, live)) else RESOURCES
            shown = FAIRSHARE if behind else reason
            decisions.append(Decision(job.task_key, position, shown, refused=job.no_wait))
            if not job.no_wait and not everything_reserved:
                more = usable_hosts(job, matrix, live) - reserved
                if more:
                    reserved |= more
                    failed.clear()
            failed[shape] = reason
            continue
        exclude = {host: set(ports) for host, ports in job.exclude_ports.items()}
        try:
            ports = pick_ports(taken, placements, job.request.port_ranges, exclude)
        except PortsExhausted:
            decisions.append(Decision(job.task_key, position, RESOURCES, refused=job.no_wait))
            continue
        held = Held.of(placements, ports)
        failed.clear()
        taken = taken.take(job.task_key, held.gpus, held.ports)
        for host, indices in held.gpus.items():
            free[host] = [i for i in free[host] if i not in indices]
            free_total -= len(indices)
        used[job.user] = used.get(job.user, 0) + job.request.gpus
        if fair is not None:
            fair.admitted(job.user, job.request.gpus)  # the entry charge, for the next choice
        decisions.append(Decision(job.task_key, position, "", tuple(placements), ports))
    return decisions


def fits_cluster(request: Request, matrix: Matrix, live: Iterable[str]) -> bool:
    """Whether ``request`` could ever run: it fits when every GPU of the live hosts is free
    (unavailable GPUs, busy with foreign work, count too: they may come back)."""
    alive = set(live)
    whole = {host: list(range(len(matrix.gpus.get(host, [])))) for host in request.hosts
             if host in alive}
    try:
        schedule(whole, request.slots, request.policy, cpu_hosts=list(whole))
    except NoFit:
        return False
    return True
