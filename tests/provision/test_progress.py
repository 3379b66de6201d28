"""How cluster.setup reports a run, from the callback's events (no Ansible, no lab)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from hypertf.ops.labprovision import lab_inventory
from hypertf.ops.provision import PlaybookRun, Progress, recap


def feed(*events: dict) -> tuple[Progress, list[str]]:
    lines: list[str] = []
    progress = Progress(lines.append)
    for event in events:
        progress.feed(event)
    return progress, lines


def stats(**hosts: dict) -> dict:
    base = {"ok": 0, "changed": 0, "failures": 0, "unreachable": 0, "skipped": 0,
            "rescued": 0, "ignored": 0}
    return {"e": "stats", "hosts": {h: {**base, **c} for h, c in hosts.items()}}


def task(role: str, name: str, t: float = 1.0) -> dict:
    return {"e": "task", "role": role, "task": name, "t": t}


def result(host: str, status: str, role: str, name: str, **extra: object) -> dict:
    return {"e": "result", "host": host, "status": status, "role": role, "task": name, **extra}


def test_one_line_per_task_with_every_hosts_outcome_and_skipped_tasks_left_out():
    _, lines = feed(
        {"e": "play", "name": "Install", "check": False},
        task("python_env", "Create the virtualenv"),
        result("h2", "ok", "python_env", "Create the virtualenv"),
        result("h1", "changed", "python_env", "Create the virtualenv"),
        task("python_env", "Copy the wheels", 2.0),
        result("h1", "skipped", "python_env", "Copy the wheels"),
        stats(h1={"ok": 1, "changed": 1}, h2={"ok": 1}),
    )
    assert lines == ["== Install",
                     "  [   1.0s] python_env | Create the virtualenv: h1 changed, h2 ok"]


def test_a_failed_node_is_named_with_its_step_and_the_others_complete():
    progress, lines = feed(
        {"e": "play", "name": "Install", "check": False},
        task("python_env", "Read the node Python's version"),
        result("h1", "ok", "python_env", "Read the node Python's version"),
        result("h2", "failed", "python_env", "Read the node Python's version",
               msg="Error executing command.\nNo such file"),
        stats(h1={"ok": 9, "changed": 3}, h2={"ok": 2, "failures": 1}),
    )
    assert ("  !! h2 FAILED at python_env | Read the node Python's version: "
            "Error executing command.") in lines
    assert progress.hosts["h1"].status == "changed" and progress.hosts["h1"].failed_step is None
    assert progress.hosts["h2"].status == "failed"
    assert progress.hosts["h2"].failed_step == "python_env | Read the node Python's version"


def test_a_failure_on_the_control_machine_leaves_every_node_unfinished():
    step = "python_env | Build HyperTF's wheel and fill the wheel directory"
    progress, _ = feed(
        {"e": "play", "name": "Install", "check": False},
        task("python_env", "Note the packages"),
        result("h1", "ok", "python_env", "Note the packages"),
        result("h2", "ok", "python_env", "Note the packages"),
        task("python_env", "Build HyperTF's wheel and fill the wheel directory"),
        result("h1", "failed", "python_env", "Build HyperTF's wheel and fill the wheel directory",
               msg="pip wheel failed", run_once=True),
        stats(h1={"ok": 1, "failures": 1}, h2={"ok": 1}),
    )
    assert {h.name: (h.status, h.failed_step) for h in progress.hosts.values()} == {
        "h1": ("failed", step), "h2": ("failed", step)}


def test_recap_says_when_nothing_changed(tmp_path):
    progress, _ = feed(stats(h1={"ok": 40}, h2={"ok": 20}))
    lines: list[str] = []
    run = PlaybookRun(playbook=Path("deploy.yml"), inventory=Path("i.yml"), check=False,
                      returncode=0, seconds=12.0, log=tmp_path / "log", hosts=progress.hosts)
    recap(run, lines.append)
    assert lines[-1] == "No changes: every node was already set up (12 s)."


def test_lab_inventory_puts_state_under_srv_and_zookeeper_on_the_named_hosts(tmp_path):
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_user": "root", "hypertf_known_hosts": str(tmp_path / "known_hosts"),
                 "hypertf_venv": "/shared/venv", "hypertf_zookeeper_hosts": "10.0.0.1:2181",
                 "ansible_ssh_common_args": "-o ControlMaster=no"},
        "children": {"gpu_nodes": {"hosts": {"h1": {"ansible_host": "10.0.0.11"},
                                             "h2": {"ansible_host": "10.0.0.12"}}}}}}))
    path = lab_inventory(tmp_path, zookeeper=["h2"], operator_dir=tmp_path / "op",
                         host_vars={"h1": {"python_env_python": "/x"}})
    variables = yaml.safe_load(path.read_text())["all"]["vars"]
    children = yaml.safe_load(path.read_text())["all"]["children"]
    assert variables["hypertf_venv"] == "/srv/hypertf/venv"
    assert "hypertf_zookeeper_hosts" not in variables
    assert children["zookeeper"] == {"hosts": {"h2": {"ansible_host": "10.0.0.12"}}}
    assert variables["hypertf_known_hosts"] == str(tmp_path / "op" / "known_hosts")
    assert variables["ansible_ssh_common_args"] == (
        f"-o UserKnownHostsFile={tmp_path / 'op' / 'known_hosts'} -o StrictHostKeyChecking=yes")
    assert variables["python_env_offline"] is True
    assert variables["zookeeper_data_dir"].startswith("/srv/")
    assert children["gpu_nodes"]["hosts"]["h1"]["python_env_python"] == "/x"


def test_the_agent_role_takes_its_settings_from_hypertf():
    """One source: the hypertf_agent role asks 'hypertf inventory agent-settings' which
    hypertf_* settings a node's agent reads (those marked agent=True in hypertf.config.settings)
    instead of keeping its own list; the controller's own settings stay out."""
    from hypertf.config.settings import AGENT_SETTINGS, SETTINGS

    done = subprocess.run([sys.executable, "-m", "hypertf.cli", "inventory", "agent-settings"],
                          capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == list(AGENT_SETTINGS)
    assert {"hypertf_known_hosts", "hypertf_ssh_timeout", "hypertf_task_env",
            "hypertf_python_packages"}.isdisjoint(AGENT_SETTINGS)
    assert {"hypertf_zk_root", "hypertf_agent_metrics_port", "hypertf_port_range"} <= set(
        AGENT_SETTINGS) <= set(SETTINGS)
    role = Path(__file__).resolve().parents[2] / "roles" / "hypertf_agent"
    role_vars = yaml.safe_load((role / "vars" / "main.yml").read_text())
    assert "__hypertf_agent_settings" not in role_vars, "no hand-kept copy in the role"
    assert "'inventory', 'agent-settings'" in (role / "tasks" / "main.yml").read_text()


def test_dev_up_installs_the_local_inventorys_packages_into_this_venv(tmp_path):
    """./dev.sh up's step: the same settings as the python_env role, into this virtualenv
    (packages already here, so pip needs no index)."""
    import subprocess
    import sys

    path = tmp_path / "local.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": "127.0.0.1:2181",
                 "hypertf_python_packages": ["absl-py"],
                 "hypertf_python_packages_no_deps": ["pyyaml"]},
        "children": {"gpu_nodes": {"hosts": {"localhost": {"ansible_connection": "local"}}}},
    }}))
    done = subprocess.run([sys.executable, "-m", "hypertf.cli", "cluster", "local-packages", "-i",
                           str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "local packages: absl-py, pyyaml" in done.stdout
    path.write_text(path.read_text().replace("- absl-py", "- 7"))
    bad = subprocess.run([sys.executable, "-m", "hypertf.cli", "cluster", "local-packages", "-i",
                          str(path)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "hypertf_python_packages must be a list" in bad.stderr
