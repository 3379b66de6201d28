"""Local processes we started, tracked and stopped by PID (never by name)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping

import psutil


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie waiting to be reaped counts as dead (the one
    answer every part of HyperTF uses, also for a process of another user)."""
    try:
        status: str = psutil.Process(pid).status()  # psutil carries no types
        zombie: str = psutil.STATUS_ZOMBIE
        return status != zombie
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def cmdline_args(pid: int) -> list[str]:
    """The process's arguments ([] if gone or not ours to read)."""
    try:
        args: list[str] = psutil.Process(pid).cmdline()
        return args
    except psutil.Error:
        return []


def cmdline(pid: int) -> str:
    """The process's command line ('' if gone): used to check a pidfile still names ours."""
    return " ".join(cmdline_args(pid))


def environ_value(pid: int, name: str) -> str | None:
    """One variable of a process's environment; None when unset, gone or not ours to read."""
    try:
        environ: dict[str, str] = psutil.Process(pid).environ()
        return environ.get(name)
    except psutil.Error:
        return None


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    return [proc.pid for proc in group_processes(pgid)]


def group_processes(pgid: int) -> list[psutil.Process]:
    """The live (non-zombie) processes of a process group, as psutil handles."""
    members = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):  # gone meanwhile
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                members.append(proc)
    return members


WAIT_SLICE_S = 0.25  # how late a member that died unreaped (a zombie) is noticed


def wait_groups(groups: Mapping[str, int], timeout: float) -> dict[str, int]:
    """The groups (name -> PGID) with a live process left after at most ``timeout``: one
    psutil.wait_procs over all their members, woken as each ends. psutil counts a process
    that is not our child as running until its parent reaps it, so a zombie counts as gone
    here, noticed within a slice of the wait; a process forked into a group meanwhile is
    found by the next look at the group."""
    deadline = time.monotonic() + timeout
    left = dict(groups)
    while True:
        members = {name: group_processes(pgid) for name, pgid in left.items()}
        left = {name: left[name] for name, found in members.items() if found}
        remaining = deadline - time.monotonic()
        if not left or remaining <= 0:
            return left
        psutil.wait_procs([proc for found in members.values() for proc in found],
                          timeout=min(remaining, WAIT_SLICE_S))


def stop_groups(groups: Mapping[str, int], grace_s: float,
                kill_wait_s: float = 5.0) -> dict[str, str]:
    """TERM each process group (name -> PGID), KILL those with a process left after
    ``grace_s``; per name 'stopped', 'killed', or 'survived SIGKILL' (a process still there
    ``kill_wait_s`` after the KILL, e.g. in uninterruptible sleep)."""
    for pgid in groups.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    stubborn = wait_groups(groups, grace_s)
    for pgid in stubborn.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    survivors = wait_groups(stubborn, kill_wait_s)
    return {name: "survived SIGKILL" if name in survivors else
            "killed" if name in stubborn else "stopped" for name in groups}


def reap(pid: int) -> None:
    """Collect our own child's exit status so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop(pid: int, grace_s: float = 10.0, group: bool = False) -> bool:
    """SIGTERM, then SIGKILL after ``grace_s``; True if it was running."""
    if not alive(pid):
        reap(pid)
        return False
    send = os.killpg if group else os.kill
    with contextlib.suppress(ProcessLookupError):
        send(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        reap(pid)
        if not alive(pid):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        send(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        reap(pid)
        time.sleep(0.02)
    return True
