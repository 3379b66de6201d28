"""Provisioning tests: real Ansible (and molecule) against bare lab hosts.

Each test builds its own lab (``agents=False``: bare hosts; the lab's ZooKeeper only where a
test asks for it) and removes it whatever happens. Molecule and Ansible get private state
directories, so nothing leaks into ~/.ansible.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hypertf.ops import lab as lab_module
from hypertf.ops import labprovision, provision

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def hypertf_source(state_home: Path) -> Path:
    """A snapshot of HyperTF's source for the wheel: edits made while the tests run do not
    turn an idempotence check into a reinstall."""
    snapshot = state_home / "hypertf-source"
    shutil.copytree(REPO / "hypertf", snapshot / "hypertf",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, snapshot / name)
    return snapshot


@pytest.fixture
def lab_inventory(hypertf_source: Path) -> Callable[..., Path]:
    """labprovision.lab_inventory, building HyperTF from the snapshot."""

    def write(lab_dir: Path, **kwargs: object) -> Path:
        kwargs.setdefault("hypertf_source", hypertf_source)
        return labprovision.lab_inventory(lab_dir, **kwargs)

    return write


@pytest.fixture
def make_lab(state_home: Path) -> Iterator[Callable[..., lab_module.Lab]]:
    """Build labs of bare hosts; every one is removed at the end of the test."""
    built: list[lab_module.Lab] = []

    def make(hosts: int = 3, gpus: int = 2, zookeeper: bool = False) -> lab_module.Lab:
        lab = lab_module.up(hosts=hosts, gpus=gpus, agents=False, zookeeper=zookeeper)
        built.append(lab)
        return lab

    try:
        yield make
    finally:
        for lab in built:
            lab_module.down(lab)


@pytest.fixture
def ansible_dirs(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Private Ansible/molecule state. SSH control sockets get a short directory of their
    own under /tmp: a Unix socket path is limited to 108 bytes, and pytest's tmp_path is
    longer in parallel runs (``popen-gw0/...``)."""
    dirs = {}
    for key, name in (("ANSIBLE_HOME", "ah"), ("ANSIBLE_LOCAL_TEMP", "at"),
                      ("MOLECULE_EPHEMERAL_DIRECTORY", "mol")):
        path = tmp_path / name
        path.mkdir()
        dirs[key] = str(path)
    sockets = tempfile.mkdtemp(prefix="htfcp-", dir="/tmp")
    dirs["ANSIBLE_SSH_CONTROL_PATH_DIR"] = sockets
    try:
        yield dirs
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


def molecule(role: str, inventory: Path, dirs: dict[str, str], timeout: float = 600,
             ) -> subprocess.CompletedProcess[str]:
    """``molecule test`` of a role's default scenario against the hosts of ``inventory``."""
    env = dict(os.environ)
    env.pop("ANSIBLE_CONFIG", None)  # molecule writes its own
    env.update(dirs, HYPERTF_MOLECULE_INVENTORY=str(inventory), ANSIBLE_NOCOLOR="1",
               PY_COLORS="0", ANSIBLE_FORCE_COLOR="0", NO_COLOR="1",
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    started = time.monotonic()
    done = subprocess.run([str(BIN / "molecule"), "test"], cwd=REPO / "roles" / role, env=env,
                          capture_output=True, text=True, timeout=timeout)
    print(f"molecule test {role}: {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, f"molecule test {role} failed:\n{done.stdout[-6000:]}\n" \
                                 f"{done.stderr[-3000:]}"
    return done


def invoke(*argv: str, env: dict[str, str] | None = None, timeout: float = 900,
           ) -> subprocess.CompletedProcess[str]:
    """Run an Invoke task from the repository root, the way a user does."""
    started = time.monotonic()
    done = subprocess.run([str(BIN / "invoke"), *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)
    print(f"invoke {' '.join(argv)}: {time.monotonic() - started:.1f} s, exit {done.returncode}")
    print(done.stdout[-4000:])
    return done


def playbook_env(dirs: dict[str, str]) -> dict[str, str]:
    env = provision.ansible_env()
    env.update(dirs)
    return env
