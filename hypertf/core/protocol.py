"""The launcher<->node protocol: every message between the launcher (hypertf.launch.nodeclient)
and ``tasknode`` on a node (hypertf.node.tasknode), typed, built and read only here.

A message is one JSON object per line. The verbs and what they carry:

- ``preflight`` answers ``PreflightAnswer``, with the node's ``PROTOCOL_VERSION``: the
  launcher refuses a node on another version before anything is allocated or started
  (``VersionMismatch``, exit 6: ``invoke cluster.setup`` installs one HyperTF everywhere).
  A node from before versioning says none: it speaks ``UNVERSIONED``.
- ``start`` reads a ``StartRequest`` on stdin and answers ``StartAnswer`` (started, ports
  busy, or problems); ``start --watch`` and ``watch`` then stream ``NodeEvent``s: a log
  line, a task listening, a task's exit, a heartbeat, and ``done`` (with the run's
  ``RunEnd`` when the node ended the run itself).
- ``stop`` answers a ``StopResult`` per task, and with ``--logs`` a whole ``RunEnd``.

The wire keys are those of the nodes before this module (``{"e": "exit", "task": ...}``),
so a message of version 2 reads as it did in version 1; what changed is that the
launcher now checks the version and every field's type. An unknown event or a malformed
message is a ``ProtocolError`` when the caller asks for ``strict`` (the launcher does with
``HYPERTF_PROTOCOL_STRICT=1``, which the test suite sets: hypertf.config.environment);
otherwise the launcher passes it on as noise, so a node one release ahead does not end a
job over a message it adds.

Records are NamedTuples, not dataclasses: ``tasknode start`` imports this module on every
node of every job, and ``dataclasses`` costs ~8 ms to import (it imports ``inspect``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, NamedTuple

from hypertf.core.errors import RemoteError

PROTOCOL_VERSION = 2
UNVERSIONED = 1  # nodes from before the version: their preflight answer names none


class ProtocolError(RemoteError):
    """A node sent a message this launcher cannot read (another version, or a bug)."""


class VersionMismatch(ProtocolError):
    """A node speaks another protocol version than this launcher: nothing may start there."""

    def __init__(self, hosts: Mapping[str, int]) -> None:
        self.hosts = dict(hosts)
        by_version: dict[int, list[str]] = {}
        for host, version in sorted(self.hosts.items()):
            by_version.setdefault(version, []).append(host)
        nodes = "; ".join(f"{', '.join(names)} on node protocol {version}"
                          for version, names in sorted(by_version.items()))
        super().__init__(f"HyperTF versions differ: {nodes}, this launcher on protocol "
                         f"{PROTOCOL_VERSION}: run invoke cluster.setup to install this "
                         f"HyperTF on the nodes (nothing was started or allocated)")


class EventKind(enum.StrEnum):
    """What a node's watcher reports (the ``"e"`` of an event line)."""

    LOG = "log"  # a line of a task's log
    LISTENING = "listening"  # a task's port accepts connections
    EXIT = "exit"  # a task ended: its code (None: killed with its wrapper)
    BEAT = "beat"  # nothing new; the node is alive (every second)
    DONE = "done"  # every task ended: the watcher ends


class StopResult(enum.StrEnum):
    """What a stop did to a task (``tasknode stop``, hypertf.node.procs.stop_groups)."""

    STOPPED = "stopped"  # ended after SIGTERM
    KILLED = "killed"  # SIGKILL after the grace
    SURVIVED = "survived SIGKILL"  # still there: its GPUs stay draining
    NOT_RUNNING = "not running"  # nothing of it was left to stop


def _fail(what: str, payload: object) -> ProtocolError:
    return ProtocolError(f"node protocol {PROTOCOL_VERSION}: {what}: {str(payload)[:200]!r}")


def _object(payload: object, what: str) -> Mapping[str, Any]:
    if not isinstance(payload, Mapping):
        raise _fail(f"{what} is not a JSON object", payload)
    return payload


def _str(payload: Mapping[str, Any], key: str, what: str, default: str | None = None) -> str:
    value = payload.get(key, default)
    if not isinstance(value, str):
        raise _fail(f"{what}: {key!r} is not a string", payload)
    return value


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(f"{what} is not an integer", value)
    return value


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _fail(f"{what} is not a list of strings", value)
    return tuple(value)


