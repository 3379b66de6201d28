"""The matrix keeper, judged by the stored matrix alone: nothing in these tests syncs it.

The keeper is the agent holding the keeper lease; it brings ``matrix`` in line with the
agents' records and the live leases. Every assertion here reads the znode as it is stored,
so these tests fail if no agent keeps the matrix (or if the keeper role does not move when
the keeper dies).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.core.matrix import Matrix
from hypertf.core.placement import Request
from hypertf.core.scheduler import TaskSlot
from hypertf.store import Store
from tests.conftest import wait_for

HOSTS = ("node1", "node2")


@pytest.fixture
def keeper_lab(zk_server, tmp_path) -> Iterator[tuple[Path, dict[str, Path]]]:
    """Two local nodes (distinct addresses, work dirs and static GPU files), no agent yet."""
    gpu_files = {}
    hosts = {}
    for i, host in enumerate(HOSTS, start=1):
        gpu_files[host] = tmp_path / f"{host}-gpus.json"
        gpu_files[host].write_text(json.dumps([{}, {}, {"utilization": 95}]))
        hosts[host] = {"ansible_connection": "local", "ansible_host": f"127.0.0.{i}",
                       "hypertf_static_gpus": str(gpu_files[host]),
                       "hypertf_workdir": str(tmp_path / host)}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": zk_server.hosts,
                 "hypertf_zk_root": f"/keeper-{tmp_path.name}", "hypertf_agent_interval": 0.3,
                 "hypertf_gpu_confine": "off",  # no cgroups: an agent here is SIGKILLed
                 "hypertf_zk_session_timeout": 2, "hypertf_gpu_source": "static",
                 "hypertf_venv": sys.prefix, "hypertf_job_retention_days": 1 / 86400,
                 "hypertf_keeper_prune_interval": 2},
        "children": {"gpu_nodes": {"hosts": hosts}},
    }}))
    store.secure_cluster(load_inventory(path).cluster, list(HOSTS))
    yield path, gpu_files


@pytest.fixture
def agents(keeper_lab) -> Iterator[dict[str, subprocess.Popen[str]]]:
    path, _ = keeper_lab
    running: dict[str, subprocess.Popen[str]] = {}
    for host in HOSTS:
        running[host] = subprocess.Popen(
            [sys.executable, "-m", "hypertf.cli", "agent", "-i", str(path), "--host", host],
            stderr=subprocess.DEVNULL, text=True)
    yield running
    for agent in running.values():  # by PID, whatever the test did
        if agent.poll() is None:
            agent.kill()
        agent.wait()


@pytest.fixture
def stored(keeper_lab) -> Iterator[Callable[[], Matrix]]:
    """Read the matrix znode as stored (a plain get: no sync, no write)."""
    path, _ = keeper_lab
    inventory = load_inventory(path)
    layout = store.Layout(inventory.cluster.zk_root)
    client = store.connect(inventory.cluster)

    def read() -> Matrix:
        if client.exists(layout.matrix) is None:
            return Matrix()
        return store.Store(client, layout).matrix.read()[0]

    yield read
    store.close(client)


def test_keeper_writes_each_agents_row_and_follows_changes(keeper_lab, agents, stored):
    _, gpu_files = keeper_lab
    wait_for(lambda: stored().gpus == {"node1": [1, 1, 0], "node2": [1, 1, 0]}, 60,
             "both rows in the stored matrix (GPU 2 is 95 % busy)")
    gpu_files["node2"].write_text(json.dumps([{"memory_used": 15 * 1024**3}, {}, {}]))
    wait_for(lambda: stored().gpus.get("node2") == [0, 1, 1], 10,  # the keeper watches the
             "node2's row to follow its agent's new reading")  # records: no 30 s quiet sweep
    assert stored().gpus["node1"] == [1, 1, 0]


def test_keeper_role_moves_when_the_keeper_dies(keeper_lab, agents, stored):
    """One agent holds the keeper lease. Killed outright, its session (and so its lease and
    its record) expires; only the other agent can then mark the dead keeper's row
    unavailable, and only if it took the lease over."""
    wait_for(lambda: stored().gpus == {"node1": [1, 1, 0], "node2": [1, 1, 0]}, 60,
             "both rows in the stored matrix")
    path, gpu_files = keeper_lab
    inventory = load_inventory(path)
    layout = store.Layout(inventory.cluster.zk_root)
    client = store.connect(inventory.cluster)
    try:
        keeper = client.get(layout.keeper_lease)[0].decode()
        survivor = next(host for host in HOSTS if host != keeper)
        agents[keeper].send_signal(signal.SIGKILL)
        agents[keeper].wait()
        wait_for(lambda: stored().gpus.get(keeper) == [0, 0, 0], 60,
                 "the surviving agent to mark the dead keeper's row unavailable")
        assert client.get(layout.keeper_lease)[0].decode() == survivor
        gpu_files[survivor].write_text(json.dumps([{}, {}, {}]))
        wait_for(lambda: stored().gpus.get(survivor) == [1, 1, 1], 60,
                 "the new keeper to keep its own row current")
    finally:
        store.close(client)


def test_keeper_frees_the_cells_of_a_job_whose_lease_vanished(keeper_lab, agents, stored):
    """A launcher killed outright: its ephemeral lease goes with its session; the agents (not
    the launcher, not this test) must mark the job lost and give its GPUs back, and the
    keeper prunes the record once it is past its retention (1 s here)."""
    path, _ = keeper_lab
    wait_for(lambda: stored().gpus == {"node1": [1, 1, 0], "node2": [1, 1, 0]}, 60,
             "both rows in the stored matrix")
    inventory = load_inventory(path)
    layout = store.Layout(inventory.cluster.zk_root)
    launcher = store.connect(inventory.cluster)
    try:
        request = Request(slots=(TaskSlot("worker", 0, 2), TaskSlot("worker", 1, 1)),
                          hosts=HOSTS, policy="pack")
        Store(launcher, layout).queue.submit(request, "job-1.root")
    finally:
        taken = stored().gpus
        store.close(launcher)  # the session ends: the lease is gone
    assert sum(cell == "job-1.root" for row in taken.values() for cell in row) == 3
    wait_for(lambda: stored().gpus == {"node1": [1, 1, 0], "node2": [1, 1, 0]}, 60,
             "the agents to free the lease-less job's GPUs")
    assert not any(stored().ports.values())
    client = store.connect(inventory.cluster)
    try:
        wait_for(lambda: client.exists(layout.job("job-1.root")) is None, 60,
                 "the keeper to prune the finished job's record (every 2 s here)")
    finally:
        store.close(client)
