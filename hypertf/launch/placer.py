"""Where a job's attempts run: the keeper's grant, the one way to GPUs (on an idle cluster
too), with the hosts it names connected and preflighted before the start.

``KeeperPlacer`` is the ``Placer`` each ``Attempt`` (hypertf.launch.attempt) is handed.
It is handed in turn what it uses: the store's queue and matrix as they are (``WaitQueue``
and ``MatrixPlans``: the job's session's ``Store.queue`` and ``Store.matrix``), the live
agents (``LiveHosts``: hypertf.launch.roster), preflight (``HostChecks``:
hypertf.launch.preflight) and the early connect (hypertf.launch.sessions), so
tests/unit/test_placer.py drives it without ZooKeeper or SSH.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Set
from typing import Any, Protocol

from hypertf.config.inventory import Inventory
from hypertf.core.admission import fits_cluster
from hypertf.core.errors import InsufficientResources
from hypertf.core.matrix import Matrix
from hypertf.core.placement import Grant, Request
from hypertf.core.records import AgentRecord
from hypertf.core.scheduler import Placement
from hypertf.core.spec import offload_hosts
from hypertf.launch.attempt import JobFailed
from hypertf.launch.reporter import Reporter
from hypertf.launch.request import TrainRequest

__all__ = ["HostChecks", "KeeperPlacer", "LiveHosts", "MatrixPlans", "WaitQueue"]


class WaitQueue(Protocol):
    """The store's queue, as the placer uses it (the real one: ``Store.queue``,
    hypertf.store.waitqueue.JobQueue): the keeper's view, then enqueue and wait for the
    keeper's grant."""

    def read_view(self) -> list[dict[str, Any]]:
        """The keeper's last view of the queue: the jobs waiting ([] when none)."""
        ...

    def enqueue(self, task_key: str, request: Request, record: Mapping[str, Any],
                priority: int = 0, exclude_ports: Mapping[str, set[int]] | None = None,
                wait: bool = True, resumes: str = "") -> None: ...

    def wait_for_admission(self, task_key: str, say: Callable[[str], None],
                           lost_session: threading.Event) -> Grant: ...


class MatrixPlans(Protocol):
    """The store's matrix, as the placer uses it (the real one: ``Store.matrix``,
    hypertf.store.allocation.StoredMatrix): a dry run and a read."""

    def plan(self, request: Request) -> list[Placement]:
        """Where ``request`` would go now (writes nothing); InsufficientResources when it
        does not fit now, the message naming what is free where."""
        ...

    def read(self) -> tuple[Matrix, object]:
        """The matrix now, and the versions it was read at."""
        ...


class LiveHosts(Protocol):
    """The hosts whose agent is up, and their records (hypertf.launch.roster.Roster)."""

    @property
    def records(self) -> Mapping[str, AgentRecord]: ...

    def live_hosts(self) -> list[str]: ...


class Pending(Protocol):
    """A preflight round under way (hypertf.launch.preflight.EarlyPreflight)."""

    def join(self, timeout: float) -> None: ...


class HostChecks(Protocol):
    """Preflight as the placer uses it (hypertf.launch.preflight.Preflight); ``offload``:
    the hosts lent to the tasks' offloaded products, checked for their part."""

    def run(self, hosts: list[str], offload: Set[str]) -> None: ...

    def unchecked(self, hosts: Iterable[str], offload: Set[str]) -> list[str]: ...

    def forget(self, hosts: Iterable[str]) -> None: ...

    def while_waiting(self, hosts: list[str], offload: Set[str]) -> Pending | None: ...


