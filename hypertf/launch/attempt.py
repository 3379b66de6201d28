"""One try at running a job, under one task key for its whole life.

allocate -> start -> watch -> stop -> release. ``Attempt.run`` returns an ``Outcome`` (the
Monitor's verdict, and the ports to avoid after a port clash) or raises the failure; stop,
release, logs and summary happen whatever goes wrong, and cannot be interrupted. A new try
is a new ``Attempt`` with a new key: nothing of an old one is reused or mutated.

An attempt is handed its collaborators (``Parts``): the placer (the keeper's grant), the
fleet (the nodes), the lease (its job record) and the reporter (lines and timeline). What
the other threads learn (the nodes' watchers, kazoo's watches) reaches the attempt only as
events on its queue, so its state changes in its own thread alone, and
tests/unit/test_attempt.py drives a whole attempt with in-memory parts.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hypertf.config.inventory import Inventory, Node
from hypertf.core import diagnose, taskenv
from hypertf.core import spec as specs
from hypertf.core.errors import Cancelled, HyperTFError
from hypertf.core.jobrecord import JobState
from hypertf.core.monitor import Event, EventKind, Limits, Monitor, TaskState, Verdict
from hypertf.core.offloadname import channel_name
from hypertf.core.placement import Grant
from hypertf.core.protocol import RunEnd, StopResult, TaskStart
from hypertf.core.records import AgentRecord
from hypertf.core.rundir import RunDir, make_private, tensorboard_dir, write_private
from hypertf.launch.fleet import Fleet, HostStart
from hypertf.launch.lease import JobLease
from hypertf.launch.nodeclient import PortsBusy
from hypertf.launch.remote import GroupResult
from hypertf.launch.reporter import Reporter
from hypertf.launch.request import TrainRequest
from hypertf.offload.taskspec import OffloadHost, summarize
from hypertf.offload.taskspec import Spec as OffloadSpec
from hypertf.offload.taskspec import command as offload_command
from hypertf.offload.taskspec import line as offload_line


class Job(Protocol):
    """What an attempt reads of its job (hypertf.launch.launcher.Job): the request, the
    inventory and what preflight and the records said. The job hands itself in, and the
    attempt sees only these members, so the two modules do not import each other."""

    inventory: Inventory
    request: TrainRequest
    records: dict[str, AgentRecord]
    queued: set[str]
    tf_keras: dict[str, bool]
    cpu_only: bool
    started_at: float
    max_port_retries: int

    @property
    def job_id(self) -> str: ...

    def announce_flags(self) -> bool: ...

    def checkpoint_dir(self, host: str) -> str: ...

    def script_path(self) -> str: ...

    def attempts_summary(self) -> list[dict[str, Any]]: ...


class Placer(Protocol):
    """Where the job's tasks go: the keeper's grant (after the queue and preflight), the
    hosts whose agent is up, and the preflight answers to forget after a failed start."""

    def place(self, task_key: str, live: list[str], exclude: dict[str, set[int]],
              avoid: frozenset[str] = ...) -> Grant: ...

    def live_hosts(self) -> list[str]: ...

    def forget_preflight(self, hosts: Iterable[str]) -> None: ...


@dataclass(frozen=True)
class Parts:
    """An attempt's collaborators, handed in: each typed, each replaceable in a test."""

    placer: Placer
    fleet: Fleet
    lease: JobLease
    reporter: Reporter


LEGACY_KERAS_ON = ("1", "true", "True")  # what TensorFlow reads as TF_USE_LEGACY_KERAS set
LATE_EXIT_WAIT_S = 5.0  # after the stop: how long the watchers may take to report the ends
ENDED_WAIT_S = 0.5  # before the stop: how long a finished host's watcher may take to end it
KILLED_WAIT_S = 1.0  # a task killed by a signal: how long a lease drop may take to arrive
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONUNBUFFERED": "1",
             "GRPC_FAIL_FAST": "use_caller"}


class JobFailed(HyperTFError):
    """The job ran and failed; the message names the task and shows its last lines.
    ``retryable``: a new attempt may cure it; ``hosts``: the hosts it points at."""

    exit_code = 1

    def __init__(self, message: str, retryable: bool = False,
                 hosts: frozenset[str] = frozenset()) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.hosts = hosts


class JobKilled(JobFailed):
    """``hypertf kill`` or ``cancel`` ended the running job (its lease was dropped): final,
    and its own exit code (errors.Cancelled's), so it is not taken for a failure."""

    exit_code = Cancelled.exit_code


