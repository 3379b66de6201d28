"""The launcher's side of the node protocol: one node, one session, ``tasknode`` verbs.

Every verb runs ``<venv>/bin/python -m hypertf.node.tasknode <verb>`` on the node and reads its
JSON answer: the first JSON object line of what the command printed after its frame (what
the user's shell startup files print is dropped by ``remote.Session``). ``start`` sends its
request, and the ``--sync`` archive after it, on the command's stdin: one round trip per
node, and a command line is limited (128 KiB per argument on Linux), a job's task specs
are not.
"""

from __future__ import annotations

import contextlib
import io
import json
import queue
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hypertf.config import environment
from hypertf.core import protocol
from hypertf.core.errors import RemoteError
from hypertf.core.monitor import Event, EventKind
from hypertf.core.protocol import (
    PreflightAnswer,
    RunEnd,
    StartAnswer,
    StartRequest,
    StopResult,
    TaskStart,
    VersionMismatch,
)
from hypertf.core.rundir import RunDir
from hypertf.launch.remote import Result, Session, command_line, quote


class PortsBusy(Exception):
    """Something else listens on granted ports of a host; nothing was started there."""

    def __init__(self, ports: set[int]) -> None:
        super().__init__(f"ports in use: {sorted(ports)}")
        self.ports = ports


class _LineSink(io.TextIOBase):
    """Invoke/Fabric write the watcher's stdout here; whole lines go to the queue as events
    (``Event.from_node``: a line that is no event is noise, or with
    ``HYPERTF_PROTOCOL_STRICT=1`` a ProtocolError that ends the watch as the host lost). A
    'done' event carries ``ended`` (the node ended the run itself) to the attempt."""

    def __init__(self, host: str, events: queue.Queue[Event]) -> None:
        self.host, self.events, self.buffer = host, events, ""
        self.strict = environment.PROTOCOL_STRICT.read()

    def write(self, text: str) -> int:
        self.buffer += text
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            if line.strip():
                try:
                    payload: object = json.loads(line)
                except json.JSONDecodeError:  # not JSON: passed on as it is, or refused
                    payload = line
                self.events.put(Event.from_node(self.host, payload, self.strict))
        return len(text)


class _StartSink(_LineSink):
    """``start --watch``'s stdout: its first JSON object line is the start's answer (to
    ``answered``); the lines after it are the watcher's events."""

    def __init__(self, host: str, events: queue.Queue[Event],
                 answered: queue.Queue[Any]) -> None:
        super().__init__(host, events)
        self.answered = answered
        self.answer: dict[str, Any] | None = None

    def write(self, text: str) -> int:
        if self.answer is not None:
            return super().write(text)
        self.buffer += text
        while self.answer is None and "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            with contextlib.suppress(json.JSONDecodeError):
                answer = json.loads(line)
                if isinstance(answer, dict):
                    self.answer = answer
                    self.answered.put(answer)
        if self.answer is not None and self.buffer:
            rest, self.buffer = self.buffer, ""
            super().write(rest)
        return len(text)


def start_timeout(request: StartRequest) -> float:
    """Seconds a start may take: longer when it unpacks a --sync archive."""
    return 120.0 if request.archive is not None else 60.0


def check_version(host: str, answer: PreflightAnswer) -> None:
    """A node on another protocol version may not run this launcher's jobs."""
    if answer.protocol != protocol.PROTOCOL_VERSION:
        raise VersionMismatch({host: answer.protocol})