class KeeperPlacer:
    """Places each attempt of one job through the keeper's queue. ``cpu_only``: the
    cluster has no GPU, and every task runs on CPU."""

    def __init__(self, queue: WaitQueue, matrix: MatrixPlans, hosts: LiveHosts,
                 checks: HostChecks, connect_soon: Callable[[Iterable[str]], None],
                 inventory: Inventory,
                 request: TrainRequest, reporter: Reporter, lost_session: threading.Event,
                 cpu_only: bool = False) -> None:
        self.queue = queue
        self.matrix = matrix
        self.hosts = hosts
        self.checks = checks
        self.connect_soon = connect_soon
        self.inventory = inventory
        self.request = request
        self.reporter = reporter
        self.lost_session = lost_session  # set by the job when its ZooKeeper session is lost
        self.cpu_only = cpu_only
        self.placed: list[str] = []  # every attempt's task key, in order: the first is the job's
        self.queued: set[str] = set()  # task keys that went through the queue
        self.offload_placed: set[str] = set()  # hosts lent to products: preflighted as such

    def say(self, line: str) -> None:
        self.reporter.say(line)

    def live_hosts(self) -> list[str]:
        return self.hosts.live_hosts()

    def forget_preflight(self, hosts: Iterable[str]) -> None:
        self.checks.forget(hosts)

    def place(self, task_key: str, live: list[str], exclude: dict[str, set[int]],
              avoid: frozenset[str] = frozenset(), resumes: str = "") -> Grant:
        """Ask the keeper for GPUs. The job waits in the queue until admitted, or with
        --no-wait is admitted at once or refused (exit 4). When it would start now, the
        hosts it would use are preflighted before it asks. Hosts in ``avoid`` (they failed
        two attempts) are left out when the others can take the job. A request larger
        than the whole cluster, or than the owner's GPU limit, fails at once whatever
        --no-wait says."""
        self.placed.append(task_key)
        others = [host for host in live if host not in avoid]
        if avoid and others:
            with contextlib.suppress(InsufficientResources):  # it needs them: keep them
                self.needed_hosts(others)
                live = others
        request = self._allocation_request(live)
        self._check_could_ever_run(request)
        expect_wait = bool(self.queue.read_view())  # others wait: in line behind them
        if not expect_wait:
            try:
                chosen = self.needed_hosts(live)
            except InsufficientResources:
                if not self.request.wait:
                    raise  # the message names what is free where
                expect_wait = True
            else:
                self.connect_soon(chosen)
                new = self.checks.unchecked(chosen, self.offload_placed)
                if new:
                    self.checks.run(new, self.offload_placed)
        return self._wait_in_queue(task_key, request, exclude, expect_wait, resumes)

    def needed_hosts(self, hosts: list[str]) -> list[str]:
        """The hosts the job would use now (a dry run): only those are preflighted, so a
        broken node the job does not need does not fail it."""
        placements = self.matrix.plan(self._allocation_request(hosts))
        self.offload_placed = set(offload_hosts(placements))
        used = {p.host for p in placements}
        return [host for host in hosts if host in used]

    def _allocation_request(self, hosts: list[str]) -> Request:
        return Request(slots=self.request.slots(self.cpu_only), hosts=tuple(hosts),
                       policy=self.request.policy,
                       port_ranges={h: self.inventory.node(h).settings.port_range
                                    for h in hosts})

    def _check_could_ever_run(self, request: Request) -> None:
        limit = self.inventory.cluster.user_gpu_limit
        if limit and request.gpus > limit:
            raise InsufficientResources(
                f"this job asks for {request.gpus} GPUs, more than the {limit} one user may "
                f"hold at once (hypertf_user_gpu_limit): ask for fewer GPUs")
        if not fits_cluster(request, self.matrix.read()[0], list(request.hosts)):
            self.matrix.plan(request)  # raises today's message: what is free, per host
            raise InsufficientResources(f"{request.describe()}: more than the whole cluster "
                                        f"has; ask for fewer tasks or GPUs")

    def _wait_in_queue(self, task_key: str, request: Request, exclude: dict[str, set[int]],
                       expect_wait: bool, resumes: str = "") -> Grant:
        """Queue the job, wait for the keeper to admit it, then preflight its hosts.
        ``resumes``: the preempted attempt this one continues (the keeper gives it that
        attempt's place in the queue, as its own notice says); it waits, --no-wait or not."""
        asked = time.monotonic()
        self.queue.enqueue(task_key, request, self._record(), self.request.priority, exclude,
                           self.request.wait or bool(resumes), resumes)
        self.queued.add(task_key)
        queued_at = time.monotonic()
        said: list[str] = []

        def say(line: str) -> None:
            said.append(line)
            self.say(line)

        early = None
        if expect_wait and self.request.wait:
            say(f"hypertf: job {task_key} queued (priority {self.request.priority}, "
                f"{request.describe()}): it starts when the GPUs are free; 'hypertf queue' "
                f"shows the queue, 'hypertf cancel {task_key}' ends it")
            early = self.checks.while_waiting(list(request.hosts), self.offload_placed)
        try:
            grant = self.queue.wait_for_admission(task_key, say, self.lost_session)
        finally:
            self.reporter.timeline.add("admission", asked, time.monotonic())
        if said:
            self.say(f"hypertf: job {task_key} admitted after "
                     f"{time.monotonic() - queued_at:.1f} s in the queue")
        if early is not None:
            early.join(self.inventory.cluster.ssh_timeout * 3 + 5)
        self.hosts.live_hosts()  # fresh records (addresses, GPU UUIDs) after the wait
        hosts = sorted({p.host for p in grant.placements})
        gone = [host for host in hosts if host not in self.hosts.records]
        if gone:
            raise JobFailed(f"the agent of {', '.join(gone)} went away while the job waited",
                            retryable=True, hosts=frozenset(gone))
        self.offload_placed = set(offload_hosts(grant.placements))
        new = self.checks.unchecked(hosts, self.offload_placed)
        if new:
            self.checks.run(new, self.offload_placed)
        return grant

    def _record(self) -> dict[str, Any]:
        """What the job record says about the request (hypertf jobs shows it): the job is
        its first attempt's key, this attempt the latest placed."""
        return {"script": self.request.script, "args": list(self.request.args),
                "inventory": str(self.inventory.path), "job_id": self.placed[0],
                "attempt": len(self.placed)}
