"""The event stream of a run's tasks (``tasknode watch``, ``tasknode start --watch``): one
JSON line per event (a log line, a port listening, an exit, a heartbeat: the messages of
hypertf.core.protocol), so a single SSH channel per node carries everything the launcher
needs, until every task has exited.

A task has ended when its wrapper wrote its exit code, or when the node can no longer
prove its wrapper lives (hypertf.node.runcontrol.proves: dead, a recycled PID, a forged
record). Under ``start --watch`` the wrappers are this process's children: their end wakes
the stream at once, they are reaped without psutil, and a run whose tasks all ended by
themselves is ended here too (its 'done' carries what a stop would answer).
Standard library only: ``start --watch`` runs it on every node of every job.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from hypertf.core import protocol as wire
from hypertf.core.protocol import NodeEvent, RunEnd, StartAnswer, StopResult
from hypertf.core.rundir import RunDir, read_pid_record
from hypertf.node import runcontrol

if TYPE_CHECKING:
    from collections.abc import Iterator


def _exit_code(run: RunDir, name: str) -> int | None:
    """The exit code task ``name``'s wrapper wrote; None while there is none."""
    try:
        return int(Path(run.exit(name)).read_text())
    except (OSError, ValueError):
        return None


def port_listening(port: int) -> bool:
    """Does something on this host accept connections on ``port`` (a task's, or one taken)?"""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


def emit(message: NodeEvent | StartAnswer) -> None:
    """One message of the protocol (hypertf.core.protocol) to the launcher, one line."""
    sys.stdout.write(json.dumps(message.wire()) + "\n")
    sys.stdout.flush()


def watch(run: RunDir, tasks: dict[str, int], interval: float = 0.2, end: bool = False) -> None:
    """Stream events until every task has exited (or the launcher goes away). With ``end``
    (``start --watch``), a run whose every task ended by itself is ended here too: when
    no process of it is left, the 'done' event carries what a stop would answer, the logs
    and the metrics (``ended``), so the launcher needs no stop round trip for this host.
    There the tasks' wrappers are this process's children: their end wakes the loop at
    once (a short job's end waited for the next poll, up to ``interval``)."""
    with _child_exits() if end else contextlib.nullcontext() as wake:
        _watch(run, tasks, interval, end, wake)


@contextlib.contextmanager
def _child_exits() -> Iterator[int | None]:
    """A descriptor that becomes readable when a child of this process ends (SIGCHLD
    through ``signal.set_wakeup_fd``); None where that cannot be set up (not the main
    thread). The previous handler and wakeup descriptor come back after."""
    try:
        read, write = os.pipe()
    except OSError:
        yield None
        return
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    try:
        previous_fd = signal.set_wakeup_fd(write)
        previous = signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    except ValueError:  # not the main thread
        os.close(read)
        os.close(write)
        yield None
        return
    try:
        yield read
    finally:
        signal.signal(signal.SIGCHLD, previous)
        signal.set_wakeup_fd(previous_fd)
        os.close(read)
        os.close(write)


def _pause(wake: int | None, seconds: float) -> None:
    """Sleep ``seconds``, or less when ``wake`` (``_child_exits``) says a child ended."""
    if wake is None:
        time.sleep(seconds)
        return
    if select.select([wake], [], [], seconds)[0]:
        with contextlib.suppress(OSError):
            os.read(wake, 4096)


