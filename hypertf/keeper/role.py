"""The keeper's pass (``Admitter.keep``) in a thread, for a process that is no agent.

An agent's keeper runs the pass in its service loop (hypertf.node.agent). Benches and tests whose
hosts are records they publish themselves have no agent process, so nothing would admit
their jobs: this runs the same pass, as the admin, waking on the changes an agent's keeper
watches (every user's leases, the records, the matrix) and every 0.2 s besides. Only one
keeper should run per root: the cluster's agents take the keeper lease, this does not.

``KeeperRole`` is what holding the keeper lease adds to a process, shared by an agent's
keeper and this thread: the watches that wake the keeper (every shard of the matrix, the
hosts and their records, every user's leases) and the ``Admitter`` with its caches. It is
started when the lease is taken and stopped when it is lost: its watches then end at their
next firing, and a later term starts from a fresh read. The records are kept by the
admitter's ``RecordCache``, the leases by its ``LeaseCache``: one persistent recursive
watch each, so no user's folder is listed again at each change (hypertf.store.leasecache).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from hypertf import store
from hypertf.config.settings import ClusterSettings
from hypertf.core import gctune
from hypertf.core.admission import Decision
from hypertf.core.requestcheck import PortBounds
from hypertf.store import HostWatch, Layout, Store
from hypertf.store.allocation import watch_matrix
from hypertf.store.waitqueue import Admitter

log = logging.getLogger(__name__)


class KeeperRole:
    """The keeper's watches and its ``Admitter``, for one term of the keeper lease.

    ``wake`` is called whenever the keeper should look again (a shard, a host or a lease
    changed); ``records_changed`` (the agent's) whenever an agent's record changed (it
    looks at its next interval, not at once). ``start()`` sets the watches; ``stop()``
    ends them (each at its next firing)."""

    def __init__(self, zk: Store, wake: Callable[[], object], user_gpu_limit: int = 0,
                 user_queue_limit: int = 0,
                 records_changed: Callable[[], object] | None = None,
                 host_gpus_max: int = 0, port_bounds: PortBounds | None = None) -> None:
        self.store = zk
        self.admitter = Admitter(zk, user_gpu_limit, user_queue_limit, host_gpus_max,
                                 port_bounds)
        self._wake = wake
        self._records_changed = records_changed
        self._hosts: HostWatch | None = None
        self.stopped = False

    def start(self) -> KeeperRole:
        client, layout = self.store.client, self.store.layout
        self.admitter.leases.changed = self._poke  # a lease came or went: look again
        self.admitter.leases.follow()
        self.admitter.cache.changed = self._on_record
        self._hosts = HostWatch(client, layout, self._poke, follow=self.admitter.cache.follow)
        self.admitter.hosts = self._registered
        watch_matrix(self.store, self._poke)
        return self

    def keep(self) -> list[Decision]:
        """One pass: sync the matrix, admit or refuse waiting jobs (``Admitter.keep``)."""
        return self.admitter.keep()

    def stop(self) -> None:
        self.stopped = True
        if self._hosts is not None:
            self._hosts.stop()
        self.admitter.cache.forget()
        self.admitter.leases.forget()

    def _registered(self) -> list[str]:
        """The registered hosts as the watch saw them last (listed when it has not yet)."""
        seen = self._hosts.hosts if self._hosts is not None else None
        return seen if seen is not None else self.store.hosts()

    def _poke(self, *_: object) -> bool:
        """A watch fired: wake the keeper; False (the watch ends) once stopped."""
        if self.stopped:
            return False
        self._wake()
        return True

    def _on_record(self, presence: bool) -> None:
        """A record came or went (wake the keeper), or changed (the agent's keeper looks at
        its next interval; this thread at its next 0.2 s turn). Called from kazoo's
        connection thread: only takes note."""
        if self.stopped:
            return
        if presence:
            self._wake()
        elif self._records_changed is not None:
            self._records_changed()


class KeeperThread:
    """Start with ``start()``; ``stop()`` ends the thread and closes its session."""

    def __init__(self, cluster: ClusterSettings, user_gpu_limit: int = 0,
                 identity: str = "admin", user_queue_limit: int = 200) -> None:
        self.client = store.connect(cluster, identity=identity)
        self.layout = Layout(cluster.zk_root)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.role = KeeperRole(Store(self.client, self.layout), self._wake.set,
                               user_gpu_limit, user_queue_limit,
                               host_gpus_max=cluster.host_gpus_max)
        self.admitter = self.role.admitter
        self._thread = threading.Thread(target=self._run, daemon=True, name="keeper")
        self.passes = 0

    def start(self) -> KeeperThread:
        self.role.start()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.2)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.role.keep()
                self.passes += 1
            except Exception as err:  # the next pass tries again, as an agent's keeper does
                log.warning("keeper pass failed: %s", err)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.role.stop()
        self._thread.join(10)
        with contextlib.suppress(Exception):
            store.close(self.client)


def main(argv: list[str] | None = None) -> int:
    """``python -m hypertf.store.keeper ZK_HOSTS ROOT [SESSION_TIMEOUT]``: a keeper process until
    killed (benches and the failover test SIGKILL it)."""
    import signal
    import sys

    gctune.tune()
    args = sys.argv[1:] if argv is None else argv
    cluster = ClusterSettings("gpu_nodes", args[0], args[1],
                              float(args[2]) if len(args) > 2 else 10.0, "/nonexistent", 5.0)
    thread = KeeperThread(cluster).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("keeping", flush=True)
    stop.wait()
    thread.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
