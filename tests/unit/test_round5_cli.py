"""What the command line says, as users read it (issue 54, round 5): ``sweep --help`` says
how to run a sweep, ``hypertf --help`` names every export target, the wording of export's
refusal, ``hypertf jobs``' header and failure reasons, status's heartbeat age, and
``sweep list`` showing only the sweeps of its inventory. Real parsers and real output; no
ZooKeeper (``sweep list`` reads only local files)."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from hypertf.cli import commands
from hypertf.dashboard.source import sweep_rows
from hypertf.export.targets import TARGETS
from hypertf.launch.request import TrainRequest
from hypertf.store import status
from hypertf.sweep import driver as sweeps
from hypertf.sweep.spec import SweepSpec, expand, parse_grid_option

REPO = Path(__file__).resolve().parents[2]


def hypertf(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hypertf.cli", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def words(text: str) -> str:
    """argparse's wrapped help as one line."""
    return " ".join(text.split())


def test_sweep_help_says_how_to_run_a_sweep() -> None:
    done = hypertf("sweep", "--help")
    assert done.returncode == 0, done.stderr
    text = words(done.stdout)
    for needed in ("--script PATH", "--grid NAME=V1,V2", "SPEC.yml", "-- script arguments",
                   "train options (passed to every trial)", "--worker N", "--priority N",
                   "sweep status", "sweep resume", "sweep cancel", "sweep list",
                   "-i INVENTORY, --inventory INVENTORY inventory YAML"):
        assert needed in text, f"{needed!r} missing from:\n{done.stdout}"


def test_only_sweep_resume_offers_detach() -> None:
    status_help = hypertf("sweep", "status", "--help")
    assert status_help.returncode == 0 and "--detach" not in status_help.stdout, \
        status_help.stdout
    assert "SWEEP_ID" in status_help.stdout and "inventory YAML" in status_help.stdout
    resume_help = hypertf("sweep", "resume", "--help")
    assert "--detach" in resume_help.stdout, resume_help.stdout


def test_top_level_help_names_every_export_target_from_the_table() -> None:
    done = hypertf("--help")
    assert done.returncode == 0, done.stderr
    export_line = words(done.stdout).split(" export ", 1)[1].split(" sweep ", 1)[0]
    for name in TARGETS:
        assert name in export_line, f"{name} missing from: {export_line}"
    assert "jobset (recommended)" in export_line, export_line


def test_export_refuses_a_train_only_option_saying_it_applies_only_to_train() -> None:
    done = hypertf("export", "--to", "jobset", "--image", "img", "--script", "x.py",
                   "--idle-fail")
    assert done.returncode == 2, done.stderr
    assert "--idle-fail applies only to 'hypertf train'" in done.stderr, done.stderr


def record(key: str, state: str, **more: object) -> dict:
    now = time.time()
    return {"task_key": key, "state": state, "alive": False, "created": now - 60,
            "admitted": now - 50, "released": now - 10, "script": "train.py",
            "owner": {"user": "alice", "host": "ws1"},
            "placements": [{"role": "worker", "index": 0, "host": "h1", "gpus": [0],
                            "port": 20000}], **more}


def test_jobs_has_a_header_and_says_why_a_job_failed() -> None:
    failed = record("20261127-050000-aaaaaa.alice", "failed", summary={
        "result": "failed", "message": "worker:0 exited 1: ValueError: bad lr\nlast lines..."})
    killed = record("20261127-050100-bbbbbb.alice", "killed", killed=time.time() - 10,
                    killed_by={"identity": "user.alice", "host": "ws1"})
    done = record("20261127-050200-cccccc.alice", "succeeded",
                  summary={"result": "succeeded", "message": "all finishers exited 0"})
    header, *rows = commands.job_table([failed, killed, done])
    assert header.split() == ["TASK", "KEY", "STATE", "OWNER", "SUBMITTED", "WAITED", "RAN",
                              "SCRIPT", "TASKS", "NOTE"]
    assert header.index("STATE") == rows[0].index("failed") == rows[1].index("killed")
    assert rows[0].endswith("worker:0 exited 1: ValueError: bad lr"), rows[0]
    assert "killed by user.alice from ws1" in rows[1]
    assert "all finishers" not in rows[2], "a success needs no reason"


def test_status_says_when_the_agent_was_last_seen() -> None:
    report = {"inventory": "inv.yml", "jobs": [], "zookeeper": {"root": "/r", "servers": []},
              "hosts": [{"name": "h1", "agent": "up", "heartbeat_age_s": 13.0,
                         "data_addr": "10.0.0.1", "address": "x", "gpu_source": "nvml",
                         "gpu_driver": {"driver": "550"},
                         "gpus": [{"index": 0, "state": "free"}]}]}
    out = io.StringIO()
    status.render(report, Console(file=out, width=200, color_system=None))
    assert "up, seen 13s ago" in out.getvalue(), out.getvalue()


@pytest.fixture
def two_sweeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A sweep of each of two inventories, made as ``hypertf sweep`` makes them."""
    monkeypatch.chdir(tmp_path)
    trials = expand(SweepSpec(script="t.py", train={}, grid=parse_grid_option(["lr=0.1"])))
    ids = []
    for inventory in ("a.yml", "b.yml"):
        (tmp_path / inventory).write_text("")
        ids.append(sweeps.create(inventory, TrainRequest(script="t.py"), trials, None, "max", 2,
                                 None).sweep_id)
    return ids[0], ids[1]


def test_sweep_list_and_the_dashboard_show_the_sweeps_of_their_inventory(
        two_sweeps: tuple[str, str], tmp_path: Path) -> None:
    of_a, of_b = two_sweeps
    listing = hypertf("sweep", "list", "-i", "a.yml", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert of_a in listing.stdout and of_b not in listing.stdout, listing.stdout
    assert "1 sweeps of other inventories not shown" in listing.stdout
    listing = hypertf("sweep", "list", "-i", str(tmp_path / "b.yml"), cwd=tmp_path)
    assert of_b in listing.stdout and of_a not in listing.stdout, listing.stdout
    every = hypertf("sweep", "list", cwd=tmp_path)  # without -i: each names its inventory
    assert f"{of_a}  idle" in every.stdout and "(on a.yml)" in every.stdout, every.stdout
    assert "(on b.yml)" in every.stdout, every.stdout
    assert [row["sweep"] for row in sweep_rows(tmp_path / "a.yml")] == [of_a]


def test_the_names_table_lists_every_target_in_order():
    """hypertf.export.names is what every command's help reads without the renderers."""
    from hypertf.export import names

    assert tuple(TARGETS) == names.TARGETS
