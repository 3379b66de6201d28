"""``KeeperThread``: the keeper's pass (``KeeperRole.keep``) on a thread, for a process that is
no agent.

An agent's keeper runs its passes on a thread of its own while it holds the keeper lease
(hypertf.keeper.role.KeeperTerm, on a hypertf.keeper.passes.PassThread). Benches and tests
whose hosts are records they publish themselves have no agent process, so nothing would
admit their jobs: this runs the same pass on the same kind of thread, as the admin, waking
on the changes an agent's keeper watches (every user's leases, the records, the matrix)
and every 0.2 s besides. Only one keeper should run per root: the cluster's agents take
the keeper lease, this does not.
"""

from __future__ import annotations

import contextlib
import threading

from hypertf import store
from hypertf.config.settings import ClusterSettings
from hypertf.core import gctune
from hypertf.core.fairshare import DAY_S
from hypertf.keeper.passes import END_WAIT_S, PassThread
from hypertf.keeper.preempter import preempt_settings
from hypertf.keeper.role import KeeperRole
from hypertf.store import Layout, Store


class KeeperThread:
    """Start with ``start()``; ``stop()`` ends the thread and closes its session."""

    def __init__(self, cluster: ClusterSettings, user_gpu_limit: int = 0,
                 identity: str = "admin", user_queue_limit: int = 200) -> None:
        self.client = store.connect(cluster, identity=identity)
        self.layout = Layout(cluster.zk_root)
        self._passes = PassThread(interval=0.2, quiet=0.2)
        self.role = KeeperRole(Store(self.client, self.layout), self._passes.wake,
                               user_gpu_limit, user_queue_limit,
                               host_gpus_max=cluster.host_gpus_max,
                               half_life_s=cluster.fairshare_half_life * DAY_S,
                               preempt=preempt_settings(cluster))
        self.admitter = self.role.admitter

    @property
    def passes(self) -> int:
        """The passes that went through so far."""
        return self._passes.counts.passes

    @property
    def failures(self) -> int:
        """The passes that failed so far (each logged with its cause)."""
        return self._passes.counts.failures

    def start(self) -> KeeperThread:
        self.role.start()
        # the role's keep looked up at each pass: a bench may wrap it (a profiler)
        self._passes.start(lambda: self.role.keep())
        return self

    def stop(self) -> None:
        self.role.stop()
        self._passes.stop(wait=END_WAIT_S)
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
