"""The resource agent: probes its node and keeps an ephemeral record in ZooKeeper.

It probes the node every ``hypertf_agent_interval`` seconds and writes its record only when
something in it changed, or after a keep-alive (30 quiet intervals, at most 60 s, less up
to a random quarter: ``WritePolicy``; the ephemeral znode already says "alive", and
10,000 idle agents need not write every second; its ``heartbeat`` is the time of the
last write), re-registers after a lost
session (a ZooKeeper restart, a long network cut), and deletes the record on SIGTERM.

An agent *reports* about its own host and decides nothing: its record also names the ended
jobs it has seen dead here (``drained``) and the processes on its GPUs their job was not
granted (``trespasses``, stopped under ``hypertf_gpu_enforce: stop``). On the keeper hosts
(``hypertf_keeper_hosts``, the only ones with ``keeper.yml``) the agent holding the keeper
lease (``keeper/lease``) is the *matrix keeper*: it brings the stored matrix in line with
the records, reports and leases, so a dead agent's row turns unavailable and a dead
launcher's GPUs return to the pool without anyone running a command, and it admits waiting
jobs from the queue whenever GPUs or the queue change (hypertf.keeper: ``KeeperTerm``).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from hypertf import store
from hypertf.config.inventory import Inventory, Node
from hypertf.config.settings import GpuSourceKind
from hypertf.core.errors import HyperTFError, StoreError
from hypertf.keeper.passes import END_WAIT_S
from hypertf.keeper.role import KeeperTerm
from hypertf.node import confine, taskaccount
from hypertf.node.hostreport import HostReport
from hypertf.node.metrics import AgentCollector, MetricsServer
from hypertf.node.probes import (
    GpuSource,
    NoGpuSource,
    NvmlGpuSource,
    StaticGpuSource,
    free_port,
    ipv4_addresses,
    judge,
    select_address,
)
from hypertf.store import AgentRecord, Layout, RecordWrite, Store

KEEPALIVE_S = 60.0  # an unchanged record is written again after this long (at most)
KEEPALIVE_BEATS = 30  # ... or after this many quiet intervals, if that is sooner
CONNECT_RETRY_S = 2.0  # a new client's next try when ZooKeeper cannot take the agent
QUIET_SWEEP_S = 30.0  # a look around nothing woke reads ZooKeeper (reap, drain) this seldom
ADDRESSES_EVERY_S = 10.0  # the NIC addresses are read again this often (and when reconnected)

log = logging.getLogger(__name__)


def gpu_source(node: Node) -> GpuSource:
    """The node's GPU source as the inventory chooses it."""
    if node.settings.gpu_source == GpuSourceKind.STATIC:
        return StaticGpuSource(node.name, node.settings.static_gpus)
    if node.settings.gpu_source == GpuSourceKind.NONE:
        return NoGpuSource()
    return NvmlGpuSource()


