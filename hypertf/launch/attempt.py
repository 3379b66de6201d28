"""One try at running a job, under one task key for its whole life.

allocate -> start -> watch -> stop -> release. ``Attempt.run`` returns an ``Outcome`` (the
Monitor's verdict, and the ports to avoid after a port clash) or raises the failure; stop,
release, logs and summary happen whatever goes wrong, and cannot be interrupted. A new try
is a new ``Attempt`` with a new key: nothing of an old one is reused or mutated.

An attempt is handed its collaborators (``Parts``): the placer (the keeper's grant:
hypertf.launch.placer), the fleet (the nodes), the lease (its job record) and the reporter
(lines and timeline). What each host is sent to start is a ``StartPlan``
(hypertf.launch.taskstart). What the other threads learn (the nodes' watchers, kazoo's
watches) reaches the attempt only as events on its ``Inbox`` (hypertf.launch.inbox), so
its state changes in its own thread alone, and tests/unit/test_attempt.py drives a whole
attempt with in-memory parts.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hypertf.core import diagnose
from hypertf.core import spec as specs
from hypertf.core.errors import Cancelled, HyperTFError, Interrupted
from hypertf.core.jobrecord import AttemptSummary, JobState, JobSummary
from hypertf.core.monitor import Event, EventKind, Limits, Monitor, TaskState, Verdict, plural
from hypertf.core.placement import Grant
from hypertf.core.preemptnotice import Notice
from hypertf.core.protocol import RunEnd, StopResult
from hypertf.core.rendezvous import Readiness
from hypertf.core.rundir import RunDir, make_private, write_private
from hypertf.launch.fleet import Fleet
from hypertf.launch.inbox import Inbox
from hypertf.launch.lease import JobLease
from hypertf.launch.nodeclient import PortsBusy
from hypertf.launch.remote import GroupResult
from hypertf.launch.reporter import Reporter
from hypertf.launch.taskstart import QUIET_ENV as QUIET_ENV  # re-exported: the benches, a test
from hypertf.launch.taskstart import StartingJob, StartPlan, reporting_task
from hypertf.launch.teardown import Teardown, hosts_of
from hypertf.offload.taskspec import line as offload_line
from hypertf.offload.taskspec import summarize


class Job(StartingJob, Protocol):
    """What an attempt reads of its job (hypertf.launch.launcher.Job): the request, the
    inventory and what preflight and the records said. The job hands itself in, and the
    attempt sees only these members, so the two modules do not import each other."""

    cpu_only: bool
    started_at: float
    max_port_retries: int
    ps_strategy: bool | None  # the script names ParameterServerStrategy (None: not known)
    readiness: Readiness  # which ports "started" waits for (decided by announce_flags)

    @property
    def tf_keras(self) -> Mapping[str, bool]:
        """Preflight's answer: tf-keras in each host's venv."""
        ...

    def announce_flags(self) -> bool: ...

    def attempts_summary(self) -> list[AttemptSummary]: ...


class Placer(Protocol):
    """Where the job's tasks go: the keeper's grant (after the queue and preflight), the
    hosts whose agent is up, the preflight answers to forget after a failed start, and
    the task keys that went through the queue (hypertf.launch.placer.KeeperPlacer)."""

    @property
    def queued(self) -> Set[str]: ...

    def place(self, task_key: str, live: list[str], exclude: dict[str, set[int]],
              avoid: frozenset[str] = ..., resumes: str = "") -> Grant: ...

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


class JobFailed(HyperTFError):
    """The job ran and failed; the message names the task and shows its last lines.
    ``retryable``: a new attempt may cure it; ``hosts``: the hosts it points at;
    ``failures``: what each of them answered, when the failure was theirs (a start that
    failed on several: each host's own exception, as Fabric's ``GroupException``)."""

    exit_code = 1

    def __init__(self, message: str, retryable: bool = False,
                 hosts: frozenset[str] = frozenset(),
                 failures: Mapping[str, BaseException] | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.failures = dict(failures or {})
        self.hosts = hosts or frozenset(self.failures)


class JobKilled(JobFailed):
    """``hypertf kill`` or ``cancel`` ended the running job (its lease was dropped): final,
    and its own exit code (errors.Cancelled's), so it is not taken for a failure."""

    exit_code = Cancelled.exit_code


class Preempted(JobFailed):
    """The keeper preempted the attempt (its notice): the tasks were told (the preemption
    file, SIGTERM) and stopped by the notice's deadline; the job waits again as its next
    attempt, at its old place in the queue."""

    def __init__(self, notice: Notice) -> None:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(notice.at))
        super().__init__(f"preempted by {notice.by} at {at} ({notice.reason})", retryable=True)
        self.notice = notice


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
    """The result and message a job or an attempt records when ``err`` ends it. An end
    someone else made is named as the job record names it (``killed`` while it ran,
    ``cancelled`` while it waited), never ``failed``."""
    if isinstance(err, Interrupted):
        return JobState.INTERRUPTED, str(err)
    if isinstance(err, JobKilled):
        return JobState.KILLED, str(err)
    if isinstance(err, Preempted):
        return JobState.PREEMPTED, str(err)
    if isinstance(err, Cancelled):  # said once: the job re-reads its attempt's error
        said = "hypertf cancel took it out of the queue; nothing ran"
        return JobState.CANCELLED, str(err) if said in str(err) else f"{err}: {said}"
    return JobState.FAILED, str(err)


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, when it did not raise: succeeded, or a port clash (retry on
    fresh ports, avoiding ``busy_ports``)."""

    verdict: Verdict
    message: str = ""
    busy_ports: dict[str, set[int]] = field(default_factory=dict)


class Attempt:
    """allocate -> start -> watch -> stop -> release, for one task key."""

    def __init__(self, job: Job, task_key: str, number: int, last: bool, parts: Parts,
                 resumes: str = "") -> None:
        self.job = job
        self.resumes = resumes  # the preempted attempt this one continues ('' : none)
        self.preempted: Notice | None = None  # the keeper's notice, once it came
        self.parts = parts
        self.task_key = task_key
        self.number = number  # 1 for the first try: HYPERTF_ATTEMPT
        self.last = last  # a port clash now fails the job instead of asking for a retry
        self.grant: Grant | None = None
        self.tasks: dict[str, TaskState] = {}
        self.inbox = Inbox()  # the events: the attempt's one input
        self._unwatch: Callable[[], None] | None = None
        self.lost_hosts: set[str] = set()
        self.offload_hosts: list[str] = []  # --offload-hosts: lent to the tasks' products
        self.offload: dict[str, dict[str, Any]] = {}  # what each task's runner offloaded
        self.legacy_flags = False  # passed to the script (it reads them)
        self.result = JobState.FAILED  # succeeded, failed, interrupted or retried
        self.message = ""
        self.teardown = Teardown(parts.fleet, self.inbox, self.run_dir, self.local, self.say)

    def say(self, line: str) -> None:
        self.parts.reporter.say(line)

    @property
    def reporter(self) -> str:
        """The task whose HYPERTF_METRICS_FILE is copied back: the chief, else worker 0."""
        return reporting_task(self.tasks)

    @property
    def local(self) -> RunDir:
        """The same layout on this machine, under the launcher's working directory: where
        the task logs and summary.json land."""
        return RunDir.of(".", self.task_key, local=True)

    @property
    def local_dir(self) -> Path:
        return self.local.local

    @property
    def ended(self) -> dict[str, RunEnd]:
        """Per host, how its run ended (the stop's answer, or the node's own word)."""
        return self.inbox.ended

    def run_dir(self, host: str) -> RunDir:
        return RunDir.of(self.job.inventory.node(host).settings.workdir, self.task_key)

    def _hosts(self) -> set[str]:
        return hosts_of(self.tasks)

    # -- the lifecycle --------------------------------------------------------------------
    def run(self, live: list[str], exclude: dict[str, set[int]],
            avoid: frozenset[str] = frozenset()) -> Outcome:
        try:
            self.grant = self.parts.placer.place(self.task_key, live, exclude, avoid,
                                                 resumes=self.resumes)
            self.tasks = {p.name: TaskState(p, self.grant.ports[p.name])
                          for p in specs.tasks_of(self.grant.placements)}
            self.offload_hosts = specs.offload_hosts(self.grant.placements)
            # the lease's end ('hypertf kill', a lost session) arrives as an event
            self._unwatch = self.parts.lease.watch(self.task_key, self.inbox.events)
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
        except Cancelled as err:  # it left the queue: say so as the record does
            self.result, self.message = ended_by(err)
            raise Cancelled(self.message) from err
        except HyperTFError as err:
            self.result, self.message = ended_by(err)
            raise
        finally:
            with uninterruptible():
                self.finish()

    # -- start ----------------------------------------------------------------------------
    def start(self) -> dict[str, set[int]]:
        """Every task at once: one request per host, hosts in parallel. Returns the granted
        ports found already in use, per host (nothing is started on such a host)."""
        assert self.grant
        plan = StartPlan(self.job, self.task_key, self.number, self.grant, self.tasks)
        self.legacy_flags = self.job.announce_flags()
        starts = plan.hosts(self.legacy_flags)
        self.parts.lease.starting(self.task_key)
        results = self.parts.fleet.start(starts, self.inbox.events)
        self.inbox.watched.update(results.succeeded)
        busy = {h: v.ports for h, v in results.failed.items() if isinstance(v, PortsBusy)}
        failed = {h: v for h, v in results.failed.items() if not isinstance(v, PortsBusy)}
        if failed:
            self.parts.placer.forget_preflight(failed)  # a cached answer may be why
            raise JobFailed("could not start tasks: " +
                            "; ".join(f"{h}: {v}" for h, v in failed.items()), failures=failed)
        if busy:
            return busy
        listed = ", ".join(
            f"{t.name}@{t.placement.host}:{t.port}"
            + (f" GPU {','.join(map(str, t.placement.gpus))}" if t.placement.gpus else "")
            for t in self.tasks.values())
        offloaded = (f"; their matrix products offloaded to {', '.join(self.offload_hosts)}"
                     if self.offload_hosts else "")
        self.say(f"hypertf: job {self.task_key}: started {plural(len(self.tasks), 'task')}: "
                 f"{listed}{offloaded}")
        return busy

    # -- watch ----------------------------------------------------------------------------
    def watch(self) -> Verdict:
        """Stream logs and feed every event to a Monitor until it decides: the verdict
        (succeeded, or a port clash to retry); a failure raises JobFailed."""
        job, timeline, inbox = self.job, self.parts.reporter.timeline, self.inbox
        request = job.request
        limits = Limits(start_timeout=request.start_timeout, timeout=request.timeout,
                        idle_timeout=request.idle_timeout, idle_fail=request.idle_fail,
                        host_silence=max(2 * job.inventory.cluster.ssh_timeout, 10.0),
                        readiness=job.readiness)
        monitor = Monitor(self.tasks, limits, time.monotonic(), logs_hint=f"{self.local_dir}/",
                          idle_causes=job.request.idle_causes(self.legacy_flags,
                                                              job.ps_strategy),
                          facts=self.facts())
        ended_by = ""  # who dropped the lease, read once from the record
        while True:
            event = inbox.next(timeout=0.2) or Event(EventKind.TICK)
            inbox.absorb(event)
            if event.kind is EventKind.LISTENING:
                timeline.mark("listening", event.host)
            elif event.kind is EventKind.LOG:
                timeline.mark("first log line")
            elif event.kind is EventKind.EXIT and event.killed:
                inbox.await_lease_drop()  # killed by an agent after 'hypertf kill'?
            elif event.kind is EventKind.PREEMPTED:
                self.take_notice(event.why)
                continue
            if inbox.lease_dropped and event.kind is not EventKind.SESSION_LOST:
                ended_by = ended_by or self.parts.lease.ended_by(self.task_key)
                event = Event(EventKind.LEASE_DROPPED, why=(
                    f"job {self.task_key} was killed: its lease was dropped ({ended_by}); "
                    f"its tasks are stopped and its GPUs returned"))
            decision = monitor.feed(event, time.monotonic())
            for line in decision.say:
                self.say(line)
            self.lost_hosts |= monitor.lost_hosts
            if decision.verdict in (Verdict.SUCCEEDED, Verdict.PORT_CLASH):
                return decision.verdict
            if decision.final and inbox.lease_dropped:
                raise JobKilled(decision.message)
            if decision.final:
                raise JobFailed(decision.message, decision.verdict is Verdict.RETRYABLE,
                                decision.hosts)

    def take_notice(self, text: str) -> None:
        """The keeper's notice (only it writes there; checked all the same): the tasks
        stop by its deadline (``stop``) and the job waits again (``Preempted``)."""
        try:
            notice = Notice.from_json(text.encode(), self.task_key)
        except ValueError as err:
            self.say(f"hypertf: warning: ignored a preemption notice: {err}")
            return
        self.preempted = notice
        grace = notice.grace_left(time.time())
        self.say(f"hypertf: job {self.task_key} preempted by {notice.by} ({notice.reason}): "
                 f"its tasks get SIGTERM and HYPERTF_PREEMPT_FILE now, SIGKILL in "
                 f"{grace:.0f} s; then it waits again at its place in the queue")
        raise Preempted(notice)

    def facts(self) -> diagnose.JobFacts:
        """What a failure's hint may rely on: TF_USE_LEGACY_KERAS=1 on every task's host,
        tf-keras in every host's venv (preflight's answer; None if a host did not say), and
        whether the legacy flags were passed."""
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
        return diagnose.JobFacts(legacy_keras=legacy, tf_keras=tf_keras,
                                 legacy_flags=self.legacy_flags)

    # -- stop, release, report ------------------------------------------------------------
    def stop(self) -> GroupResult[dict[str, StopResult]]:
        """Every task stopped (hypertf.launch.teardown), by the notice's deadline if any."""
        return self.teardown.stop(self.tasks, self.lost_hosts, self.preempted,
                                  self.job.request.grace)

    def collect_logs(self) -> None:
        """Logs, metrics and offload counts brought back (hypertf.launch.teardown)."""
        self.teardown.collect(self.tasks, self.lost_hosts,
                              self.offload if self.offload_hosts else None)

    def finish(self) -> None:
        """Stop every task, release (GPUs first: the logs are collected while the keeper
        frees them), write the summary."""
        if self._unwatch is not None:
            self._unwatch()  # the release below drops the lease: no kill to hear of
        stopped: GroupResult[dict[str, StopResult]] = GroupResult()
        timeline, lease = self.parts.reporter.timeline, self.parts.lease

        def logs() -> None:
            with timeline.phase("logs"):
                self.collect_logs()

        try:
            with timeline.phase("stop"):
                stopped = self.stop()
                self.inbox.late_exits(self.tasks, self.lost_hosts)
        finally:
            with timeline.phase("release"):
                if self.grant is not None:
                    lease.release(self.task_key, self.result, summary_of(self),
                                  confirmed_dead(self.tasks.values(), stopped, self.grant),
                                  meanwhile=logs)
                elif self.task_key in self.parts.placer.queued:  # left the queue: nothing ran
                    lease.release(self.task_key, self.result, summary_of(self), None,
                                  meanwhile=logs)
                else:
                    logs()
            if self.tasks:
                make_private(self.local_dir)
                write_private(Path(self.local.summary), json.dumps(summary_of(self), indent=2))
            if self.offload_hosts and self.offload:
                self.say(offload_line(summarize(self.offload, self.offload_hosts)))


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


def summary_of(attempt: Attempt) -> JobSummary:
    """An attempt as summary.json and its job record say it: placement, ports, how each task
    ended, and the job's attempts so far."""
    job = attempt.job
    summary: JobSummary = {
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
    }
    if attempt.offload_hosts:
        summary["offload"] = summarize(attempt.offload, attempt.offload_hosts)
    return summary
