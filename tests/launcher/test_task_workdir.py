"""Where tasks run on the lab (issue 39 item 8): each task in a directory of its own under
the job's run directory, so two tasks on one host never write the same relative file and
nothing lands in the node's hypertf_workdir; ``--workdir DIR`` instead; no empty
``checkpoints/<key>/`` left by a job that neither restarts nor names --checkpoint-dir."""

from __future__ import annotations

import re
import secrets
from pathlib import Path

from tests.launcher.helpers import FAKE, all_free, hypertf, summaries


def srv(lab, host: str) -> Path:
    """A lab host's hypertf_workdir (/srv/hypertf), seen from this machine."""
    return lab.dir / host / "srv" / "hypertf"


def wrote(log: Path) -> str:
    """Where the fake task wrote its relative file (``--write_relative``)."""
    found = re.search(r"^wrote (\S+)$", log.read_text(), re.MULTILINE)
    assert found, log.read_text()
    return found.group(1)


def test_two_tasks_on_one_host_write_the_same_relative_file_each_in_its_own_dir(lab, tmp_path):
    relative = f"out-{secrets.token_hex(3)}/model/1/saved.txt"
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2",
                   "--policy", "pack", "--", "--work_s", "0", "--write_relative", relative,
                   cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [summary] = summaries(tmp_path)
    key = summary["task_key"]
    [host] = {t["host"] for t in summary["tasks"]}  # packed: both tasks on one host
    for task, name in (("worker:0", "worker0"), ("worker:1", "worker1")):
        path = wrote(tmp_path / "runs" / key / f"{name}.log")
        assert path == f"/srv/hypertf/runs/{key}/{name}/{relative}"
        mine = srv(lab, host) / "runs" / key / name / relative
        assert mine.read_text() == f"{task}\n", "another task wrote into this task's file"
    top = relative.split("/")[0]  # nothing beside agent.log
    assert not any((srv(lab, other.name) / top).exists() for other in lab.hosts)
    assert all_free(lab.inventory)


def test_no_checkpoint_dir_is_left_unless_the_job_may_restart(lab, tmp_path):
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "1", "--",
                   "--work_s", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [summary] = summaries(tmp_path)
    key = summary["task_key"]
    assert f"checkpoint_dir=/srv/hypertf/checkpoints/{key}" in (
        tmp_path / "runs" / key / "worker0.log").read_text()  # named all the same
    assert not any((srv(lab, h.name) / "checkpoints" / key).exists() for h in lab.hosts)

    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "1",
                   "--max-restarts", "1", "--", "--work_s", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [summary] = [s for s in summaries(tmp_path) if s["task_key"] != key]
    [task] = summary["tasks"]  # made before the tasks start: attempts resume from it
    assert (srv(lab, task["host"]) / "checkpoints" / summary["task_key"]).is_dir()
    assert all_free(lab.inventory)


def test_workdir_runs_every_task_there_and_a_relative_one_below_the_nodes_workdir(lab,
                                                                                 tmp_path):
    shared = tmp_path / "work"  # the lab's hosts share this machine's filesystem outside /srv
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2",
                   "--workdir", str(shared), "--", "--work_s", "0",
                   "--write_relative", "out.txt", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [summary] = summaries(tmp_path)
    for name in ("worker0", "worker1"):
        assert wrote(tmp_path / "runs" / summary["task_key"] / f"{name}.log") == \
            str(shared / "out.txt")
    assert sorted((shared / "out.txt").read_text().splitlines()) == ["worker:0", "worker:1"]

    relative = f"exp-{secrets.token_hex(3)}"
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "1",
                   "--workdir", relative, "--", "--work_s", "0",
                   "--write_relative", "out.txt", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [summary] = [s for s in summaries(tmp_path) if s["task_key"] != summary["task_key"]]
    [task] = summary["tasks"]
    assert wrote(tmp_path / "runs" / summary["task_key"] / "worker0.log") == \
        f"/srv/hypertf/{relative}/out.txt"
    assert (srv(lab, task["host"]) / relative / "out.txt").read_text() == "worker:0\n"
    assert all_free(lab.inventory)


def test_a_script_path_relative_to_the_users_directory_still_runs(lab, tmp_path):
    """The script is resolved where the user is, not in the task's own directory."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "fake.py").write_text(Path(FAKE).read_text())
    done = hypertf("train", "-i", lab.inventory, "--script", "scripts/fake.py", "--worker",
                   "1", "--", "--work_s", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all_free(lab.inventory)