class Prober:
    """Builds the node's record; the port stays the same while it is free.

    Work proportional to change: an idle node's probe reads its GPUs and checks its port,
    and gives back the last record itself when nothing changed, so the agent serialises and
    compares only what did. The NIC addresses (a netifaces walk of every interface) are read
    again every ``ADDRESSES_EVERY_S`` and for a new session; a GPU with a process on it is
    always judged afresh (its process's job is read from /proc)."""

    def __init__(self, node: Node, source: GpuSource) -> None:
        self.node = node
        self.source = source
        self._port: int | None = None
        self._addresses: dict[str, list[str]] = {}
        self._addresses_due = 0.0
        self._last: tuple[object, AgentRecord] | None = None
        self.cgroups = confine.NodeCgroups()  # what the node enforces (the agent sets it)
        self.minors: dict[int, int] = {}  # GPU index -> /dev/nvidia<minor>, as last read

    def _port_still_free(self) -> int:
        if self._port is not None:
            try:
                return free_port((self._port, self._port), tries=1)
            except HyperTFError:
                pass
        self._port = free_port(self.node.settings.port_range)
        return self._port

    def _addresses_now(self, fresh: bool) -> dict[str, list[str]]:
        now = time.monotonic()
        if fresh or now >= self._addresses_due:
            self._addresses = ipv4_addresses()
            self._addresses_due = now + ADDRESSES_EVERY_S
        return self._addresses

    def probe(self, fresh: bool = False) -> AgentRecord:
        """The node's record now (the last one itself when nothing in it changed);
        ``fresh`` reads the NICs again too."""
        settings = self.node.settings
        addresses = self._addresses_now(fresh)
        readings = self.source.read()
        port = self._port_still_free()
        key = (readings, addresses, port)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        gpus = judge(readings, settings.gpu_util_max, settings.gpu_mem_max)
        self.minors = {r.index: r.minor if r.minor >= 0 else r.index for r in readings}
        if self.cgroups.required and self.cgroups.mode is not confine.Mode.DEVICES:
            why = (f"not confined ({self.cgroups.label}) and hypertf_gpu_confine is "
                   f"required")
            gpus = [replace(g, available=False, reason=why) for g in gpus]
        record = AgentRecord(
            host=self.node.name,
            mgmt_addr=select_address(settings.mgmt_network, addresses, self.node.address),
            data_addr=select_address(settings.data_network, addresses, self.node.address),
            port=port,
            gpu=len(gpus),
            gpu_avail_list=[g.index for g in gpus if g.available],
            gpus=gpus,
            gpu_source=self.source.name,
            gpu_driver=self.source.versions(),
            heartbeat=time.time(),
            pid=os.getpid(),
            hostname=socket.gethostname(),
            confine=self.cgroups.label,
        )
        # a process's job comes from /proc, not from the readings: judged again each time
        self._last = None if any(r.processes for r in readings) else (key, record)
        return record


@dataclass
class WritePolicy:
    """When an agent writes its record: when it changed (the heartbeat aside), else when
    its keep-alive is due (30 intervals, at most 60 s), drawn between 75% and 100% of that
    at each write, so 10,000 agents started together spread their keep-alives over the
    period instead of writing in the same second. Benches' simulated agents use it too."""

    interval: float
    written: bytes = b""  # the record as last written, heartbeat zeroed
    due_at: float = 0.0  # monotonic time of the next keep-alive
    rng: random.Random = field(default_factory=random.Random)

    @property
    def keepalive(self) -> float:
        return max(self.interval, min(KEEPALIVE_BEATS * self.interval, KEEPALIVE_S))

    def due(self, content: bytes, now: float) -> bool:
        return content != self.written or now >= self.due_at

    def wrote(self, content: bytes, now: float) -> None:
        self.written = content
        self.due_at = now + self.keepalive * self.rng.uniform(0.75, 1.0)


def confinement(node: Node, zk_root: str) -> confine.JobCgroups:
    """What ``node`` can enforce (its cgroup subtrees made), written for tasknode."""
    settings = node.settings
    relative = confine.host_subtree(settings.cgroup_root, zk_root, node.name)
    state = confine.detect(relative, settings.gpu_confine)
    try:
        confine.write_state(settings.workdir, state)
    except OSError as err:
        state = confine.NodeCgroups(why=f"cannot write {confine.STATE_FILE} ({err})",
                                    required=state.required)
    if state.mode is not confine.Mode.DEVICES:
        log.warning("%s: tasks are %s: %s", node.name, state.label,
                    "the trespass detector still stops processes on GPUs not granted "
                    "to their job" if state.mode is confine.Mode.NONE else state.why)
    return confine.JobCgroups(state)


