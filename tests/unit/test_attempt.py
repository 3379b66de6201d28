"""A whole attempt, and a job's restart, without a lab or root: ``Attempt`` and ``Job``
driven against in-memory collaborators (a fleet of nodes that answer as ``tasknode``
does, a lease, a placer). The attempt, its Monitor and the job's restart loop are the
real ones; the fakes stand for the nodes and ZooKeeper, which the lab tests exercise."""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hypertf.config.inventory import Inventory, load_inventory
from hypertf.core.errors import Interrupted, RemoteError
from hypertf.core.jobrecord import JobState
from hypertf.core.monitor import Event, EventKind
from hypertf.core.placement import Grant
from hypertf.core.protocol import RunEnd, StopResult
from hypertf.core.records import AgentRecord
from hypertf.core.rundir import RunDir
from hypertf.core.scheduler import Placement
from hypertf.launch.attempt import (
    Attempt,
    JobFailed,
    JobKilled,
    Parts,
    interrupted_by_signals,
)
from hypertf.launch.fleet import HostStart
from hypertf.launch.launcher import Job
from hypertf.launch.remote import GroupResult
from hypertf.launch.reporter import Reporter
from hypertf.launch.request import TrainRequest

HOSTS = ("h1", "h2")


@dataclass
class FakeFleet:
    """Nodes in memory. Each task does what ``plan(attempt number, task)`` says: "exit N"
    (listens, logs a line, exits N), "killed" (dies of a signal nobody here sent), "run"
    (listens and runs until stopped). The events come as ``tasknode start --watch`` sends
    them: listening, a log line, the exit; a host whose tasks all ended by themselves says
    'done' with the run's end; then its watcher closes."""

    plan: Callable[[int, str], str]
    starts: list[dict[str, HostStart]] = field(default_factory=list)
    stops: list[list[str]] = field(default_factory=list)
    running: dict[str, list[str]] = field(default_factory=dict)  # host -> tasks still running
    on_start: Callable[[], None] = lambda: None
    events: queue.Queue[Event] | None = None
    preempt_deadlines: list[float | None] = field(default_factory=list)

    def start(self, starts: Mapping[str, HostStart],
              events: queue.Queue[Event]) -> GroupResult[dict[str, int]]:
        self.starts.append(dict(starts))
        self.events = events
        number = len(self.starts)
        results: GroupResult[dict[str, int]] = GroupResult()
        for host, start in starts.items():
            results[host] = {task.name: 1000 + i for i, task in enumerate(start.tasks)}
            self.running[host] = []
            for task in start.tasks:
                events.put(Event(EventKind.LISTENING, host, task.name))
                events.put(Event(EventKind.LOG, host, task.name, line=f"{task.name} here"))
                what = self.plan(number, task.name)
                if what == "run":
                    self.running[host].append(task.name)
                elif what == "killed":
                    events.put(Event(EventKind.EXIT, host, task.name, code=137, killed=True))
                else:
                    events.put(Event(EventKind.EXIT, host, task.name, code=int(what.split()[1])))
            if not self.running[host]:
                self._ended(host, {t.name: StopResult.NOT_RUNNING for t in start.tasks})
        self.on_start()
        return results

    def _ended(self, host: str, stopped: dict[str, StopResult]) -> RunEnd:
        end = RunEnd(stopped, {name: f"{name} here\n" for name in stopped}, None, {})
        assert self.events is not None
        self.events.put(Event(EventKind.DONE, host, ended=end))
        self.events.put(Event(EventKind.CLOSED, host))
        return end

    def stop(self, runs: Mapping[str, RunDir], grace: float,
             preempt_deadline: float | None = None) -> GroupResult[RunEnd]:
        self.stops.append(sorted(runs))
        self.preempt_deadlines.append(preempt_deadline)
        results: GroupResult[RunEnd] = GroupResult()
        assert self.events is not None
        for host in runs:
            for name in self.running.get(host, []):
                self.events.put(Event(EventKind.EXIT, host, name, code=143, killed=True))
            stopped = dict.fromkeys(self.running.pop(host, []), StopResult.STOPPED)
            results[host] = self._ended(host, stopped)
        return results

    def fetch_logs(self, runs: Mapping[str, RunDir], tasks: Mapping[str, Sequence[str]],
                   local: RunDir, have: Mapping[str, Mapping[str, str]]) -> None:
        for host, names in tasks.items():
            for name in names:
                Path(local.log(name)).write_text(have.get(host, {}).get(name, ""))

    def fetch_metrics(self, host: str, run: RunDir, local: RunDir) -> None:
        pass


