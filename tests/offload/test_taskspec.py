"""The launcher's side of a task's offload (pure): the spec's round trip, hydra's command
line across hosts, the SSH config that pins host keys, the job's summary and last line."""

from __future__ import annotations

import dataclasses
import json

from hypertf.offload.runner import ssh_config
from hypertf.offload.taskspec import DEFAULT_PORT_RANGE, OffloadHost, Spec, line, summarize
from hypertf.offload.world import mpiexec_argv, network_env

SPEC = Spec(hosts=(OffloadHost("10.0.0.2", 2222, "alice", "/opt/venv/bin/python"),
                   OffloadHost("10.0.0.3")),
            channel="/hypertf-offload-KEY-worker0", local_address="10.0.0.1",
            known_hosts="/etc/hypertf/known_hosts", key_file="/home/alice/.ssh/id_ed25519",
            min_flops=1000)


def test_the_spec_survives_its_json():
    assert Spec.from_json(SPEC.to_json()) == SPEC


def test_the_ssh_config_pins_host_keys_and_never_asks():
    config = ssh_config(SPEC)
    per_host, defaults = config.split("Host *")
    assert "Host 10.0.0.2\n  Port 2222\n  User alice" in per_host  # first: ssh keeps it
    assert "Host 10.0.0.3\n  Port 22\n" in per_host
    for option in ("StrictHostKeyChecking yes", "BatchMode yes",
                   "UserKnownHostsFile /etc/hypertf/known_hosts",
                   "IdentityFile /home/alice/.ssh/id_ed25519", "IdentitiesOnly yes"):
        assert option in defaults


def test_hydra_puts_the_agent_here_and_one_processor_on_each_host():
    argv = mpiexec_argv("/c", 2, "/venv/bin/python", hosts=["10.0.0.2", "10.0.0.3"],
                        launcher_exec="/run/ssh", iface="eth0",
                        remote_python=["/opt/venv/bin/python", "/srv/venv/bin/python"])
    assert argv[:7] == ["mpiexec", "-launcher", "ssh", "-launcher-exec", "/run/ssh", "-iface",
                        "eth0"]
    assert argv[argv.index("-hosts") + 1] == "localhost:1,10.0.0.2:1,10.0.0.3:1"
    agent, *processors = " ".join(argv).split(" : ")
    assert "-n 1 /venv/bin/python -m hypertf.offload.agent --channel /c" in agent
    # the processors run in "/": the task's own working directory exists on its node only;
    # each with its own host's venv (issue 42 item 4): a section per host, in slot order
    assert processors == ["-n 1 -wdir / /opt/venv/bin/python -m hypertf.offload.processor",
                          "-n 1 -wdir / /srv/venv/bin/python -m hypertf.offload.processor"]


def test_the_summary_adds_the_tasks_and_the_line_says_what_went():
    per_task = {"worker:0": {"ops": 8, "bytes": 2_000_000_000, "seconds": 1.25, "fallbacks": 0,
                             "local": 1, "failed": ""},
                "worker:1": {"ops": 2, "bytes": 500_000_000, "seconds": 0.5, "fallbacks": 3,
                             "local": 0, "failed": "the agent did not answer"}}
    summary = summarize(per_task, ["h3", "h4"])
    assert (summary["ops"], summary["bytes"], summary["fallbacks"]) == (10, 2_500_000_000, 3)
    assert summary["failed"] == {"worker:1": "the agent did not answer"}
    assert line(summary) == ("hypertf: offloaded 10 matmuls (2.5 GB, 1.8 s) over 2 hosts; 3 "
                             "computed locally after a failure (worker:1: the agent did not "
                             "answer)")


def test_hydras_port_comes_from_the_setting_and_ucx_stays_on_the_data_interface():
    """hypertf_offload_port_range reaches mpiexec as MPIEXEC_PORT_RANGE (low:high), through
    the spec's JSON; UCX is held to the task's data interface (its listeners bind there)."""
    spec = Spec.from_json(dataclasses.replace(SPEC, port_range=(23000, 23009)).to_json())
    assert spec.port_range == (23000, 23009)
    assert network_env("eth1", spec.port_range) == {
        "UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth1", "MPIEXEC_PORT_RANGE": "23000:23009"}
    older = json.loads(SPEC.to_json())
    del older["port_range"]  # a spec from a launcher before the setting
    assert Spec.from_json(json.dumps(older)).port_range == DEFAULT_PORT_RANGE