def _reap_children(reaped: set[int]) -> None:
    """Collect every ended child (the tasks' wrappers, under ``start --watch``) into
    ``reaped``. A reaped wrapper is known dead without psutil (14 ms to import, on every
    node of every job), and once reaped its group is gone as soon as its task is, so
    ``run_alive`` needs no scan of the node's processes either."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        reaped.add(pid)


def _watch(run: RunDir, tasks: dict[str, int], interval: float, end: bool,
           wake: int | None) -> None:
    offsets = dict.fromkeys(tasks, 0)
    partial = dict.fromkeys(tasks, b"")
    listening: set[str] = set()
    finished: set[str] = set()
    missing_since: dict[str, float] = {}
    last_beat = 0.0
    reaped: set[int] = set()  # our own children (``wake`` set): ended and collected
    while True:
        if wake is not None:
            _reap_children(reaped)
        for name, port in tasks.items():
            if name in finished:
                continue
            log = Path(run.log(name))
            with contextlib.suppress(OSError), open(log, "rb") as handle:
                handle.seek(offsets[name])
                chunk = handle.read(1 << 20)
                offsets[name] += len(chunk)
                *lines, partial[name] = (partial[name] + chunk).split(b"\n")
                for line in lines:
                    emit(wire.log_line(name, line.decode(errors="replace")))
            if name not in listening and port_listening(port):
                listening.add(name)
                emit(wire.listening(name))
            code = _exit_code(run, name)
            try:
                record = read_pid_record(Path(run.pid(name)))
            except ValueError:  # a record that proves nothing: the task counts as dead
                record = (0, 0)
            # ended: reaped (our child), or no longer a wrapper the node can prove (dead, a
            # recycled PID, a forged record)
            gone = record is not None and (record[0] in reaped or not (
                record[0] and runcontrol.proves(run, name, *record)))
            if record is None:
                missing_since.setdefault(name, time.monotonic())
                gone = time.monotonic() - missing_since[name] > 10
            if code is not None or gone:
                if code is None:
                    time.sleep(0.05)  # the wrapper may be writing it right now
                    code = _exit_code(run, name)
                with contextlib.suppress(OSError), open(log, "rb") as handle:
                    handle.seek(offsets[name])
                    rest = partial[name] + handle.read()
                    for line in rest.split(b"\n"):
                        if line:
                            emit(wire.log_line(name, line.decode(errors="replace")))
                finished.add(name)
                # killed: no code (the wrapper died too) or the wrapper saw TERM/KILL end it
                killed = code is None or code in (128 + signal.SIGTERM, 128 + signal.SIGKILL)
                emit(wire.exited(name, code, killed))
        if len(finished) == len(tasks):
            if wake is not None:  # each wrapper exits right after writing its code
                _await_wrappers(run, tasks, reaped)
            ended = _end(run, tasks) if end else None
            emit(wire.done(ended))
            return
        now = time.monotonic()
        if now - last_beat >= 1.0:
            emit(wire.BEAT)
            last_beat = now
        _pause(wake, interval)


def _await_wrappers(run: RunDir, names: Iterable[str], reaped: set[int],
                    seconds: float = 0.5) -> None:
    """Reap the wrappers of ``names`` (our children), waiting up to ``seconds``: a wrapper
    that wrote its exit code is about to end, and once reaped, ``run_alive`` learns that
    its group is gone from one ``killpg(pgid, 0)``. One still there after ``seconds`` is
    left to ``run_alive``'s full look."""
    pids = {pid for pid in (runcontrol.task_pid(run, name) for name in names) if pid is not None}
    deadline = time.monotonic() + seconds
    while True:
        _reap_children(reaped)
        if pids <= reaped or time.monotonic() > deadline:
            return
        time.sleep(0.002)


def _end(run: RunDir, names: Iterable[str]) -> RunEnd | None:
    """After every task exited: if nothing of the run lives here, mark it drained and
    stopped (as a stop would) and return the stop's answer, the logs and the metrics."""
    names = list(names)
    if runcontrol.run_alive(run):
        return None  # a task left a process behind: the launcher's stop handles it
    try:
        runcontrol.mark_drained(run)
        Path(run.stopped).touch()
    except OSError:
        return None
    runcontrol.unlink_offload_channels(run.task_key)
    return runcontrol.ended_answer(run, dict.fromkeys(names, StopResult.NOT_RUNNING), names)