@dataclass
class FakeLease:
    """The job record and lease in memory: what was written, and a way to drop the lease."""

    started: list[str] = field(default_factory=list)
    released: list[tuple[str, JobState, Sequence[str] | None]] = field(default_factory=list)
    watching: dict[str, queue.Queue[Event]] = field(default_factory=dict)

    def starting(self, task_key: str) -> None:
        self.started.append(task_key)

    def watch(self, task_key: str, events: queue.Queue[Event]) -> Callable[[], None]:
        self.watching[task_key] = events
        return lambda: self.watching.pop(task_key, None)  # type: ignore[func-returns-value]

    def drop(self, task_key: str) -> None:  # 'hypertf kill'
        self.watching[task_key].put(Event(EventKind.LEASE_DROPPED))

    def ended_by(self, task_key: str) -> str:
        return "hypertf cancel by user.bob from ws1"

    def release(self, task_key: str, result: JobState, summary: Mapping[str, Any],
                stopped_on: Sequence[str] | None,
                meanwhile: Callable[[], object] | None = None) -> None:
        assert summary["task_key"] == task_key
        self.released.append((task_key, result, stopped_on))
        if meanwhile is not None:
            meanwhile()


@dataclass
class FakePlacer:
    """The keeper's grant: worker:i on HOSTS[i], port 2000 + attempt."""

    placed: list[str] = field(default_factory=list)
    queued: set[str] = field(default_factory=set)
    forgotten: list[str] = field(default_factory=list)

    def place(self, task_key: str, live: list[str], exclude: dict[str, set[int]],
              avoid: frozenset[str] = frozenset(), resumes: str = "") -> Grant:
        self.placed.append(task_key)
        placements = tuple(Placement("worker", i, host, ()) for i, host in enumerate(HOSTS))
        return Grant(task_key, placements, {p.name: 2000 + len(self.placed)
                                            for p in placements})

    def forget_preflight(self, hosts: Iterable[str]) -> None:
        self.forgotten.extend(hosts)

    def live_hosts(self) -> list[str]:
        return list(HOSTS)


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Inventory:
    monkeypatch.chdir(tmp_path)  # runs/<key>/ (logs, summary.json) land here
    path = tmp_path / "cluster.yml"
    path.write_text("all:\n  vars:\n    hypertf_zookeeper_hosts: 'zk.example:2181'\n"
                    "    hypertf_workdir: /srv/hypertf\n  children:\n    gpu_nodes:\n"
                    "      hosts:\n        h1: {ansible_host: 10.0.0.1}\n"
                    "        h2: {ansible_host: 10.0.0.2}\n")
    return load_inventory(path)


def job_of(inventory: Inventory, tmp_path: Path, fleet: FakeFleet, lease: FakeLease,
           placer: FakePlacer, said: list[str], **request: Any) -> Job:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    parts = Parts(placer=placer, fleet=fleet, lease=lease, reporter=Reporter(said.append))
    job = Job(inventory, TrainRequest(script=str(script), workers=2, ps=0, **request),
              said.append, first_key="20261125-140000-aaaaaa.alice", parts=parts)
    job.records = {h: AgentRecord(h, f"10.0.0.{i + 1}", f"10.0.1.{i + 1}", 0, 0, [])
                   for i, h in enumerate(HOSTS)}
    return job


def parts_of(job: Job) -> Parts:
    assert job.parts is not None
    return job.parts


def attempt_of(job: Job) -> Attempt:
    key = f"20261125-14000{len(job.attempts)}-bbbbbb.alice"
    job.attempts.append(Attempt(job, key, len(job.attempts) + 1, last=False,
                                parts=parts_of(job)))
    return job.attempts[-1]


