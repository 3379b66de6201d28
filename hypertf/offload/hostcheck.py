"""Preflight of an offload host: can it run what a job's offload world starts there?

An offload host runs none of the user's script: hydra's SSH launcher starts MPICH's
``hydra_pmi_proxy`` there, which starts ``<venv>/bin/python -m hypertf.offload.processor``.
So this checks exactly those (the venv's python: the one running this, MPICH's programs,
the processor's import and mpi4py's MPI library, loaded without initializing MPI) and
answers like ``tasknode preflight``: one JSON line, ``problems`` empty when all is there.
Run by the launcher as ``<venv>/bin/python -m hypertf.offload.hostcheck``.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import sys
from typing import Any

MPICH_PROGRAMS = ("mpiexec", "hydra_pmi_proxy")
FIX = "set hypertf_offload: true for it in the inventory and run 'invoke cluster.setup'"


def missing() -> list[str]:
    """What this host lacks to run an offload processor, in words ([] when nothing)."""
    lacks = []
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", ""),
                            "/usr/bin", "/usr/local/bin"])
    programs = [name for name in MPICH_PROGRAMS if not shutil.which(name, path=path)]
    if programs:
        lacks.append(f"MPICH ({', '.join(programs)} not found)")
    try:
        importlib.import_module("hypertf.offload.processor")
    except ImportError as exc:
        lacks.append(f"the processor's import in {sys.executable} ({exc})")
    try:
        import mpi4py

        mpi4py.rc.initialize = False  # load libmpich, start no MPI
        importlib.import_module("mpi4py.MPI")
    except ImportError as exc:
        lacks.append(f"mpi4py in {sys.executable} ({exc})")
    return lacks


def report() -> dict[str, Any]:
    """The preflight answer: ``problems`` is one line naming what is missing and the fix."""
    lacks = missing()
    problems = [f"as an offload host it lacks {'; '.join(lacks)}: {FIX}"] if lacks else []
    return {"python": sys.executable, "problems": problems, "hostname": socket.gethostname(),
            "offload": True}


def main() -> int:
    print(json.dumps(report()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
