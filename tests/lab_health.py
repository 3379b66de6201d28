"""The shared lab's health, checked before every test that uses it, and its repair.

A test that damages the lab (kills an agent, cuts a link, restarts ZooKeeper, leaves a job
running because an assert failed first) must not fail the tests after it. So before each
lab test the fixture asks: does ZooKeeper answer, is every link up, has every agent
registered, is there no lease, no job process on any host, no GPU or port held? Anything
wrong is repaired here (only things this test session started are stopped, by PID), and if
the lab is still not healthy it is rebuilt.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass, field

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.core.errors import HyperTFError
from hypertf.core.matrix import FREE
from hypertf.keeper.sync import sync_matrix
from hypertf.launch.remote import Cluster
from hypertf.ops import lab as lab_module
from hypertf.ops import labcluster
from hypertf.store import Store

JOB_MARKER = "HYPERTF_TASK_KEY="


@dataclass
class Health:
    """What is wrong with a lab; empty ``problems`` means healthy."""

    problems: list[str] = field(default_factory=list)
    job_pids: dict[str, list[int]] = field(default_factory=dict)
    leases: set[str] = field(default_factory=set)
    missing_agents: set[str] = field(default_factory=set)
    zookeeper_down: bool = False
    links_down: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _links_down(lab: lab_module.Lab) -> list[str]:
    down = []
    for host in lab.hosts:
        shown = subprocess.run(["ip", "-o", "link", "show", "dev", host.veth],
                               capture_output=True, text=True).stdout
        if "state UP" not in shown and ",UP" not in shown and "<UP" not in shown:
            down.append(host.name)
    return down


def _job_pids(lab: lab_module.Lab) -> dict[str, list[int]]:
    """Per host, the PIDs of live processes started by a job (the marker is inherited)."""
    inventory = load_inventory(lab.inventory)
    with Cluster(inventory.nodes.values(), inventory.cluster) as cluster:
        results = cluster.each(lambda s: s.run("ps eww -eo pid,stat,args", timeout=20))
    found: dict[str, list[int]] = {}
    for host, result in results.items():
        if isinstance(result, BaseException):
            found[host] = [-1]  # unreachable: cannot tell, so not healthy
            continue
        pids = [int(line.split()[0]) for line in result.stdout.splitlines()
                if JOB_MARKER in line and line.split()[1][0] != "Z"]
        if pids:
            found[host] = pids
    return found


def check(lab: lab_module.Lab) -> Health:
    health = Health()
    health.links_down = _links_down(lab)
    if health.links_down:
        health.problems.append(f"links down: {', '.join(health.links_down)}")
    servers = lab.zk_servers()
    if not servers or any(server.mode() is None for server in servers):
        health.zookeeper_down = True
        health.problems.append("ZooKeeper does not answer")
        return health
    inventory = load_inventory(lab.inventory)
    layout = store.Layout(inventory.cluster.zk_root)
    try:
        client = store.connect(inventory.cluster)
    except HyperTFError as err:
        health.zookeeper_down = True
        health.problems.append(f"cannot connect to ZooKeeper: {err}")
        return health
    try:
        records = store.Store(client, layout).records()
        health.missing_agents = set(inventory.nodes) - set(records)
        health.leases = store.Store(client, layout).leases()
        matrix, _ = Store(client, layout).matrix.read()
    finally:
        store.close(client)
    if health.missing_agents:
        health.problems.append(f"agents not registered: {sorted(health.missing_agents)}")
    if health.leases:
        health.problems.append(f"leases left: {sorted(health.leases)}")
    held = {host: row for host, row in matrix.gpus.items() if any(c != FREE for c in row)}
    if held or set(matrix.gpus) != set(inventory.nodes):
        health.problems.append(f"GPUs not free: {held or matrix.gpus}")
    if any(matrix.ports.values()):
        health.problems.append(f"ports reserved: {matrix.ports}")
    health.job_pids = _job_pids(lab)
    if health.job_pids:
        health.problems.append(f"job processes left: {health.job_pids}")
    return health


def repair(lab: lab_module.Lab, health: Health) -> None:
    """Undo what a test left: links, ZooKeeper, job processes (by PID), leases, agents."""
    for name in health.links_down:
        lab.restore(name)
    if health.zookeeper_down:
        for server in lab.zk_servers():
            if server.mode() is None:
                with contextlib.suppress(HyperTFError):
                    server.stop(grace_s=2)
                server.start(heap="192m", tick_ms=500)
        with contextlib.suppress(HyperTFError):
            labcluster.secure_lab_root(lab)  # idempotent; needed if its data was lost
        health = check(lab)
        if health.zookeeper_down:
            return
    inventory = load_inventory(lab.inventory)
    if health.job_pids:
        with Cluster(inventory.nodes.values(), inventory.cluster) as cluster:
            for host, pids in health.job_pids.items():
                live = [str(p) for p in pids if p > 0]
                if live:
                    cluster.each(lambda s, live=live: s.run(
                        f"kill -KILL {' '.join(live)} 2>/dev/null; true", timeout=20), [host])
    client = store.connect(inventory.cluster, identity="admin")  # may end anyone's job
    try:
        layout = store.Layout(inventory.cluster.zk_root)
        for key in store.Store(client, layout).leases():
            with contextlib.suppress(KazooException, KazooTimeoutError):
                client.delete(layout.lease(key))
        # Always: an agent killed a moment ago still has its record until its session ends.
        labcluster.start_lab_agents(lab, wait_s=60)
        sync_matrix(Store(client, layout))
    finally:
        store.close(client)


def ensure_healthy(lab: lab_module.Lab, gpus: int) -> tuple[lab_module.Lab, list[str]]:
    """The lab healthy (repaired, or rebuilt as a last resort) and what was wrong before."""
    health = check(lab)
    if health.ok:
        return lab, []
    found = list(health.problems)
    for _ in range(3):  # a repair can race with what is still settling (sessions ending)
        with contextlib.suppress(HyperTFError, KazooException, KazooTimeoutError, OSError):
            repair(lab, health)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                health = check(lab)
                if health.ok:
                    return lab, found
                time.sleep(1)
    lab_module.down(lab)
    rebuilt = lab_module.up(hosts=len(lab.hosts), gpus=gpus, per_user=lab.per_user)
    return rebuilt, [*found, "repair failed: lab rebuilt"]