def test_an_attempt_whose_tasks_all_exit_0_succeeds_with_no_stop_round_trip(
        inventory: Inventory, tmp_path: Path) -> None:
    fleet, lease, placer, said = FakeFleet(lambda _n, _t: "exit 0"), FakeLease(), FakePlacer(), []
    attempt = attempt_of(job_of(inventory, tmp_path, fleet, lease, placer, said))
    outcome = attempt.run(list(HOSTS), {})
    assert (outcome.message, attempt.result) == ("all finishers exited 0", JobState.SUCCEEDED)
    starts = fleet.starts[0]
    assert sorted(starts) == ["h1", "h2"]
    (task,) = starts["h2"].tasks
    assert (task.name, task.port, task.env["HYPERTF_ATTEMPT"]) == ("worker1", 2001, "1")
    assert json.loads(task.env["TF_CONFIG"]) == {
        "cluster": {"worker": ["10.0.1.1:2001", "10.0.1.2:2001"]},
        "task": {"type": "worker", "index": 1}}
    assert fleet.stops == [[]], "both nodes ended their runs themselves: nothing to stop"
    assert lease.started == [attempt.task_key]
    assert lease.released == [(attempt.task_key, JobState.SUCCEEDED, ["h1", "h2"])]
    assert set(attempt.ended) == {"h1", "h2"}, "each node said how its run ended"
    assert (tmp_path / "runs" / attempt.task_key / "worker0.log").read_text() == "worker0 here\n"
    assert any("started 2 tasks: worker:0@h1:2001, worker:1@h2:2001" in line for line in said)


def test_a_failing_task_fails_the_attempt_and_the_running_one_is_stopped(
        inventory: Inventory, tmp_path: Path) -> None:
    fleet = FakeFleet(lambda _n, task: "exit 3" if task == "worker1" else "run")
    lease, placer, said = FakeLease(), FakePlacer(), []
    attempt = attempt_of(job_of(inventory, tmp_path, fleet, lease, placer, said))
    with pytest.raises(JobFailed, match="task worker:1@h2 failed: exit 3") as failed:
        attempt.run(list(HOSTS), {})
    assert not failed.value.retryable and failed.value.hosts == frozenset({"h2"})
    assert fleet.stops == [["h1"]], "h2's node ended its run; only h1 is stopped"
    ends = {t.name: (t.exit_code, t.stop_result) for t in attempt.tasks.values()}
    assert ends == {"worker:0": (143, StopResult.STOPPED), "worker:1": (3, StopResult.NOT_RUNNING)}
    assert lease.released == [(attempt.task_key, JobState.FAILED, ["h1", "h2"])]
    summary = (tmp_path / "runs" / attempt.task_key / "summary.json").read_text()
    assert '"result": "failed"' in summary and "stopped by HyperTF (SIGTERM)" in summary


@dataclass
class RefusingFleet(FakeFleet):
    """Nodes whose every start fails, each with its own error (as ``Cluster.each`` gives
    them back: an exception per host)."""

    def start(self, starts: Mapping[str, HostStart],
              events: queue.Queue[Event]) -> GroupResult[dict[str, int]]:
        self.starts.append(dict(starts))
        self.events = events
        return GroupResult({host: RemoteError(f"{host}: tasknode: no such file ({i})")
                            for i, host in enumerate(sorted(starts))})


def test_a_start_failing_on_two_hosts_is_one_error_that_keeps_each_hosts_own(
        inventory: Inventory, tmp_path: Path) -> None:
    """Fabric's GroupException: one exception for people (one line), each host's own
    error kept beside it for code and logs; the hosts are forgotten by the preflight."""
    fleet, lease, placer, said = RefusingFleet(lambda _n, _t: "run"), FakeLease(), \
        FakePlacer(), []
    attempt = attempt_of(job_of(inventory, tmp_path, fleet, lease, placer, said))
    with pytest.raises(JobFailed) as failed:
        attempt.run(list(HOSTS), {})
    assert str(failed.value) == ("could not start tasks: h1: h1: tasknode: no such file (0); "
                                 "h2: h2: tasknode: no such file (1)")
    assert sorted(failed.value.failures) == ["h1", "h2"]
    assert [str(e) for e in failed.value.failures.values()] == [
        "h1: tasknode: no such file (0)", "h2: tasknode: no such file (1)"]
    assert all(isinstance(e, RemoteError) for e in failed.value.failures.values())
    assert failed.value.hosts == frozenset({"h1", "h2"})
    assert placer.forgotten == ["h1", "h2"]


