"""Start and stop agents on nodes that have no service manager (these machines, the lab).

On the node, ``hypertf agent-ctl start`` runs the agent as a supervised background process
in its own session with a pidfile in the work dir; ``stop`` ends it by that PID (after
checking the PID is still an agent). From the operator's machine, ``start_agents`` and
``stop_agents`` run those commands on many nodes at once over SSH. Real servers use the
systemd unit that the Ansible role installs instead.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from hypertf.config.inventory import Inventory, Node
from hypertf.core.errors import HyperTFError
from hypertf.launch.remote import Cluster, Result, Session, command_line
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


def _ctl(node: Node, action: str, inventory_path: Path) -> str:
    return command_line(
        [f"{node.settings.venv}/bin/hypertf", "agent-ctl", action,
         "--inventory", str(inventory_path.resolve()), "--host", node.name]
    )


def _run_everywhere(inventory: Inventory, names: Iterable[str] | None, action: str,
                    ) -> dict[str, Result]:
    chosen = list(inventory.nodes if names is None else names)
    nodes = [inventory.node(name) for name in chosen]
    with Cluster(nodes, inventory.cluster) as cluster:
        results = cluster.each(
            lambda s: _run(s, action, inventory.path), names=[n.name for n in nodes]
        )
    results.raise_failed(f"agent {action}", noun="node")
    return results.succeeded


def _run(session: Session, action: str, inventory_path: Path) -> Result:
    return session.run(_ctl(session.node, action, inventory_path), timeout=60)


def start_agents(inventory: Inventory, names: Iterable[str] | None = None) -> dict[str, Result]:
    """Start the agent on each node (all GPU nodes by default), in parallel over SSH."""
    return _run_everywhere(inventory, names, "start")


def stop_agents(inventory: Inventory, names: Iterable[str] | None = None) -> dict[str, Result]:
    return _run_everywhere(inventory, names, "stop")
