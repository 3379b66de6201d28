"""The agent as a process against a real ZooKeeper (no lab): record, heartbeat, SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import yaml

from hypertf import auth, store
from hypertf.allocation import sync_matrix
from hypertf.inventory import load_inventory
from tests.conftest import wait_for


@pytest.fixture
def agent_inventory(zk_server, tmp_path):
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps([{}, {}, {"utilization": 95}]))
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": zk_server.hosts,
                 "hypertf_zk_root": f"/agent-{tmp_path.name}", "hypertf_agent_interval": 0.3,
                 "hypertf_zk_session_timeout": 2, "hypertf_gpu_source": "static",
                 "hypertf_static_gpus": str(gpus), "hypertf_workdir": str(tmp_path / "work"),
                 "hypertf_venv": sys.prefix},
        "children": {"gpu_nodes": {"hosts": {"node1": {"ansible_connection": "local"}}}},
    }}))
    auth.initialize(load_inventory(path).cluster, ["node1"])
    return path, gpus


def test_agent_publishes_refreshes_and_deletes_on_sigterm(agent_inventory):
    path, gpus = agent_inventory
    inventory = load_inventory(path)
    layout = store.Layout(inventory.cluster.zk_root)
    agent = subprocess.Popen([sys.executable, "-m", "hypertf.cli", "agent", "-i", str(path),
                              "--host", "node1"], stderr=subprocess.PIPE, text=True)
    client = store.connect(inventory.cluster)
    try:
        records = wait_for(lambda: store.read_records(client, layout), 20, "the record")
        record = records["node1"]
        assert (record.gpu, record.gpu_avail_list) == (3, [0, 1])  # GPU 2 is 95 % busy
        assert record.data_addr == record.mgmt_addr == "127.0.0.1"
        assert 20000 <= record.port <= 20999
        assert [g.available for g in record.gpus] == [True, True, False]
        matrix, _ = sync_matrix(client, layout)
        assert matrix.gpus["node1"] == [1, 1, 0]
        # The static source is re-read every heartbeat: GPU 0 gets busy, GPU 2 idle.
        gpus.write_text(json.dumps([{"memory_used": 15 * 1024**3}, {}, {}]))
        wait_for(lambda: store.read_records(client, layout)["node1"].gpu_avail_list == [1, 2],
                 10, "the new availability")
        wait_for(lambda: sync_matrix(client, layout)[0].gpus["node1"] == [0, 1, 1], 10,
                 "the matrix to follow (keeper agent)")
        beat = store.read_records(client, layout)["node1"].heartbeat
        wait_for(lambda: store.read_records(client, layout)["node1"].heartbeat > beat, 5,
                 "a newer heartbeat")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=10) == 0
        started = time.monotonic()
        assert "node1" not in store.read_records(client, layout)
        assert time.monotonic() - started < 1
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        store.close(client)


def test_agent_refuses_a_bad_network_setting(agent_inventory):
    path, _ = agent_inventory
    data = yaml.safe_load(path.read_text())
    data["all"]["vars"]["hypertf_data_network"] = "nosuchnic0"
    path.write_text(yaml.safe_dump(data))
    done = subprocess.run([sys.executable, "-m", "hypertf.cli", "agent", "-i", str(path),
                           "--host", "node1", "--once"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert "network 'nosuchnic0' is neither an interface of this node" in done.stderr
    assert "Traceback" not in done.stderr
