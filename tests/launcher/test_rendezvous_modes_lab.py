"""Readiness follows the job's rendezvous (docs/frameworks.md): a script that imports jax is
judged by its coordinator's port alone, and a job said to need no port by its exits."""

from __future__ import annotations

from pathlib import Path

from tests.launcher.helpers import REPO, hypertf

SCRIPT = str(REPO / "tests" / "scripts" / "no_coordinator.py")


def test_a_coordinator_that_never_starts_fails_the_deadline_naming_rank_0(lab, tmp_path: Path):
    run = hypertf("train", "-i", lab.inventory, "--script", SCRIPT, "--worker", "2",
                  "--start-timeout", "4", "--", "20", cwd=tmp_path)
    said = run.stdout + run.stderr
    assert run.returncode != 0, said
    assert "rendezvous: coordinator (only rank 0's port" in said, said
    assert "the script imports jax" in said, said
    deadline = next(line for line in said.splitlines() if "start-up deadline:" in line)
    assert "worker:0@" in deadline and "worker:1" not in deadline, deadline  # rank 0 alone
    assert "rank 0 is the coordinator" in said, said


def test_a_job_said_to_need_no_port_is_judged_by_its_exits(lab, tmp_path: Path):
    run = hypertf("train", "-i", lab.inventory, "--script", SCRIPT, "--worker", "2",
                  "--start-timeout", "3", "--rendezvous", "none", "--", "6", cwd=tmp_path)
    said = run.stdout + run.stderr
    assert run.returncode == 0, said
    assert "rendezvous: none (no port must open" in said and "--rendezvous" in said, said
