"""The lab wherever the repository is, and an SSH key refused for its directory's modes
(issue 39 item 1): a clone under /tmp failed its own test command with "Authentication
failed", because the benches kept their labs under the repository and sshd's StrictModes
refuses keys below a world-writable directory.

Real labs (network namespaces with sshd, no agents, no ZooKeeper) and real SSH.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypertf.config.inventory import load_inventory
from hypertf.core.errors import LabError, RemoteError
from hypertf.launch.remote import Session
from hypertf.ops import lab as lab_module
from hypertf.ops import labhosts

REPO = Path(__file__).resolve().parents[2]


def test_a_bench_home_is_private_wherever_the_repository_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A clone under /tmp: the bench's labs (its HYPERTF_HOME) must not lie below /tmp."""
    from bench import common

    with tempfile.TemporaryDirectory(dir="/tmp") as clone:
        monkeypatch.setattr(common, "REPO", Path(clone))
        monkeypatch.setenv("HYPERTF_HOME", os.environ["HYPERTF_HOME"])  # bench_home sets it
        with common.bench_home("strict") as home:
            assert not home.is_relative_to(clone)
            assert labhosts.strict_modes_problem(home / "labs" / "x" / "authorized_keys") \
                is None
            assert (home.stat().st_mode & 0o777) == 0o700


def test_a_lab_below_a_world_writable_directory_is_refused_naming_it() -> None:
    """Before anything is built, in one line: which directory and why."""
    with tempfile.TemporaryDirectory(dir="/tmp") as base:
        built = None
        try:
            with pytest.raises(LabError) as caught:
                built = lab_module.up(hosts=1, gpus=0, agents=False, zookeeper=False,
                                      base=Path(base))
        finally:
            if built is not None:
                lab_module.down(built)
        message = str(caught.value)
        assert "StrictModes" in message
        assert "/tmp is writable by others (mode 1777)" in message
        assert list(Path(base).iterdir()) == []  # nothing built


def test_strict_modes_rules_as_sshd_applies_them(tmp_path: Path) -> None:
    private = Path.home() / ".hypertf" / "strict-rules"
    private.mkdir(parents=True, mode=0o700, exist_ok=True)
    try:
        assert labhosts.strict_modes_problem(private / "a" / "keys") is None
        private.chmod(0o770)
        assert labhosts.strict_modes_problem(private / "keys") == (
            f"{private} is writable by its group (mode 770)")
    finally:
        private.rmdir()


@pytest.fixture
def small_lab(state_home: Path) -> Iterator[lab_module.Lab]:
    base = state_home / "strict-labs"
    base.mkdir(mode=0o700, exist_ok=True)
    built = lab_module.up(hosts=1, gpus=0, agents=False, base=base)
    try:
        yield built
    finally:
        base.chmod(0o700)
        lab_module.down(built)


def test_a_key_refused_for_its_directorys_modes_is_said_with_the_path(
        small_lab: lab_module.Lab) -> None:
    """The lab's directory made world-writable after the build: sshd refuses its key.
    The launcher's error names the key and StrictModes instead of 'Authentication
    failed', and the lab reads the exact path from its host's sshd log."""
    inventory = load_inventory(small_lab.inventory)
    node = inventory.node("h1")
    session = Session(node, inventory.cluster)
    try:
        assert session.run("true", timeout=30).ok  # the key works as built
    finally:
        session.close()
    small_lab.dir.parent.chmod(0o777)  # (Debian's sshd lets a group-writable one pass)
    session = Session(dataclasses.replace(node), inventory.cluster)
    try:
        with pytest.raises(RemoteError) as caught:
            session.run("true", timeout=30)
    finally:
        session.close()
    message = str(caught.value)
    assert f"SSH refused the key {node.key_file}" in message
    assert "StrictModes" in message and "Authentication failed" not in message
    refused = labhosts.refused_keys(small_lab)
    assert any(f"bad ownership or modes for directory {small_lab.dir.parent}" in line
               for line in refused), refused
