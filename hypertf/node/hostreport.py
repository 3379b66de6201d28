"""What an agent reports about its own host, beside its probe: the ended jobs whose tasks it
has seen dead here (``drained``: the keeper frees their cells on this host only), and the
processes on its GPUs that their job was not granted (``trespasses``, stopped under
``hypertf_gpu_enforce: stop``). It also stops what a dead launcher left running here, and
what a preempted job left past its notice's deadline (the keeper drained its cells). An
agent reports and decides nothing: its credential writes only its own record.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace

from hypertf.config.inventory import Node
from hypertf.config.settings import GpuEnforce
from hypertf.core.layout import Layout
from hypertf.core.matrix import Cell, job_of
from hypertf.core.records import AgentRecord, Trespass
from hypertf.core.rundir import RunDir
from hypertf.node import confine, dcgmmap, runcontrol, trespass
from hypertf.node.metrics import AgentCollector
from hypertf.store import Store

MAX_DRAINED = 1000  # ended jobs one report names at most (the rest: next report)
STOP_GRACE_S = 5.0  # TERM to KILL for tasks of a job that ended without its launcher

log = logging.getLogger(__name__)


ADOPT_S = 0.02  # how often the adopter looks for wrappers waiting to join their cgroups


class HostReport:
    """The host's reports, kept between probes; ``wake`` is the agent's watch callback (a
    lease of a job running here went: look again)."""

    def __init__(self, node: Node, layout: Layout, metrics: AgentCollector,
                 wake: Callable[..., object], cgroups: confine.JobCgroups | None = None,
                 minors: Callable[[], Mapping[int, int]] = dict) -> None:
        self.node = node
        self.cgroups = cgroups or confine.JobCgroups(confine.NodeCgroups())
        self._minors = minors
        self._inside: set[tuple[str, str]] = set()  # (job, task) seen in its cgroups
        self._adopting = threading.Lock()  # the probe's adopt and the adopter thread's
        self.layout = layout
        self.metrics = metrics
        self._wake = wake
        self.drained: set[str] = set()  # ended jobs seen dead here, reported to the keeper
        self.row: list[Cell] = []  # this host's cells as last read
        self.trespasses: list[Trespass] = []
        self._suspects: set[tuple[int, int, str, str]] = set()  # seen once, not yet twice

    def apply(self, zk: Store, record: AgentRecord) -> AgentRecord:
        """The record with this agent's reports: the ended jobs it saw dead here, and the
        processes on its GPUs that their job was not granted (stopped under
        ``hypertf_gpu_enforce: stop``).

        A trespass counts only when two probes in a row see it, the second against this
        host's row read afresh from ZooKeeper: a task that starts on a GPU the keeper has
        just granted its job must not be taken for a trespasser because this agent's row
        was read before the grant, or because its wrapper has not written its PID yet."""
        self.adopt()
        enforce = self.node.settings.gpu_enforce
        found: list[Trespass] = []
        # An idle node (no job holds or drains a GPU here, NVML sees no process) is not
        # scanned: the scan reads every process's environment (agent_footprint's budget).
        busy = any(isinstance(cell, str) for cell in self.row) or any(
            gpu.processes for gpu in record.gpus)
        if enforce != GpuEnforce.OFF and self.row and busy:
            seen = trespass.scan(record.gpus, self.node.settings.workdir)
            found = trespass.judge(seen, self.row, record.gpus)
            if found:
                zk.client.sync(self.layout.matrix)  # the keeper's latest grants
                fresh, _ = zk.matrix.read(hosts=[self.node.name])
                self.row = list(fresh.gpus.get(self.node.name, []))
                found = trespass.judge(seen, self.row, record.gpus)
            suspects = {(t.pid, t.gpu, t.claims, t.holder) for t in found}
            found = [t for t in found
                     if (t.pid, t.gpu, t.claims, t.holder) in self._suspects]
            self._suspects = suspects
            if found and enforce == GpuEnforce.STOP:
                found = trespass.stop(found, seen)
            elif found and found != self.trespasses:
                for t in found:
                    log.warning("trespass: pid %d (%s) on GPU %d granted to %s", t.pid,
                                t.claims or "no job", t.gpu, t.holder or "no job")
        else:
            self._suspects = set()
        self.trespasses = found
        if not found and not self.drained:
            return record
        return replace(record, drained=sorted(self.drained), trespasses=found)

    def adopt(self) -> None:
        """Move each proven task wrapper of a job with cgroups here that is not in them
        (its account may not join them by itself: not root, or cgroup v2) into them; the
        wrapper waits for that before it runs its command (task.sh). A task found inside is
        not looked at again (a run starts each task once, and only root moves it out), so a
        probe reads a run's folder per job and nothing when no job has cgroups here."""
        with self._adopting:
            self._adopt()

    def adopt_often(self, stop: threading.Event, every: float = ADOPT_S) -> None:
        """The agent's adopter thread: ``adopt`` every ``every`` seconds until ``stop``. A
        task account that is not root cannot join its job's cgroups itself (cgroup v2
        moves need the common ancestor's ``cgroup.procs``), and its wrapper waits for this:
        at the probe's pace alone (1-5 s) every per-user task started that much later."""
        while not stop.wait(every):
            try:
                self.adopt()
            except OSError:
                continue  # a run or cgroup that went while it looked: the next look sees
            except Exception:  # a bug: said with its traceback, and the thread goes on
                log.exception("the adopter's look failed")

    def _adopt(self) -> None:
        jobs = self.cgroups.jobs()
        self._inside = {(key, name) for key, name in self._inside if key in jobs}
        for key in jobs:
            run = RunDir.of(self.node.settings.workdir, key, local=True)
            for name in run.task_names():
                if (key, name) in self._inside:
                    continue
                wrapper = runcontrol.wrapper(run, name)
                if wrapper is None:
                    continue  # not started yet, or gone: looked at again next probe
                moved, inside = self.cgroups.move_in(key, wrapper)
                if inside:
                    self._inside.add((key, name))
                elif moved:
                    log.info("moved task %s of %s (pid %d) into its cgroups %s", name, key,
                             wrapper, moved)

    def reap_orphans(self, zk: Store) -> None:
        """Stop tasks on this node whose job lease is gone (a launcher killed outright)."""
        runs = runcontrol.unstopped_runs(self.node.settings.workdir)
        if not runs:
            return
        # Read after listing: see reap(). Only this node's runs, by ``exists`` (a data watch
        # on each wakes the loop when its lease goes): no agent lists users' folders.
        leases = zk.leases_of((run.task_key for run in runs), watch=self._wake)
        for task_key, result in runcontrol.reap(runs, leases).items():
            log.warning("job %s has no lease any more: stopped its tasks %s", task_key, result)

    def confirm_drained(self, zk: Store) -> bool:
        """Report this host's draining cells (and cells of jobs whose lease is gone) dead
        once no process of the job is left here: stop what is left first (TERM, KILL after
        the grace). The keeper frees them when it reads the report; nothing is reported
        while a process lives: a GPU is free only when this node says so. True when the
        report changed (the agent writes its record then)."""
        host = self.node.name
        matrix, _ = zk.matrix.read(hosts=[host])  # its own row's shard only
        # After the matrix (see allocation); only the jobs of its own row, as in reap_orphans.
        row = [*matrix.gpus.get(host, []), *matrix.ports.get(host, {}).values()]
        leases = zk.leases_of((key for cell in row if (key := job_of(cell))),
                              watch=self._wake)
        self.row = list(matrix.gpus.get(host, []))
        self.cgroups.sync(_jobs_of(self.row, row), self._minors())  # before the drain below
        self.metrics.update(row=matrix.gpus.get(host, []))
        mapping = self.node.settings.dcgm_job_mapping_dir
        if mapping:
            try:
                dcgmmap.write(mapping, self.row)
            except OSError as err:
                log.error("cannot write dcgm-exporter's job mapping in %s: %s", mapping, err)
        ended = matrix.ended_on(host, leases, self._preempted(zk, matrix.draining_on(host)
                                                              & leases))
        reported = self.drained & ended  # freed by the keeper already: no longer said
        dead = {key for key in ended - reported if runcontrol.drain(
            RunDir.of(self.node.settings.workdir, key, local=True), grace=STOP_GRACE_S)}
        changed = reported != self.drained or bool(dead)
        if changed:
            self.drained = set(sorted(reported | dead)[:MAX_DRAINED])
        if dead:
            log.info("saw the tasks of %s dead on %s: reported to the keeper", sorted(dead),
                     host)
        return changed

    def _preempted(self, zk: Store, keys: set[str]) -> set[str]:
        """Of the live jobs draining on this host (normally none), those the keeper has
        preempted: its notice exists (only the keeper writes there), so their draining
        cells are its word that the notice's deadline passed; stopped like ended jobs."""
        if not keys:
            return set()
        return {key for key in keys if zk.client.exists(zk.layout.preempt(key)) is not None}


def _jobs_of(gpus: list[Cell], cells: list[Cell | str]) -> dict[str, frozenset[int]]:
    """Each job holding or draining a cell (a GPU or a port) of this host, with the GPU
    indices it holds here: what its cgroup allows."""
    jobs: dict[str, set[int]] = {}
    for cell in cells:
        if key := job_of(cell):
            jobs.setdefault(key, set())
    for index, cell in enumerate(gpus):
        if key := job_of(cell):
            jobs[key].add(index)
    return {key: frozenset(held) for key, held in jobs.items()}
