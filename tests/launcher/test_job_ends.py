"""A job ended by someone else is named the same everywhere: a waiting job ``hypertf cancel``
ends is ``cancelled``, a running one ``hypertf kill`` ends is ``killed``, in its record, its
summary (the record's and summary.json), the launcher's last lines and a detached launcher's
launcher.log; never ``failed``."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import wait_for
from tests.launcher.helpers import FAKE, all_free, hypertf, start_hypertf, until_line

LAB_GPUS = 12


def record(inventory: str, key: str) -> dict:
    done = hypertf("jobs", "--json", "--last", "50", "-i", inventory, cwd=Path.cwd(), timeout=60)
    assert done.returncode == 0, done.stderr
    return {job["task_key"]: job for job in json.loads(done.stdout)}[key]


def launcher_log(cwd: Path, key: str) -> str:
    log = cwd / "runs" / key / "launcher.log"
    return log.read_text() if log.exists() else ""


def test_a_cancelled_waiter_and_a_killed_runner_are_named_so_everywhere(lab, tmp_path):
    finish = tmp_path / "finish"
    done = hypertf("train", "-i", lab.inventory, "--detach", "--script", FAKE, "--worker",
                   str(LAB_GPUS), "--", "--until_file", str(finish), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    runner = done.stdout.split()[0]
    try:
        wait_for(lambda: record(lab.inventory, runner)["status"] == "running", 60,
                 "the detached job running")
        waiter = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "1",
                               cwd=tmp_path)
        found = re.search(r"job (\S+) queued", "".join(until_line(waiter, " queued ")))
        assert found
        waiting = found.group(1)

        cancelled = hypertf("cancel", "-i", lab.inventory, waiting, cwd=tmp_path, timeout=60)
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        out, _ = waiter.communicate(timeout=60)
        assert waiter.returncode == 8, out
        last = out.strip().splitlines()[-1]
        assert "cancelled" in last and "hypertf cancel" in last and "failed" not in last, out
        job = record(lab.inventory, waiting)
        assert (job["state"], job["summary"]["result"]) == ("cancelled", "cancelled"), job
        assert "hypertf cancel" in job["summary"]["message"], job

        killed = hypertf("kill", "-i", lab.inventory, runner, cwd=tmp_path, timeout=60)
        assert killed.returncode == 0, killed.stdout + killed.stderr
        wait_for(lambda: (tmp_path / "runs" / runner / "summary.json").exists(), 90,
                 "the detached launcher's end")
        wait_for(lambda: f"job {runner} was" in launcher_log(tmp_path, runner), 30,
                 "the detached launcher's last line")
        log = launcher_log(tmp_path, runner)
        last = log.strip().splitlines()[-1]
        assert "killed" in last and "(hypertf kill by user." in last, log
        assert "failed" not in log and "error" not in log, log
        summary = json.loads((tmp_path / "runs" / runner / "summary.json").read_text())
        assert summary["result"] == "killed" and "hypertf kill" in summary["message"], summary
        job = record(lab.inventory, runner)
        assert (job["state"], job["summary"]["result"]) == ("killed", "killed"), job
    finally:
        finish.touch()
    wait_for(lambda: all_free(lab.inventory), 90, "every GPU free")