class Interrupted(HyperTFError):
    exit_code = 130


@contextlib.contextmanager
def interrupted_by_signals() -> Iterator[None]:
    """Inside, SIGINT and SIGTERM raise Interrupted (the job stops and releases what it
    holds); the previous handlers come back after."""
    def interrupt(signum: int, _frame: object) -> None:
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}: job stopped, "
                          f"GPUs released")

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def uninterruptible() -> Iterator[None]:
    """Cleanup must finish: SIGINT and SIGTERM wait until it has."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def ended_by(err: HyperTFError) -> tuple[JobState, str]:
    """The result and message a job or an attempt records when ``err`` ends it."""
    return (JobState.INTERRUPTED if isinstance(err, Interrupted) else JobState.FAILED), str(err)


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, when it did not raise: succeeded, or a port clash (retry on
    fresh ports, avoiding ``busy_ports``)."""

    verdict: Verdict
    message: str = ""
    busy_ports: dict[str, set[int]] = field(default_factory=dict)


class Attempt:
    """allocate -> start -> watch -> stop -> release, for one task key."""

    def __init__(self, job: Job, task_key: str, number: int, last: bool, parts: Parts) -> None:
        self.job = job
        self.parts = parts
        self.task_key = task_key
        self.number = number  # 1 for the first try: HYPERTF_ATTEMPT
        self.last = last  # a port clash now fails the job instead of asking for a retry
        self.grant: Grant | None = None
        self.tasks: dict[str, TaskState] = {}
        self.events: queue.Queue[Event] = queue.Queue()
        self._pending: deque[Event] = deque()  # taken from the queue early, handled next
        self.lease_dropped = False
        self._unwatch: Callable[[], None] | None = None
        self.lost_hosts: set[str] = set()
        self.offload_hosts: list[str] = []  # --offload-hosts: lent to the tasks' products
        self.offload: dict[str, dict[str, Any]] = {}  # what each task's runner offloaded
        self.watched: set[str] = set()  # hosts whose watcher runs (until closed or lost)
        self.start_after: dict[str, str] = {}  # task -> address it starts after (TF1 order)
        self.legacy_flags = False  # passed to the script (it reads them)
        # per host: what the stop answered (logs, metrics, offload counts), or the watcher's
        # 'done' when the node ended the run itself ("stopped": what a stop would have said)
        self.ended: dict[str, RunEnd] = {}
        self.result = JobState.FAILED  # succeeded, failed, interrupted or retried
        self.message = ""

    def say(self, line: str) -> None:
        self.parts.reporter.say(line)

    @property
    def reporter(self) -> str:
        """The task whose HYPERTF_METRICS_FILE is copied back: the chief, else worker 0."""
        return "chief:0" if "chief:0" in self.tasks else "worker:0"

    @property
    def local(self) -> RunDir:
        """The same layout on this machine, under the launcher's working directory: where
        the task logs and summary.json land."""
        return RunDir.of(".", self.task_key, local=True)

    @property
    def local_dir(self) -> Path:
        return self.local.local

    def run_dir(self, host: str) -> RunDir:
        return RunDir.of(self.job.inventory.node(host).settings.workdir, self.task_key)

    def _hosts(self) -> set[str]:
        return {t.placement.host for t in self.tasks.values()}

    # -- the lifecycle --------------------------------------------------------------------
    def run(self, live: list[str], exclude: dict[str, set[int]],
            avoid: frozenset[str] = frozenset()) -> Outcome:
        try:
            self.grant = self.parts.placer.place(self.task_key, live, exclude, avoid)
            self.tasks = {p.name: TaskState(p, self.grant.ports[p.name])
                          for p in specs.tasks_of(self.grant.placements)}
            self.offload_hosts = specs.offload_hosts(self.grant.placements)
            # the lease's end ('hypertf kill', a lost session) arrives as an event
            self._unwatch = self.parts.lease.watch(self.task_key, self.events)
            busy = self.start()
            verdict = Verdict.PORT_CLASH if busy else self.watch()
            if verdict is Verdict.PORT_CLASH:
                if self.last:
                    raise JobFailed("tasks could not bind their ports after "
                                    f"{self.job.max_port_retries} retries")
                self.result = JobState.RETRIED
                return Outcome(verdict, busy_ports=busy or {
                    host: {t.port for t in self.tasks.values() if t.placement.host == host}
                    for host in self._hosts()})
            self.result, self.message = JobState.SUCCEEDED, "all finishers exited 0"
            return Outcome(verdict, self.message)
        except HyperTFError as err:
            self.result, self.message = ended_by(err)
            raise
        finally:
            with uninterruptible():
                self.finish()

    # -- events ---------------------------------------------------------------------------
    def _next(self, timeout: float) -> Event | None:
        """The next event (one taken early first), or None after ``timeout``."""
        if self._pending:
            return self._pending.popleft()
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def _absorb(self, event: Event, exits: bool = False) -> None:
        """What the attempt keeps of any event, besides the Monitor's rules: how a node
        ended its run, whose watcher is gone, the lease's end; with ``exits`` (once the
        Monitor has decided) the exit codes that come after the decision."""
        if event.kind is EventKind.DONE and event.ended is not None:
            self.ended[event.host] = event.ended
        elif event.kind in (EventKind.CLOSED, EventKind.LOST):
            self.watched.discard(event.host)
        elif event.kind is EventKind.LEASE_DROPPED:
            self.lease_dropped = True
        elif exits and event.kind is EventKind.EXIT:
            task = next((t for t in self.tasks.values() if t.placement.host == event.host
                         and t.file_name == event.task), None)
            if task is not None and task.ended is None:
                task.ended, task.exit_code, task.killed = (time.monotonic(), event.code,
                                                           event.killed)

    def _await_lease_drop(self, wait_s: float = KILLED_WAIT_S) -> None:
        """A task killed by a signal: was it an agent stopping it after 'hypertf kill'?
        Events that come meanwhile are kept, in order, for the watch loop."""
        deadline = time.monotonic() + wait_s
        while not self.lease_dropped and (left := deadline - time.monotonic()) > 0:
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                return
            self._pending.append(event)
            if event.kind is EventKind.LEASE_DROPPED:
                self.lease_dropped = True

    # -- start ----------------------------------------------------------------------------
    def start(self) -> dict[str, set[int]]:
        """Every task at once: one request per host, hosts in parallel. Returns the granted
        ports found already in use, per host (nothing is started on such a host)."""
        job, grant = self.job, self.grant
        assert grant
        placements = specs.tasks_of(grant.placements)
        addresses = {p.name: f"{job.records[p.host].data_addr}:{grant.ports[p.name]}"
                     for p in placements}
        by_host: dict[str, list[specs.TaskSpec]] = {}
        for task_spec in sorted(specs.build(placements, addresses),
                                key=lambda s: specs.start_rank(s.placement)):
            by_host.setdefault(task_spec.placement.host, []).append(task_spec)
        self.start_after = specs.start_after(placements, addresses)
        legacy_flags = self.legacy_flags = job.announce_flags()
        script = job.script_path()
        starts = {}
        for host, host_specs in by_host.items():
            node, run = job.inventory.node(host), self.run_dir(host)
            starts[host] = HostStart(
                run, tuple(task_requests(self, node, host_specs, legacy_flags)),
                make_dirs=(job.checkpoint_dir(host),) if job.request.makes_checkpoint_dir
                else (), sync_dir=job.request.sync_dir,
                script=job.request.script_on(node.settings.workdir, run, script))
        self.parts.lease.starting(self.task_key)
        results = self.parts.fleet.start(starts, self.events)
        self.watched.update(results.succeeded)
        busy = {h: v.ports for h, v in results.failed.items() if isinstance(v, PortsBusy)}
        failed = {h: v for h, v in results.failed.items() if not isinstance(v, PortsBusy)}
        if failed:
            self.parts.placer.forget_preflight(failed)  # a cached answer may be why
            raise JobFailed("could not start tasks: " +
                            "; ".join(f"{h}: {v}" for h, v in failed.items()))
        if busy:
            return busy
        self.say(f"hypertf: job {self.task_key}: started {len(self.tasks)} tasks: " + ", ".join(
            f"{t.name}@{t.placement.host}:{t.port}"
            + (f" GPU {','.join(map(str, t.placement.gpus))}" if t.placement.gpus else "")
            for t in self.tasks.values())
            + (f"; their matrix products offloaded to {', '.join(self.offload_hosts)}"
               if self.offload_hosts else ""))
        return busy

    # -- watch ----------------------------------------------------------------------------
    def watch(self) -> Verdict:
        """Stream logs and feed every event to a Monitor until it decides: the verdict
        (succeeded, or a port clash to retry); a failure raises JobFailed."""
        job, timeline = self.job, self.parts.reporter.timeline
        request = job.request
        limits = Limits(start_timeout=request.start_timeout, timeout=request.timeout,
                        idle_timeout=request.idle_timeout, idle_fail=request.idle_fail,
                        host_silence=max(2 * job.inventory.cluster.ssh_timeout, 10.0))
        monitor = Monitor(self.tasks, limits, time.monotonic(), logs_hint=f"{self.local_dir}/",
                          idle_causes=job.request.idle_causes(self.legacy_flags),
                          facts=self.facts())
        while True:
            event = self._next(timeout=0.2) or Event(EventKind.TICK)
            self._absorb(event)
            if event.kind is EventKind.LISTENING:
                timeline.mark("listening", event.host)
            elif event.kind is EventKind.LOG:
                timeline.mark("first log line")
            elif event.kind is EventKind.EXIT and event.killed:
                self._await_lease_drop()  # killed by an agent after 'hypertf kill'?
            if self.lease_dropped and event.kind is not EventKind.SESSION_LOST:
                event = Event(EventKind.LEASE_DROPPED, why=(
                    f"job {self.task_key} was killed: its lease was dropped (hypertf kill); "
                    f"its tasks are stopped and its GPUs returned"))
            decision = monitor.feed(event, time.monotonic())
            for line in decision.say:
                self.say(line)
            self.lost_hosts |= monitor.lost_hosts
            if decision.verdict in (Verdict.SUCCEEDED, Verdict.PORT_CLASH):
                return decision.verdict
            if decision.final and self.lease_dropped:
                raise JobKilled(decision.message)
            if decision.final:
                raise JobFailed(decision.message, decision.verdict is Verdict.RETRYABLE,
                                decision.hosts)

    def facts(self) -> diagnose.JobFacts:
        """What a failure's hint may rely on: TF_USE_LEGACY_KERAS=1 on every task's host,
        and tf-keras in every host's venv (preflight's answer; None if a host did not say)."""
        job = self.job
        hosts = sorted(self._hosts())
        legacy = bool(hosts) and all(
            job.request.task_env(job.inventory.node(host)).get("TF_USE_LEGACY_KERAS")
            in LEGACY_KERAS_ON for host in hosts)
        known = job.tf_keras
        tf_keras = (all(known[host] for host in hosts)
                    if hosts and all(host in known for host in hosts) else None)
        if any(known.get(host) is False for host in hosts):
            tf_keras = False
        return diagnose.JobFacts(legacy_keras=legacy, tf_keras=tf_keras)

    # -- stop, release, report ------------------------------------------------------------
    def stop(self) -> GroupResult[dict[str, StopResult]]:
        """TERM each task's process group, KILL after the grace period; every host at once.
        A host whose node ended the run itself needs no stop."""
        if not self.tasks:
            return GroupResult()
        hosts = sorted(self._hosts() - self.lost_hosts)
        for host in sorted(self.lost_hosts):
            self.say(f"hypertf: warning: {host} does not answer: its agent stops the job's "
                     f"tasks there when it can reach ZooKeeper again (the lease is released)")
        done = self._ended_by_nodes(hosts)
        ends = self.parts.fleet.stop({h: self.run_dir(h) for h in hosts if h not in done},
                                     self.job.request.grace)
        self.ended.update(ends.succeeded)  # the stop's answer: logs, metrics, offload counts
        results: GroupResult[dict[str, StopResult]] = GroupResult()
        results.update({host: end.stopped for host, end in ends.succeeded.items()})
        results.update(ends.failed)
        results.update(done)
        for host, value in results.succeeded.items():
            for task in self.tasks.values():
                if task.placement.host == host and task.file_name in value:
                    task.stop_result = task.stop_result or value[task.file_name]
        for host, err in results.failed.items():
            self.say(f"hypertf: warning: could not stop tasks on {host} ({err}); its "
                     f"agent stops them once the job's lease is released")
        return results

    def _ended_by_nodes(self, hosts: list[str], wait_s: float = ENDED_WAIT_S,
                        ) -> dict[str, dict[str, StopResult]]:
        """Hosts whose every task exited by itself: their watcher ends the run there and
        says so right after the last exit (nothing of it left, logs attached), so they
        need no stop. Waits briefly for that word; a host without it is stopped."""
        finished = {host for host in hosts if all(
            t.ended is not None for t in self.tasks.values() if t.placement.host == host)}
        deadline = time.monotonic() + wait_s
        while any(h not in self.ended for h in finished) and \
                (left := deadline - time.monotonic()) > 0:
            event = self._next(timeout=left)
            if event is not None:
                self._absorb(event, exits=True)
        return {host: self.ended[host].stopped for host in finished if host in self.ended}

    def late_exits(self, wait_s: float = LATE_EXIT_WAIT_S) -> None:
        """Record the exit codes the watchers report after the Monitor decided. A job ends
        at its first failure; its peers die of it a second later (a mirrored worker's
        'Socket closed') or are stopped now, and their ends arrive after the decision.
        Without this, a task that exited 1 with its own traceback read as having no exit
        code at all. Waits until every watched host's tasks have ended, its watcher
        closed, or ``wait_s``."""
        def waiting() -> bool:
            return any(t.ended is None and t.placement.host in self.watched - self.lost_hosts
                       for t in self.tasks.values())

        deadline = time.monotonic() + wait_s
        while waiting() and time.monotonic() < deadline:
            event = self._next(timeout=0.1)
            if event is not None:
                self._absorb(event, exits=True)

    def collect_logs(self) -> None:
        """Every task's log into the local copy of the run (hosts that answer; the stop's
        answer carried them, and the metrics, unless they were large)."""
        if not self.tasks:
            return
        make_private(self.local_dir)
        on = {host: [t.file_name for t in self.tasks.values() if t.placement.host == host]
              for host in self._hosts() - self.lost_hosts}
        fleet = self.parts.fleet
        fleet.fetch_logs({host: self.run_dir(host) for host in on}, on, self.local,
                         {host: end.logs for host, end in self.ended.items()})
        if self.offload_hosts:
            self.collect_offload(on)
        reporter = self.tasks.get(self.reporter)
        if reporter and reporter.placement.host in on:
            host = reporter.placement.host
            if host in self.ended:  # the stop's answer said (None: no metrics file)
                metrics = self.ended[host].metrics
                if metrics and metrics.strip():
                    Path(self.local.metrics).write_text(metrics)
                return
            fleet.fetch_metrics(host, self.run_dir(host), self.local)

    def collect_offload(self, on: Iterable[str]) -> None:
        """What each task's offload runner did, from its node's end-of-run answer (a host
        that gave none, lost or not stopped, is left out of the counts)."""
        for host in on:
            per_task = self.ended[host].offload if host in self.ended else {}
            self.offload |= {t.name: per_task[t.file_name] for t in self.tasks.values()
                             if t.placement.host == host and t.file_name in per_task}

    def finish(self) -> None:
        """Stop every task, release (GPUs first; logs wait), collect logs, write the summary."""
        if self._unwatch is not None:
            self._unwatch()  # the release below drops the lease: no kill to hear of
        stopped: GroupResult[dict[str, StopResult]] = GroupResult()
        timeline, lease = self.parts.reporter.timeline, self.parts.lease
        try:
            with timeline.phase("stop"):
                stopped = self.stop()
                self.late_exits()
        finally:
            with timeline.phase("release"):
                if self.grant is not None:
                    lease.release(self.task_key, self.result, summary_of(self),
                                  confirmed_dead(self.tasks.values(), stopped, self.grant))
                elif self.task_key in self.job.queued:  # left the queue: nothing ran
                    lease.release(self.task_key, self.result, summary_of(self), None)
            with timeline.phase("logs"):
                self.collect_logs()
            if self.tasks:
                make_private(self.local_dir)
                write_private(Path(self.local.summary), json.dumps(summary_of(self), indent=2))
            if self.offload_hosts and self.offload:
                self.say(offload_line(summarize(self.offload, self.offload_hosts)))