def _str_map(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise _fail(f"{what} is not an object of strings", value)
    return dict(value)


# -- stop and the end of a run --------------------------------------------------------------
def parse_stopped(payload: object) -> dict[str, StopResult]:
    """A stop's answer: per task, what the stop did."""
    found = _object(payload, "a stop's answer")
    try:
        return {str(task): StopResult(result) for task, result in found.items()}
    except ValueError as err:
        raise _fail("a stop's answer has an unknown result", payload) from err


class RunEnd(NamedTuple):
    """A run's end on one node in one answer: what the stop did (or, when the node ended
    the run itself, what a stop would have said), the tasks' logs (those that fit), the
    metrics file's text (None: no file) and each task's offload counts."""

    stopped: dict[str, StopResult]
    logs: dict[str, str]
    metrics: str | None = None
    offload: dict[str, Any] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)

    def wire(self) -> dict[str, Any]:
        return {"stopped": {task: str(result) for task, result in self.stopped.items()},
                "logs": self.logs, "metrics": self.metrics, "offload": self.offload}

    @classmethod
    def parse(cls, payload: object) -> RunEnd:
        found = _object(payload, "a run's end")
        metrics = found.get("metrics")
        if metrics is not None and not isinstance(metrics, str):
            raise _fail("a run's end: 'metrics' is not a string", payload)
        offload = found.get("offload", {})
        if not isinstance(offload, Mapping):
            raise _fail("a run's end: 'offload' is not an object", payload)
        return cls(parse_stopped(found.get("stopped")),
                   _str_map(found.get("logs", {}), "a run's logs"), metrics, dict(offload))


# -- events ---------------------------------------------------------------------------------
class NodeEvent(NamedTuple):
    """One line of a node's watcher; the fields that its kind carries (the others empty)."""

    kind: EventKind
    task: str = ""  # the task's file name (worker0)
    line: str = ""  # LOG
    code: int | None = None  # EXIT
    killed: bool = False  # EXIT: by a signal (no code, or 128 + TERM/KILL)
    ended: RunEnd | None = None  # DONE, when the node ended the run itself

    def wire(self) -> dict[str, Any]:
        """The JSON object of this event: the keys nodes have always sent for its kind."""
        kind = self.kind
        if kind is EventKind.LOG:
            return {"e": "log", "task": self.task, "line": self.line}
        if kind is EventKind.LISTENING:
            return {"e": "listening", "task": self.task}
        if kind is EventKind.EXIT:
            return {"e": "exit", "task": self.task, "code": self.code, "killed": self.killed}
        if kind is EventKind.DONE and self.ended is not None:
            return {"e": "done", "ended": self.ended.wire()}
        return {"e": str(kind)}


BEAT = NodeEvent(EventKind.BEAT)


def log_line(task: str, line: str) -> NodeEvent:
    return NodeEvent(EventKind.LOG, task, line=line)


def listening(task: str) -> NodeEvent:
    return NodeEvent(EventKind.LISTENING, task)


def exited(task: str, code: int | None, killed: bool) -> NodeEvent:
    return NodeEvent(EventKind.EXIT, task, code=code, killed=killed)


def done(ended: RunEnd | None = None) -> NodeEvent:
    return NodeEvent(EventKind.DONE, ended=ended)


def parse_event(payload: object, strict: bool = False) -> NodeEvent | None:
    """A watcher's line, read: the event, or None for one this launcher cannot read (an
    unknown kind, a field of the wrong type), which raises ProtocolError when ``strict``
    (the launcher's choice: ``HYPERTF_PROTOCOL_STRICT``)."""
    try:
        found = _object(payload, "an event")
        try:
            kind = EventKind(str(found.get("e")))
        except ValueError as err:
            raise _fail("unknown event", payload) from err
        task = _str(found, "task", "an event", "")
        code = found.get("code")
        if kind is EventKind.EXIT and code is not None:
            code = _int(code, "an exit code")
        killed = found.get("killed", False)
        if not isinstance(killed, bool):
            raise _fail("an event: 'killed' is not true or false", payload)
        ended = found.get("ended")
        return NodeEvent(kind, task, _str(found, "line", "an event", ""), code, killed,
                         RunEnd.parse(ended) if ended is not None else None)
    except ProtocolError:
        if strict:
            raise
        return None


# -- start ----------------------------------------------------------------------------------
class TaskStart(NamedTuple):
    """One task to start: its file name, granted port, working directory, environment and
    command (run under task.sh)."""

    name: str
    port: int
    cwd: str
    env: dict[str, str]
    argv: tuple[str, ...]

    def wire(self) -> dict[str, Any]:
        return {"name": self.name, "port": self.port, "cwd": self.cwd, "env": self.env,
                "argv": list(self.argv)}

    @classmethod
    def parse(cls, payload: object) -> TaskStart:
        found = _object(payload, "a task to start")
        return cls(_str(found, "name", "a task"), _int(found.get("port"), "a task's port"),
                   _str(found, "cwd", "a task"), _str_map(found.get("env", {}), "a task's env"),
                   _strings(found.get("argv"), "a task's argv"))


