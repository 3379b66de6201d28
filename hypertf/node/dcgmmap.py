"""Per-job labels on NVIDIA dcgm-exporter's series: its HPC job mapping directory.

Ops teams already run dcgm-exporter and its Grafana dashboards. Started with
``--hpc-job-mapping-dir DIR`` (or ``DCGM_HPC_JOB_MAPPING_DIR``), it reads one file per GPU,
named by the GPU's index, holding the job ID(s) on that GPU one per line, and adds them to
every ``DCGM_FI_*`` series of that GPU as the ``hpc_job`` label. The agent keeps such a
directory (``hypertf_dcgm_job_mapping_dir``) in line with its row of the matrix: a GPU held
or draining by a job has a file naming its task key; any other GPU has none.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from hypertf.core.matrix import Cell, job_of


def write(directory: str | Path, row: Sequence[Cell]) -> bool:
    """Make ``directory`` say which job holds each GPU of ``row``; True if it changed.
    Each file is replaced atomically, so the exporter never reads half a name."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    wanted = {str(i): f"{key}\n" for i, cell in enumerate(row) if (key := job_of(cell))}
    changed = False
    for name in os.listdir(path):
        if name.isdigit() and name not in wanted:
            with contextlib.suppress(FileNotFoundError):
                (path / name).unlink()
                changed = True
    for name, text in wanted.items():
        target = path / name
        with contextlib.suppress(OSError):
            if target.read_text() == text:
                continue
        tmp = path / f".{name}.tmp"
        tmp.write_text(text)
        tmp.chmod(0o644)  # the exporter often runs as another user
        os.replace(tmp, target)
        changed = True
    return changed
