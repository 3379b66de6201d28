"""--max-restarts on the lab: a retryable failure stops the whole job and starts it again
as a new attempt (new task key, same checkpoint directory); a script's own failure does
not, unless --restart-on-failure; a host that failed two attempts is left out."""

from __future__ import annotations

import re
import subprocess

import pytest

from hypertf.config.inventory import load_inventory
from tests.conftest import on_host
from tests.launcher.helpers import (
    EXAMPLES,
    FAKE,
    all_free,
    hypertf,
    start_hypertf,
    summaries,
    task_key,
    until_line,
)


def test_a_scripts_own_failure_is_not_restarted_without_restart_on_failure(lab, tmp_path):
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2",
                   "--max-restarts", "2", "--", "--fail_on", "worker:1", "--fail_s", "0",
                   cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "restart" not in done.stdout
    [summary] = summaries(tmp_path)
    assert [a["result"] for a in summary["attempts"]] == ["failed"]
    assert all_free(lab.inventory)


def test_restart_on_failure_gives_new_attempts_and_leaves_out_a_host_failing_twice(lab,
                                                                                    tmp_path):
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2",
                   "--max-restarts", "2", "--restart-on-failure", "--",
                   # 1 s: worker 0 has written its attempt line before worker 1 fails (the
                   # launcher learns of an exit at once and stops the rest; at 0 s worker 0
                   # could be stopped before its first line)
                   "--fail_on", "worker:1", "--fail_s", "1", cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "restart 1 of 2 in 1 s" in out and "restart 2 of 2 in 2 s" in out
    by_key = {s["task_key"]: s for s in summaries(tmp_path)}
    last = max(by_key.values(), key=lambda s: len(s["attempts"]))
    attempts = last["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    assert [a["result"] for a in attempts] == ["failed"] * 3
    hosts = [{t["task"]: t["host"] for t in by_key[a["task_key"]]["tasks"]} for a in attempts]
    failing_host = hosts[0]["worker:1"]
    assert hosts[1]["worker:1"] == failing_host  # one failure: the host stays a candidate
    assert failing_host not in hosts[2].values(), "failed twice: left out of the third"
    # Every attempt saw its number and the same checkpoint directory.
    seen = set()
    for number, attempt in enumerate(attempts, 1):
        log = (tmp_path / "runs" / attempt["task_key"] / "worker0.log").read_text()
        found = re.search(r"attempt=(\d+) checkpoint_dir=(\S+)", log)
        assert found and found.group(1) == str(number), log
        seen.add(found.group(2))
    [checkpoints] = seen
    assert checkpoints == f"/srv/hypertf/checkpoints/{attempts[0]['task_key']}"
    jobs = hypertf("jobs", "-i", lab.inventory, cwd=tmp_path).stdout
    assert f"attempt 3 of {attempts[0]['task_key']}" in jobs
    assert all_free(lab.inventory)


@pytest.mark.tf
def test_a_killed_worker_restarts_the_job_from_its_checkpoint(lab, tmp_path):
    """SIGKILL one worker of the checkpointed example mid-training: the whole job is stopped
    and released, then started again; it resumes from the last checkpoint (not step 0) and
    reaches the example's accuracy threshold."""
    shared = tmp_path / "checkpoints"  # the lab's hosts share this machine's /tmp
    job = start_hypertf("train", "-i", lab.inventory, "--script",
                        str(EXAMPLES / "checkpointed.py"), "--worker", "2", "--max-restarts",
                        "1", "--checkpoint-dir", str(shared), "--", "--steps", "300",
                        "--save_every", "50", "--step_delay", "0.05", cwd=tmp_path)
    lines = until_line(job, "checkpoint saved at step 100")
    first = task_key(lines)
    host = re.search(r"worker:1@(\w+):", "".join(lines)).group(1)
    workdir = load_inventory(lab.inventory).node(host).settings.workdir
    # The worker's python is the child of its task.sh wrapper, whose PID (then its start
    # time) is in the pidfile.
    on_host(lab.inventory, host,
            f"kill -KILL $(pgrep -P $(cut -d' ' -f1 {workdir}/runs/{first}/worker1.pid))")
    try:
        out, _ = job.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        job.kill()
        out, _ = job.communicate()
    out = "".join(lines) + out
    assert job.returncode == 0, out
    assert "restart 1 of 1" in out
    resumed = [int(n) for n in re.findall(r"attempt 2: resumed from step (\d+)", out)]
    assert resumed and min(resumed) >= 100, out
    summary = next(s for s in summaries(tmp_path) if s["task_key"] != first)
    assert [a["result"] for a in summary["attempts"]] == ["failed", "succeeded"]
    accuracy = float(re.findall(r"test_accuracy=([0-9.]+)", out)[-1])
    assert accuracy >= 0.90
    assert all_free(lab.inventory)
