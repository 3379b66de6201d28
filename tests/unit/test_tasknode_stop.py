"""``tasknode stop``: it waits for a job's process groups with psutil.wait_procs. Real
tasks; no ZooKeeper, no network."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hypertf.node import runcontrol


def test_stop_waits_for_the_groups_with_psutils_wait_procs(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            ) -> None:
    """Real tasks, one ending on TERM and one ignoring it: both are waited for by
    psutil.wait_procs (counted here, then called through), not by a hand-written poll."""
    import psutil

    from tests.unit.test_tasknode import SLEEPER, STUBBORN, Node

    waits: list[int] = []
    real = psutil.wait_procs

    def counted(procs, timeout=None, callback=None):  # type: ignore[no-untyped-def]
        waits.append(len(procs))
        return real(procs, timeout=timeout, callback=callback)

    monkeypatch.setattr(psutil, "wait_procs", counted)
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "activate").write_text("")
    node = Node(tmp_path, tmp_path / "venv")
    try:
        run = node.run_dir()
        pids = tmp_path / "stubborn.pids"
        node.python_task(run, "ps0", SLEEPER)
        node.python_task(run, "worker0", STUBBORN, str(pids))
        wait_for_file = time.monotonic() + 10
        while not pids.exists() and time.monotonic() < wait_for_file:
            time.sleep(0.05)
        assert runcontrol.stop(run, grace=0.5) == {"ps0": "stopped", "worker0": "killed"}
        assert waits and max(waits) >= 2
        assert not runcontrol.run_alive(run)
    finally:
        node.cleanup()
