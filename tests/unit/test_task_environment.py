"""A node's Python environment as task.sh uses it: one without bin/activate (hand-made or
conda) runs tasks, a missing or failing one is named in the task's log, and the node's
preflight checks what task.sh needs. The real wrapper; no ZooKeeper, no network."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypertf.node import tasknode


def _run_task(tmp_path: Path, venv: Path, argv: list[str]) -> tuple[int, str]:
    """One task through the real task.sh, as ``tasknode start`` runs it: exit code, log."""
    from hypertf.core.rundir import RunDir

    run = RunDir.of(tmp_path / "work", "job", local=True)
    run.local.mkdir(parents=True)
    done = subprocess.run(tasknode.wrapper_argv(run, "worker0", str(venv), str(tmp_path), argv),
                          capture_output=True, text=True, timeout=30)
    log = Path(run.log("worker0"))
    assert Path(run.exit("worker0")).read_text().strip() == str(done.returncode)
    return done.returncode, log.read_text() if log.exists() else ""


def _bare_env(tmp_path: Path, python: bool) -> Path:
    """A hand-made (or conda) environment: bin/python, no bin/activate."""
    venv = tmp_path / "env"
    (venv / "bin").mkdir(parents=True)
    if python:
        (venv / "bin" / "python").symlink_to(sys.executable)
    return venv


def test_a_task_runs_in_an_environment_without_activate(tmp_path: Path) -> None:
    """It ended 'exit 127' with no output: now bin/ comes first on PATH, as activate does."""
    venv = _bare_env(tmp_path, python=True)
    code, log = _run_task(tmp_path, venv, [
        "bash", "-c", 'echo "python is $(command -v python); env $VIRTUAL_ENV"'])
    assert code == 0, log
    assert f"python is {venv}/bin/python; env {venv}" in log


def test_a_task_without_any_environment_says_why_in_its_log(tmp_path: Path) -> None:
    venv = _bare_env(tmp_path, python=False)
    code, log = _run_task(tmp_path, venv, ["python", "-c", "print(1)"])
    assert code == 127
    assert f"hypertf: no Python environment at {venv} (neither bin/activate nor bin/python)" \
        in log


def test_an_activate_that_fails_is_named_in_the_log(tmp_path: Path) -> None:
    venv = _bare_env(tmp_path, python=True)
    (venv / "bin" / "activate").write_text("return 3\n")
    code, log = _run_task(tmp_path, venv, ["python", "-c", "print(1)"])
    assert code == 127
    assert f"hypertf: sourcing {venv}/bin/activate failed (exit 3)" in log


def test_preflight_checks_what_task_sh_needs_of_the_environment(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    bare = _bare_env(tmp_path, python=True)
    assert tasknode.preflight(str(tmp_path / "work"), "", str(bare))["problems"] == []
    nothing = tmp_path / "nothing"
    (problem,) = tasknode.preflight(str(tmp_path / "work"), "", str(nothing))["problems"]
    assert problem.startswith(f"no Python environment at {nothing}")
    assert "hypertf_venv" in problem
    assert tasknode.preflight(str(tmp_path / "work"), "")["problems"] == []  # this venv
