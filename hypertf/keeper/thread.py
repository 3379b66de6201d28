"""The keeper's pass (``Admitter.keep``) in a thread, for a process that is no agent.

An agent's keeper runs the pass in its service loop (hypertf.node.agent, through
hypertf.keeper.role.KeeperTerm). Benches and tests whose hosts are records they publish
themselves have no agent process, so nothing would admit their jobs: this runs the same
pass, as the admin, waking on the changes an agent's keeper watches (every user's leases,
the records, the matrix) and every 0.2 s besides. Only one keeper should run per root: the
cluster's agents take the keeper lease, this does not.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from hypertf import store
from hypertf.config.settings import ClusterSettings
from hypertf.core import gctune
from hypertf.core.fairshare import DAY_S
from hypertf.keeper.preempter import preempt_settings
from hypertf.keeper.role import KeeperRole
from hypertf.store import Layout, Store

log = logging.getLogger(__name__)


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
                               host_gpus_max=cluster.host_gpus_max,
                               half_life_s=cluster.fairshare_half_life * DAY_S,
                               preempt=preempt_settings(cluster))
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
    """``python -m hypertf.keeper.thread ZK_HOSTS ROOT [SESSION_TIMEOUT]``: a keeper process until
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
