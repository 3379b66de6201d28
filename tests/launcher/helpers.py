"""Helpers for launcher tests: run the real CLI, read what it left, look on every host."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from hypertf.config import environment
from hypertf.config.inventory import load_inventory
from hypertf.launch.remote import Cluster

REPO = Path(__file__).resolve().parents[2]
FAKE = str(REPO / "tests" / "scripts" / "fake_tf.py")
EXAMPLES = REPO / "examples"


def strict_env() -> dict[str, str]:
    """The environment of a launcher under test: it refuses a node message it cannot read
    (hypertf.core.protocol) instead of passing it on as noise."""
    return {**os.environ, environment.PROTOCOL_STRICT.name: "1"}


def hypertf(*argv: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hypertf.cli", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=strict_env())


STARTED: list[subprocess.Popen[str]] = []


def start_hypertf(*argv: str, cwd: Path) -> subprocess.Popen[str]:
    """A launcher in the background; the test session stops it if the test does not."""
    job = subprocess.Popen([sys.executable, "-m", "hypertf.cli", *argv], cwd=cwd,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=strict_env())
    STARTED.append(job)
    return job


def stop_started(grace_s: float = 60) -> None:
    """Interrupt every launcher still running (it stops its tasks and releases), by PID;
    KILL it if it does not exit within ``grace_s``."""
    while STARTED:
        job = STARTED.pop()
        if job.poll() is None:
            job.send_signal(signal.SIGINT)
            try:
                job.communicate(timeout=grace_s)
            except subprocess.TimeoutExpired:
                job.kill()
                job.communicate()
        elif job.stdout is not None:
            job.stdout.close()


def finish_file(cwd: Path) -> Path:
    """A file whose creation ends every fake task run with ``--until_file`` (the lab's hosts
    share this machine's filesystem outside /srv)."""
    return cwd / "finish-now"


def until_line(job: subprocess.Popen[str], needle: str) -> list[str]:
    """Read the launcher's output until ``needle`` shows up (or the launcher exits)."""
    lines: list[str] = []
    for line in job.stdout:
        lines.append(line)
        if needle in line:
            break
    return lines


def task_key(lines: list[str]) -> str:
    """The task key from the launcher's 'job KEY: started ...' line."""
    return re.search(r"job (\S+): started", "".join(lines)).group(1)


def summaries(cwd: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cwd / "runs").glob("*/summary.json"))]


def status(inventory: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "hypertf.cli", "status", "--json", "-i",
                           inventory], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def all_free(inventory: str) -> bool:
    report = status(inventory)
    return not report["jobs"] and all(
        gpu["state"] == "free" for host in report["hosts"] for gpu in host["gpus"]
    ) and all(host["ports_reserved"] == 0 for host in report["hosts"])


def processes_of(inventory: str, task_key: str = "") -> dict[str, list[str]]:
    """Per host, every live process of the job (of any job by default), children included.

    Found by the HYPERTF_TASK_KEY in their environment, which every child inherits.
    """
    inv = load_inventory(inventory)
    with Cluster(inv.nodes.values(), inv.cluster) as cluster:
        results = cluster.each(lambda s: s.run("ps eww -eo pid,stat,args", timeout=20))
    found = {}
    marker = f"HYPERTF_TASK_KEY={task_key}"
    for host, result in results.items():
        assert not isinstance(result, BaseException), result
        lines = [line.split(" HYPERTF_TASK_KEY=")[0] for line in result.stdout.splitlines()
                 if marker in line and line.split()[1][0] != "Z"]
        if lines:
            found[host] = lines
    return found
