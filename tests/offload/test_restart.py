"""A world that ends under a live task is started again and the task's products go back to
it (issue 38: a garbage connection to hydra's control port, or a lost processor, ends the
world; it must not end the job's offloading). Real MPI worlds on this machine; the bound
on restarts with a stand-in world (a collaborator of the supervisor)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from typing import Any

import pytest

from hypertf.offload.channel import new_name
from hypertf.offload.runner import Supervisor
from hypertf.offload.world import World
from tests.conftest import wait_for
from tests.offload.test_hook import check_results, finish, processors_of, start


def test_a_world_that_dies_under_the_task_is_restarted_and_offloads_again(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    go = tmp_path / "go"
    channel = new_name()
    supervisor = Supervisor(lambda: World(channel, 2, tmp_path), 30.0)
    assert supervisor.start()
    first = supervisor.world
    assert first is not None and first.proc is not None
    proc = start(first.task_env(1000, tmp_path / "stats.json"), out, "--pause", str(go))
    code: list[int] = []
    waiter = threading.Thread(target=lambda: code.append(supervisor.wait(proc)), daemon=True)
    waiter.start()
    try:
        wait_for(lambda: (out / "paused").exists() or proc.poll() is not None, 60,
                 "the program to pause")
        os.kill(processors_of(first.proc.pid)[-1], signal.SIGKILL)  # the world ends
        wait_for(lambda: supervisor.world not in (None, first), 60, "a new world")
        go.touch()
        output = finish(proc)
        waiter.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        supervisor.stop()
    assert code == [0] and supervisor.restarted == 1 and not supervisor.failed
    check_results(out)
    stats = json.loads((tmp_path / "stats.json").read_text())
    # every product offloaded, before the world ended and after: none computed locally
    assert (stats["ops"], stats["fallbacks"], stats["failed"]) == (8, 0, ""), (stats, output)
    assert "hypertf offload:" not in output


class Dying:
    """A stand-in world whose mpiexec has already ended (or that cannot start)."""

    starts = 0

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.proc: Any = subprocess.Popen(["true"])
        self.proc.wait()

    def start(self, timeout: float) -> Dying:
        Dying.starts += 1
        if self.fails:
            raise RuntimeError("the offload world ended at start: no route to host")
        return self

    def output(self) -> str:
        return "cannot find proxy with ID 1234\n"

    def stop(self) -> None:
        pass


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(Supervisor, "BACKOFF_S", (0.01, 0.02))
    Dying.starts = 0


def test_restarts_are_bounded_then_one_line_and_local_products(quick, capsys):
    task = subprocess.Popen(["sleep", "30"])
    try:
        supervisor = Supervisor(Dying, 5.0)  # type: ignore[arg-type]
        assert supervisor.start()
        for _ in range(Supervisor.RESTARTS + 1):
            assert supervisor.died()
            supervisor.restart(task)
        assert supervisor.world is None and supervisor.restarted == Supervisor.RESTARTS
        assert "ended 4 times in 10 min (last: cannot find proxy with ID 1234)" in \
            supervisor.failed
        assert capsys.readouterr().err.count("hypertf offload:") == 1
    finally:
        task.kill()
        task.wait()


def test_a_world_that_cannot_start_again_is_tried_with_backoff_then_given_up(quick, capsys):
    task = subprocess.Popen(["sleep", "30"])
    try:
        supervisor = Supervisor(lambda: Dying(fails=True), 5.0)  # type: ignore[arg-type,return-value]
        started = time.monotonic()
        assert not supervisor.start(task)
        assert Dying.starts == 3 and time.monotonic() - started < 5
        assert "no route to host" in supervisor.failed
        assert capsys.readouterr().err.count("hypertf offload:") == 1
    finally:
        task.kill()
        task.wait()


def test_an_ended_task_is_not_waited_on_for_a_new_world(quick):
    task = subprocess.Popen(["true"])
    task.wait()
    supervisor = Supervisor(lambda: Dying(fails=True), 5.0)  # type: ignore[arg-type,return-value]
    assert not supervisor.start(task) and Dying.starts == 1