def task_requests(attempt: Attempt, node: Node, task_specs: Iterable[specs.TaskSpec],
                  legacy_flags: bool) -> list[TaskStart]:
    """What ``tasknode start`` gets for each task on ``node``: name, port, working dir,
    environment (TF_CONFIG, GPU pinning, attempt, checkpoints, the user's) and argv."""
    job, run = attempt.job, attempt.run_dir(node.name)
    script = job.request.script_on(node.settings.workdir, run, job.script_path())
    requests = []
    for task_spec in task_specs:
        task = attempt.tasks[task_spec.placement.name]
        extra = {"HYPERTF_METRICS_FILE": str(run.metrics)} if task.name == attempt.reporter \
            else {}
        if task.name in attempt.start_after:
            extra["HYPERTF_START_AFTER"] = attempt.start_after[task.name]
        env = {**QUIET_ENV, **job.request.task_env(node), **taskenv.ours({
            "TF_CONFIG": task_spec.tf_config,
            **specs.gpu_env(task_spec.placement.gpus, job.records[node.name].gpus),
            "HYPERTF_TASK_KEY": attempt.task_key, "HYPERTF_TASK": task.name,
            "HYPERTF_ATTEMPT": str(attempt.number),
            "HYPERTF_CHECKPOINT_DIR": job.checkpoint_dir(node.name),
            "HYPERTF_TENSORBOARD_DIR": tensorboard_dir(node.settings.workdir, job.job_id),
            **extra})}
        argv = ["python", script, *(task_spec.flags if legacy_flags else ()), *job.request.args]
        if attempt.offload_hosts:
            argv = offload_command(
                offload_spec(attempt, node, task.file_name), str(run.offload_dir(task.file_name)),
                str(run.offload(task.file_name)), argv)
        cwd = job.request.task_cwd(node.settings.workdir, run, task.file_name)
        requests.append(TaskStart(task.file_name, task.port, cwd, env, tuple(argv)))
    return requests


