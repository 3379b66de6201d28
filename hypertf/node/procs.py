"""Local processes we started, tracked and stopped by PID (never by name)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie waiting to be reaped counts as dead (the one
    answer every part of HyperTF uses, also for a process of another user)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def cmdline_args(pid: int) -> list[str]:
    """The process's arguments ([] if gone or not ours to read)."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def cmdline(pid: int) -> str:
    """The process's command line ('' if gone): used to check a pidfile still names ours."""
    return " ".join(cmdline_args(pid))


def environ_value(pid: int, name: str) -> str | None:
    """One variable of a process's environment; None when unset, gone or not ours to read."""
    try:
        return psutil.Process(pid).environ().get(name)
    except psutil.Error:
        return None


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    members = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):  # gone meanwhile
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
    return members


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
