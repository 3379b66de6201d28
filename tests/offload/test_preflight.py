"""Preflight of an offload host (issue 42 item 4), through the launcher on the lab: it checks
what the host runs (MPICH, the processor's import, mpi4py), not the user's script, which an
offload host never runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from tests.launcher.helpers import all_free, hypertf
from tests.offload.test_hook import PROGRAM

QUIET = ("--env", "TF_CPP_MIN_LOG_LEVEL=2")


def test_a_script_only_on_the_task_host_runs_with_offload_hosts(lab, tmp_path):
    """The script lies in h1's private /srv only: the offload hosts are not asked for it."""
    only = lab.dir / "h1" / "srv" / "h1only"
    only.mkdir(exist_ok=True)
    (only / "prog.py").write_text("print('ran on the task host')\n")
    try:
        done = hypertf("train", "-i", lab.inventory, "--script", "/srv/h1only/prog.py",
                       "--worker", "1", "--offload-hosts", "2", *QUIET, cwd=tmp_path)
    finally:
        (only / "prog.py").unlink()
        only.rmdir()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "offloaded 0 matmuls" in done.stdout, done.stdout
    assert all_free(lab.inventory)


def test_an_offload_host_without_mpi4py_fails_preflight_in_one_line(lab, tmp_path):
    """h3's venv (a wrapper around this one) cannot import mpi4py: the job fails before
    anything is allocated, naming h3, what it lacks and the fix; nothing is left."""
    venv = tmp_path / "venv"
    block = venv / "block" / "mpi4py"
    block.mkdir(parents=True)
    (block / "__init__.py").write_text("raise ImportError(\"No module named 'mpi4py'\")\n")
    (venv / "bin").mkdir()
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={venv / 'block'}${{PYTHONPATH:+:$PYTHONPATH}} "
                      f"exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    inventory = yaml.safe_load(Path(lab.inventory).read_text())
    inventory["all"]["children"]["gpu_nodes"]["hosts"]["h3"]["hypertf_venv"] = str(venv)
    copy = tmp_path / "inventory.yml"
    copy.write_text(yaml.safe_dump(inventory, sort_keys=False))
    os.chmod(tmp_path, 0o755)  # the hosts log in as the lab's user: they read the venv
    done = hypertf("train", "-i", str(copy), "--script", str(PROGRAM),
                   "--worker", "1", "--offload-hosts", "2", *QUIET, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output, output
    (line,) = [x for x in output.splitlines() if "h3:" in x and "offload host" in x]
    assert "lacks mpi4py" in line and "No module named 'mpi4py'" in line, line
    assert "hypertf_offload: true" in line and "invoke cluster.setup" in line, line
    assert "preflight failed on 1 host(s); nothing was started or allocated" in output, output
    assert all_free(lab.inventory)