def offload_spec(attempt: Attempt, node: Node, file_name: str) -> OffloadSpec:
    """What the task's runner on ``node`` needs to start its world: the offload hosts as
    this node reaches them over SSH (with the cluster-internal key and the known_hosts the
    nodes share, both on the node where cluster.setup put them: never the controller's),
    and a channel name of the task's own (the node's agent can find it by the task key)."""
    job = attempt.job
    hosts = tuple(OffloadHost(address=n.address, port=n.port, user=n.user,
                              python=f"{n.settings.venv}/bin/python")
                  for n in map(job.inventory.node, attempt.offload_hosts))
    record = job.records.get(node.name)
    return OffloadSpec(hosts=hosts, channel=channel_name(attempt.task_key, file_name),
                       local_address=record.data_addr if record else node.address,
                       known_hosts=node.settings.offload_known_hosts,
                       key_file=node.settings.offload_key,
                       min_flops=job.request.offload_min_flops,
                       start_timeout=min(60.0, job.request.start_timeout),
                       port_range=node.settings.offload_port_range)


def confirmed_dead(tasks: Iterable[TaskState], stopped: GroupResult[dict[str, StopResult]],
                   grant: Grant | None) -> list[str]:
    """Hosts where the stop saw every task of the job dead: only their GPUs go back now;
    the others drain until their agent has confirmed. An offload host runs no task: its
    processors end with the worlds of the tasks, so it goes back with the last task host."""
    hosts = {t.placement.host for t in tasks}
    if not hosts:
        return sorted({p.host for p in grant.placements}) if grant else []
    dead = {host for host in hosts if host in stopped.succeeded
            and StopResult.SURVIVED not in stopped.succeeded[host].values()}
    if grant and dead == hosts:
        dead |= set(specs.offload_hosts(grant.placements))
    return sorted(dead)


