"""Offload tests: a real MPI world on loopback (mpiexec, the agent, processors), real POSIX
shared memory, real TensorFlow; every process started here stopped by PID."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mpi4py")
pytest.importorskip("posix_ipc")
if shutil.which("mpiexec") is None:
    pytest.skip("no mpiexec (apt-get install mpich)", allow_module_level=True)

from hypertf.offload.world import World, world


@pytest.fixture
def offload_world(tmp_path: Path) -> Iterator[World]:
    """An agent and two processors on this machine."""
    with world(2, tmp_path) as w:
        yield w
        if w.proc is not None and w.proc.poll() is not None and os.environ.get("CI_DEBUG"):
            print(w.output())


def shm_names(channel: str) -> list[str]:
    """What is left of a channel in /dev/shm (segments and semaphores)."""
    stem = channel.strip("/")
    return [n for n in os.listdir("/dev/shm") if stem in n]
