"""The agent as a process against a real ZooKeeper (no lab): record, heartbeat, SIGTERM."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from rich.console import Console

from hypertf import store
from hypertf.cli import statustable
from hypertf.config.inventory import load_inventory
from hypertf.store import Store, status
from tests.conftest import wait_for


@pytest.fixture
def agent_inventory(zk_server, tmp_path):
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps([{}, {}, {"utilization": 95}]))
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": zk_server.hosts,
                 "hypertf_zk_root": f"/agent-{tmp_path.name}", "hypertf_agent_interval": 0.3,
                 "hypertf_gpu_confine": "off",  # no cgroups: an agent here is SIGKILLed
                 "hypertf_zk_session_timeout": 2, "hypertf_gpu_source": "static",
                 "hypertf_static_gpus": str(gpus), "hypertf_workdir": str(tmp_path / "work"),
                 "hypertf_venv": sys.prefix},
        "children": {"gpu_nodes": {"hosts": {"node1": {"ansible_connection": "local"}}}},
    }}))
    store.secure_cluster(load_inventory(path).cluster, ["node1"])
    return path, gpus


def test_agent_publishes_refreshes_and_deletes_on_sigterm(agent_inventory):
    path, gpus = agent_inventory
    inventory = load_inventory(path)
    layout = store.Layout(inventory.cluster.zk_root)
    agent = subprocess.Popen([sys.executable, "-m", "hypertf.cli", "agent", "-i", str(path),
                              "--host", "node1"], stderr=subprocess.PIPE, text=True)
    client = store.connect(inventory.cluster)
    try:
        records = wait_for(lambda: store.Store(client, layout).records(), 20, "the record")
        record = records["node1"]
        assert (record.gpu, record.gpu_avail_list) == (3, [0, 1])  # GPU 2 is 95 % busy
        assert record.data_addr == record.mgmt_addr == "127.0.0.1"
        assert 20000 <= record.port <= 20999
        assert [g.available for g in record.gpus] == [True, True, False]
        wait_for(lambda: Store(client, layout).matrix.read()[0].gpus.get("node1") == [1, 1, 0],
                 10, "the keeper's row for node1")
        # The static source is re-read every heartbeat: GPU 0 gets busy, GPU 2 idle.
        gpus.write_text(json.dumps([{"memory_used": 15 * 1024**3}, {}, {}]))
        wait_for(lambda: store.Store(client, layout).records()["node1"].gpu_avail_list == [1, 2],
                 10, "the new availability")
        wait_for(lambda: Store(client, layout).matrix.read()[0].gpus.get("node1") == [0, 1, 1], 10,
                 "the matrix to follow (keeper agent)")
        # Nothing changes now: the record is not written again before its keep-alive (the
        # agent probes every interval, writes on change: idle agents cost ZooKeeper nothing).
        written = client.exists(layout.resource("node1")).version
        time.sleep(3 * inventory.nodes["node1"].settings.agent_interval)
        assert client.exists(layout.resource("node1")).version == written
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=10) == 0
        started = time.monotonic()
        assert "node1" not in store.Store(client, layout).records()
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


@pytest.mark.flaky(reruns=1)  # seen once under the parallel suite's load: a metric not yet
# updated (the metrics are now waited for; the rerun stays for what else load may show)
def test_processes_on_a_gpu_show_in_record_status_and_metrics(agent_inventory):
    """Busy by process: a foreign process (an idle one, below every threshold) and a
    HyperTF task on a GPU it was not granted both make the GPU unavailable; status names
    them, and the agent's /metrics on its management address shows the same."""
    path, gpus = agent_inventory
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data = yaml.safe_load(path.read_text())
    data["all"]["vars"]["hypertf_agent_metrics_port"] = port
    path.write_text(yaml.safe_dump(data))
    inventory = load_inventory(path)
    layout = store.Layout(inventory.cluster.zk_root)
    key = "20261122-085000-a1b2c3.alice"
    foreign = subprocess.Popen(["sleep", "300"])
    stray = subprocess.Popen(["sleep", "300"], env={**os.environ, "HYPERTF_TASK_KEY": key})
    gpus.write_text(json.dumps([{"processes": [foreign.pid]}, {"processes": [stray.pid]}, {}]))
    agent = subprocess.Popen([sys.executable, "-m", "hypertf.cli", "agent", "-i", str(path),
                              "--host", "node1"], stderr=subprocess.PIPE, text=True)
    client = store.connect(inventory.cluster)
    try:
        record = wait_for(lambda: store.Store(client, layout).records().get("node1"), 20,
                          "the record")
        assert record.gpu_avail_list == [2]
        assert record.gpus[0].reason == f"foreign process pid {foreign.pid}"
        assert record.gpus[1].reason == f"in use by {key}"
        assert record.gpus[1].processes == [store.GpuProcess(stray.pid, None, key)]
        wait_for(lambda: Store(client, layout).matrix.read()[0].gpus.get("node1") == [0, 0, 1], 10,
                 "the matrix to follow")
        view = status.collect(client, inventory)
        first, second, third = view["hosts"][0]["gpus"]
        assert (first["state"], first["foreign_pids"]) == ("unavailable", [foreign.pid])
        assert second["foreign_pids"] == [stray.pid]  # not granted to its job: foreign here
        assert third["foreign_pids"] == [] and third["state"] == "free"
        console = Console(record=True, width=300)
        statustable.render(view, console)
        assert f"busy-with-foreign-process pid {foreign.pid}" in console.export_text()
        # the compact view of a large cluster reads no GPU detail it does not show
        compact = status.collect(client, inventory, gpu_details=False)
        out = io.StringIO()
        statustable.render_compact(compact, Console(file=out, width=300))
        line = out.getvalue().splitlines()[3]
        assert f"unavailable (foreign process pid {foreign.pid}) busy-with-foreign-process " \
               f"pid {foreign.pid} 0" in line and line.endswith("; free 2")
        assert "name" not in compact["hosts"][0]["gpus"][2]  # shared, details left out

        foreign_line = ('hypertf_gpu_foreign_processes{gpu="0",host="node1",name="Static GPU",'
                        'uuid="GPU-static-node1-0"} 1.0')

        def metrics() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                return reply.read().decode()

        # the gauges follow the published record (under load, a moment later)
        wait_for(lambda: foreign_line in metrics(), 10, "the metrics to follow the record")
        text = metrics()
        assert 'hypertf_gpu_state{gpu="2",host="node1",name="Static GPU",state="free",' \
               'uuid="GPU-static-node1-2"} 1.0' in text
        assert "hypertf_agent_heartbeat_age_seconds" in text

        foreign.kill()
        stray.kill()
        gpus.write_text(json.dumps([{}, {}, {}]))
        wait_for(lambda: Store(client, layout).matrix.read()[0].gpus.get("node1") == [1, 1, 1], 10,
                 "the GPUs to free when the processes are gone")
    finally:
        for process in (agent, foreign, stray):
            if process.poll() is None:
                process.kill()
                process.wait()
        store.close(client)
