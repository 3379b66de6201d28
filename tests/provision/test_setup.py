"""``invoke cluster.setup`` / ``cluster.teardown`` on bare lab hosts, as a user runs them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from hypertf.config.inventory import load_inventory
from hypertf.launch.remote import Session
from hypertf.ops import provision
from hypertf.store import fourletter
from tests.provision.conftest import invoke

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1200)]


def cluster_status(inventory: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "hypertf.cli", "status", "--json", "-i",
                           inventory], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def agents(report: dict) -> dict[str, str]:
    return {h["name"]: h["agent"] for h in report["hosts"]}


def processes(inventory: str, host: str) -> str:
    inv = load_inventory(inventory)
    session = Session(inv.node(host), inv.cluster)
    try:
        return session.run("ps -eo args", timeout=30).stdout
    finally:
        session.close()


def test_check_mode_changes_nothing_and_a_failing_node_is_named(make_lab, lab_inventory,
                                                                ansible_dirs):
    lab = make_lab(hosts=2)
    env = {**os.environ, **ansible_dirs}
    check = lab_inventory(lab.dir, name="check.yml", tensorflow="")
    done = invoke("cluster.setup", "--check", "-i", str(check), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "would change" in done.stdout
    assert not (lab.dir / "h1" / "srv" / "hypertf").exists()
    assert not (lab.dir / "h2" / "srv" / "hypertf").exists()

    # h2's Python does not exist: h2 fails at that step, h1 still gets its agent.
    broken = lab_inventory(
        lab.dir, name="broken.yml", tensorflow="",
        host_vars={"h2": {"python_env_python": "/nonexistent/python3"}})
    done = invoke("cluster.setup", "-i", str(broken), env=env)
    assert done.returncode == provision.ProvisionError.exit_code, done.stdout + done.stderr
    assert re.search(r"h2: failed at python_env \| Read the node Python's version", done.stderr)
    assert "FAILED at python_env | Read the node Python's version" in done.stdout
    assert agents(cluster_status(str(broken))) == {"h1": "up", "h2": "down"}


@pytest.mark.tf
def test_bare_hosts_to_a_trained_example(make_lab, lab_inventory, ansible_dirs, tmp_path):
    """Bare hosts reachable only with the lab's key (held by an ssh-agent, as an operator's
    personal key would be): cluster.setup makes the operator key, pins the host keys, installs
    everything; a second run changes nothing; train runs an example; teardown cleans up."""
    lab = make_lab(hosts=2)  # two are enough to be a cluster; each installs TensorFlow
    operator = lab.dir / "operator"
    inventory = str(lab_inventory(lab.dir, zookeeper=("h1",), operator_dir=operator))
    socket = tmp_path / "agent.sock"
    started = subprocess.run(["ssh-agent", "-a", str(socket)], capture_output=True, text=True,
                             check=True)
    agent_pid = int(re.search(r"SSH_AGENT_PID=(\d+)", started.stdout).group(1))
    try:
        env = {**os.environ, **ansible_dirs, "SSH_AUTH_SOCK": str(socket)}
        subprocess.run(["ssh-add", "-q", str(lab.key_file)], env=env, check=True, timeout=30)

        first = invoke("cluster.setup", "-i", inventory, env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        second = invoke("cluster.setup", "-i", inventory, env=env)
        assert second.returncode == 0, second.stdout + second.stderr
    finally:
        os.kill(agent_pid, signal.SIGTERM)
    assert "No changes: every node was already set up" in second.stdout
    assert (operator / "id_ed25519").stat().st_mode & 0o777 == 0o600
    report = cluster_status(inventory)
    assert agents(report) == {"h1": "up", "h2": "up"}
    assert all([g["state"] for g in h["gpus"]] == ["free", "free"] for h in report["hosts"])
    assert report["zookeeper"]["servers"][0]["mode"] == "standalone"

    # No ssh-agent from here on: HyperTF's launcher logs in with the operator key alone.
    env = {**os.environ, **ansible_dirs}
    env.pop("SSH_AUTH_SOCK", None)
    train = invoke("train", "--script", "examples/mirrored_strategy.py", "--worker", "2",
                   "-i", inventory, env=env)
    assert train.returncode == 0, train.stdout + train.stderr
    accuracy = [float(m) for m in re.findall(r"test_accuracy=([0-9.]+)", train.stdout)]
    assert accuracy and min(accuracy) >= 0.85, train.stdout[-3000:]

    down = invoke("cluster.teardown", "--zookeeper", "-i", inventory, env=env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert fourletter.mode(lab.host("h1").address, 2181) is None
    for host in ("h1", "h2"):
        left = processes(inventory, host)
        assert "hypertf.cli agent" not in left and "QuorumPeerMain" not in left, left
        workdir = lab.dir / host / "srv" / "hypertf"
        assert not (workdir / "agent.pid").exists()
        assert not (workdir / "agent-inventory.yml").exists()
    assert not (lab.dir / "h1" / "srv" / "zookeeper" / "conf").exists()
