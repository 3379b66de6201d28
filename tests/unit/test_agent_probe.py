"""The agent's probe does work proportional to change: an idle node's record is built once."""

from __future__ import annotations

import json
import socket
import sys
import time

import yaml

from hypertf.config.inventory import load_inventory
from hypertf.node import agent
from hypertf.node.metrics import AgentCollector, MetricsServer
from hypertf.node.probes import StaticGpuSource


def prober(tmp_path, gpus):
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": "127.0.0.1:2181", "hypertf_zk_root": "/p",
                 "hypertf_gpu_source": "static", "hypertf_static_gpus": str(gpus),
                 "hypertf_workdir": str(tmp_path / "work"), "hypertf_venv": sys.prefix},
        "children": {"gpu_nodes": {"hosts": {"node1": {"ansible_connection": "local"}}}},
    }}))
    node = load_inventory(path).node("node1")
    return agent.Prober(node, StaticGpuSource(node.name, str(gpus)))


def test_an_unchanged_node_gives_back_its_last_record_and_a_change_a_new_one(tmp_path):
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps([{}, {}]))
    probe = prober(tmp_path, gpus)
    first = probe.probe()
    assert probe.probe() is first  # nothing to serialise or compare again
    gpus.write_text(json.dumps([{}, {"utilization": 97}]))
    changed = probe.probe()
    assert changed is not first and changed.gpu_avail_list == [0]
    assert probe.probe() is changed


def test_a_gpu_with_a_process_is_judged_again_at_every_probe(tmp_path):
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps([{"processes": [1]}]))  # pid 1: a foreign process
    probe = prober(tmp_path, gpus)
    first = probe.probe()
    assert first.gpus[0].reason.startswith("foreign process")
    assert probe.probe() is not first  # its job is read from /proc each time


def test_the_nics_are_read_again_after_a_while_or_for_a_new_session(tmp_path, monkeypatch):
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps([{}]))
    reads = []
    real = agent.ipv4_addresses
    monkeypatch.setattr(agent, "ipv4_addresses", lambda: reads.append(1) or real())
    probe = prober(tmp_path, gpus)
    for _ in range(5):
        probe.probe()
    assert len(reads) == 1
    monkeypatch.setattr(agent, "ADDRESSES_EVERY_S", 0.0)  # due again at once from now on
    probe.probe(fresh=True)
    assert len(reads) == 2
    probe.probe()
    assert len(reads) == 3


def test_the_metrics_server_sleeps_until_scraped_and_stops_at_once():
    server = MetricsServer(AgentCollector("node1"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert server.start("127.0.0.1", port)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 1.0
    with socket.socket() as again:  # the port is free again
        again.bind(("127.0.0.1", port))
