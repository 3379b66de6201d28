"""The command line's help as users read it: ``sweep --help`` says how to run a sweep, only
``sweep resume`` offers --detach, ``hypertf --help`` names every export target from the
names table, and ``invoke --help train | head -1`` prints no traceback. Real parsers and a
real shell pipeline; no ZooKeeper."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tasks
from hypertf.cli import main as cli
from hypertf.export.targets import TARGETS

REPO = Path(__file__).resolve().parents[2]
INVOKE = REPO / ".venv" / "bin" / "invoke"


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


def test_the_names_table_lists_every_target_in_order():
    """hypertf.export.names is what every command's help reads without the renderers."""
    from hypertf.export import names

    assert tuple(TARGETS) == names.TARGETS


@pytest.mark.skipif(not INVOKE.exists(), reason="needs the venv's invoke")
def test_invoke_help_into_head_prints_no_traceback() -> None:
    """Invoke prints the help itself, after loading tasks.py: its BrokenPipeError went
    through as a traceback (exit 1) when ``head`` left first."""
    assert tasks.ns.task_names  # the collection the command loads
    for _ in range(3):  # the race is lost almost always; three tries make it certain
        done = subprocess.run(["bash", "-c", f"{INVOKE} --help train | head -1; "
                                             f"exit ${{PIPESTATUS[0]}}"],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.stdout.startswith("Usage: inv")
        assert done.stderr == "", done.stderr
        assert done.returncode in (0, cli.SIGPIPE_EXIT)
