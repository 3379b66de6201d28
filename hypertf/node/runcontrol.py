"""The runs on this node, as the agent and the ``tasknode`` verbs act on them: which
process is a run's task, stopping and draining a run, reaping runs whose launcher died, and
what a run's end answers.

A task is believed only as far as the node can prove it (``wrapper``): its pid file names
a live process group leader running our wrapper (``task.sh``) for this run, with the start
time recorded beside the PID (a recycled PID has another), owned by the run directory's
owner, who on a per-user node must be the job owner's account (hypertf.node.taskaccount);
a bare number in a file proves nothing. ``stop`` marks a run drained (a task still starting
then never runs), TERMs each task's process group and the job's cgroups, and KILLs what is
left after the grace. The agent ``drain``s the runs of jobs whose GPUs it frees and
``reap``s those whose lease is gone; ``tasknode stop`` and ``start --watch`` end runs with
the same calls (hypertf.node.tasknode).

Standard library only (and hypertf.node.procs, imported where a stop needs it): every
``tasknode start --watch`` imports this module, on every node of every job.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path, PurePath
from typing import Any

from hypertf.core import offloadname
from hypertf.core.protocol import RunEnd, StopResult
from hypertf.core.rundir import RunDir, read_pid_record
from hypertf.node import confine, taskaccount

WRAPPER = "task.sh"  # the wrapper every task runs under (beside this module)
KEY_ENV = "HYPERTF_TASK_KEY"  # the job's task key, in every task's environment
INLINE_LOGS_MAX = 1 << 20  # stop --logs: logs up to this many bytes ride on the answer


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


def uid_of(path: str | PurePath) -> int | None:
    """The owner of ``path`` (a run directory, ``/proc/PID``); None when it is gone."""
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


def proves(run: RunDir, name: str, pid: int, start: int) -> bool:
    """``pid`` lives (not a zombie), leads its own process group, started at ``start``,
    runs our wrapper for this run's ``name`` and is the run directory's owner's. The start
    time is read again after the command line: a PID recycled in between fails it."""
    stat = _proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X") or stat[1] != pid or stat[2] != start:
        return False
    if not _runs_wrapper_for(pid, run, name):
        return False
    owner = uid_of(run.path)
    if owner is None or uid_of(f"/proc/{pid}") != owner:
        return False
    expected = taskaccount.expected_uid(workdir_of(run), run.task_key)  # per-user nodes
    if expected is not None and owner != expected:
        return False  # a run directory another account made under this job's name
    again = _proc_stat(pid)  # the same process still: its group and start time (its state,
    return again is not None and again[1:] == stat[1:]  # running or sleeping, may change)


def wrapper(run: RunDir, name: str) -> int | None:
    """The PID (= process group) of task ``name``'s wrapper if the node can prove it is this
    run's and alive now (``proves``); None otherwise: the task counts as dead for the run,
    and processes claiming it are not believed. A recycled PID has another start time, a
    forged record names no wrapper of this run, a bare PID is no record."""
    record = _record(run, name)
    return record[0] if record and proves(run, name, *record) else None


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
        return pid if proves(run, name, pid, start) else None
    if stat is not None and (stat[2] != start or stat[1] != pid):
        return None
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # another user's group: its members are checked below (and are not ours)
    from hypertf.node import procs

    owner = uid_of(run.path)
    for member in procs.group_members(pid):
        found = _proc_stat(member)
        if (found and found[2] >= start and uid_of(f"/proc/{member}") == owner
                and procs.environ_value(member, KEY_ENV) == run.task_key):
            return pid
    return None


def task_pid(run: RunDir, name: str) -> int | None:
    """The PID task ``name``'s record names, proven or not (None: no record yet)."""
    record = _record(run, name)
    return record[0] if record else None


def workdir_of(run: RunDir) -> Path:
    """The node's workdir (``<workdir>/runs/<task key>``), where the agent's cgroups.json is."""
    return run.local.parent.parent


def _cgroups(run: RunDir) -> list[Path]:
    """The run's job cgroups on this node, as the agent's cgroups.json names them."""
    return confine.read_state(workdir_of(run)).job_dirs(run.task_key)


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
