"""Deciding a running job's fate from what its nodes report: pure, the clock injected.

The launcher feeds every event (a log line, a task listening or ending, a host lost or
silent, the lease dropped, a clock tick) with the time; ``Monitor.feed`` returns a
``Decision``: go on, or the job's outcome. The rules come from TensorFlow's behaviour
(docs/tensorflow.md, tests/unit/test_monitor.py):

- finishers and servers: mirrored jobs finish on every task; parameter-server jobs with a
  chief when the chief does (workers and ps serve); legacy jobs (ps, no chief) when every
  worker has exited 0. The job has succeeded when every finisher exited 0;
- a finisher's non-zero exit fails the job; so does any parameter server's end (the chief
  would fail ~11 s later anyway); other servers' ends are warnings. A ps job whose tasks
  ran without their roles (no ps served) fails whichever exit comes first: a ps's exit 0, or
  every worker's exit 0 while no task ever opened its port; both name --legacy-flags;
- a port taken by someone else fails a task with ``Address already in use`` (or gRPC's
  words for it) before every task listens: a port clash, retried on fresh ports;
- hangs raise no error: a start-up deadline (the port of every task that must listen,
  ``must_listen``: every task of a job of two or more, none of a single task), an optional
  job deadline, a warning (or, with ``idle_fail``, a failure) when every task listens and
  none writes, and a host whose watcher stays silent is lost. A task that writes but never
  listens is named as a script that may not be distributed, a silent one with how long it
  has been silent and the causes (a file another task writes among them).

Retryable failures are those a new attempt can cure: a host lost or silent, the start-up
deadline, a task killed by a signal nobody on our side sent.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hypertf.core import diagnose, protocol
from hypertf.core import spec as specs
from hypertf.core.protocol import StopResult
from hypertf.core.rendezvous import Readiness, rank_order
from hypertf.core.scheduler import Placement

PORT_IN_USE = ("Failed to add port to server", "Could not start gRPC server",
               "Address already in use")
TAIL_LINES = 200  # kept per task: a Keras error is often followed by a long tensor dump
TAIL_SHOWN = 10  # lines of a failed task's log its failure shows
# At the start-up deadline a task that wrote within this long (or half the deadline, if
# shorter) is still writing: it runs, but never opened its port; an older last line is silence.
WRITING_WITHIN_S = 30.0
NOT_DISTRIBUTED = (
    "TensorFlow opens a task's port only when the script makes a tf.distribute strategy or "
    "tf.distribute.Server from TF_CONFIG; without one each task trains alone")
NO_COORDINATOR = (
    "rank 0 is the coordinator the other processes connect to (JAX_COORDINATOR_ADDRESS, "
    "MASTER_ADDR:MASTER_PORT, docs/frameworks.md): its jax.distributed.initialize() or "
    "init_process_group() never opened it; --rendezvous none if the script needs no "
    "coordinator")
MADE_LATE = "a script that makes it late (after loading its data) needs a longer --start-timeout"
STARTUP_CAUSES = (
    "likely causes: a task waiting for a file another task writes (each task has its own "
    "directory; `--workdir DIR` on shared storage shares one), a peer that never started, "
    "a host cut off, or a script that never serves; raise --start-timeout only if start-up "
    "is just slow")


def must_listen(placements: Sequence[Placement], readiness: Readiness = Readiness.TF
                ) -> frozenset[str]:
    """The tasks whose port must open before the start-up deadline, because a peer connects
    to it. TensorFlow's way: every task of a job of two or more (each is in the others'
    cluster spec); a coordinator's (JAX, Keras 3 on JAX, PyTorch): rank 0's alone, the one
    the others connect to; none of a single task (no peer needs its port; a script without
    a strategy never opens one), nor of a job said to need none (``--rendezvous none``)."""
    if len(placements) < 2 or readiness is Readiness.NONE:
        return frozenset()
    if readiness is Readiness.COORDINATOR:
        return frozenset({rank_order(placements)[0].name})
    return frozenset(p.name for p in placements)


def plural(count: int, noun: str) -> str:
    """'1 line', '2 lines'."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