def test_a_dropped_lease_is_a_kill_and_ctrl_c_an_interruption(
        inventory: Inventory, tmp_path: Path) -> None:
    fleet, lease, placer, said = FakeFleet(lambda _n, _t: "run"), FakeLease(), FakePlacer(), []
    job = job_of(inventory, tmp_path, fleet, lease, placer, said)
    fleet.on_start = lambda: lease.drop(job.attempts[-1].task_key)
    killed = attempt_of(job)
    with pytest.raises(JobKilled, match=r"its lease was dropped \(hypertf cancel by user\.bob "
                                        r"from ws1\)"):
        killed.run(list(HOSTS), {})
    assert fleet.stops == [["h1", "h2"]]
    assert lease.released[-1] == (killed.task_key, JobState.KILLED, ["h1", "h2"])

    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))  # Ctrl-C
    fleet.on_start = timer.start
    interrupted = attempt_of(job)
    with pytest.raises(Interrupted), interrupted_by_signals():
        interrupted.run(list(HOSTS), {})
    timer.join()
    assert fleet.stops[-1] == ["h1", "h2"]
    assert lease.released[-1] == (interrupted.task_key, JobState.INTERRUPTED, ["h1", "h2"])
    assert lease.watching == {}, "each attempt ended its lease watch"


def test_a_task_killed_by_a_signal_restarts_the_job_as_a_new_attempt(
        inventory: Inventory, tmp_path: Path) -> None:
    fleet = FakeFleet(lambda n, task: "killed" if (n, task) == (1, "worker0") else "exit 0")
    lease, placer, said = FakeLease(), FakePlacer(), []
    job = job_of(inventory, tmp_path, fleet, lease, placer, said, max_restarts=1)
    outcome = job.run_attempts(list(HOSTS))
    assert outcome.message == "all finishers exited 0"
    assert [a.result for a in job.attempts] == [JobState.FAILED, JobState.SUCCEEDED]
    assert placer.placed == [a.task_key for a in job.attempts]
    assert [s["h1"].tasks[0].env["HYPERTF_ATTEMPT"] for s in fleet.starts] == ["1", "2"]
    assert [r[1] for r in lease.released] == [JobState.FAILED, JobState.SUCCEEDED]
    assert any("restart 1 of 1 in 1 s" in line for line in said)


def test_a_preempted_attempt_is_stopped_by_the_notices_deadline_and_the_job_waits_again(
        inventory: Inventory, tmp_path: Path) -> None:
    """No restart is spent on it, the next attempt names the one it resumes, and it asks
    for the hosts the job had even when an agent is down at that moment (the keeper admits
    only on live hosts: the job waits for them)."""
    import time as clock

    from hypertf.core.preemptnotice import Notice

    fleet = FakeFleet(lambda n, task: "run" if n == 1 else "exit 0")
    lease, said = FakeLease(), []

    @dataclass
    class Placer(FakePlacer):
        asked: list[tuple[list[str], str]] = field(default_factory=list)

        def place(self, task_key: str, live: list[str], exclude: dict[str, set[int]],
                  avoid: frozenset[str] = frozenset(), resumes: str = "") -> Grant:
            self.asked.append((list(live), resumes))
            return super().place(task_key, live, exclude, avoid, resumes)

        def live_hosts(self) -> list[str]:
            return list(HOSTS)[:1]  # an agent down for a moment

    placer = Placer()
    job = job_of(inventory, tmp_path, fleet, lease, placer, said)
    deadline = clock.time() + 30

    def preempt() -> None:
        if len(job.attempts) == 1:
            key = job.attempts[0].task_key
            notice = Notice(key, "20261125-140001-bbbbbb.bob", clock.time(), deadline,
                            "priority", order=7)
            lease.watching[key].put(Event(EventKind.PREEMPTED, why=notice.to_json().decode()))

    fleet.on_start = preempt
    outcome = job.run_attempts(list(HOSTS))
    assert outcome.message == "all finishers exited 0"
    assert [a.result for a in job.attempts] == [JobState.PREEMPTED, JobState.SUCCEEDED]
    first = job.attempts[0].task_key
    assert placer.asked == [(list(HOSTS), ""), (list(HOSTS), first)]
    assert fleet.preempt_deadlines[0] == deadline  # the nodes write the file, then TERM
    assert job.attempts[0].message.startswith("preempted by 20261125-140001-bbbbbb.bob")
    assert any("requeued as attempt 2" in line for line in said)
