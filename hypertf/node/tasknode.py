"""The node side of a job: preflight, start, watch and stop the tasks of one run directory.

The launcher runs ``python -m hypertf.node.tasknode ...`` on each node over SSH. ``start`` reads
the tasks to start as a JSON line on stdin (no command-line limit, no shell), then the
``--sync`` archive if any (upload and start: one round trip), refuses when a
granted port is already taken, and starts each task in its own session. ``watch``
streams one JSON event per line (log lines, port listening, exits, heartbeats) so a single
SSH channel per node carries everything the launcher needs; ``stop`` signals each task's
process group (TERM, then KILL after a grace period: MultiWorkerMirroredStrategy catches
TERM). A task is believed only as far as the node can prove it (``wrapper``): its pid file
names a live process group leader running our wrapper for this run, with the start time
recorded beside the PID (a recycled PID has another), owned by the run directory's owner,
who on a per-user node must be the job owner's account (hypertf.node.taskaccount); a bare
number in a file proves nothing. On such a node ``start`` starts only the job owner's
account's tasks (never root's unless the admin allows it). ``start`` refuses a run
directory that is not the job's or already has tasks, and makes everything private to the
job's user (0700/0600).
Standard library only (and hypertf.node.procs), so it starts fast:
``start`` is on every job's critical path (one Python start per host), so what only other
verbs need (psutil through procs, tarfile, logging, diagnose) is imported where it is used.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from hypertf.core import offloadname
from hypertf.core import protocol as wire
from hypertf.core.errors import HyperTFError, NotAllowed
from hypertf.core.protocol import NodeEvent, RunEnd, StartAnswer, StartRequest, StopResult
from hypertf.core.rundir import RunDir, read_pid_record
from hypertf.node import confine, taskaccount

if TYPE_CHECKING:
    from collections.abc import Iterator

WRAPPER = "task.sh"
INLINE_LOGS_MAX = 1 << 20  # stop --logs: logs up to this many bytes ride on the answer


def wrapper_path() -> str:
    return str(Path(__file__).with_name(WRAPPER))


KEY_ENV = "HYPERTF_TASK_KEY"
PRIVATE = 0o077  # the umask of what a start makes: its user's alone


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """``pid``'s state, process group and start time (clock ticks after boot; fields 3, 5
    and 22 of /proc/PID/stat, read after the command name's closing parenthesis); None when
    there is no such process. Standard library: ``start --watch`` calls it."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        fields = data[data.rindex(b")") + 2:].split()
        return fields[0].decode(), int(fields[2]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _owner(path: str | PurePath) -> int | None:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def _runs_wrapper_for(pid: int, run: RunDir, name: str) -> bool:
    """Is ``pid`` our task.sh, started with this run's pid file for ``name``?"""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    for at, arg in enumerate(args[:3]):  # bash [options] .../task.sh LOG PIDFILE ...
        if PurePath(os.fsdecode(arg)).name == WRAPPER and len(args) > at + 2:
            pidfile = PurePath(os.fsdecode(args[at + 2]))
            return pidfile.name == f"{name}.pid" and pidfile.parent.name == run.task_key
    return False


def _record(run: RunDir, name: str) -> tuple[int, int] | None:
    """The task's pid record; None when there is none yet or it is malformed."""
    try:
        return read_pid_record(Path(run.pid(name)))
    except ValueError:
        return None


def _proves(run: RunDir, name: str, pid: int, start: int) -> bool:
    """``pid`` lives (not a zombie), leads its own process group, started at ``start``,
    runs our wrapper for this run's ``name`` and is the run directory's owner's. The start
    time is read again after the command line: a PID recycled in between fails it."""
    stat = _proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X") or stat[1] != pid or stat[2] != start:
        return False
    if not _runs_wrapper_for(pid, run, name):
        return False
    owner = _owner(run.path)
    if owner is None or _owner(f"/proc/{pid}") != owner:
        return False
    expected = taskaccount.expected_uid(_workdir(run), run.task_key)  # per-user nodes
    if expected is not None and owner != expected:
        return False  # a run directory another account made under this job's name
    again = _proc_stat(pid)  # the same process still: its group and start time (its state,
    return again is not None and again[1:] == stat[1:]  # running or sleeping, may change)


def wrapper(run: RunDir, name: str) -> int | None:
    """The PID (= process group) of task ``name``'s wrapper if the node can prove it is this
    run's and alive now (``_proves``); None otherwise: the task counts as dead for the run,
    and processes claiming it are not believed. A recycled PID has another start time, a
    forged record names no wrapper of this run, a bare PID is no record."""
    record = _record(run, name)
    return record[0] if record and _proves(run, name, *record) else None


def task_group(run: RunDir, name: str) -> int | None:
    """The process group of task ``name`` that a stop or drain must end: its proven
    wrapper's, or, the wrapper gone (killed alone, or its command ended leaving a child),
    the group its record names while a member of it is the run owner's, started after the
    wrapper and carries the job's HYPERTF_TASK_KEY. Never when the record's PID is now
    another process (recycled or forged): Linux gives no process the id of a live group,
    so a live PID with another start time means the task's group is gone."""
    record = _record(run, name)
    if record is None:
        return None
    pid, start = record
    stat = _proc_stat(pid)
    if stat is not None and stat[0] not in ("Z", "X"):
        return pid if _proves(run, name, pid, start) else None
    if stat is not None and (stat[2] != start or stat[1] != pid):
        return None
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # another user's group: its members are checked below (and are not ours)
    from hypertf.node import procs

    owner = _owner(run.path)
    for member in procs.group_members(pid):
        found = _proc_stat(member)
        if (found and found[2] >= start and _owner(f"/proc/{member}") == owner
                and procs.environ_value(member, KEY_ENV) == run.task_key):
            return pid
    return None


def _pid(run: RunDir, name: str) -> int | None:
    record = _record(run, name)
    return record[0] if record else None


def _exit_code(run: RunDir, name: str) -> int | None:
    try:
        return int(Path(run.exit(name)).read_text())
    except (OSError, ValueError):
        return None


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


def emit(message: NodeEvent | StartAnswer) -> None:
    """One message of the protocol (hypertf.core.protocol) to the launcher, one line."""
    sys.stdout.write(json.dumps(message.wire()) + "\n")
    sys.stdout.flush()


def wrapper_argv(run: RunDir, name: str, venv: str, cwd: str, argv: Sequence[str]) -> list[str]:
    """The command that runs one task under ``task.sh``, every file it writes named."""
    return ["bash", wrapper_path(), str(run.log(name)), str(run.pid(name)),
            str(run.exit(name)), str(run.drained), venv, cwd, "--", *argv]


def start(request: Mapping[str, Any], archive: bytes = b"") -> dict[str, Any]:
    """``tasknode start``: the request (``protocol.StartRequest``, as JSON) read, the
    answer as JSON (``protocol.StartAnswer``)."""
    return start_tasks(StartRequest.parse(request), archive).wire()


def start_tasks(request: StartRequest, archive: bytes = b"") -> StartAnswer:
    """Start the tasks of ``request``, each in its own session so its process group can
    be signalled whole. Answers the granted ports already in use without starting
    anything (the launcher retries on fresh ports), or the problems when ``archive``
    (``--sync``, a tar.gz) does not unpack, the request's ``script`` is not there or a
    task's ``cwd`` cannot be made (each task's is made here: its own directory in the
    run, or --workdir), else each task's PID. Raises NotAllowed, starting nothing, for a
    run directory that is not this job's or was started already (``_claim``). What it
    makes is the job's user's alone: directories 0700, and the wrappers, the tasks and
    the unpacked code under umask 077."""
    tasks = request.tasks
    busy = tuple(sorted(task.port for task in tasks if _listening(task.port)))
    if busy:
        return StartAnswer(busy=busy)
    run = RunDir(Path(request.run_dir))
    refused = taskaccount.start_problem(_workdir(run), run.task_key)
    if refused:
        raise NotAllowed(f"tasknode start: {refused}: refused, nothing started")
    _claim(run, tasks)
    problems = _unpack(run, archive) if archive else []
    script = request.script
    if script and tasks and not (Path(tasks[0].cwd) / script).is_file():
        problems.append(f"script {script} not found (relative paths start in "
                        f"{tasks[0].cwd})")
    for cwd in sorted({task.cwd for task in tasks} if not problems else ()):
        try:
            _private_dir(Path(cwd))
        except OSError as err:
            problems.append(f"cannot make the working directory {cwd} ({err.strerror})")
    if problems:
        return StartAnswer(problems=tuple(problems))
    for directory in request.make_dirs:  # checkpoints: kept across attempts
        _private_dir(Path(directory))
    # The job's cgroups, made by the agent from its grant: each wrapper joins them first.
    state = confine.read_state(_workdir(run))
    join, notice = confine.join_env(state, run.task_key) if tasks else ({}, "")
    if notice and state.required:
        return StartAnswer(problems=(f"{socket.gethostname()}: {notice}, and "
                                     f"hypertf_gpu_confine is required here",))
    started = {}
    umask = os.umask(PRIVATE)  # inherited by each wrapper and its task
    try:
        for task in tasks:
            if notice:
                with open(run.log(task.name), "a") as log:
                    log.write(notice + "\n")
            process = subprocess.Popen(
                wrapper_argv(run, task.name, request.venv, task.cwd, task.argv),
                env={**os.environ, **task.env, **join}, start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            started[task.name] = process.pid
    finally:
        os.umask(umask)
    return StartAnswer(started=started)


def _workdir(run: RunDir) -> Path:
    """The node's workdir (``<workdir>/runs/<task key>``), where the agent's cgroups.json is."""
    return run.local.parent.parent


def _cgroups(run: RunDir) -> list[Path]:
    """The run's job cgroups on this node, as the agent's cgroups.json names them."""
    return confine.read_state(_workdir(run)).job_dirs(run.task_key)


def _claim(run: RunDir, tasks: Sequence[Any]) -> None:
    """Take ``run``'s directory for this start, made 0700, or refuse (NotAllowed): a task
    of another job (its HYPERTF_TASK_KEY is not the directory's name), a directory that
    is a link, another user's, has tasks already or was taken by another start. The
    'started' mark is made with O_EXCL: of two starts into one run, one wins."""
    path = run.local
    other = sorted({task.env.get(KEY_ENV) for task in tasks} - {None, run.task_key})
    if other:
        raise NotAllowed(f"tasknode start: {path} is not the run directory of job {other[0]}: "
                         f"refused, nothing started")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        if path.is_symlink() or not path.is_dir():
            raise NotAllowed(f"tasknode start: {path} is not a directory of this job (a link "
                             f"or a file): refused, nothing started") from None
        if _owner(path) != os.geteuid():
            raise NotAllowed(f"tasknode start: {path} belongs to another user: refused, "
                             f"nothing started") from None
        if run.task_names():
            raise NotAllowed(f"tasknode start: {path} already has tasks "
                             f"({', '.join(run.task_names())}): a start never joins another "
                             f"run; refused, nothing started") from None
        os.chmod(path, 0o700)
    try:
        fd = os.open(run.started, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise NotAllowed(f"tasknode start: {path} was taken by another start: refused, "
                         f"nothing started") from None
    with os.fdopen(fd, "w") as mark:
        mark.write(json.dumps(sorted(task.name for task in tasks)) + "\n")


def _private_dir(path: Path) -> None:
    """``path`` made 0700 when missing; its missing parents as the node's umask makes them
    (shared folders such as <workdir>/checkpoints). One already there is left as it is:
    a --workdir or --checkpoint-dir of the user's, or the job's own from its first attempt."""
    try:
        path.mkdir(mode=0o700)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
    except FileExistsError:
        if not path.is_dir():
            raise


def _unpack(run: RunDir, archive: bytes) -> list[str]:
    """``--sync``: the archive into the run directory (only plain files and directories
    inside it: tarfile's 'data' filter where this Python has it), its user's alone: files
    keep only their owner's bits, directories are made under umask 077."""
    import io
    import tarfile

    def private(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
        member = tarfile.data_filter(member, dest)
        return member if member.mode is None else member.replace(
            mode=member.mode & 0o700, deep=False)

    safe: dict[str, Any] = {"filter": private} if hasattr(tarfile, "data_filter") else {}
    umask = os.umask(PRIVATE)
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as packed:
            packed.extractall(run.path, **safe)
            if not safe:  # no filter: narrow what the archive's modes opened
                for member in packed.getmembers():
                    if member.isreg() or member.isdir():
                        with contextlib.suppress(OSError):
                            os.chmod(run.local / member.name, member.mode & 0o700)
    except (tarfile.TarError, OSError, EOFError) as err:
        return [f"--sync upload failed: {err}"]
    finally:
        os.umask(umask)
    return []


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
            if name not in listening and _listening(port):
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
                record[0] and _proves(run, name, *record)))
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
    pids = {pid for pid in (_pid(run, name) for name in names) if pid is not None}
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
    if run_alive(run):
        return None  # a task left a process behind: the launcher's stop handles it
    try:
        mark_drained(run)
        Path(run.stopped).touch()
    except OSError:
        return None
    unlink_offload_channels(run.task_key)
    return ended_answer(run, dict.fromkeys(names, StopResult.NOT_RUNNING), names)


def write_preempt_file(run: RunDir, deadline: float) -> None:
    """The run's HYPERTF_PREEMPT_FILE, written whole (a rename) before the tasks' SIGTERM:
    a script that polls for it, or reads it in its SIGTERM handler, learns its deadline."""
    import math

    if not math.isfinite(deadline):
        return
    path = Path(run.preempt)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(OSError):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(f"HYPERTF_PREEMPT_DEADLINE={deadline:.0f}\n")
        os.replace(tmp, path)


def mark_drained(run: RunDir) -> None:
    """Mark the run so that a task starting from now on does not run (task.sh checks the
    mark after writing its PID file): whoever then looks at the PID files sees every task."""
    run.local.parent.mkdir(parents=True, exist_ok=True)
    run.local.mkdir(mode=0o700, exist_ok=True)
    Path(run.drained).touch(mode=0o600)


def stop(run: RunDir, names: Iterable[str] | None = None, grace: float = 5.0,
         ) -> dict[str, StopResult]:
    """TERM each task's process group, KILL what is left after ``grace``; report per task.
    The run is marked drained first, so a task still starting is either seen or never runs."""
    with contextlib.suppress(OSError):
        mark_drained(run)
    chosen = list(names) if names else run.task_names()
    # The whole run: also whatever its tasks started in the job's cgroups (setsid daemons)
    cgroups = _cgroups(run) if set(chosen) >= set(run.task_names()) else []
    groups = {}
    result = {}
    for name in chosen:
        pgid = task_group(run, name)
        if pgid:
            groups[name] = pgid
        else:
            result[name] = StopResult.NOT_RUNNING
    began = time.monotonic()
    if cgroups:
        confine.term(cgroups, spare=groups.values())  # the tasks' own groups: TERMed below
    if groups:  # psutil only here: 'start' must not import it (15-20 ms, every node, every job)
        from hypertf.node.procs import stop_groups

        result.update({name: StopResult(said) for name, said in stop_groups(groups, grace).items()})
    emptied = confine.kill(cgroups, max(0.0, grace - (time.monotonic() - began)))
    # a survivor is e.g. stuck in uninterruptible sleep: not dead, not confirmed
    if emptied and StopResult.SURVIVED not in result.values():
        unlink_offload_channels(run.task_key)
        if run.local.is_dir():
            Path(run.stopped).touch()
    return result


def unlink_offload_channels(task_key: str, shm: Path = Path("/dev/shm")) -> None:
    """The shared memory and semaphores of the job's offload channels (named after its task
    key by the launcher): the agent beside a SIGKILLed task could not unlink them itself."""
    if not task_key:
        return
    prefixes = offloadname.shm_prefixes(task_key)
    with contextlib.suppress(OSError):
        for name in os.listdir(shm):
            if name.startswith(prefixes):
                with contextlib.suppress(OSError):
                    (shm / name).unlink()


def logs(run: RunDir, names: Iterable[str] | None = None,
         limit: int = INLINE_LOGS_MAX) -> dict[str, str]:
    """The tasks' logs, for ``stop --logs``: the stop's answer carries them, so a job's
    end is one round trip per host. Only while they total at most ``limit`` bytes: a
    larger log is left out (the launcher copies it on its own)."""
    found: dict[str, str] = {}
    left = limit
    for name in sorted(names or run.task_names()):
        with contextlib.suppress(OSError):
            size = Path(run.log(name)).stat().st_size
            if size <= left:
                found[name] = Path(run.log(name)).read_bytes().decode(errors="replace")
                left -= size
    return found


def ended_answer(run: RunDir, stopped: dict[str, StopResult], names: Iterable[str] | None,
                 ) -> RunEnd:
    """A run's end as the launcher takes it in one answer: the stop's result, the logs, the
    metrics file's text and the offload counts (``stop --logs``, the watcher's 'done')."""
    names = list(names or ())
    return RunEnd(stopped, logs(run, names), _text(run.metrics), offload_counts(run, names))


def offload_counts(run: RunDir, names: Iterable[str] | None = None) -> dict[str, Any]:
    """What each task's offload runner wrote at its end (--offload-hosts), by task."""
    found = {}
    for name in sorted(names or run.task_names()):
        with contextlib.suppress(OSError, ValueError):
            found[name] = json.loads(Path(run.offload(name)).read_text())
    return found


def _text(path: PurePath) -> str | None:
    with contextlib.suppress(OSError):
        return Path(path).read_bytes()[:INLINE_LOGS_MAX].decode(errors="replace")
    return None


def drain(run: RunDir, grace: float) -> bool:
    """For the agent, a job whose GPUs it frees: mark the run drained (before looking: see
    task.sh), stop whatever of it is left here; True once nothing of it lives here."""
    import logging

    log = logging.getLogger(__name__)
    try:
        mark_drained(run)
    except OSError as err:  # a full or read-only disk: cannot be sure, keep draining
        log.error("cannot mark %s drained (%s): its GPUs stay draining", run.path, err)
        return False
    if run_alive(run):
        result = stop(run, grace=grace)
        log.warning("job %s ended without its launcher's stop: stopped its tasks %s",
                    run.task_key, result)
    return not run_alive(run)


def run_alive(run: RunDir) -> bool:
    """Is any process of this run still alive on this node (by its tasks' groups, as far
    as the node can tell they are the run's: ``task_group``)?"""
    return (any(task_group(run, name) for name in run.task_names())
            or confine.populated(_cgroups(run)))


def unstopped_runs(workdir: str | Path) -> list[RunDir]:
    """Run directories whose tasks may still be running (no 'stopped' marker yet)."""
    return [run for run in RunDir.all_on(workdir) if not Path(run.stopped).exists()]


def reap(runs: Iterable[RunDir], leases: set[str], grace: float = 5.0,
         ) -> dict[str, dict[str, StopResult]]:
    """Stop the tasks of every run whose lease is gone (its launcher died).

    List ``run_dirs`` *before* reading ``leases``: a run directory is made only after its
    lease exists, so a run missing from the newer lease list is really dead.
    """
    reaped = {}
    for run in runs:
        if run.task_key in leases:
            continue
        if run_alive(run):
            reaped[run.task_key] = stop(run, grace=grace)
        else:
            Path(run.stopped).touch()
    return reaped


def preflight(workdir: str, script: str, venv: str | None = None) -> dict[str, Any]:
    """Can this node run the job? Checked before anything is allocated or started; the
    answer (``protocol.PreflightAnswer``) names this node's protocol version, which the
    launcher checks. ``venv``: the tasks' environment (default: this Python's,
    ``<venv>/bin/python``)."""
    import importlib.util
    import tempfile

    from hypertf.core import diagnose

    problems = venv_problems(venv or str(Path(sys.executable).parent.parent))
    work = Path(workdir)
    runs = RunDir.runs(workdir)
    try:
        runs.mkdir(parents=True, exist_ok=True)
        # a probe of its own: two jobs' preflights on one host (a sweep's trials) shared
        # ".write-test", and one's unlink made the other's fail "No such file or directory"
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=runs)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        problems.append(f"work dir {workdir} is not writable ({err.strerror})")
    if script and not (work / script).is_file():
        problems.append(f"script {script} not found (relative paths start in {workdir})")
    problems += taskaccount.secret_problems(workdir)
    # the script and the modules beside it that it imports (its flags may live there)
    scan = diagnose.scan_script(work / script) if script else None
    # tf-keras in this venv (the tasks' venv): a Keras 3 error's hint says whether
    # TF_USE_LEGACY_KERAS=1 would work as is. find_spec imports nothing (fast).
    tf_keras = importlib.util.find_spec("tf_keras") is not None
    return wire.PreflightAnswer(sys.executable, tuple(problems), socket.gethostname(),
                                bool(scan and scan.legacy_flags), tf_keras,
                                wire.PROTOCOL_VERSION,
                                scan.ps_strategy if scan and scan.files else None,
                                scan.coordinator if scan and scan.files else None,
                                confine.read_state(workdir).label).wire()


def venv_problems(venv: str) -> list[str]:
    """What task.sh needs of the environment: ``bin/activate`` readable when there is one,
    else an executable ``bin/python`` (a hand-made or conda environment: task.sh then puts
    its ``bin`` first on PATH, as activate would)."""
    bin_dir = Path(venv) / "bin"
    activate, python = bin_dir / "activate", bin_dir / "python"
    if activate.exists():
        return [] if os.access(activate, os.R_OK) else [
            f"{activate} is not readable: tasks source it (fix its permissions)"]
    if os.access(python, os.X_OK):
        return []
    return [f"no Python environment at {venv} (neither bin/activate nor bin/python): set "
            f"hypertf_venv in the inventory, or run invoke cluster.setup"]


def _start_verb(watch_after: bool) -> int:
    """``start [--watch]``: the request's JSON line on stdin, then its archive's bytes."""
    header, _, archive = sys.stdin.buffer.read().partition(b"\n")
    if not header.strip():
        return 0  # started early by a launcher that then had nothing for this node
    request = StartRequest.parse(json.loads(header))
    try:
        answer = start_tasks(request, archive)
    except HyperTFError as err:  # the launcher shows this line (its RemoteError)
        print(f"hypertf: error: {err}", file=sys.stderr)
        return err.exit_code
    emit(answer)
    if watch_after and not (answer.busy or answer.problems):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # launcher gone: just end
        watch(RunDir(Path(request.run_dir)), {t.name: t.port for t in request.tasks}, end=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["start"], ["start", "--watch"]):  # every node of every job: no argparse
        return _start_verb(watch_after=len(argv) == 2)
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hypertf.node.tasknode")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("preflight")
    p.add_argument("--workdir", required=True)
    p.add_argument("--script", default="")
    p = sub.add_parser("start", help="start the tasks a JSON request on stdin names")
    p.add_argument("--watch", action="store_true",
                   help="then watch them, as 'watch' does (start and watch: one command)")
    p = sub.add_parser("watch")
    p.add_argument("run_dir")
    p.add_argument("tasks", nargs="+", help="NAME=PORT")
    p = sub.add_parser("stop")
    p.add_argument("run_dir")
    p.add_argument("names", nargs="*")
    p.add_argument("--grace", type=float, default=5.0)
    p.add_argument("--logs", action="store_true", help='answer {"stopped": ..., "logs": '
                   '{task: text} (up to 1 MiB), "metrics": text or null}')
    p.add_argument("--preempt-deadline", type=float, default=None,
                   help="a preemption: write the run's preempt file (HYPERTF_PREEMPT_FILE) "
                        "with this deadline (epoch seconds) before the SIGTERM")
    args = parser.parse_args(argv)
    if args.action == "preflight":
        print(json.dumps(preflight(args.workdir, args.script)))
    elif args.action == "start":
        return _start_verb(watch_after=args.watch)
    elif args.action == "watch":
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # launcher gone: just end
        tasks = {name: int(port) for name, port in (t.rsplit("=", 1) for t in args.tasks)}
        watch(RunDir(Path(args.run_dir)), tasks)
    else:
        run = RunDir(Path(args.run_dir))
        if args.preempt_deadline is not None:
            write_preempt_file(run, args.preempt_deadline)
        stopped = stop(run, args.names, args.grace)
        print(json.dumps(ended_answer(run, stopped, args.names).wire() if args.logs
                         else {name: str(result) for name, result in stopped.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