class NodeClient:
    """One node's preflight, start, watch, stop and logs for the jobs of this launcher."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.node = session.node

    def run_dir(self, task_key: str) -> RunDir:
        return RunDir.of(self.node.settings.workdir, task_key)

    def start_command(self) -> str:
        """``start_watching``'s command: the same for every job on this node, so the launcher
        can start it early (``Session.open_soon``) and send the request once it has one."""
        return self._tasknode("start", "--watch")

    def _tasknode(self, verb: str, *args: object) -> str:
        return command_line([f"{self.node.settings.venv}/bin/python", "-m", "hypertf.node.tasknode",
                             verb, *args])

    def _answer(self, result: Result) -> Any:
        """The verb's JSON answer; a failed command is a RemoteError with its last words."""
        if not result.ok:
            detail = (result.stderr or result.stdout).strip().splitlines()
            why = detail[-1] if detail else f"exit {result.exited}"
            if result.exited == 127 or "No such file" in why:
                why = (f"the virtualenv {self.node.settings.venv} has no python with HyperTF "
                       f"(run invoke cluster.setup): {why}")
            raise RemoteError(why)
        for line in result.stdout.splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                answer = json.loads(line)
                if isinstance(answer, dict):
                    return answer
        said = " ".join(result.stdout.split())
        raise RemoteError(f"{self.node.name}: no answer from hypertf.node.tasknode (it printed "
                          f"{said[:200]!r}); is HyperTF installed in {self.node.settings.venv}?")

    def preflight(self, script: str, timeout: float, offload: bool = False) -> PreflightAnswer:
        """Venv, work dir and script on this node, and its protocol version: a node on
        another version raises VersionMismatch (before its problems: they may be words of
        another version); problems raise RemoteError. An offload host runs no script: what
        its processor needs is checked (hypertf.offload.hostcheck, which names no version)."""
        command = (command_line([f"{self.node.settings.venv}/bin/python", "-m",
                                 "hypertf.offload.hostcheck"]) if offload else self._tasknode(
            "preflight", "--workdir", self.node.settings.workdir, "--script", script))
        report = PreflightAnswer.parse(self._answer(self.session.run(command, timeout=timeout)))
        if not offload:
            check_version(self.node.name, report)
        if report.problems:
            raise RemoteError("; ".join(report.problems))
        return report

    def start(self, run: RunDir, tasks: Sequence[TaskStart],
              make_dirs: Sequence[str] = (), sync_dir: str | None = None,
              script: str = "") -> dict[str, int]:
        """Start ``tasks`` (name, port, cwd, env, argv) in ``run``, after making ``make_dirs``
        and unpacking ``sync_dir`` (``--sync``) as ``<run dir>/code``: one command, one
        round trip (the request and the archive travel on its stdin). ``script``, when
        given, must be there (relative to the first task's cwd): preflight's answer may be
        cached and the script gone since. PortsBusy when a granted port is taken (nothing
        is started then). Returns each task's PID."""
        request, payload = self._start_request(run, tasks, make_dirs, sync_dir, script)
        answer = self._answer(self.session.feed(self._tasknode("start"), payload,
                                                timeout=start_timeout(request)))
        return self._started(StartAnswer.parse(answer))

    def start_watching(self, run: RunDir, tasks: Sequence[TaskStart],
                       events: queue.Queue[Event], make_dirs: Sequence[str] = (),
                       sync_dir: str | None = None, script: str = "") -> dict[str, int]:
        """``start`` and ``follow`` in one command (``tasknode start --watch``): the answer
        is its first line, the tasks' events follow on the same channel, so a host costs
        one round trip and one Python start to launch and watch. Raises as ``start``
        does; once started, every event goes to ``events``, then ``closed`` or ``lost``.
        When every task ends by itself and nothing of the run is left, the node ends the
        run and its 'done' event carries the stop's answer, the logs and the metrics: the
        launcher then skips this host's stop."""
        request, payload = self._start_request(run, tasks, make_dirs, sync_dir, script)
        host = self.node.name
        answered: queue.Queue[Any] = queue.Queue()
        sink = _StartSink(host, events, answered)
        command = self.start_command()

        def run_it() -> None:
            try:
                result = self.session.feed_stream(command, payload, sink)
            except Exception as err:  # reported per host, as follow does
                if sink.answer is None:
                    answered.put(err)
                elif "started" in sink.answer:
                    events.put(Event(EventKind.LOST, host, why=str(err)))
            else:
                if sink.answer is None:  # it ended without answering: its exit says why
                    answered.put(result)
                elif "started" in sink.answer:
                    events.put(Event(EventKind.CLOSED, host))

        threading.Thread(target=run_it, daemon=True, name=f"start-watch-{host}").start()
        try:
            got = answered.get(timeout=start_timeout(request))
        except queue.Empty as err:
            raise RemoteError(f"{host}: no answer to the start within "
                              f"{start_timeout(request):.0f} s") from err
        if isinstance(got, BaseException):
            raise got
        answer = got if isinstance(got, dict) else self._answer(got)
        return self._started(StartAnswer.parse(answer))

    def _start_request(self, run: RunDir, tasks: Sequence[TaskStart],
                       make_dirs: Sequence[str], sync_dir: str | None, script: str,
                       ) -> tuple[StartRequest, bytes]:
        """The start's request and the bytes sent on its stdin (the request's JSON line,
        then the --sync archive)."""
        archive = b""
        if sync_dir:
            import tarfile  # only --sync needs it (with shutil, bz2, lzma: ~2 ms per launch)

            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w:gz") as packed:
                packed.add(sync_dir, arcname=run.code.name)
            archive = buffer.getvalue()
        request = StartRequest(str(run.path), self.node.settings.venv, tuple(tasks),
                               tuple(make_dirs), script, len(archive) if sync_dir else None)
        return request, json.dumps(request.wire()).encode() + b"\n" + archive

    @staticmethod
    def _started(answer: StartAnswer) -> dict[str, int]:
        if answer.problems:
            raise RemoteError("; ".join(answer.problems))
        if answer.busy:
            raise PortsBusy(set(answer.busy))
        return dict(answer.started)

    def watch(self, run: RunDir, ports: Mapping[str, int], sink: io.TextIOBase) -> Result:
        """Stream ``tasknode watch`` events (one JSON line each) into ``sink`` until every
        task named in ``ports`` has ended."""
        return self.session.stream(
            self._tasknode("watch", run.path, *(f"{name}={port}" for name, port in ports.items())),
            sink)

    def follow(self, run: RunDir, ports: Mapping[str, int], events: queue.Queue[Event]) -> None:
        """Watch in a thread of its own: every event goes to ``events``, then ``closed``
        when the watcher ends, or ``lost`` when the host goes away (the Monitor decides)."""
        host = self.node.name

        def watch() -> None:
            try:
                self.watch(run, ports, _LineSink(host, events))
            except Exception as err:
                events.put(Event(EventKind.LOST, host, why=str(err)))
            else:
                events.put(Event(EventKind.CLOSED, host))

        threading.Thread(target=watch, daemon=True).start()

    def stop(self, run: RunDir, grace: float) -> dict[str, StopResult]:
        """TERM, then KILL after ``grace``, every task of the run; per task what happened."""
        return protocol.parse_stopped(self._answer(self.session.run(
            self._tasknode("stop", run.path, "--grace", grace), timeout=grace + 30)))

    def stop_with_logs(self, run: RunDir, grace: float,
                       preempt_deadline: float | None = None) -> RunEnd:
        """``stop``, and in the same answer the tasks' logs (up to 1 MiB in all: a larger
        log is not in it; ``fetch_logs`` copies it) and the metrics file's text (None: no
        file): a job's end in one round trip per host. ``preempt_deadline``: a preemption,
        whose file the node writes before the SIGTERM."""
        extra = ("--preempt-deadline", preempt_deadline) if preempt_deadline else ()
        return RunEnd.parse(self._answer(self.session.run(
            self._tasknode("stop", run.path, "--grace", grace, "--logs", *extra),
            timeout=grace + 30)))

    def fetch_metrics(self, run: RunDir, local: RunDir) -> None:
        """The reporting task's metrics file, if it wrote one (sweeps read it)."""
        result = self.session.run(f"cat {quote(run.metrics)}", timeout=60)
        if result.ok and result.stdout.strip():
            Path(local.metrics).write_text(result.stdout)

    def fetch_logs(self, run: RunDir, tasks: Sequence[str], local: RunDir,
                   have: Mapping[str, str] | None = None) -> None:
        """Copy the tasks' logs into ``local`` (the same layout on this machine); those in
        ``have`` (the stop's answer carried them) are written without asking the node."""
        have = have or {}
        for task in tasks:
            if task in have:
                Path(local.log(task)).write_text(have[task])
                continue
            log = self.session.run(f"cat {quote(run.log(task))}", timeout=60).stdout
            Path(local.log(task)).write_text(log)
