"""What holding the keeper lease adds to a process: ``KeeperRole``, shared by an agent's
keeper and the keeper thread of benches and tests (hypertf.keeper.thread), and
``KeeperTerm``, an agent's terms of the lease.

``KeeperRole`` holds the watches that wake the keeper (every shard of the matrix, the
hosts and their records, every user's leases) and the ``Admitter`` with its caches. It is
started when the lease is taken and stopped when it is lost: its watches then end at their
next firing, and a later term starts from a fresh read. The records are kept by the
admitter's ``RecordCache``, the leases by its ``LeaseCache``: one persistent recursive
watch each, so no user's folder is listed again at each change (hypertf.keeper.leasecache).

``KeeperTerm`` is the agent's side: its loop takes the lease when it is free (only an
agent with the keeper's credential tries) and begins a term: a role, the thread its passes
run on (hypertf.keeper.passes.PassThread: never the agent's loop, so a slow or failing pass
delays no heartbeat and no drain report) and the prune thread (hypertf.keeper.prune). The
term ends when the lease is lost or the agent's session ends: its pass thread stops after
the pass in progress, then stops the role.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from hypertf import store
from hypertf.config.inventory import Inventory
from hypertf.core.admission import Decision
from hypertf.core.fairshare import DAY_S, DEFAULT_HALF_LIFE_DAYS
from hypertf.core.requestcheck import PortBounds
from hypertf.keeper.admitter import Admitter
from hypertf.keeper.hostwatch import HostWatch
from hypertf.keeper.passes import PassCounts, PassThread
from hypertf.keeper.preempter import PreemptSettings, preempt_settings
from hypertf.keeper.prune import PRUNE_AT, Pruner
from hypertf.keeper.statusview import StatusPublisher
from hypertf.store import LeaseState, Store

log = logging.getLogger(__name__)
QUIET_PASS_S = 30.0  # an agent's keeper passes at least this often, whatever woke it


class KeeperRole:
    """The keeper's watches and its ``Admitter``, for one term of the keeper lease.

    ``wake`` is called whenever the keeper should look again (a shard, a host or a lease
    changed); ``records_changed`` (the agent's) whenever an agent's record changed (it
    looks at its next interval, not at once). ``start()`` sets the watches; ``stop()``
    ends them (each at its next firing)."""

    def __init__(self, zk: Store, wake: Callable[[], object], user_gpu_limit: int = 0,
                 user_queue_limit: int = 0,
                 records_changed: Callable[[], object] | None = None,
                 host_gpus_max: int = 0, port_bounds: PortBounds | None = None,
                 half_life_s: float = DEFAULT_HALF_LIFE_DAYS * DAY_S,
                 preempt: PreemptSettings | None = None) -> None:
        self.store = zk
        self.admitter = Admitter(zk, user_gpu_limit, user_queue_limit, host_gpus_max,
                                 port_bounds, half_life_s,
                                 preempt=preempt or PreemptSettings())
        self.status_view = StatusPublisher(zk)
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
        self.store.matrix.watch(self._poke, self.admitter.shards)
        return self

    def keep(self) -> list[Decision]:
        """One pass: sync the matrix, admit or refuse waiting jobs (``Admitter.keep``), then
        publish what changed of the hosts for ``hypertf status`` (hypertf.keeper.statusview)."""
        decisions = self.admitter.keep()
        synced = self.admitter.last_synced
        if synced is not None:
            cache = self.admitter.cache
            self.status_view.publish(synced.matrix, synced.version, synced.records,
                                     cache.written, cache.unreadable, self._registered(),
                                     *cache.touched())
        return decisions

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


class KeeperTerm:
    """An agent's terms of the keeper lease. Only the hosts the admin names hold the
    keeper's credential (``keeper.yml``): elsewhere a stolen agent credential reports about
    its own host and decides nothing. ``step`` (the agent's loop, whenever it looks around)
    takes the lease when it is free, begins a term when it was taken (a role, its pass
    thread and its prune thread) and ends it when the lease is lost, and wakes the term's
    pass thread: the passes themselves never run on the agent's loop. ``end`` ends the term
    when the agent's session ends. ``counts``: every term's passes, for the agent's
    /metrics."""

    def __init__(self, inventory: Inventory, host: str, wake: Callable[..., object],
                 running: Callable[[], bool]) -> None:
        self.inventory = inventory
        self.host = host
        self.capable = host in inventory.keeper_hosts and (
            store.credentials_dir(inventory.cluster) / "keeper.yml").exists()
        self.interval = inventory.node(host).settings.agent_interval
        self.counts = PassCounts()
        self.role: KeeperRole | None = None
        self._passes: PassThread | None = None  # the term's passes
        self._wake = wake  # the agent's: the keeper lease's watch wakes its loop
        self._running = running  # False once the agent stops: the prune thread ends too
        self._pruner: tuple[KeeperRole, Pruner] | None = None  # the keeper's prune thread

    def step(self, zk: Store) -> None:
        """Hold a term while this agent holds the lease, and ask it for a pass (as often as
        the agent looks around: a watch of its own, its record changed, the quiet sweep).
        Only the keeper wakes when GPUs are freed and when a host comes or goes (10,000
        agents x 10,000 host watches would be 10^8 watches in ZooKeeper): its role's watches
        wake its pass thread; a changed record, at its next interval."""
        if not self.holds_lease(zk):
            self.end()
            return
        if self.role is None or self._passes is None or not self._passes.alive:
            self.end()  # a pass thread that ended by itself (it never should) is replaced
            self.role, self._passes = self._begin(zk)  # its first pass: at once
        else:
            self._passes.wake()
        self.prune(zk, self.role)

    def _begin(self, zk: Store) -> tuple[KeeperRole, PassThread]:
        """A new term: its role (watches, admitter) and the thread of its passes, the first
        at once. The role stops on that thread once its last pass is over."""
        cluster = self.inventory.cluster
        passes = PassThread(self.interval, max(self.interval, QUIET_PASS_S), self.counts)
        role = KeeperRole(zk, passes.wake, cluster.user_gpu_limit, cluster.user_queue_limit,
                          records_changed=passes.records_changed,
                          host_gpus_max=cluster.host_gpus_max,
                          port_bounds=PortBounds.of(
                              {name: node.settings.port_range
                               for name, node in self.inventory.nodes.items()}),
                          half_life_s=cluster.fairshare_half_life * DAY_S,
                          preempt=preempt_settings(cluster),
                          ).start()
        return role, passes.start(lambda: self.keep(role), on_end=role.stop)

    def end(self, wait: float | None = 0.0, finish: bool = False) -> None:
        """End the term: its pass thread stops after the pass in progress and then stops the
        role (its watches end at their next firing). ``wait``: how long to wait for that
        (the agent's session is closing); ``finish``: not before the term's first pass has
        run (``hypertf agent --once``)."""
        passes, self._passes, self.role = self._passes, None, None
        if passes is not None and not passes.stop(wait, finish) and wait != 0.0:
            log.warning("the keeper's pass did not end within %.0f s of its term; it ends "
                        "with its pass", wait or 0.0)

    def holds_lease(self, zk: Store) -> bool:
        """Whether this agent keeps the matrix (it takes the keeper lease when it is free;
        only an agent with the keeper's credential tries)."""
        if not self.capable:
            return False
        taken = zk.take_keeper_lease(self.host, watch=self._wake)
        if taken is LeaseState.TAKEN:
            log.info("this agent now keeps the matrix (keeper lease taken)")
        return taken in (LeaseState.TAKEN, LeaseState.HELD)

    def keep(self, role: KeeperRole) -> None:
        """The keeper's pass (on the term's pass thread): sync the matrix (and repair it),
        admit or refuse waiting jobs. A failure is the pass thread's to say and count."""
        for decision in role.keep():
            if decision.admitted:
                log.info("admitted %s: %s", decision.task_key,
                         ", ".join(f"{p.name}@{p.host}" for p in decision.placements))
            elif decision.refused:
                log.info("refused %s (--no-wait): %s", decision.task_key, decision.reason)

    def prune(self, zk: Store, role: KeeperRole) -> None:
        """The keeper's prune thread (hypertf.keeper.prune) runs while ``role``'s term
        lasts: started here, it ends by itself when the role stops or the agent does.
        Never in the agent's loop: 100,000 records read and deleted there held up every
        admission for 22-26 s each minute."""
        if self._pruner is not None:
            term, pruner = self._pruner
            if term is role and pruner.alive:
                return
            pruner.stop()  # an earlier term's
        cluster = self.inventory.cluster
        self._pruner = (role, Pruner(
            zk, cluster.job_retention_days * 86400, cluster.job_records_max,
            cluster.keeper_prune_interval,
            active=lambda: not role.stopped and self._running(),
            max_bytes=int((cluster.user_records_mb << 20) * PRUNE_AT)).start())
