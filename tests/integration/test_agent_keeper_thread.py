"""The keeper on a thread of its own inside the agent process, against a real ZooKeeper:
a keeper pass that raises is logged with its cause and counted in the agent's /metrics while
the agent's heartbeat goes on; a pass that hangs delays no heartbeat; a lost keeper lease
ends its term's pass thread once the pass in progress is over, and the agent's next term
keeps the matrix again; ``--once`` runs the term's first pass and leaves no thread behind.

The agent is the real NodeAgent (its loop, its keeper term, its pass thread) in a thread of
this process; only the pass itself (``KeeperRole.keep``) is made to fail or to hang here."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from kazoo.client import KazooClient
from prometheus_client import generate_latest

from hypertf import store
from hypertf.config.inventory import Inventory, load_inventory
from hypertf.core.records import AgentRecord
from hypertf.keeper.role import KeeperRole
from hypertf.node.agent import NodeAgent
from tests.conftest import wait_for

HOST = "node1"


@pytest.fixture
def inventory(zk_server, tmp_path: Path) -> Inventory:
    """One keeper host (the first node keeps: it gets keeper.yml) with static GPUs."""
    (tmp_path / "gpus.json").write_text(json.dumps([{}, {}]))
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": zk_server.hosts,
                 "hypertf_zk_root": f"/keeper-thread-{tmp_path.name}",
                 "hypertf_agent_interval": 0.3, "hypertf_zk_session_timeout": 2,
                 "hypertf_gpu_confine": "off", "hypertf_gpu_source": "static",
                 "hypertf_static_gpus": str(tmp_path / "gpus.json"),
                 "hypertf_agent_metrics_port": 0,
                 "hypertf_workdir": str(tmp_path / "work")},
        "children": {"gpu_nodes": {"hosts": {HOST: {"ansible_connection": "local"}}}},
    }}))
    loaded = load_inventory(path)
    store.secure_cluster(loaded.cluster, [HOST])
    return loaded


@pytest.fixture
def admin(inventory: Inventory) -> Iterator[KazooClient]:
    client = store.connect(inventory.cluster, identity="admin")
    yield client
    store.close(client)


@pytest.fixture
def running(inventory: Inventory) -> Iterator[Callable[[], NodeAgent]]:
    """``running()``: the inventory's agent, serving in a thread until the test ends."""
    started: list[tuple[NodeAgent, threading.Thread]] = []

    def start() -> NodeAgent:
        agent = NodeAgent(inventory, HOST)
        assert agent.keeper.capable, "the test's host should hold the keeper's credential"
        thread = threading.Thread(target=agent.run, name="agent-under-test", daemon=True)
        thread.start()
        started.append((agent, thread))
        return agent

    yield start
    for agent, thread in started:
        agent.stop()
        thread.join(30)
        assert not thread.is_alive(), "the agent did not stop"


def gpus_file(inventory: Inventory) -> Path:
    return Path(inventory.nodes[HOST].settings.static_gpus)


def record(admin: KazooClient, inventory: Inventory) -> AgentRecord | None:
    path = store.Layout(inventory.cluster.zk_root).resource(HOST)
    found = admin.exists(path)
    return AgentRecord.from_json(admin.get(path)[0]) if found else None


def available(admin: KazooClient, inventory: Inventory) -> list[int] | None:
    found = record(admin, inventory)
    return found.gpu_avail_list if found else None


def keeper_metric(agent: NodeAgent, name: str) -> float:
    """A keeper counter from the agent's /metrics, as Prometheus would read it."""
    text = generate_latest(agent.metrics_server.registry).decode()
    line = next(line for line in text.splitlines()
                if line.startswith(f'{name}{{host="{HOST}"}}'))
    return float(line.rsplit(" ", 1)[1])


def keeper_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "keeper" and t.is_alive()]


