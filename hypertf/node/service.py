"""The agent as a supervised background process, on nodes without a service manager
(containers, the lab): ``hypertf agent-ctl start|stop|status`` runs these on the node itself.

It starts the agent in its own session with a pidfile in the work dir, and stops it by that
PID after checking the PID is still an agent. Real servers use the systemd unit that the
Ansible role installs instead.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from hypertf.core.errors import HyperTFError
from hypertf.node import procs


def pidfile(workdir: str) -> Path:
    return Path(workdir) / "agent.pid"


def running_pid(workdir: str) -> int | None:
    """The agent's PID if the pidfile names a live agent (not a reused PID)."""
    try:
        pid = int(pidfile(workdir).read_text())
    except (OSError, ValueError):
        return None
    if procs.alive(pid) and "hypertf" in procs.cmdline(pid) and " agent" in procs.cmdline(pid):
        return pid
    return None


def local_start(inventory_path: str, host: str, workdir: str) -> tuple[int, bool]:
    """Start this node's agent in the background; (pid, True if it was started now)."""
    pid = running_pid(workdir)
    if pid:
        return pid, False
    Path(workdir).mkdir(parents=True, exist_ok=True)
    log = open(Path(workdir) / "agent.log", "ab")  # noqa: SIM115 - handed to the child
    with log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hypertf.cli", "agent", "--inventory",
             str(Path(inventory_path).resolve()), "--host", host],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=workdir,
        )
    pidfile(workdir).write_text(str(proc.pid))
    time.sleep(0.3)
    if proc.poll() is not None:
        tail = (Path(workdir) / "agent.log").read_text(errors="replace").splitlines()[-3:]
        raise HyperTFError(f"agent for {host} exited at start: " + " | ".join(tail))
    return proc.pid, True


def local_stop(workdir: str, grace_s: float = 10.0) -> bool:
    """Stop this node's agent by its pidfile; True if one was running."""
    pid = running_pid(workdir)
    stopped = procs.stop(pid, grace_s) if pid else False
    pidfile(workdir).unlink(missing_ok=True)
    return stopped
