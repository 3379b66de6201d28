"""The shared lab's own guard: what a failed test leaves behind is found and repaired.

This test damages the lab the way a test that fails half-way does (launcher SIGKILLed with
its tasks running, agents dead, a host cut off) and restores nothing itself; the health
check must see every problem and the repair must leave the lab as the next test expects it.
"""

from __future__ import annotations

import signal

from tests.conftest import LAB_GPUS, on_host, wait_for
from tests.lab_health import check, ensure_healthy
from tests.launcher.helpers import FAKE, finish_file, start_hypertf, task_key, until_line


def test_health_check_finds_and_repairs_a_damaged_lab(lab, tmp_path):
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2", "--",
                        "--until_file", str(finish_file(tmp_path)), cwd=tmp_path)
    key = task_key(until_line(job, "tasks listening"))
    for host in ("h1", "h2"):
        on_host(lab.inventory, host, "kill -KILL $(cat /srv/hypertf/agent.pid)")
    job.send_signal(signal.SIGKILL)  # nobody left to stop the tasks
    job.communicate()
    lab.cut("h3")

    health = wait_for(lambda: (lambda h: h if {"h1", "h2"} <= h.missing_agents else None)(
        check(lab)), 90, "the killed agents' records to expire")
    assert not health.ok
    assert health.links_down == ["h3"]
    assert {"h1", "h2"} <= health.missing_agents
    assert {"h1", "h2"} <= set(health.job_pids)

    repaired, problems = ensure_healthy(lab, LAB_GPUS)
    assert repaired is lab, problems  # repaired in place, not rebuilt
    assert check(lab).ok
    assert problems and not any("rebuilt" in p for p in problems)
    assert key  # the job's processes are gone: check() found no HYPERTF_TASK_KEY process
