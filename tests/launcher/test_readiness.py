"""Which tasks must listen by the start-up deadline, and what it says of those that do not,
on the lab (real sshd hosts, real ZooKeeper, real processes; issue 54, defects 5 and 6)."""

from __future__ import annotations

import time

from tests.launcher.helpers import REPO, all_free, hypertf, processes_of, summaries

TRAINS_ALONE = str(REPO / "tests" / "scripts" / "trains_alone.py")
WAITS_FOR_FILE = str(REPO / "tests" / "scripts" / "waits_for_file.py")


def test_a_single_task_that_never_listens_runs_past_the_start_up_deadline(lab, tmp_path):
    """One worker training without a strategy never opens its port; no peer needs it, so
    a 5 s start-up deadline does not end its 15 s of training."""
    done = hypertf("train", "-i", lab.inventory, "--script", TRAINS_ALONE, "--worker", "1",
                   "--start-timeout", "5", cwd=tmp_path, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "started 1 task: worker:0@h1:" in out
    assert "epoch 15/15" in out and "trained alone" in out
    assert "start-up deadline" not in out and "note:" not in out
    (summary,) = summaries(tmp_path)
    assert summary["result"] == "succeeded"
    assert all_free(lab.inventory)


def test_tasks_waiting_for_a_file_are_named_silent_with_the_file_cause(lab, tmp_path):
    """Two tasks each wait for a file in their own working directory, which never comes:
    the deadline names both, how long each has been silent and its last line, and lists a
    file another task writes (and --workdir) among the causes."""
    started = time.monotonic()
    done = hypertf("train", "-i", lab.inventory, "--script", WAITS_FOR_FILE, "--worker", "2",
                   "--start-timeout", "5", cwd=tmp_path, timeout=120)
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    error = done.stderr
    assert "start-up deadline: worker:0@h1, worker:1@h2 not listening on their port after 5 s" \
        in error
    for task in ("worker:0@h1", "worker:1@h2"):
        assert f"{task} has been silent for " in error
        assert "(the last: waiting for vocab.txt)" in error
    assert ("a task waiting for a file another task writes (each task has its own directory; "
            "`--workdir DIR` on shared storage shares one)") in error
    assert elapsed < 30
    (summary,) = summaries(tmp_path)
    assert processes_of(lab.inventory, summary["task_key"]) == {}
    assert all_free(lab.inventory)