@dataclass
class TaskState:
    placement: Placement
    port: int
    started: float | None = None
    exit_code: int | None = None
    killed: bool = False
    ended: float | None = None
    tail: list[str] = field(default_factory=list)
    stop_result: StopResult | None = None  # what HyperTF's stop did to it (tasknode.stop)
    lines: int = 0  # log lines it wrote (its tail keeps the last TAIL_LINES)
    last_line: float | None = None  # when the last one came
    listened: bool = False  # its port was seen open (``started`` is also a fast exit 0)

    def end(self, lost: bool) -> str:
        """How the task ended, in words: exit code, stopped by HyperTF, died of a signal,
        or lost with its host."""
        code = self.exit_code
        if self.stop_result == StopResult.SURVIVED:
            return "survived SIGKILL (its GPUs stay draining)"
        if self.stop_result == StopResult.KILLED and (code is None or code == 128 + signal.SIGKILL):
            return "stopped by HyperTF (SIGKILL after the grace)"
        if self.stop_result == StopResult.STOPPED and code in (None, 128 + signal.SIGTERM):
            return "stopped by HyperTF (SIGTERM)"
        if code is None and lost:
            return "lost with its host"
        if code is None and self.ended is None:  # its watcher never said it ended
            return "end not seen (its host's watcher did not report it)"
        if code is None:  # task.sh died with it, before writing the code
            return "killed with its wrapper (no exit code: a SIGKILL not sent by HyperTF)"
        if code > 128 and code - 128 in signal.valid_signals():
            return f"died of signal {code - 128} ({signal.Signals(code - 128).name})"
        return f"exit {code}"

    @property
    def name(self) -> str:
        return self.placement.name

    @property
    def label(self) -> str:
        return f"{self.placement.name}@{self.placement.host}"

    @property
    def file_name(self) -> str:
        return f"{self.placement.role}{self.placement.index}"

    @property
    def running(self) -> bool:
        return self.ended is None


