"""Offload tests: a real MPI world on loopback (mpiexec, the agent, processors), real POSIX
shared memory, real TensorFlow; every process started here stopped by PID."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytest.importorskip("mpi4py")
pytest.importorskip("posix_ipc")
if shutil.which("mpiexec") is None:
    pytest.skip("no mpiexec (apt-get install mpich)", allow_module_level=True)

from hypertf.offload.world import World, world
from hypertf.ops import lab as lab_module
from hypertf.ops import provision

OFFLOAD_KEY = "hypertf_offload_ed25519"  # the settings' default file name, in each host's home
_TRUSTED: set[str] = set()  # labs whose hosts cluster.setup gave node-to-node trust


def offload_inventory(lab: lab_module.Lab) -> Path:
    """The lab's inventory with ``hypertf_offload: true`` for every host."""
    inventory = yaml.safe_load(Path(lab.inventory).read_text())
    inventory["all"]["vars"]["hypertf_offload"] = True
    path = lab.dir / "offload.yml"
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return path


def trusted(lab: lab_module.Lab) -> bool:
    return lab.lab_id in _TRUSTED and all(
        (lab.dir / h.name / "home" / ".ssh" / OFFLOAD_KEY).exists() for h in lab.hosts)


def forget_trust(lab: lab_module.Lab) -> None:
    """The next test that needs the trust runs the setup again (a test took it away)."""
    _TRUSTED.discard(lab.lab_id)


@pytest.fixture
def lab(lab: lab_module.Lab) -> lab_module.Lab:
    """The shared lab, its hosts (each with a home of its own, nothing shared with this
    machine's ~/.ssh) given node-to-node trust the way a cluster gets it: cluster.setup with
    ``hypertf_offload: true`` (deploy.yml's offload_trust play; the lab's hosts already run
    HyperTF from this machine's venv, so the other plays are not run). Once per lab."""
    if not trusted(lab):
        run = provision.setup(offload_inventory(lab), tags=("offload_trust",),
                              say=lambda line: None)
        assert run.succeeded, run.log.read_text()[-4000:]
        _TRUSTED.add(lab.lab_id)
    return lab


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