@dataclass
class Turns:
    """The pace of an agent's loop around one client. Work proportional to change: every
    interval the node is probed (and its record written if that changed), but the reap,
    the drain check and the keeper lease read ZooKeeper only when a watch woke the loop (a
    lease, the keeper lease, its own row's shard), the record changed, or after
    QUIET_SWEEP_S (a net)."""

    interval: float
    beat_at: float = 0.0  # the next heartbeat (monotonic)
    look_at: float = 0.0  # the next look around however quiet (monotonic)
    woken: bool = True  # a look around now
    shard_watched: bool = False  # its own row's shard: watched once per client
    record: AgentRecord | None = None  # the record as last published

    def beaten(self, record: AgentRecord, changed: bool, now: float) -> None:
        self.record = record
        self.woken |= changed  # a new record (not a keep-alive): look around too
        self.beat_at = now + self.interval

    def look_due(self, now: float) -> bool:
        return self.woken or now >= self.look_at

    def looked(self, now: float) -> None:
        self.woken = False
        self.look_at = now + max(self.interval, QUIET_SWEEP_S)

    def until_beat(self, now: float) -> float:
        return max(0.0, self.beat_at - now)


class NodeAgent:
    """The service loop around one ZooKeeper client."""

    def __init__(self, inventory: Inventory, host: str, prober: Prober | None = None,
                 client_factory: Callable[[], KazooClient] | None = None) -> None:
        self.inventory = inventory
        self.node = inventory.node(host)
        self.layout = Layout(inventory.cluster.zk_root)
        self.prober = prober or Prober(self.node, gpu_source(self.node))
        self._wake = threading.Event()
        self._stop = threading.Event()
        # the keeper lease's terms (only on a keeper host with the keeper's credential): the
        # passes run on a thread of their own, never on this agent's loop
        self.keeper = KeeperTerm(inventory, host, self._wake_up,
                                 running=lambda: not self._stop.is_set())
        also = ("keeper",) if self.keeper.capable else ()
        self._client_factory = client_factory or (lambda: store.connect(
            inventory.cluster, 30, identity=f"agent.{host}", long_lived=True,
            on_pause=log.warning, also=also))
        self._disconnected_since: float | None = None
        self._waiting_for = ""  # why ZooKeeper cannot take this agent now, said once
        self._republish = True
        self._writes = WritePolicy(self.node.settings.agent_interval)
        self._content: tuple[AgentRecord | None, bytes] = (None, b"")  # a record, serialised
        self.metrics = AgentCollector(host, keeper=self.keeper.counts if self.keeper.capable
                                      else None)
        self.metrics_server = MetricsServer(self.metrics)
        # what the node enforces: found (its cgroup subtrees made) when it starts serving
        self.cgroups = confine.JobCgroups(confine.NodeCgroups(why="the agent is not serving"))
        self.report = HostReport(self.node, self.layout, self.metrics, self._wake_up,
                                 cgroups=self.cgroups, minors=lambda: self.prober.minors)

    def _on_state(self, state: str) -> None:
        """Listeners must not block: note what happened and wake the loop."""
        if state == KazooState.CONNECTED:
            self._disconnected_since = None
        elif self._disconnected_since is None:
            self._disconnected_since = time.monotonic()
        if state in (KazooState.LOST, KazooState.CONNECTED):
            self._republish = True  # a new session has no record yet
        if state == KazooState.LOST and not self._stop.is_set():
            log.warning("ZooKeeper session lost: the record is gone, re-registering")
        self._wake.set()

    def _wake_up(self, *_: object) -> None:
        """A watch fired: look again now. One bound method, so kazoo keeps one watcher
        per path however often the loop sets it."""
        self._wake.set()

    def publish(self, zk: Store, record: AgentRecord, force: bool = False) -> bool:
        """Write the record (Store.publish_record) when it changed (the heartbeat aside) or
        the keep-alive is due, or when ``force``d; try again next pass if it cannot yet.
        True when what it says changed (not a mere keep-alive)."""
        if self._content[0] is not record:  # the prober gives back an unchanged record
            self._content = (record, replace(record, heartbeat=0.0).to_json())
        content = self._content[1]
        changed = content != self._writes.written
        if not force and not self._writes.due(content, time.monotonic()):
            return False
        outcome = zk.publish_record(replace(record, heartbeat=time.time()))
        if outcome in (RecordWrite.CREATED, RecordWrite.UPDATED):
            self._writes.wrote(content, time.monotonic())
        if outcome is RecordWrite.CREATED:
            log.info("registered %s: %d GPUs, %s available", self.node.name, record.gpu,
                     record.gpu_avail_list)
        elif outcome is RecordWrite.OLDER_SESSION:
            log.info("the record of an older session of this agent is still there: "
                     "waiting for it to expire")
        if outcome in (RecordWrite.OLDER_SESSION, RecordWrite.TAKEN):
            self._republish = True  # look again next pass
        return changed and outcome in (RecordWrite.CREATED, RecordWrite.UPDATED)

    def _publish_probe(self, zk: Store) -> tuple[AgentRecord, bool]:
        """Probe the node, publish the record, and serve it as metrics; True when the
        record's content changed."""
        force, self._republish = self._republish, False
        record = self.report.apply(zk, self.prober.probe(fresh=force))
        changed = self.publish(zk, record, force)
        self.metrics.update(record=record)
        self.metrics_server.start(record.mgmt_addr, self.node.settings.metrics_port)
        return record, changed

    def confirm_drained(self, zk: Store) -> None:
        """The host's report of ended jobs (``HostReport.confirm_drained``); a changed
        report is the record, written now (the keeper frees the cells when it reads it),
        probing again so the dead tasks' processes (NVML's list) no longer keep their GPUs
        unavailable."""
        if self.report.confirm_drained(zk):
            self._republish = True
            self._publish_probe(zk)

    def stop(self, *_: object) -> None:
        self._stop.set()
        self._wake.set()

    def _stale(self) -> bool:
        """Disconnected for long: a new client, because a ZooKeeper whose data was lost
        refuses every reconnect of a client that has seen a newer transaction id."""
        since = self._disconnected_since
        limit = store.outage_patience(self.inventory.cluster)
        return since is not None and time.monotonic() - since >= limit

    def run(self, once: bool = False) -> AgentRecord | None:
        """Serve until stopped; with ``once``, publish one record and return it. The
        node's cgroup subtrees exist while it serves: removed (when empty) however it ends."""
        record = None
        taskaccount.publish(self.node.settings.workdir, self.inventory.cluster.account_policy)
        self.cgroups = self.report.cgroups = confinement(self.node,
                                                          self.inventory.cluster.zk_root)
        self.prober.cgroups = self.cgroups.state
        if not once:  # per-user tasks wait for it to join their cgroups (HostReport)
            threading.Thread(target=self.report.adopt_often, args=(self._stop,),
                             daemon=True, name="adopter").start()
        try:
            while not self._stop.is_set():
                client = self._connect(once)
                if client is None:
                    continue
                self._disconnected_since = None
                client.add_listener(self._on_state)
                try:
                    record = self._serve(client, once)
                finally:
                    self._stop_requested_cleanup(client)
                if once:
                    break
                if not self._stop.is_set():
                    log.warning("no ZooKeeper for a long time: reconnecting with a new client")
        finally:
            self.metrics_server.stop()
            self.cgroups.close(self.node.settings.workdir)
            close = getattr(self.prober.source, "close", None)
            if close:
                close()
        return record

    def _connect(self, once: bool) -> KazooClient | None:
        """A new client; None after a pause when ZooKeeper cannot take this agent yet (it
        is down, or lost its data and waits for 'hypertf auth init'): a service waits and
        registers by itself once the admin has acted, saying why once per reason."""
        try:
            client = self._client_factory()
        except StoreError as err:
            if once:
                raise
            if str(err) != self._waiting_for:
                self._waiting_for = str(err)
                log.error("%s; retrying every %.0f s", err, CONNECT_RETRY_S)
            self._stop.wait(CONNECT_RETRY_S)
            return None
        if self._waiting_for:
            log.info("ZooKeeper takes this agent again: registering")
        self._waiting_for = ""
        return client

    def _serve(self, client: KazooClient, once: bool) -> AgentRecord | None:
        """Serve one client: heartbeat every interval (or after a reconnect), look around
        when a watch woke the loop (``Turns``), until stopped, stale (a new client) or, with
        ``once``, after one turn. The keeper's passes (this agent holding the keeper lease)
        run on their own thread, which ends with this client's term."""
        zk = Store(client, self.layout)
        turns = Turns(self.node.settings.agent_interval)
        try:
            while not self._stop.is_set():
                if self._wake.is_set():  # cleared only when seen: a watch firing now is kept
                    self._wake.clear()
                    turns.woken = True
                if self._stale():
                    break  # a new client (run): this one's watches and keeper term end here
                pause = self._turn(zk, turns)
                if pause is not None:
                    self._wake.wait(pause)
                    turns.woken = True
                    continue
                if once:
                    break
                turns.woken = self._wake.wait(turns.until_beat(time.monotonic()))
        finally:  # a new session's term starts from a fresh read
            self.keeper.end(wait=None if once else END_WAIT_S, finish=once)
        return turns.record

    def _turn(self, zk: Store, turns: Turns) -> float | None:
        """One turn of the loop: the heartbeat when due, then a look around when due. None
        when it went through, else the pause before the next try (the failure said)."""
        if not zk.client.connected:
            return 1.0  # calls would queue and block until reconnected
        try:
            self._heartbeat(zk, turns)
            if turns.look_due(time.monotonic()):
                self._look_around(zk, turns)
        except NoNodeError:
            log.error("ZooKeeper has no HyperTF root %s (did it lose its data?): the admin "
                      "runs 'hypertf auth init'; retrying", self.layout.root)
            return 2.0
        except (KazooException, KazooTimeoutError) as err:
            log.warning("ZooKeeper unavailable (%s); retrying", type(err).__name__)
            return 1.0
        except (StoreError, OSError) as err:  # unreadable data, a full disk: keep serving
            log.error("agent pass failed: %s; retrying", err)
            return 1.0
        except HyperTFError:
            raise  # a setting to fix (a network that is not there...): say it and stop
        except Exception:  # a bug must not take every agent down in turn: log, go on
            log.exception("agent pass failed unexpectedly; retrying")
            return 5.0
        return None

    def _heartbeat(self, zk: Store, turns: Turns) -> None:
        """Probe the node and write its record if that changed, every interval (at once
        after a reconnect); a new record (not a keep-alive) makes the loop look around."""
        if self._republish or time.monotonic() >= turns.beat_at:
            record, changed = self._publish_probe(zk)
            turns.beaten(record, changed, time.monotonic())

    def _look_around(self, zk: Store, turns: Turns) -> None:
        """What a watch (a lease, the keeper lease, its own row's shard), a new record or
        the quiet sweep asks for: the keeper lease held or taken (its pass thread woken),
        the tasks of dead launchers stopped, this host's drained jobs reported."""
        turns.looked(time.monotonic())
        if not turns.shard_watched:  # its own row: the keeper marked cells draining
            zk.matrix.watch_shard_of(self.node.name, self._wake_up)
            turns.shard_watched = True
        self.keeper.step(zk)
        self.report.reap_orphans(zk)
        self.confirm_drained(zk)

    def _stop_requested_cleanup(self, client: KazooClient) -> None:
        """Close the session: its ephemeral record goes at once (an agent may not delete
        records, not even its own; closing needs no permission)."""
        try:
            store.close(client)
        except Exception as err:  # a dying client must not keep the agent from going on
            log.debug("closing the ZooKeeper client: %s", err)


def serve(inventory: Inventory, host: str) -> None:
    """The ``hypertf agent`` entry point: run until SIGTERM or SIGINT."""
    agent = NodeAgent(inventory, host)
    signal.signal(signal.SIGTERM, agent.stop)
    signal.signal(signal.SIGINT, agent.stop)
    log.info("agent for %s starting (ZooKeeper %s, root %s)", host,
             inventory.cluster.zookeeper_hosts, inventory.cluster.zk_root)
    agent.run()
    log.info("agent for %s stopped, record removed", host)
