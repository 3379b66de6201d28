"""``python -m hypertf.node.tasknode VERB``: the node's side of the protocol, the one command
every launcher runs on each node over SSH (hypertf.launch.nodeclient), so it stays
wire-compatible across node upgrades (hypertf.core.protocol: the node names its protocol
version in its preflight's answer).

- ``preflight``: can this node run the job (its venv, its workdir, the script and what it
  reads)?
- ``start [--watch]``: the tasks to start as a JSON line on stdin (no command-line limit,
  no shell), then the ``--sync`` archive if any (upload and start: one round trip).
  Refuses when a granted port is already taken, a run directory that is not the job's or
  already has tasks, and on a per-user node any account but the job owner's (never root's
  unless the admin allows it); starts each task in its own session under ``task.sh``,
  everything private to the job's user (0700/0600). ``--watch`` then streams the run's
  events (hypertf.node.taskwatch).
- ``watch RUN NAME=PORT...``: the events alone.
- ``stop RUN [NAME...]``: TERM each task's process group, KILL after the grace
  (MultiWorkerMirroredStrategy catches TERM); ``--logs`` answers the logs and metrics too.

Which process is a run's task, and how a run is stopped, is hypertf.node.runcontrol's (the
agent's reap and drain use it too).

Import budget: ``start`` is on every job's critical path (one Python start per host), so
importing this module loads the standard library's light modules and the HyperTF modules
of ``IMPORT_BUDGET``, nothing else: never a module of ``NOT_IMPORTED`` (what only other
verbs need: psutil through procs, tarfile, logging, argparse, diagnose; dataclasses, which
imports inspect), nor a package outside the standard library. Those are imported where
they are used. tests/unit/test_protocol.py checks an import against these two lists.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hypertf.core import protocol as wire
from hypertf.core.errors import HyperTFError, NotAllowed
from hypertf.core.protocol import StartAnswer, StartRequest
from hypertf.core.rundir import RunDir
from hypertf.node import confine, runcontrol, taskaccount, taskwatch

# The HyperTF modules an import of this module may load (its own, the packages, and what
# they import in turn); see the module's "Import budget".
IMPORT_BUDGET = frozenset({
    "hypertf", "hypertf.core", "hypertf.node",
    "hypertf.core.accounts", "hypertf.core.errors", "hypertf.core.offloadname",
    "hypertf.core.protocol", "hypertf.core.rundir", "hypertf.core.taskkey",
    "hypertf.node.confine", "hypertf.node.runcontrol", "hypertf.node.taskaccount",
    "hypertf.node.tasknode", "hypertf.node.taskwatch",
})
# Modules an import of this module must not load: only other verbs need them (each is
# imported in the function that uses it), or they cost every start for nothing.
NOT_IMPORTED = frozenset({
    "argparse", "dataclasses", "inspect", "logging", "psutil", "tarfile",
    "hypertf.core.diagnose", "hypertf.node.procs",
})

PRIVATE = 0o077  # the umask of what a start makes: its user's alone


def wrapper_path() -> str:
    """The wrapper every task runs under (``task.sh``, beside this module)."""
    return str(Path(__file__).with_name(runcontrol.WRAPPER))


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
    busy = tuple(sorted(task.port for task in tasks if taskwatch.port_listening(task.port)))
    if busy:
        return StartAnswer(busy=busy)
    run = RunDir(Path(request.run_dir))
    refused = taskaccount.start_problem(runcontrol.workdir_of(run), run.task_key)
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
    state = confine.read_state(runcontrol.workdir_of(run))
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


def _claim(run: RunDir, tasks: Sequence[Any]) -> None:
    """Take ``run``'s directory for this start, made 0700, or refuse (NotAllowed): a task
    of another job (its HYPERTF_TASK_KEY is not the directory's name), a directory that
    is a link, another user's, has tasks already or was taken by another start. The
    'started' mark is made with O_EXCL: of two starts into one run, one wins."""
    path = run.local
    other = sorted({task.env.get(runcontrol.KEY_ENV) for task in tasks} - {None, run.task_key})
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
        if runcontrol.uid_of(path) != os.geteuid():
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
    taskwatch.emit(answer)
    if watch_after and not (answer.busy or answer.problems):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # launcher gone: just end
        taskwatch.watch(RunDir(Path(request.run_dir)), {t.name: t.port for t in request.tasks},
                        end=True)
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
        taskwatch.watch(RunDir(Path(args.run_dir)), tasks)
    else:
        run = RunDir(Path(args.run_dir))
        if args.preempt_deadline is not None:
            write_preempt_file(run, args.preempt_deadline)
        stopped = runcontrol.stop(run, args.names, args.grace)
        print(json.dumps(runcontrol.ended_answer(run, stopped, args.names).wire() if args.logs
                         else {name: str(result) for name, result in stopped.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
