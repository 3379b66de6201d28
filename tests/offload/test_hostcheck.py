"""An offload host's preflight checks what runs there (MPICH, the processor's import,
mpi4py's library), not the user's script (issue 42 item 4)."""

from __future__ import annotations

import json
import subprocess
import sys

from hypertf.offload import hostcheck


def test_this_machine_can_be_an_offload_host():
    done = subprocess.run([sys.executable, "-m", "hypertf.offload.hostcheck"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["problems"] == [] and answer["python"] == sys.executable, answer


def test_a_host_without_mpich_gets_one_line_naming_it_and_the_fix(monkeypatch):
    monkeypatch.setattr(hostcheck.shutil, "which", lambda name, path=None: None)
    (problem,) = hostcheck.report()["problems"]
    assert "\n" not in problem
    assert "MPICH (mpiexec, hydra_pmi_proxy not found)" in problem
    assert "hypertf_offload: true" in problem and "invoke cluster.setup" in problem
