"""A cold ``hypertf train`` begins its SSH connections, and the nodes' ``tasknode start
--watch``, before the launcher's modules are imported (hypertf.launch.prestart): on the lab,
the job takes over those very sessions, a failure before it does (an unreachable
ZooKeeper) is said as before, in one line, and nothing of the early start is left behind."""

from __future__ import annotations

import threading

import pytest

from hypertf.config.inventory import load_inventory
from hypertf.core.errors import StoreError, UsageError
from hypertf.launch import launcher
from hypertf.launch.launcher import Job
from hypertf.launch.prestart import connect_early, likely_hosts
from hypertf.launch.request import TrainRequest
from hypertf.launch.sessions import Sessions
from tests.conftest import wait_for
from tests.launcher.helpers import FAKE, all_free, hypertf, processes_of
from tests.launcher.test_preflight_and_ports import variant

UNREACHABLE_ZK = "127.0.0.1:1"  # nobody listens there
HOSTS = ["h1", "h2", "h3"]


def early_threads() -> list[str]:
    """The threads of an early start: one per host's connect, one per node's start."""
    return [t.name for t in threading.enumerate() if t.name.startswith(("ssh-", "start-watch-"))]


def all_closed(sessions: Sessions) -> bool:
    return all(s._runner is None for s in sessions.cluster.sessions.values())


def test_the_job_takes_over_the_early_sessions(lab, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inventory = load_inventory(lab.inventory)
    request = TrainRequest(script=FAKE, workers=3, args=("--work_s", "0"))
    assert likely_hosts(inventory, request) == HOSTS
    assert likely_hosts(inventory, TrainRequest(script=FAKE, workers=2)) == []
    sessions = connect_early(inventory, request)
    # begun before any Job exists: a session per host the job surely uses
    assert sorted(sessions.cluster.sessions) == HOSTS
    wait_for(lambda: all(s._runner is not None for s in sessions.cluster.sessions.values()),
             20, "the early connections")
    said: list[str] = []
    job = Job(inventory, request, said.append, sessions=sessions)
    assert job.sessions is sessions
    summary = job.run()
    assert summary["result"] == "succeeded", said
    assert sorted(sessions.cluster.sessions) == HOSTS, "no second session for a host"
    assert all_closed(sessions), "closed at the job's end"
    wait_for(lambda: not early_threads(), 10, "the early start's threads to end")
    assert processes_of(lab.inventory, summary["task_key"]) == {}
    assert all_free(lab.inventory)


def test_sessions_closed_while_they_connect_leave_nothing(lab):
    """Ctrl-C among the launcher's imports: the sessions closed before their connect ends."""
    sessions = connect_early(load_inventory(lab.inventory), TrainRequest(script=FAKE, workers=3))
    sessions.close()
    wait_for(lambda: not early_threads(), 20, "the early start's threads to end")
    assert all_closed(sessions), "a connection made after the close was closed too"


def test_a_refused_request_connects_nowhere(lab):
    with pytest.raises(UsageError, match="at least one worker"):
        connect_early(load_inventory(lab.inventory), TrainRequest(script=FAKE, workers=0))
    assert not early_threads()


def test_unreachable_zookeeper_is_one_line_as_before(lab, tmp_path):
    def edit(inv: dict) -> None:
        inv["all"]["vars"]["hypertf_zookeeper_hosts"] = UNREACHABLE_ZK

    bad = variant(lab, tmp_path, edit)
    done = hypertf("train", "-i", bad, "--script", FAKE, "--worker", "3", cwd=tmp_path,
                   timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"hypertf: error: cannot reach ZooKeeper at {UNREACHABLE_ZK} (")
    assert line.endswith("start it with 'invoke zk.start' or fix hypertf_zookeeper_hosts "
                         "in the inventory")
    # the same failure in process: the job raises it, and closes the early sessions
    inventory = load_inventory(bad)
    request = TrainRequest(script=FAKE, workers=3)
    sessions = connect_early(inventory, request)
    with pytest.raises(StoreError, match="cannot reach ZooKeeper") as raised:
        launcher.train(inventory, request, sessions=sessions)
    assert str(raised.value) == line.removeprefix("hypertf: error: ")
    wait_for(lambda: not early_threads(), 10, "the early start's threads to end")
    assert all_closed(sessions)
    assert processes_of(lab.inventory) == {}