class StartRequest(NamedTuple):
    """What ``tasknode start`` reads on stdin: the run directory, the tasks' environment,
    the tasks, directories to make first (checkpoints), the script that must be there
    (relative to the first task's cwd; "": not checked) and the size of the ``--sync``
    archive that follows the request's line (None: none)."""

    run_dir: str
    venv: str
    tasks: tuple[TaskStart, ...]
    make_dirs: tuple[str, ...] = ()
    script: str = ""
    archive: int | None = None

    def wire(self) -> dict[str, Any]:
        found: dict[str, Any] = {"run_dir": self.run_dir, "venv": self.venv,
                                 "make_dirs": list(self.make_dirs),
                                 "tasks": [task.wire() for task in self.tasks],
                                 "script": self.script}
        if self.archive is not None:
            found["archive"] = self.archive
        return found

    @classmethod
    def parse(cls, payload: object) -> StartRequest:
        found = _object(payload, "a start request")
        tasks = found.get("tasks")
        if not isinstance(tasks, list):
            raise _fail("a start request: 'tasks' is not a list", payload)
        archive = found.get("archive")
        return cls(_str(found, "run_dir", "a start request"),
                   _str(found, "venv", "a start request"),
                   tuple(TaskStart.parse(task) for task in tasks),
                   _strings(found.get("make_dirs", []), "a start request's make_dirs"),
                   _str({"script": found.get("script") or ""}, "script", "a start request"),
                   None if archive is None else _int(archive, "an archive's size"))


class StartAnswer(NamedTuple):
    """A start's answer: each task's PID; or the granted ports found taken (nothing
    started: the launcher retries on fresh ports); or problems (nothing started)."""

    started: dict[str, int] = {}  # noqa: RUF012 (a NamedTuple default, never mutated)
    busy: tuple[int, ...] = ()
    problems: tuple[str, ...] = ()

    def wire(self) -> dict[str, Any]:
        if self.busy:
            return {"busy": list(self.busy)}
        if self.problems:
            return {"problems": list(self.problems)}
        return {"started": self.started}

    @classmethod
    def parse(cls, payload: object) -> StartAnswer:
        found = _object(payload, "a start's answer")
        if "problems" in found:
            return cls(problems=_strings(found["problems"], "a start's problems"))
        if "busy" in found:
            busy = found["busy"]
            if not isinstance(busy, list):
                raise _fail("a start's busy ports are not a list", payload)
            return cls(busy=tuple(_int(port, "a busy port") for port in busy))
        started = _object(found.get("started"), "a start's PIDs")
        return cls(started={str(task): _int(pid, "a PID") for task, pid in started.items()})


# -- preflight ------------------------------------------------------------------------------
class PreflightAnswer(NamedTuple):
    """Can this node run the job: its problems (sentences for the user), whether the
    script (or a local module it imports) reads the legacy flags, tf-keras in the tasks'
    venv, the node's protocol, and whether the script names ParameterServerStrategy or
    ClusterCoordinator (``ps_strategy``; None: not known, a node from before the field or
    no script to read), and why it rendezvouses on a coordinator (``coordinator``: it
    imports JAX, PyTorch...; "" it does not say so; None: not known)."""

    python: str
    problems: tuple[str, ...]
    hostname: str = ""
    legacy_flags: bool = False
    tf_keras: bool = False
    protocol: int = PROTOCOL_VERSION
    ps_strategy: bool | None = None
    coordinator: str | None = None
    confine: str | None = None  # what the node enforces (hypertf.node.confine); None: unknown

    def wire(self) -> dict[str, Any]:
        return {"python": self.python, "problems": list(self.problems),
                "hostname": self.hostname, "legacy_flags": self.legacy_flags,
                "tf_keras": self.tf_keras, "ps_strategy": self.ps_strategy,
                "coordinator": self.coordinator, "confine": self.confine,
                "protocol": self.protocol}

    @classmethod
    def parse(cls, payload: object) -> PreflightAnswer:
        """A preflight answer; one without a version is ``UNVERSIONED`` (an old node),
        whose other fields are read as far as they go."""
        found = _object(payload, "a preflight answer")
        protocol = found.get("protocol", UNVERSIONED)
        ps_strategy = found.get("ps_strategy")  # added within version 2: missing is unknown
        coordinator = found.get("coordinator")  # likewise
        confine = found.get("confine")  # likewise
        return cls(str(found.get("python", "")),
                   _strings(found.get("problems", []), "a preflight's problems"),
                   str(found.get("hostname", "")), bool(found.get("legacy_flags", False)),
                   bool(found.get("tf_keras", False)),
                   protocol if isinstance(protocol, int) and not isinstance(protocol, bool)
                   else UNVERSIONED,
                   ps_strategy if isinstance(ps_strategy, bool) else None,
                   coordinator[:200] if isinstance(coordinator, str)
                   and coordinator.isprintable() else None,  # said on the user's terminal
                   confine[:300] if isinstance(confine, str) and confine.isprintable()
                   else None)
