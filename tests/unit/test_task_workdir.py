"""Where a task runs (issue 39 item 8): its own directory in the run, the synced copy with
--sync, or --workdir (relative: below the node's work dir); the script by absolute path;
HYPERTF_CHECKPOINT_DIR made only when a job may restart or names it; 'tasknode start'
makes each task's working directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hypertf.core.errors import UsageError
from hypertf.core.rundir import RunDir
from hypertf.launch.request import TrainRequest
from hypertf.node import tasknode
from hypertf.ops.zkserver import free_port
from tests.conftest import wait_for

RUN = RunDir.of("/srv/hypertf", "20261125-120000-abcdef.alice")


def test_each_task_runs_in_its_own_directory_of_the_run_by_default() -> None:
    request = TrainRequest(script="train.py")
    assert request.task_cwd("/srv/hypertf", RUN, "worker0") == \
        "/srv/hypertf/runs/20261125-120000-abcdef.alice/worker0"
    assert request.task_cwd("/srv/hypertf", RUN, "worker1") != \
        request.task_cwd("/srv/hypertf", RUN, "worker0")


def test_sync_keeps_the_synced_copy_and_workdir_wins_relative_to_the_nodes_workdir(
        tmp_path: Path) -> None:
    synced = TrainRequest(script="train.py", sync_dir=str(tmp_path))
    assert synced.task_cwd("/srv/hypertf", RUN, "worker0") == str(RUN.code)
    assert TrainRequest(script="t.py", workdir="exp/1").task_cwd(
        "/srv/hypertf", RUN, "worker0") == "/srv/hypertf/exp/1"
    assert TrainRequest(script="t.py", workdir="/data/exp", sync_dir=str(tmp_path)).task_cwd(
        "/srv/hypertf", RUN, "worker0") == "/data/exp"


def test_the_script_is_named_by_absolute_path_whatever_the_tasks_directory(
        tmp_path: Path) -> None:
    assert TrainRequest(script="train.py").script_on("/srv/hypertf", RUN, "train.py") == \
        "/srv/hypertf/train.py"  # not a file here: relative to the node's work dir
    assert TrainRequest(script="t.py").script_on("/srv/hypertf", RUN, "/home/a/t.py") == \
        "/home/a/t.py"  # a file here: resolved where the user is (Job.script_path)
    assert TrainRequest(script="m/t.py", sync_dir=str(tmp_path)).script_on(
        "/srv/hypertf", RUN, "/elsewhere/m/t.py") == f"{RUN.code}/m/t.py"


def test_the_checkpoint_dir_is_made_only_for_restarts_or_when_named() -> None:
    assert not TrainRequest(script="t.py").makes_checkpoint_dir
    assert TrainRequest(script="t.py", max_restarts=1).makes_checkpoint_dir
    assert TrainRequest(script="t.py", checkpoint_dir="/shared/ckpt").makes_checkpoint_dir


@pytest.mark.parametrize("workdir", ["", "a\0b"])
def test_a_workdir_that_is_no_path_is_refused(workdir: str) -> None:
    with pytest.raises(UsageError, match="--workdir"):
        TrainRequest(script="t.py", workdir=workdir).validate()


def request_for(run: RunDir, cwd: Path, code: str) -> dict:
    return {"run_dir": str(run.path), "venv": str(Path(sys.executable).parent.parent),
            "tasks": [{"name": "worker0", "port": free_port(), "cwd": str(cwd),
                       "argv": [sys.executable, "-c", code], "env": {}}]}


def test_start_makes_each_tasks_working_directory(tmp_path: Path) -> None:
    run = RunDir.of(tmp_path, "job", local=True)
    cwd = Path(run.task_dir("worker0"))
    answer = tasknode.start(request_for(
        run, cwd, "import os; open('here', 'w').write(os.getcwd())"))
    assert "started" in answer, answer
    wait_for(lambda: Path(run.exit("worker0")).exists(), 10, "the task's end")
    assert Path(run.exit("worker0")).read_text().strip() == "0", \
        Path(run.log("worker0")).read_text()
    assert (cwd / "here").read_text() == str(cwd)


def test_start_names_a_working_directory_it_cannot_make_and_starts_nothing(
        tmp_path: Path) -> None:
    run = RunDir.of(tmp_path, "job", local=True)
    (tmp_path / "file").write_text("")
    answer = tasknode.start(request_for(run, tmp_path / "file" / "sub", "pass"))
    assert answer == {"problems": [
        f"cannot make the working directory {tmp_path}/file/sub (Not a directory)"]}
    assert not Path(run.pid("worker0")).exists()