class Verdict(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a new attempt would fail the same way
    RETRYABLE = "retryable"  # a new attempt may succeed (host lost, deadline, signal)
    PORT_CLASH = "port-clash"  # a granted port was taken: retry on fresh ports


@dataclass(frozen=True)
class Decision:
    verdict: Verdict = Verdict.RUNNING
    message: str = ""
    say: tuple[str, ...] = ()  # lines for the user, in order
    hosts: frozenset[str] = frozenset()  # the hosts a failure points at

    @property
    def final(self) -> bool:
        return self.verdict is not Verdict.RUNNING


@dataclass(frozen=True)
class Limits:
    """The deadlines a job runs under (seconds; None: none)."""

    start_timeout: float = 120.0
    timeout: float | None = None
    idle_timeout: float | None = 300.0
    idle_fail: bool = False
    host_silence: float = 20.0
    readiness: Readiness = Readiness.TF  # which ports "started" waits for (must_listen)


class EventKind(enum.StrEnum):
    """What an event says: a node's watcher's (``protocol.EventKind``: log, listening, exit,
    beat, done), then what the launcher itself learns."""

    LOG = "log"
    LISTENING = "listening"
    EXIT = "exit"
    BEAT = "beat"
    DONE = "done"
    NOISE = "noise"  # a line of the watcher's channel that is no event (not strict)
    LOST = "lost"  # the host's channel broke (``why``)
    CLOSED = "closed"  # the host's watcher ended
    TICK = "tick"  # nothing came for a while: the clock's rules run
    LEASE_DROPPED = "lease-dropped"  # hypertf kill or cancel: the job's lease is gone
    SESSION_LOST = "session-lost"  # the ZooKeeper session (and so the lease) is gone
    PREEMPTED = "preempted"  # the keeper's preemption notice for this attempt (``why``: it)


@dataclass(frozen=True)
class Event:
    """What a node's watcher (or the launcher) reported."""

    kind: EventKind
    host: str = ""
    task: str = ""  # the task's file name (worker0)
    line: str = ""
    code: int | None = None
    killed: bool = False
    why: str = ""
    ended: protocol.RunEnd | None = None  # DONE: the node ended the run itself

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", EventKind(self.kind))  # "exit" -> EventKind.EXIT

    @classmethod
    def from_node(cls, host: str, payload: object, strict: bool = False) -> Event:
        """A line of ``tasknode watch`` JSON (``{"e": "exit", "task": ..., ...}``); one this
        launcher cannot read is noise, or with ``strict`` a ProtocolError
        (``protocol.parse_event``)."""
        event = protocol.parse_event(payload, strict)
        if event is None:
            return cls(EventKind.NOISE, host, line=str(payload))
        return cls(EventKind(event.kind), host, task=event.task, line=event.line,
                   code=event.code, killed=event.killed, ended=event.ended)


class Monitor:
    """The state of one attempt's tasks and the rules that end it."""

    def __init__(self, tasks: Mapping[str, TaskState], limits: Limits, now: float,
                 logs_hint: str = "", idle_causes: str = "",
                 facts: diagnose.JobFacts | None = None) -> None:
        self.tasks = dict(tasks)
        self.limits = limits
        placements: Sequence[Placement] = [t.placement for t in self.tasks.values()]
        self.finishers = specs.finishers(placements)
        self.fatal = specs.fatal_servers(placements)
        self.legacy = specs.mode(placements) == "legacy"  # ps, no chief: the workers finish
        self.begun = now
        self.last_output = now
        self.idle_warned = False
        self.idle_warnings = 0  # said for the current silence (repeated every idle_timeout)
        self._warned_silence = now  # the last_output that silence started from
        self.all_started = False  # every task listens: until then a bind error is a clash
        self.must_listen = must_listen(placements, limits.readiness)
        self.host_seen = {t.placement.host: now for t in self.tasks.values()}
        self.lost_hosts: set[str] = set()
        self._by_file = {(t.placement.host, t.file_name): t for t in self.tasks.values()}
        self._logs_hint = logs_hint
        self._idle_causes = idle_causes
        self._facts = facts or diagnose.JobFacts()

    def feed(self, event: Event, now: float) -> Decision:
        """One event at ``now`` (monotonic seconds): the decision it leads to."""
        if event.host:
            self.host_seen[event.host] = now
        said: list[str] = []
        decision = self._on_event(event, now, said)
        if decision is None:
            decision = self._on_clock(now, said)
        if decision is None:
            return Decision(say=tuple(said))
        return Decision(decision.verdict, decision.message, (*said, *decision.say),
                        decision.hosts)

    # -- events ---------------------------------------------------------------------------
    def _on_event(self, event: Event, now: float, said: list[str]) -> Decision | None:
        if event.kind is EventKind.LEASE_DROPPED:
            return Decision(Verdict.FAILED, event.why or "the job's lease was dropped")
        if event.kind is EventKind.SESSION_LOST:
            return Decision(Verdict.RETRYABLE, "lost the ZooKeeper session: the job's lease "
                            "is gone, so the agents stop its tasks and its GPUs return to the "
                            "pool")
        if event.kind is EventKind.LOST:
            self.lost_hosts.add(event.host)
            return Decision(Verdict.RETRYABLE, f"lost contact with {event.host}: {event.why}",
                            hosts=frozenset({event.host}))
        task = self._by_file.get((event.host, event.task)) if event.task else None
        if task is None:
            return None
        if event.kind is EventKind.LOG:
            self.last_output = now
            task.tail = [*task.tail, event.line][-TAIL_LINES:]
            task.lines += 1
            task.last_line = now
            said.append(f"[{task.label}] {event.line}")
        elif event.kind is EventKind.LISTENING:
            task.started = task.started or now
            task.listened = True
        elif event.kind is EventKind.EXIT:
            return self._on_exit(task, event, now, said)
        return None

    def _on_exit(self, task: TaskState, event: Event, now: float,
                 said: list[str]) -> Decision | None:
        task.ended = now
        task.exit_code = event.code
        task.killed = event.killed
        code = "killed" if task.killed else f"exit {task.exit_code}"
        said.append(f"hypertf: {task.label} ended ({code})")
        if task.exit_code != 0 and not self.all_started and any(
                marker in line for line in task.tail for marker in PORT_IN_USE):
            return Decision(Verdict.PORT_CLASH, f"{task.label} could not bind port {task.port}")
        culprit = frozenset({task.placement.host})
        if task.name in self.finishers and task.exit_code != 0:
            return Decision(self._failed_by(task), self.failure(task, code), hosts=culprit)
        if task.name in self.fatal:
            return Decision(self._failed_by(task), self._ps_ended(task, code), hosts=culprit)
        if task.name not in self.finishers:
            said.append(f"hypertf: warning: {task.label} ended; the job goes on without it")
        elif task.exit_code == 0 and task.started is None:
            task.started = task.ended
        if all(self.tasks[name].exit_code == 0 for name in self.finishers):
            unheard = bool(self.must_listen) and not any(t.listened for t in self.tasks.values())
            if unheard and self.legacy:
                # a ps job without a chief: the ps-first order fails in _ps_ended; so does this
                return Decision(Verdict.FAILED, self._roleless_workers())
            if unheard:
                said.append(f"hypertf: note: no task of this job ever opened its port, so its "
                            f"{len(self.tasks)} tasks ran as separate copies of the script, "
                            f"not as one cluster: the script may not be distributed "
                            f"({NOT_DISTRIBUTED})")
            return Decision(Verdict.SUCCEEDED, "all finishers exited 0")
        return None

    def _ps_ended(self, task: TaskState, code: str) -> str:
        """A ps only serves: one that exits 0 by itself ran the script as a lone trainer,
        without its role (no cluster formed), and the hint names --legacy-flags."""
        if task.exit_code != 0 or task.killed:
            return self.failure(task, f"parameter server ended ({code})")
        return self.failure(task, f"parameter server ended ({code}): {diagnose.ROLELESS}",
                            hint=diagnose.roleless_ps_hint(self._facts))

    def _roleless_workers(self) -> str:
        """Every worker of a ps job (no chief) exited 0 and no task ever opened its port: no
        ps served, so each task trained alone, without its role; the failure says so with
        the hint _ps_ended gives when the ps's exit comes first."""
        workers = [t.label for t in self.tasks.values() if t.name in self.finishers]
        return (f"{', '.join(workers)} exited 0, but no "
                f"task ever opened its port: {diagnose.ROLELESS}.\n  hint: "
                f"{diagnose.roleless_ps_hint(self._facts, ps_ended=False)}"
                f"\n  full logs: {self._logs_hint}")

    @staticmethod
    def _failed_by(task: TaskState) -> Verdict:
        """A signal the task did not send itself (the OOM killer, a neighbour's kill) is
        worth a new attempt; an exit code is the script's own verdict."""
        killed = task.killed or (task.exit_code is not None and task.exit_code > 128)
        return Verdict.RETRYABLE if killed else Verdict.FAILED

    # -- the clock ------------------------------------------------------------------------
    def _on_clock(self, now: float, said: list[str]) -> Decision | None:
        limits = self.limits
        if self.all_started:
            pass
        elif limits.readiness is not Readiness.TF:
            # the other tasks open no port of their own: say the coordinator's, once
            if self.ready:
                self.all_started = True
                if self.must_listen:
                    who = ", ".join(self.tasks[name].label for name in sorted(self.must_listen))
                    said.append(f"hypertf: coordinator {who} listening after "
                                f"{now - self.begun:.1f} s")
        elif all(t.started for t in self.tasks.values()):
            self.all_started = True
            count = f" {len(self.tasks)}" if len(self.tasks) > 1 else ""  # not 'all 1 tasks'
            said.append(f"hypertf: all{count} tasks listening after {now - self.begun:.1f} s")
        if not self.ready and now - self.begun > limits.start_timeout:
            return self._start_deadline(now)
        if limits.timeout and now - self.begun > limits.timeout:
            return Decision(Verdict.FAILED,
                            f"job timeout: still running after {limits.timeout:.0f} s")
        idle = limits.idle_timeout
        silent = now - self.last_output
        if self.idle_warnings and self.last_output != self._warned_silence:
            self.idle_warnings = 0  # a task wrote since: a new silence is said in full again
        if self.ready and idle and silent > idle * (self.idle_warnings + 1):
            self._warned_silence = self.last_output
            self.idle_warnings += 1
            self.idle_warned = True
            why = self._idle_words(idle)
            if limits.idle_fail:
                return Decision(Verdict.FAILED, f"idle: {why}")
            if self.idle_warnings == 1:
                said.append(f"hypertf: warning: {why} (--idle-fail ends such a job)")
            else:  # without --idle-fail nothing ends it: keep saying so, not wait silently
                said.append(f"hypertf: warning: still no line from any task after "
                            f"{silent:.0f} s; the job waits until a task writes or ends "
                            f"(--idle-fail, --timeout or Ctrl-C end it)")
        for host, seen in self.host_seen.items():
            if now - seen > limits.host_silence and any(
                    t.running for t in self.tasks.values() if t.placement.host == host):
                self.lost_hosts.add(host)
                return Decision(Verdict.RETRYABLE, f"host {host} stopped answering "
                                f"({now - seen:.0f} s without news)", hosts=frozenset({host}))
        return None

    @property
    def ready(self) -> bool:
        """The start-up deadline is met: every task that must listen has (or has exited 0)."""
        return all(self.tasks[name].started for name in self.must_listen)

    # -- words ----------------------------------------------------------------------------
    def _start_deadline(self, now: float) -> Decision:
        """The tasks that must listen and do not, each as it is: still writing (the script
        may not be distributed) or silent, and for how long; then what to do about it."""
        waiting = [t for t in self.tasks.values() if t.name in self.must_listen and not t.started]
        within = min(WRITING_WITHIN_S, self.limits.start_timeout / 2)
        writing = [t for t in waiting if t.last_line is not None and now - t.last_line <= within]
        states = []
        for task in waiting:
            if task in writing:
                states.append(f"{task.label} has written {plural(task.lines, 'line')} but never "
                              f"opened port {task.port}: the script may not be distributed")
            elif task.last_line is not None:
                states.append(f"{task.label} has been silent for {now - task.last_line:.0f} s "
                              f"after {plural(task.lines, 'line')} (the last: "
                              f"{diagnose.shorten(task.tail[-1].strip(), 120)})")
            else:
                states.append(f"{task.label} has written nothing in {now - self.begun:.0f} s")
        port = "its port" if len(waiting) == 1 else "their port"
        advice = (f"{NOT_DISTRIBUTED}; {MADE_LATE}" if len(writing) == len(waiting)
                  else STARTUP_CAUSES)
        if self.limits.readiness is Readiness.COORDINATOR:
            advice = f"{NO_COORDINATOR}; {advice}"
        return Decision(Verdict.RETRYABLE, hosts=frozenset(t.placement.host for t in waiting),
                        message=(f"start-up deadline: {', '.join(t.label for t in waiting)} not "
                                 f"listening on {port} after {self.limits.start_timeout:.0f} s"
                                 + "".join(f"\n  {state}" for state in states)
                                 + f"\n  {advice}"))

    def _idle_words(self, idle: float) -> str:
        """The silence as it is: which tasks ended and how, which run silent, and the
        known cause of this state (a TF1 worker left waiting for worker 0, which ended)."""
        ended = [t for t in self.tasks.values() if not t.running]
        if not ended:
            listens = self.all_started and self.limits.readiness is Readiness.TF
            who = "every task listens and none" if listens else "no task"
            return f"{who} has written a line for {idle:.0f} s: {self._idle_causes}"
        running = [t for t in self.tasks.values() if t.running]
        state = "; ".join(f"{t.label} ended ({t.end(t.placement.host in self.lost_hosts)})"
                          for t in ended)
        waiting = [t for t in running if t.name in self.finishers]
        tf1 = specs.mode([t.placement for t in self.tasks.values()]) == "legacy" and waiting \
            and any(t.exit_code == 0 for t in ended if t.name in self.finishers)
        cause = diagnose.TF1_WORKER_LEFT_WAITING if tf1 else self._idle_causes
        return (f"{', '.join(t.label for t in running)} still running, none has written a "
                f"line for {idle:.0f} s ({state}): {cause}")

    def failure(self, task: TaskState, what: str, hint: str = "") -> str:
        """What died and why: a refused legacy flag named with its fix, the exception (the
        last traceback's whole error and the script's own frame, FATAL and error lines), the
        fixes HyperTF recognises (Keras 3, a missing module) after ``hint`` (one the caller
        knows), the last lines."""
        lines = list(task.tail)
        refused = diagnose.unknown_legacy_flag(lines)
        if refused:
            what = (f"{what}: the script does not accept --{refused} (a legacy flag HyperTF "
                    f"passed); run it with --no-legacy-flags (it reads TF_CONFIG then)")
        causes = diagnose.cause_lines(lines)
        cause = "".join(f"\n    {line}" for line in causes)
        fixes = "".join(f"\n  hint: {fix}" for fix in
                        [*([hint] if hint else []), *diagnose.hints(lines, self._facts)])
        tail = "\n".join(f"    {line}" for line in shown_tail(lines, causes)) or "    (no output)"
        return (f"task {task.label} failed: {what}."
                + (f" Cause:{cause}" if cause else "") + fixes
                + f"\n  last lines of its log:\n{tail}\n  full logs: {self._logs_hint}")


def shown_tail(lines: Sequence[str], causes: Sequence[str]) -> list[str]:
    """A failed task's last lines, reaching back to the line its cause quotes (the error,
    else the last FATAL line): a tail that stopped before the exception the cause names, or
    left it out as said already, read as a log cut short. Lines past TAIL_SHOWN between that
    line and the end are left out and counted."""
    start = max(0, len(lines) - TAIL_SHOWN)
    quoted = _quoted_at(lines, causes[-1]) if causes else None
    if quoted is None or quoted >= start:
        return list(lines[start:])
    if len(lines) - quoted <= 2 * TAIL_SHOWN:
        return list(lines[quoted:])
    head, end = lines[quoted:quoted + 3], lines[-(TAIL_SHOWN - 3):]
    skipped = len(lines) - quoted - len(head) - len(end)
    return [*head, f"... ({plural(skipped, 'line')} left out)", *end]


def _quoted_at(lines: Sequence[str], cause: str) -> int | None:
    """Where the line ``cause`` quotes is in ``lines`` (the last one): the cause is a line
    stripped, or an error line joined with its continuation and shortened, so the line's
    start is the cause's start."""
    for index in range(len(lines) - 1, -1, -1):
        text = lines[index].strip()
        if text and cause.startswith(text[:80]):
            return index
    return None
