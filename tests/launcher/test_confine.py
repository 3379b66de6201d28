"""Grants enforced by the kernel on the lab (issue 50, docs/gpu.md "Confinement"): a task
opens only its granted GPU's device node (195:<index>, made here with mknod: an allowed one
without a driver gives ENXIO, a refused one EPERM), whatever it does to its own
CUDA_VISIBLE_DEVICES; a daemon it double-forks and setsids ends with the job (success,
failure, a SIGKILLed launcher), before the job's GPUs are free."""

from __future__ import annotations

import os
import re
import secrets
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import LAB_GPUS, wait_for
from tests.launcher.helpers import (
    REPO,
    all_free,
    hypertf,
    start_hypertf,
    status,
    strict_env,
    until_line,
)

TASK = str(REPO / "tests" / "scripts" / "confined_task.py")


@pytest.fixture
def devices(tmp_path: Path) -> list[str]:
    """/dev/nvidia0.. as device nodes in a folder every lab host sees (outside /srv)."""
    folder = tmp_path / "dev"
    folder.mkdir()
    paths = []
    for minor in range(LAB_GPUS):
        path = folder / f"nvidia{minor}"
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(195, minor))
        paths.append(str(path))
    return paths


def daemons(token: str) -> list[int]:
    """This machine's processes with ``token`` in their command line (the lab's hosts
    are PID namespaces of this machine: their processes are here too)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def job_cgroups(lab, key: str) -> list[Path]:
    from hypertf.node import confine
    from hypertf.ops.labcluster import cgroup_root

    return [d for mount in confine.mounts() if mount
            for d in Path(mount, cgroup_root(lab)).glob(f"*/*/{key}")]


def test_a_task_opens_only_its_gpu_and_its_daemon_ends_with_the_job(lab, tmp_path, devices):
    token = str(secrets.randbelow(10 ** 12))
    done = hypertf("train", "-i", lab.inventory, "--script", TASK, "--worker", "2",
                   "--", "--devices", *devices, "--daemon", token, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not daemons(token), "a task's setsid daemon outlived its job"
    assert all_free(lab.inventory)
    said = re.findall(r"\[(worker:\d)@\S+\] cuda=GPU-static-\S+-(\d) opens: (.*)", done.stdout)
    widened = re.findall(r"\[(worker:\d)@\S+\] widened opens: (.*)", done.stdout)
    assert len(said) == 2 and len(widened) == 2, done.stdout
    for (task, gpu, opens), (_, after) in zip(sorted(said), sorted(widened), strict=True):
        expected = " ".join(f"{path}={'ENXIO' if index == int(gpu) else 'EPERM'}"
                            for index, path in enumerate(devices))
        assert opens == expected, (task, opens)
        assert after == expected, "widening CUDA_VISIBLE_DEVICES changed what opens"
    assert "not confined" not in done.stdout
    key = re.search(r"job (\S+): started", done.stdout).group(1)
    wait_for(lambda: not job_cgroups(lab, key), 10, "the agents to remove the job's cgroups")


def test_a_failed_jobs_daemon_ends_with_it(lab, tmp_path):
    token = str(secrets.randbelow(10 ** 12))
    done = hypertf("train", "-i", lab.inventory, "--script", TASK, "--worker", "1",
                   "--", "--daemon", token, "--exit_code", "3", cwd=tmp_path)
    assert done.returncode != 0, done.stdout + done.stderr
    assert not daemons(token)
    assert all_free(lab.inventory)


def running_with_daemon(lab, tmp_path: Path) -> tuple[subprocess.Popen[str], str, list[str]]:
    """A launcher whose one task left a setsid daemon and runs on: (it, the daemon's
    token, its output so far)."""
    token = str(secrets.randbelow(10 ** 12))
    job = start_hypertf("train", "-i", lab.inventory, "--script", TASK, "--worker", "1",
                        "--", "--daemon", token, "--work_s", "300", cwd=tmp_path)
    lines = until_line(job, "widened opens")
    assert daemons(token), "".join(lines)
    return job, token, lines


def test_a_killed_launchers_daemon_is_gone_before_its_gpu_is_free(lab, tmp_path):
    job, token, _ = running_with_daemon(lab, tmp_path)
    job.send_signal(signal.SIGKILL)  # nobody left to stop the task: the agent does
    job.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all_free(lab.inventory):  # then, after it was freed, nothing of the job lives
            assert not daemons(token), "the job's GPU was free while its daemon still ran"
            break
        time.sleep(0.2)
    else:
        pytest.fail("the job's GPU was not freed within 60 s")
    assert not daemons(token)


def test_status_and_preflight_show_each_nodes_confinement(lab):
    report = status(lab.inventory)
    assert {host["confine"] for host in report["hosts"]} == {"devices+cgroup"}


def test_a_node_that_cannot_confine_runs_the_job_with_a_notice(lab, tmp_path):
    """As an agent that found no writable cgroup hierarchy writes it (cgroups.json); the
    launcher says so for the job's host and the job runs as before (the trespass
    detector). Preflight's cache is off: an answer from before the change would hide it."""
    from hypertf.config import environment
    from hypertf.node import confine

    files = [lab.dir / h.name / "srv" / "hypertf" / confine.STATE_FILE for h in lab.hosts]
    kept = [path.read_text() for path in files]
    why = "cgroup v2 (/sys/fs/cgroup/unified/x: Read-only file system)"
    for path in files:
        confine.write_state(path.parent, confine.NodeCgroups(why=why))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "hypertf.cli", "train", "-i", lab.inventory, "--script",
             TASK, "--worker", "1", "--", "--work_s", "0"], cwd=tmp_path, capture_output=True,
            text=True, timeout=120,
            env={**strict_env(), environment.PREFLIGHT_CACHE_S.name: "0"})
    finally:
        for path, text in zip(files, kept, strict=True):
            path.write_text(text)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(rf"hypertf: notice: h\d: tasks not confined \(none: {re.escape(why)}\)",
                     done.stdout), done.stdout
    assert all_free(lab.inventory)


def test_hypertf_kill_ends_a_jobs_daemon_too(lab, tmp_path):
    job, token, lines = running_with_daemon(lab, tmp_path)
    key = re.search(r"job (\S+): started", "".join(lines)).group(1)
    killed = hypertf("kill", "-i", lab.inventory, key, cwd=tmp_path)
    assert killed.returncode == 0, killed.stdout + killed.stderr
    job.communicate(timeout=60)
    assert job.returncode != 0
    wait_for(lambda: all_free(lab.inventory), 30, "the killed job's GPU to be free")
    assert not daemons(token), "a killed job's daemon outlived it"
