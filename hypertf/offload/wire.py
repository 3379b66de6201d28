"""The MPI messages between the compute agent (rank 0) and the processors: tags and the
task header's fields, written down once for both sides (and the dtype codes the channel's
header uses too)."""

from __future__ import annotations

from typing import Any

import numpy as np

TASK, RESULT, STOP, CALIBRATE, ECHO = 1, 2, 3, 4, 5
# product, shard index, dtype code, rows, depth (k1 - k0), n, B follows, batch, k0
TASK_FIELDS = 9
DTYPES: dict[int, np.dtype[Any]] = {0: np.dtype(np.float32), 1: np.dtype(np.float64)}
CODES: dict[np.dtype[Any], int] = {v: k for k, v in DTYPES.items()}


def poll(comm: Any, source: int, tag: int, status: Any, idle_max_s: float = 0.005) -> None:
    """Return once a message from ``source`` with ``tag`` is there (into ``status``).

    MPICH's blocking receive spins: an idle processor would burn a core, and on a small
    machine the agent's threads and the processors would starve one another. This probes
    and sleeps, 50 us at first, backing off to ``idle_max_s`` while nothing comes."""
    import time

    pause = 50e-6
    while not comm.Iprobe(source=source, tag=tag, status=status):
        time.sleep(pause)
        pause = min(pause * 2, idle_max_s)


def wait_all(requests: list[Any]) -> None:
    """MPI.Request.Waitall without spinning (see poll)."""
    import time

    from mpi4py import MPI

    pause = 20e-6
    while not MPI.Request.Testall(requests):
        time.sleep(pause)
        pause = min(pause * 2, 0.001)