def summary_of(attempt: Attempt) -> dict[str, Any]:
    """An attempt as summary.json and its job record say it: placement, ports, how each task
    ended, and the job's attempts so far."""
    job = attempt.job
    return {
        "task_key": attempt.task_key,
        "result": attempt.result,
        "message": attempt.message,
        "script": job.request.script,
        "args": list(job.request.args),
        "inventory": str(job.inventory.path),
        "policy": job.request.policy,
        "cpu_only": job.cpu_only,
        # names only: the record is read by every member, and a value may be a secret
        "env": {host: sorted(job.request.task_env(job.inventory.node(host)))
                for host in sorted({t.placement.host for t in attempt.tasks.values()})},
        "wall_s": round(time.time() - job.started_at, 2),
        "tasks": [
            {"task": t.name, "host": t.placement.host, "gpus": list(t.placement.gpus),
             "port": t.port, "exit_code": t.exit_code, "killed": t.killed,
             "end": t.end(t.placement.host in attempt.lost_hosts),
             "duration_s": round(t.ended - t.started, 2) if t.ended and t.started else None}
            for t in attempt.tasks.values()
        ],
        "attempts": job.attempts_summary(),
        "timeline": attempt.parts.reporter.timeline.to_json(),
        **({"offload": summarize(attempt.offload, attempt.offload_hosts)}
           if attempt.offload_hosts else {}),
    }
