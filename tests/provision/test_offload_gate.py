"""The cluster-internal key's forced command (roles/offload_trust/files/hypertf-offload-gate),
run as sshd runs it: SSH_ORIGINAL_COMMAND in its environment. Only hydra's proxy command
line gets through; anything else is refused (exit 126) and logged. And the node side's one
line for a world that failed for want of that trust (hypertf.offload.trust)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hypertf.offload.taskspec import OffloadHost, Spec
from hypertf.offload.trust import FIX, explain, local_problem

GATE = Path(__file__).resolve().parents[2] / "roles" / "offload_trust" / "files" / \
    "hypertf-offload-gate"
# What MPICH 4.0.2's ssh launcher asks for (seen through -launcher-exec).
HYDRA = ('"{proxy}" --control-port 10.1.2.11:21003 --rmk user --launcher ssh --launcher-exec '
         '/srv/hypertf/runs/k/worker0/offload/ssh --demux poll --pgid 0 --retries 10 '
         '--usize -2 --pmi-port 0 --gpus-per-proc -2 --proxy-id 1')


def gate(tmp_path: Path, command: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the gate with a stand-in proxy that prints its argv (the real one would dial
    the control port)."""
    proxy = tmp_path / "hydra_pmi_proxy"
    proxy.write_text('#!/bin/sh\nprintf "%s|" ran "$@"\necho "PATH=$PATH"\n')
    proxy.chmod(0o755)
    log = tmp_path / "gate.log"
    env = {"PATH": "/usr/bin:/bin", "SSH_ORIGINAL_COMMAND": command.format(proxy=proxy),
           "SSH_CLIENT": "10.1.2.11 40000 22"}
    done = subprocess.run([sys.executable, "-I", str(GATE), "--proxy", str(proxy), "--venv",
                           "/opt/hypertf/venv", "--log", str(log)], env=env,
                          capture_output=True, text=True, timeout=30)
    return done, log.read_text() if log.exists() else ""


def test_hydras_proxy_command_runs_with_the_venv_first_on_path(tmp_path):
    done, log = gate(tmp_path, HYDRA)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ran|--control-port|10.1.2.11:21003|--rmk|user|")
    assert "PATH=/opt/hypertf/venv/bin:" in done.stdout
    assert log == ""


@pytest.mark.parametrize("command", [
    "", "bash", "cat /etc/shadow", "python -c 'import os'",
    '"{proxy}" --control-port 10.1.2.11:21003; touch /tmp/owned',
    '"{proxy}" --control-port "$(id)"',
    '"{proxy}" --exec /bin/sh',
    '"{proxy}" --control-port',
    "/usr/bin/hydra_pmi_proxy --control-port 10.1.2.11:21003",  # not the configured proxy
    'sh -c "{proxy}"',
])
def test_anything_else_is_refused_and_logged(tmp_path, command):
    done, log = gate(tmp_path, command)
    assert done.returncode == 126, (done.stdout, done.stderr)
    assert "ran|" not in done.stdout
    assert done.stderr.startswith("hypertf offload gate: refused")
    assert len(log.splitlines()) == 1 and "refused from 10.1.2.11" in log


def spec(tmp_path: Path, key: str, known_hosts: str) -> Spec:
    return Spec(hosts=(OffloadHost("10.1.2.12"),), channel="/c", local_address="10.1.2.11",
                known_hosts=known_hosts, key_file=key)


def test_a_node_without_the_key_is_told_the_setting_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "hosts").write_text("")
    problem = local_problem(spec(tmp_path, "~/.ssh/key", "~/.ssh/hosts"))
    assert problem == f"this node has no cluster-internal SSH key ({tmp_path}/.ssh/key): {FIX}"
    (tmp_path / ".ssh" / "key").write_text("")
    assert local_problem(spec(tmp_path, "~/.ssh/key", "~/.ssh/hosts")) is None
    assert "hypertf_offload: true" in FIX and "invoke cluster.setup" in FIX


@pytest.mark.parametrize(("output", "named"), [
    ("root@10.1.2.13: Permission denied (publickey).\n[mpiexec@h1] ...", "10.1.2.13"),
    ("No ED25519 host key is known for 10.1.2.13 and you have requested strict checking.\n"
     "Host key verification failed.", "10.1.2.13"),
    ("hypertf offload gate: refused: option '--x' is not one hydra's launcher sends", "gate"),
])
def test_trust_failures_in_hydras_output_become_one_line(output, named):
    line = explain("~/.ssh/known", output)
    assert line is not None and "\n" not in line and named in line and line.endswith(FIX)


def test_other_failures_are_left_as_they_are():
    assert explain("~/.ssh/known", "[proxy:0:1@h2] HYDU_create_process: execvp error") is None
    assert os.path.basename(str(GATE)) == "hypertf-offload-gate"