def test_a_keeper_pass_that_raises_is_logged_counted_and_the_heartbeat_goes_on(
        inventory, admin, running, monkeypatch, caplog) -> None:
    def broken(_role: KeeperRole) -> list[object]:
        raise RuntimeError("a keeper bug, for the test")

    monkeypatch.setattr(KeeperRole, "keep", broken)
    caplog.set_level(logging.INFO)
    agent = running()
    wait_for(lambda: keeper_metric(agent, "hypertf_keeper_pass_failures_total") >= 1, 20,
             "a failed keeper pass counted")
    failed = [r for r in caplog.records if r.name == "hypertf.keeper.passes"
              and r.levelno == logging.ERROR]
    assert failed, "the failed pass was not logged"
    assert failed[0].exc_info is not None, "logged without its cause"
    assert isinstance(failed[0].exc_info[1], RuntimeError)
    assert "a keeper bug, for the test" in caplog.text  # the cause, with its traceback
    assert keeper_metric(agent, "hypertf_keeper_passes_total") == 0
    # The agent's own loop goes on meanwhile: it probes, and writes what changed.
    wait_for(lambda: available(admin, inventory) == [0, 1], 20, "the agent's record")
    gpus_file(inventory).write_text(json.dumps([{"utilization": 99}, {}]))
    wait_for(lambda: available(admin, inventory) == [1], 10,
             "the heartbeat while every keeper pass fails")
    assert not any("agent pass failed" in r.getMessage() for r in caplog.records), \
        "a keeper failure reached the agent's loop"
    # ... and the keeper tries again (a bug's pass: 5 s later, or sooner when woken)
    wait_for(lambda: keeper_metric(agent, "hypertf_keeper_pass_failures_total") >= 2, 20,
             "the failed pass tried again")
    agent.stop()
    wait_for(lambda: not keeper_threads(), 20, "the keeper's pass thread to end with the agent")


def test_a_hung_pass_delays_no_heartbeat_and_a_lost_lease_ends_its_term(
        inventory, admin, running, monkeypatch) -> None:
    real = KeeperRole.keep
    entered, release = threading.Event(), threading.Event()

    def slow(role: KeeperRole) -> list[object]:
        if not release.is_set():
            entered.set()
            release.wait(60)
        return list(real(role))

    monkeypatch.setattr(KeeperRole, "keep", slow)
    agent = running()
    try:
        assert entered.wait(20), "the keeper's first pass never began"
        # The pass hangs: the agent's loop does not.
        wait_for(lambda: available(admin, inventory) == [0, 1], 20, "the agent's record")
        gpus_file(inventory).write_text(json.dumps([{}, {"utilization": 99}]))
        wait_for(lambda: available(admin, inventory) == [0], 10,
                 "the heartbeat while the keeper's pass hangs")
        # Another session takes the keeper lease: the agent's term ends, without waiting
        # for its pass (its loop goes on), and its thread ends once that pass is over.
        layout = store.Layout(inventory.cluster.zk_root)
        lease = layout.keeper_lease
        other = store.connect(inventory.cluster, identity="admin")
        try:
            transaction = other.transaction()
            transaction.delete(lease)
            transaction.create(lease, b"another", acl=store.acls(other).keeper_lease(),
                               ephemeral=True)
            assert not any(isinstance(r, Exception) for r in transaction.commit())
            wait_for(lambda: agent.keeper.role is None, 10, "the term to end with the lease")
            gpus_file(inventory).write_text(json.dumps([{}, {}]))
            wait_for(lambda: available(admin, inventory) == [0, 1], 10,
                     "the heartbeat after the term ended")
            assert keeper_threads(), "the pass in progress should still be running"
            release.set()
            wait_for(lambda: not keeper_threads(), 10, "the old term's thread to end")
        finally:
            store.close(other)  # the lease goes with its session: the agent takes it again
        wait_for(lambda: agent.keeper.role is not None and keeper_threads(), 20,
                 "a new term with a thread of its own")
        passes = keeper_metric(agent, "hypertf_keeper_passes_total")  # the old term's, too
        gpus_file(inventory).write_text(json.dumps([{"utilization": 99}, {}]))
        wait_for(lambda: keeper_metric(agent, "hypertf_keeper_passes_total") > passes, 20,
                 "the new term's passes")
        assert keeper_metric(agent, "hypertf_keeper_pass_failures_total") == 0
    finally:
        release.set()


def test_once_runs_the_terms_first_pass_and_leaves_no_thread(inventory, admin) -> None:
    """``hypertf agent --once`` publishes one record and, holding the keeper lease, runs one
    keeper pass (inline before the pass thread): the term's first, then its thread ends."""
    agent = NodeAgent(inventory, HOST)
    assert agent.run(once=True) is not None
    assert (agent.keeper.counts.passes, agent.keeper.counts.failures) == (1, 0)
    assert not keeper_threads()
    assert record(admin, inventory) is None  # its session closed: the record went with it
