"""The job's SSH sessions: one per host it touches, kept from its first use (an early
connect, preflight) to the job's end, so a host's handshake is paid once per job.

Only the launcher's main thread adds sessions; a round in another thread (the preflight
while the job waits) is handed a ``Cluster`` of its own over the sessions it needs. The
sessions themselves may be shared: each opens its connection under its own lock
(hypertf.launch.remote.Session).
"""

from __future__ import annotations

from collections.abc import Iterable

from hypertf.config.inventory import Inventory
from hypertf.launch.login import as_job_owner
from hypertf.launch.nodeclient import NodeClient
from hypertf.launch.remote import Cluster, Session

__all__ = ["Sessions"]


class Sessions:
    """The job's ``Cluster``, grown host by host, and which hosts are being connected early.
    Its sessions log in as the job owner's account (hypertf.launch.login)."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = as_job_owner(inventory)
        self.cluster = Cluster([], inventory.cluster)
        self._connecting: set[str] = set()  # hosts whose connection is being made early

    def of(self, hosts: Iterable[str]) -> Cluster:
        """The job's cluster, with a session for each of ``hosts`` (made now if need be)."""
        for host in hosts:
            self.cluster.sessions.setdefault(
                host, Session(self.inventory.node(host), self.inventory.cluster))
        return self.cluster

    def apart(self, hosts: list[str]) -> Cluster:
        """A cluster over the sessions of ``hosts`` only, for another thread: the same
        sessions in a table of its own, which the main thread does not grow."""
        sessions = self.of(hosts).sessions
        cluster = Cluster([], self.inventory.cluster)
        cluster.sessions = {host: sessions[host] for host in hosts}
        return cluster

    def connect_soon(self, hosts: Iterable[str]) -> None:
        """Open the SSH connections to ``hosts`` in the background, and start each node's
        ``tasknode start --watch`` there, waiting for its request: the handshakes and the
        nodes' Python starts overlap ZooKeeper, the dry run and the admission instead of
        opening the start round."""
        todo = [host for host in hosts if host not in self._connecting]
        cluster = self.of(todo)
        for host in todo:
            self._connecting.add(host)
            session = cluster.sessions[host]
            session.open_soon(NodeClient(session).start_command())

    def close(self) -> None:
        self.cluster.close()
