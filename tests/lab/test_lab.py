"""The lab and the agents on it: real namespaces, real sshd, real ZooKeeper."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

from hypertf.ops import lab as lab_module
from hypertf.ops import labcluster
from tests.conftest import on_host, wait_for

HYPERTF = [sys.executable, "-m", "hypertf.cli"]


def status(lab: lab_module.Lab) -> dict:
    done = subprocess.run([*HYPERTF, "status", "--json", "-i", lab.inventory],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def ssh(lab: lab_module.Lab, host: str, command: str) -> str:
    return on_host(lab.inventory, host, command)


def row_states(report: dict, host: str) -> list[str]:
    entry = next(h for h in report["hosts"] if h["name"] == host)
    return [gpu["state"] for gpu in entry["gpus"]]


def test_three_agents_three_records_and_a_3x4_matrix(lab):
    report = status(lab)
    assert [h["name"] for h in report["hosts"]] == ["h1", "h2", "h3"]
    for host in report["hosts"]:
        assert host["agent"] == "up"
        assert host["data_addr"] == lab.host(host["name"]).address
        assert host["gpus"] == [
            {"index": i, "state": "free", "task_key": None, "name": "Static GPU",
             "uuid": f"GPU-static-{host['name']}-{i}", "utilization": 0.0, "memory_used": 0,
             "memory_total": 16 * 1024**3, "reason": "", "mig": False, "foreign_pids": []}
            for i in range(4)
        ]
    assert report["zookeeper"]["servers"][0]["mode"] == "standalone"
    # Each host really is its own machine: own hostname, own /srv.
    assert ssh(lab, "h2", "hostname").strip() == "h2"
    assert "agent.pid" in ssh(lab, "h2", "ls /srv/hypertf")


def test_agent_metrics_answer_on_the_management_address_only(lab):
    """Prometheus can scrape each node over the lab's network; the agent listens nowhere
    else (not on the node's loopback)."""
    address = lab.host("h2").address
    with urllib.request.urlopen(f"http://{address}:9401/metrics", timeout=10) as reply:
        text = reply.read().decode()
    assert ('hypertf_gpu_state{gpu="3",host="h2",name="Static GPU",state="free",'
            'uuid="GPU-static-h2-3"} 1.0') in text
    assert 'hypertf_agent_info{gpu_source="static",host="h2"} 1.0' in text
    probe = ("python3 -c \"import socket; s = socket.socket(); "
             "print(s.connect_ex(('127.0.0.1', 9401)))\"")
    assert ssh(lab, "h2", probe).strip() != "0"


def test_killed_agent_row_turns_unavailable_then_comes_back(lab):
    ssh(lab, "h3", "kill -KILL $(cat /srv/hypertf/agent.pid)")
    try:
        # Session timeout 4 s in the lab inventory; the keeper agent syncs every second.
        wait_for(lambda: row_states(status(lab), "h3") == ["unavailable"] * 4, 90,
                 "h3's row to turn unavailable")
        report = status(lab)
        assert next(h for h in report["hosts"] if h["name"] == "h3")["agent"] == "down"
        assert row_states(report, "h1") == ["free"] * 4
    finally:
        labcluster.start_lab_agents(lab, wait_s=60)
    wait_for(lambda: row_states(status(lab), "h3") == ["free"] * 4, 90, "h3 back")


def test_agents_reregister_after_zookeeper_restart_with_empty_data(lab):
    server = lab.zk_server()
    try:
        server.stop()
        shutil.rmtree(server.directory / "data")  # a new server: every session is unknown
    finally:
        server.start(heap="192m", tick_ms=500)
        labcluster.secure_lab_root(lab)  # the admin secures the new, empty root
    wait_for(lambda: all(h["agent"] == "up" and row_states(status(lab), h["name"]) == ["free"] * 4
                         for h in status(lab)["hosts"]), 90, "agents to re-register")


def test_second_lab_does_not_collide_and_down_removes_everything(lab, state_home):
    other = lab_module.up(hosts=1, gpus=1)
    try:
        assert other.bridge != lab.bridge
        assert other.gateway.rsplit(".", 1)[0] != lab.gateway.rsplit(".", 1)[0]
        assert status(other)["hosts"][0]["agent"] == "up"
        assert status(lab)["hosts"][0]["agent"] == "up"
    finally:
        lab_module.down(other)
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert other.hosts[0].namespace not in namespaces
    links = subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert other.bridge not in links
    assert not Path(other.directory).exists()
    assert other.zk_server().mode() is None
    wait_for(lambda: not Path(f"/proc/{other.hosts[0].holder_pid}").exists()
             or "Z" in Path(f"/proc/{other.hosts[0].holder_pid}/stat").read_text().split()[2],
             5, "the host's sshd holder to exit")
