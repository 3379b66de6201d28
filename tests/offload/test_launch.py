"""``hypertf train --offload-hosts`` on the lab: the job takes hosts that run no task, each
task's matrix products go over MPI (hydra over the lab's pinned SSH) to processors there,
and nothing of the world is left behind: not on success, not when an offload host's
processor is SIGKILLed (local fallback, the job succeeds), not when the launcher is."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hypertf.config.inventory import load_inventory
from hypertf.launch.remote import Cluster
from tests.conftest import wait_for
from tests.launcher.helpers import (
    EXAMPLES,
    all_free,
    hypertf,
    processes_of,
    start_hypertf,
    status,
    summaries,
    task_key,
    until_line,
)
from tests.offload.conftest import OFFLOAD_KEY, forget_trust
from tests.offload.test_hook import PROGRAM, check_results

QUIET = ("--env", "TF_CPP_MIN_LOG_LEVEL=2")


def world_processes(inventory: str) -> dict[str, list[str]]:
    """Per lab host, the MPI processes of any offload world (hydra's proxies carry no task
    key; this lab runs one test at a time, so every one found is the test's)."""
    inv = load_inventory(inventory)
    with Cluster(inv.nodes.values(), inv.cluster) as cluster:
        results = cluster.each(lambda s: s.run("ps -eo pid,stat,args", timeout=20))
    found = {}
    for host, result in results.items():
        assert not isinstance(result, BaseException), result
        lines = [line for line in result.stdout.splitlines()
                 if ("hydra_pmi_proxy" in line or "hypertf.offload" in line)
                 and line.split()[1][0] != "Z"]
        if lines:
            found[host] = lines
    return found


def nothing_left(inventory: str, key: str) -> bool:
    return not processes_of(inventory, key) and not world_processes(inventory) and not [
        name for name in os.listdir("/dev/shm") if key in name]


def start_paused(lab, tmp_path: Path) -> tuple[subprocess.Popen[str], str, Path, Path]:
    """The test program through the launcher, 1 worker and 2 offload hosts, paused after
    its first products (until the test touches ``go``)."""
    out, go = tmp_path / "out", tmp_path / "go"
    out.mkdir()
    job = start_hypertf("train", "-i", lab.inventory, "--script", str(PROGRAM), "--worker", "1",
                        "--offload-hosts", "2", "--offload-min-flops", "1000", *QUIET, "--",
                        str(out), "--pause", str(go), cwd=tmp_path)
    key = task_key(until_line(job, ": started"))
    wait_for(lambda: (out / "paused").exists() or job.poll() is not None, 120,
             "the program to pause")
    assert job.poll() is None, job.stdout.read()
    return job, key, out, go


def test_a_job_offloads_to_hosts_of_its_own_and_leaves_nothing(lab, tmp_path):
    job, key, out, go = start_paused(lab, tmp_path)
    report = status(lab.inventory)
    cpu_only = {h["name"]: h["cpu_jobs"] for h in report["hosts"]}
    assert cpu_only == {"h1": [], "h2": [key], "h3": [key]}, cpu_only  # held, shown
    running = processes_of(lab.inventory, key)
    assert sorted(running) == ["h1", "h2", "h3"], running
    assert all("hypertf.offload.processor" in " ".join(running[h]) for h in ("h2", "h3"))
    go.touch()
    output, _ = job.communicate(timeout=120)
    assert job.returncode == 0, output
    (summary,) = summaries(tmp_path)
    offload = summary["offload"]
    assert (offload["ops"], offload["fallbacks"], offload["local"]) == (8, 0, 1), offload
    assert offload["hosts"] == ["h2", "h3"] and not offload["failed"]
    assert [t["host"] for t in summary["tasks"]] == ["h1"]
    assert re.search(r"offloaded 8 matmuls \([0-9.e-]+ GB, [0-9.]+ s\) over 2 hosts", output)
    check_results(out)
    assert nothing_left(lab.inventory, key)
    assert all_free(lab.inventory)


def test_an_offload_host_killed_mid_job_falls_back_and_the_job_succeeds(lab, tmp_path):
    job, key, out, go = start_paused(lab, tmp_path)
    (processor,) = [line for line in processes_of(lab.inventory, key)["h3"]
                    if "hypertf.offload.processor" in line]
    inv = load_inventory(lab.inventory)
    with Cluster([inv.node("h3")], inv.cluster) as cluster:
        killed = cluster.each(lambda s: s.run(f"kill -KILL {int(processor.split()[0])}"))
    assert not killed.failed
    go.touch()
    output, _ = job.communicate(timeout=180)
    assert job.returncode == 0, output
    (summary,) = summaries(tmp_path)
    offload = summary["offload"]
    assert offload["fallbacks"] >= 1 and offload["failed"], offload
    assert "computed locally after a failure" in output
    log = (tmp_path / "runs" / key / "worker0.log").read_text()
    warnings = [line for line in log.splitlines() if line.startswith("hypertf offload:")]
    assert len(warnings) == 1, log[-3000:]
    check_results(out)
    wait_for(lambda: nothing_left(lab.inventory, key), 30, "the world to end")
    assert all_free(lab.inventory)


def test_a_node_left_out_of_the_offload_setup_fails_the_world_in_one_line(lab, tmp_path):
    """h3 as a node that cluster.setup never gave ``hypertf_offload: true``: no cluster key
    authorized there, none of its own. The world cannot start; the task says so in one line
    naming the setting and the command, and the job succeeds with local products."""
    ssh = lab.dir / "h3" / "home" / ".ssh"
    authorized = ssh / "authorized_keys"
    forget_trust(lab)  # the next test sets it up again
    authorized.write_text("".join(line for line in authorized.read_text().splitlines(True)
                                  if "hypertf-offload" not in line))
    for name in (OFFLOAD_KEY, "hypertf_offload_known_hosts"):
        (ssh / name).unlink()
    out = tmp_path / "out"
    out.mkdir()
    done = hypertf("train", "-i", lab.inventory, "--script", str(PROGRAM), "--worker", "1",
                   "--offload-hosts", "2", "--offload-min-flops", "1000", *QUIET, "--",
                   str(out), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    key = task_key(done.stdout)
    log = (tmp_path / "runs" / key / "worker0.log").read_text()
    warnings = [line for line in log.splitlines() if line.startswith("hypertf offload:")]
    assert len(warnings) == 1, log[-3000:]
    print(warnings[0])
    assert "hypertf_offload: true" in warnings[0] and "invoke cluster.setup" in warnings[0]
    assert lab.host("h3").address in warnings[0], warnings[0]
    (summary,) = summaries(tmp_path)
    assert summary["offload"]["ops"] == 0 and summary["offload"]["failed"], summary["offload"]
    check_results(out)
    assert nothing_left(lab.inventory, key)
    assert all_free(lab.inventory)


def test_a_sigkilled_launcher_leaves_no_offload_process(lab, tmp_path):
    job, key, _, _ = start_paused(lab, tmp_path)
    job.send_signal(signal.SIGKILL)
    job.communicate(timeout=30)
    # the lease expires, the agent of h1 stops the task's group (runner, mpiexec, agent);
    # the processors end with their SSH connections
    wait_for(lambda: nothing_left(lab.inventory, key), 90, "the agents to reap the job")
    wait_for(lambda: all_free(lab.inventory), 90, "the GPUs and ports to return")


@pytest.mark.tf
def test_the_digits_example_trains_to_the_same_accuracy_with_offload_hosts(lab, tmp_path):
    """examples/keras_fit.py, unmodified, through the launcher with --offload-hosts 2, and
    the same program run here without offload: test accuracy within 0.01."""
    pytest.importorskip("tf_keras")
    example = str(EXAMPLES / "keras_fit.py")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "1"}
    local = subprocess.Popen([sys.executable, example, "--epochs", "3"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    done = hypertf("train", "-i", lab.inventory, "--script", example, "--worker", "1",
                   "--offload-hosts", "2", "--offload-min-flops", "1000", *QUIET,
                   "--env", "TF_USE_LEGACY_KERAS=1", "--", "--epochs", "3", cwd=tmp_path,
                   timeout=600)
    local_out, _ = local.communicate(timeout=max(60.0, 300 - (time.monotonic() - started)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert local.returncode == 0, local_out[-2000:]
    accuracy = {name: float(re.findall(r"test_accuracy=([0-9.]+)", text)[-1])
                for name, text in (("local", local_out), ("offloaded", done.stdout))}
    (summary,) = summaries(tmp_path)
    assert summary["offload"]["ops"] > 100 and summary["offload"]["fallbacks"] == 0, \
        json.dumps(summary["offload"])[:2000]
    assert abs(accuracy["local"] - accuracy["offloaded"]) <= 0.01, accuracy
    assert all_free(lab.inventory)
