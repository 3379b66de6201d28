"""The keeper's screen before a pass: refusals decided from the admin's limits, the
inventory's port ranges and the cluster's size, before the admission pass spends any work
on a request that can never be admitted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from hypertf.core.admission import (
    Waiting,
    fits_cluster,
)
from hypertf.core.limits import UserLimits
from hypertf.core.matrix import Matrix
from hypertf.core.placement import Request
from hypertf.core.requestcheck import (
    PortBounds,
)

INVALID = "Invalid"  # refused before the pass: invalid, past a limit, never fits


@dataclass
class Screen:
    """Refusals decided before a pass, from the admin's limits and the cluster's size: a
    request past its owner's GPU limit, one no cluster state could ever fit (it would
    reserve hosts for nothing), and a user's waiting jobs past ``queue_limit`` (oldest
    first kept). Whether a request can ever fit is decided once per record version, and
    once per shape: 1,000 waiting jobs that ask the same of 25,000 hosts cost one scan of
    them (a new ``hypertf queue`` process scanned them once per job: ~20 s)."""

    user_gpu_limit: int = 0
    queue_limit: int = 0
    port_bounds: PortBounds | None = None  # the inventory's port ranges (the agent's keeper)
    _fits: dict[tuple[str, int, int], bool] = field(default_factory=dict)
    _ports: dict[tuple[str, int], str] = field(default_factory=dict)  # why, per version
    _shapes: dict[tuple[object, ...], bool] = field(default_factory=dict)
    _sizes: tuple[tuple[str, ...], tuple[int, ...]] = ((), ())  # the rows the shapes saw

    def __call__(self, waiting: list[Waiting], versions: Mapping[str, int], matrix: Matrix,
                 limits: UserLimits) -> tuple[list[Waiting], dict[str, str]]:
        kept, refused = [], {}
        per_user: Counter[str] = Counter()
        rows = len(matrix.gpus)
        sizes = (tuple(matrix.gpus), tuple(map(len, matrix.gpus.values())))
        if sizes != self._sizes:  # a host's GPUs came or went: judge every shape again
            self._shapes.clear()
            self._sizes = sizes
        for job in sorted(waiting, key=lambda w: (w.order, w.task_key)):
            cap = limits.gpu_limit(job.user, self.user_gpu_limit)
            why = ""
            if cap and job.request.gpus > cap:
                why = (f"it asks for {job.request.gpus} GPUs, more than the {cap} {job.user} "
                       f"may hold at once (hypertf_user_gpu_limit, or the admin's 'hypertf "
                       f"auth limits'): ask for fewer GPUs")
            elif ports := self._ports_outside(job, versions.get(job.task_key, 0)):
                why = f"invalid request: {ports}"
            elif not self._ever_fits(job, versions.get(job.task_key, 0), matrix, rows):
                why = (f"{job.request.describe()}: more than the cluster's hosts can ever "
                       f"hold; ask for fewer tasks or GPUs")
            elif self.queue_limit and per_user[job.user] >= self.queue_limit:
                why = (f"{job.user} has {self.queue_limit} jobs waiting already "
                       f"(hypertf_user_queue_limit): submit it again when some have started, "
                       f"or cancel some ('hypertf queue')")
            if why:
                refused[job.task_key] = why
                continue
            per_user[job.user] += 1
            kept.append(job)
        return kept, refused

    def _ports_outside(self, job: Waiting, version: int) -> str:
        """Why the job's port ranges reach past the inventory's (once per record version)."""
        if self.port_bounds is None:
            return ""
        known = self._ports.get((job.task_key, version))
        if known is None:
            if len(self._ports) > 100_000:
                self._ports.clear()
            known = self._ports[(job.task_key, version)] = self.port_bounds.outside(
                job.request.port_ranges)
        return known

    def _ever_fits(self, job: Waiting, version: int, matrix: Matrix, rows: int) -> bool:
        known = self._fits.get((job.task_key, version, rows))
        if known is None:
            request = job.request
            shape = (request.hosts, request.slots, request.policy, rows)
            known = self._shapes.get(shape)
            if known is None:
                known = _could_ever_fit(request, matrix)
                if len(self._shapes) > 10_000:
                    self._shapes.clear()
                self._shapes[shape] = known
            if len(self._fits) > 100_000:
                self._fits.clear()
            self._fits[(job.task_key, version, rows)] = known
        return known


def _could_ever_fit(request: Request, matrix: Matrix) -> bool:
    """Whether ``request`` fits the matrix's hosts were every GPU free: by the counts, and
    exactly (a schedule) where the hosts are few enough for that to be cheap."""
    sizes = [len(matrix.gpus.get(h, ())) for h in request.hosts]
    biggest = max((slot.gpus for slot in request.slots), default=0)
    known = request.gpus <= sum(sizes) and biggest <= max(sizes, default=0)
    if known and len(request.hosts) <= 512:
        known = fits_cluster(request, matrix, [h for h in request.hosts if h in matrix.gpus])
    return known

