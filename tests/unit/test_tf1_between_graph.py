"""TF1 between-graph jobs: a node starts the ps, then worker 0, then the others, which
task.sh holds until worker 0 listens; the idle warning of a worker left waiting says what
is and the fixes that apply to the legacy flags."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from hypertf.node import tasknode
from tests.unit.test_task_environment import _bare_env


def _placements(*names: str) -> list:
    from hypertf.core.scheduler import Placement

    return [Placement(n.split(":")[0], int(n.split(":")[1]), "h1", ()) for n in names]


def test_a_node_starts_the_ps_then_worker_0_then_the_others() -> None:
    from hypertf.core import spec

    placed = _placements("worker:0", "worker:1", "worker:2", "ps:0", "ps:1")  # slot order
    ordered = sorted(placed, key=spec.start_rank)
    assert [p.name for p in ordered] == ["ps:0", "ps:1", "worker:0", "worker:1", "worker:2"]
    chief = sorted(_placements("chief:0", "worker:0", "ps:0"), key=spec.start_rank)
    assert [p.name for p in chief] == ["ps:0", "chief:0", "worker:0"]


def test_only_the_other_tf1_workers_wait_for_worker_0() -> None:
    from hypertf.core import spec

    addresses = {"worker:0": "10.0.0.1:2000", "worker:1": "10.0.0.2:2001",
                 "ps:0": "10.0.0.3:2002", "chief:0": "10.0.0.4:2003"}
    legacy = _placements("worker:0", "worker:1", "ps:0")
    assert spec.start_after(legacy, addresses) == {"worker:1": "10.0.0.1:2000"}
    assert spec.start_after(_placements("chief:0", "worker:0", "worker:1", "ps:0"),
                            addresses) == {}  # TF2 parameter server
    assert spec.start_after(_placements("worker:0", "worker:1"), addresses) == {}  # mirrored


def test_task_sh_starts_a_task_after_its_address_listens(tmp_path: Path) -> None:
    """The real wrapper: the command runs only once the port accepts a connection."""
    import socket

    from hypertf.core.rundir import RunDir

    venv = _bare_env(tmp_path, python=True)
    run = RunDir.of(tmp_path / "work", "job", local=True)
    run.local.mkdir(parents=True)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stamp = tmp_path / "started"
    wrapper = subprocess.Popen(
        tasknode.wrapper_argv(run, "worker1", str(venv), str(tmp_path),
                              ["bash", "-c", f"date +%s.%N > {stamp}"]),
        env={**os.environ, "HYPERTF_START_AFTER": f"127.0.0.1:{port}"})
    try:
        time.sleep(1.0)
        assert not stamp.exists(), "started before worker 0 listened"
        listened = time.time()
        listener.listen()
        assert wrapper.wait(timeout=10) == 0
        assert listened <= float(stamp.read_text()) < listened + 2
    finally:
        listener.close()
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()


def test_the_idle_warning_of_a_tf1_worker_left_waiting_says_what_is_and_the_fixes() -> None:
    """legacy_mnist: worker 0 trained and exited 0; worker 1 logged 'Waiting for model to
    be ready' and nothing more. The warning said 'every task listens' and advised --chief
    (a TF2 fix) although the script reads the legacy flags."""
    from hypertf.core.monitor import Event, Limits, Monitor, TaskState
    from hypertf.launch.request import TrainRequest

    tasks = {p.name: TaskState(p, 20000 + i)
             for i, p in enumerate(_placements("worker:0", "worker:1", "ps:0"))}
    causes = TrainRequest(script="t.py", workers=2, ps=1).idle_causes(legacy_flags=True)
    assert "--chief" not in causes
    monitor = Monitor(tasks, Limits(idle_timeout=300.0), 0.0, idle_causes=causes)
    for name in ("worker0", "worker1", "ps0"):
        monitor.feed(Event("listening", "h1", name), 1.0)
    monitor.feed(Event("log", "h1", "worker1", line="Waiting for model to be ready."), 2.0)
    monitor.feed(Event("exit", "h1", "worker0", code=0), 3.0)
    said = [line for now in range(4, 310) for line in monitor.feed(Event("tick"), now).say]
    (warning,) = [line for line in said if "warning" in line]
    assert "every task listens" not in warning and "--chief" not in warning
    assert "worker:1@h1, ps:0@h1 still running" in warning
    assert "worker:0@h1 ended (exit 0)" in warning
    assert "device_filters" in warning and "wait for the other workers" in warning
