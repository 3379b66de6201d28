"""Node-to-node SSH for an offload world (node side): the cluster-internal key and the
known_hosts the nodes share, where ``cluster.setup`` put them on this node, and what to tell
the user when they are missing or another node refuses them.

The launcher names the two files by the inventory's settings (``hypertf_offload_key``,
``hypertf_offload_known_hosts``); "~" in them is this node's login home, read from $HOME
(ssh itself would take the password database's home, which a node's session may not use).
A world that cannot start for want of that trust says so in one line naming the setting
and the command that gives it, instead of hydra's and ssh's many.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
from dataclasses import dataclass

from hypertf.offload.taskspec import Spec
from hypertf.offload.world import World

FIX = "set hypertf_offload: true for every node of the job and run invoke cluster.setup"

# What ssh and the offload gate print when the trust is missing (MPICH 4.0.2's hydra passes
# ssh's stderr through): the peer is named where ssh names it.
_DENIED = re.compile(r"(?:(?P<user>[^\s@]+)@)?(?P<host>[^\s:]+): Permission denied")
_HOST_KEY = re.compile(r"No \S+ host key is known for (?P<host>\S+)|"
                       r"Host key for (?P<changed>\S+) has changed|"
                       r"Host key verification failed")
_GATE = "hypertf offload gate: refused"


def node_path(path: str) -> str:
    """``path`` with a leading "~" made this node's home ($HOME)."""
    return os.path.expanduser(path)


def local_problem(spec: Spec) -> str | None:
    """Why this node cannot reach offload hosts at all (no key, no shared known_hosts)."""
    wanted = [("cluster-internal SSH key", spec.key_file), ("offload known_hosts",
                                                            spec.known_hosts)]
    for what, path in wanted:
        if path and not os.access(node_path(path), os.R_OK):
            return f"this node has no {what} ({node_path(path)}): {FIX}"
    return None


def explain(known_hosts: str, output: str) -> str | None:
    """One line for a world that failed at start for want of node-to-node trust, found in
    its output (hydra's, with ssh's errors in it), or None for any other failure."""
    for line in output.splitlines():
        denied = _DENIED.search(line)
        if denied:
            return (f"offload host {denied.group('host')} refused this node's "
                    f"cluster-internal SSH key: {FIX}")
        key = _HOST_KEY.search(line)
        if key:
            host = key.group("host") or key.group("changed")
            where = f"the host key of {host}" if host else "an offload host's host key"
            return (f"{where} is not pinned in {node_path(known_hosts)} (or it changed): "
                    f"{FIX}")
        if _GATE in line:
            return (f"an offload host's gate refused the command ({line.strip()[:160]}): "
                    f"{FIX}")
    return None


@dataclass
class TrustedWorld(World):
    """A world across hosts whose failure at start, when it comes from missing node-to-node
    trust, is told in one line (``explain``) instead of hydra's output."""

    known_hosts: str = "~/.ssh/known_hosts"  # the shared known_hosts (the launcher's setting)

    def start(self, timeout: float = 30.0, python: str = sys.executable) -> World:
        # Hydra waits for a proxy whose ssh failed until the start times out: its output is
        # watched, and the world ended at the first sign of missing trust.
        done = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(done,), daemon=True)
        watcher.start()
        try:
            return super().start(timeout, python)
        except RuntimeError as err:
            line = explain(self.known_hosts, self.output())
            if line:
                raise RuntimeError(line) from err
            raise
        finally:
            done.set()
            watcher.join()

    def _watch(self, done: threading.Event, poll_s: float = 0.1) -> None:
        while not done.wait(poll_s):
            proc = self.proc
            if proc is not None and proc.poll() is None and explain(self.known_hosts,
                                                                    self.output()):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                return
