"""The placer without ZooKeeper or SSH: ``KeeperPlacer`` driven against in-memory stand-ins
for what it is handed (the queue's store side over a matrix in memory, the live agents,
preflight, the early connect). The placer's decisions are the real ones: what it
preflights before it asks, when it queues and says so, what it refuses at once, and what
it does with the keeper's grant; the lab tests exercise the real queue and nodes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hypertf.config.inventory import Inventory, load_inventory
from hypertf.core.errors import InsufficientResources
from hypertf.core.matrix import FREE, Matrix
from hypertf.core.placement import Grant, Request, cannot_place, pick_ports
from hypertf.core.records import AgentRecord
from hypertf.core.scheduler import Placement, schedule
from hypertf.launch.attempt import JobFailed
from hypertf.launch.placer import KeeperPlacer
from hypertf.launch.reporter import Reporter
from hypertf.launch.request import TrainRequest

HOSTS = ("h1", "h2", "h3")
FIRST, SECOND = "20261125-140000-aaaaaa.alice", "20261125-140100-bbbbbb.alice"


@dataclass
class FakeQueue:
    """The store's queue and matrix (as the placer uses them) over a matrix in memory: the
    dry run and the keeper's grant
    are the core's scheduler and port picking on ``cells`` (free GPUs per host)."""

    cells: Matrix
    waiting: list[dict[str, Any]] = field(default_factory=list)  # the keeper's view
    enqueued: list[tuple[str, Request, Mapping[str, Any], bool]] = field(default_factory=list)
    while_waiting: Callable[[], None] = lambda: None  # what happens while the job waits

    def read_view(self) -> list[dict[str, Any]]:
        return list(self.waiting)

    def plan(self, request: Request) -> list[Placement]:
        why = cannot_place(request, self.cells, request.hosts)
        if why:
            raise InsufficientResources(why)
        hosts = list(request.hosts)
        return schedule({h: self.cells.free(h) for h in hosts}, request.slots, request.policy,
                        cpu_hosts=hosts)

    def read(self) -> tuple[Matrix, object]:
        return self.cells, None

    def enqueue(self, task_key: str, request: Request, record: Mapping[str, Any],
                priority: int = 0, exclude_ports: Mapping[str, set[int]] | None = None,
                wait: bool = True, resumes: str = "") -> None:
        self.enqueued.append((task_key, request, dict(record), wait))

    def wait_for_admission(self, task_key: str, say: Callable[[str], None],
                           lost_session: threading.Event) -> Grant:
        self.while_waiting()
        request = next(r for key, r, _, _ in self.enqueued if key == task_key)
        placements = self.plan(request)
        return Grant(task_key, tuple(placements),
                     pick_ports(self.cells, placements, request.port_ranges, {}))


@dataclass
class FakeHosts:
    """The live agents: a record for each host that is up."""

    records: dict[str, AgentRecord]
    reads: int = 0

    def live_hosts(self) -> list[str]:
        self.reads += 1
        return [h for h in HOSTS if h in self.records]


@dataclass
class FakeRound:
    """An early preflight round: its hosts count as checked once joined."""

    checks: FakeChecks
    hosts: list[str]

    def join(self, timeout: float) -> None:
        self.checks.joined.append(timeout)
        if self.checks.early_answers:
            self.checks.checked.update(self.hosts)


@dataclass
class FakeChecks:
    """Preflight: every host passes; what was checked, when, and as what."""

    checked: set[str] = field(default_factory=set)
    runs: list[list[str]] = field(default_factory=list)
    early: list[list[str]] = field(default_factory=list)
    joined: list[float] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    early_answers: bool = True  # False: the early round is still running at the join

    def run(self, hosts: list[str], offload: Set[str]) -> None:
        self.runs.append(list(hosts))
        self.checked.update(hosts)

    def unchecked(self, hosts: Iterable[str], offload: Set[str]) -> list[str]:
        return [h for h in hosts if h not in self.checked]

    def forget(self, hosts: Iterable[str]) -> None:
        self.forgotten.extend(hosts)
        self.checked.difference_update(self.forgotten)

    def while_waiting(self, hosts: list[str], offload: Set[str]) -> FakeRound:
        self.early.append(list(hosts))
        return FakeRound(self, list(hosts))


@dataclass
class Setup:
    placer: KeeperPlacer
    queue: FakeQueue
    hosts: FakeHosts
    checks: FakeChecks
    connected: list[str]
    said: list[str]


@pytest.fixture
def inventory(tmp_path: Path) -> Inventory:
    path = tmp_path / "cluster.yml"
    path.write_text("all:\n  vars:\n    hypertf_zookeeper_hosts: 'zk.example:2181'\n"
                    "    hypertf_user_gpu_limit: 4\n  children:\n    gpu_nodes:\n      hosts:\n"
                    + "".join(f"        {h}: {{ansible_host: 10.0.0.{i + 1}}}\n"
                              for i, h in enumerate(HOSTS)))
    return load_inventory(path)


def setup(inventory: Inventory, tmp_path: Path, gpus: Mapping[str, int] | None = None,
          **request: Any) -> Setup:
    gpus = gpus or dict.fromkeys(HOSTS, 1)
    queue = FakeQueue(Matrix({h: [FREE] * n for h, n in gpus.items()}))
    hosts = FakeHosts({h: AgentRecord(h, f"10.0.0.{i + 1}", f"10.0.1.{i + 1}", 0, gpus[h], [])
                       for i, h in enumerate(HOSTS)})
    checks, connected, said = FakeChecks(), [], []
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    placer = KeeperPlacer(queue, queue, hosts, checks, connected.extend, inventory,
                          TrainRequest(script=str(script), **request), Reporter(said.append),
                          threading.Event())
    return Setup(placer, queue, hosts, checks, connected, said)


def test_on_an_idle_cluster_only_the_hosts_it_needs_are_connected_and_checked_first(
        inventory: Inventory, tmp_path: Path) -> None:
    s = setup(inventory, tmp_path, workers=2)
    grant = s.placer.place(FIRST, list(HOSTS), {})
    assert sorted(p.host for p in grant.placements) == ["h1", "h2"]
    assert s.connected == ["h1", "h2"], "the dry run's hosts are connected early, h3 is not"
    assert s.checks.runs == [["h1", "h2"]], "preflighted before asking; nothing after"
    ((key, request, record, wait),) = s.queue.enqueued
    assert (key, request.hosts, wait) == (FIRST, HOSTS, True)
    assert (record["job_id"], record["attempt"]) == (FIRST, 1)
    assert s.placer.queued == {FIRST}
    assert not any("queued" in line for line in s.said), "it did not wait: nothing to say"
    assert s.hosts.reads == 1, "the records are read again after the admission"
    assert [e["phase"] for e in s.placer.reporter.timeline.to_json()] == ["admission"]


def test_behind_others_the_job_queues_says_so_and_preflights_while_it_waits(
        inventory: Inventory, tmp_path: Path) -> None:
    s = setup(inventory, tmp_path, workers=2, priority=3)
    s.queue.waiting = [{"task_key": "20261125-130000-cccccc.bob"}]
    grant = s.placer.place(FIRST, list(HOSTS), {})
    assert s.connected == [] and s.checks.runs == [], "no dry run in line behind others"
    assert s.checks.early == [list(HOSTS)], "every host it may get, checked meanwhile"
    assert s.checks.joined == [inventory.cluster.ssh_timeout * 3 + 5]
    assert sorted(p.host for p in grant.placements) == ["h1", "h2"]
    assert any(f"job {FIRST} queued (priority 3" in line for line in s.said)
    assert any(f"job {FIRST} admitted after" in line for line in s.said)


def test_the_granted_hosts_the_early_round_missed_are_checked_before_the_start(
        inventory: Inventory, tmp_path: Path) -> None:
    s = setup(inventory, tmp_path, workers=2)
    s.queue.waiting = [{"task_key": "20261125-130000-cccccc.bob"}]
    s.checks.early_answers = False
    s.placer.place(FIRST, list(HOSTS), {})
    assert s.checks.joined, "the early round was waited for, and had not answered"
    assert s.checks.runs == [["h1", "h2"]], "so the granted hosts are checked now"


def test_more_than_the_cluster_or_the_users_limit_fails_at_once_and_queues_nothing(
        inventory: Inventory, tmp_path: Path) -> None:
    s = setup(inventory, tmp_path, workers=4)
    with pytest.raises(InsufficientResources, match="cannot place worker:3"):
        s.placer.place(FIRST, list(HOSTS), {})
    s = setup(inventory, tmp_path, gpus=dict.fromkeys(HOSTS, 4), workers=5)
    with pytest.raises(InsufficientResources, match="more than the 4 one user may hold"):
        s.placer.place(FIRST, list(HOSTS), {})
    assert s.queue.enqueued == [] and s.checks.runs == []


def test_with_no_wait_a_job_that_does_not_fit_now_is_refused_unqueued(
        inventory: Inventory, tmp_path: Path) -> None:
    s = setup(inventory, tmp_path, workers=2, wait=False)
    s.queue.cells.gpus["h2"] = s.queue.cells.gpus["h3"] = ["20261125-130000-cccccc.bob"]
    with pytest.raises(InsufficientResources, match="free now: h1: 1 of 1 free"):
        s.placer.place(FIRST, list(HOSTS), {})
    assert s.queue.enqueued == []


def test_an_agent_gone_during_the_wait_fails_the_attempt_as_retryable(
        inventory: Inventory, tmp_path: Path) -> None:
    s = setup(inventory, tmp_path, workers=2)

    def agent_gone() -> None:
        del s.hosts.records["h2"]

    s.queue.while_waiting = agent_gone
    with pytest.raises(JobFailed, match="the agent of h2 went away") as failed:
        s.placer.place(FIRST, list(HOSTS), {})
    assert failed.value.retryable and failed.value.hosts == frozenset({"h2"})
    assert s.placer.queued == {FIRST}, "it went through the queue: its record is ended"


def test_hosts_to_avoid_are_left_out_when_the_others_can_take_the_job(
        inventory: Inventory, tmp_path: Path) -> None:
    s = setup(inventory, tmp_path, workers=2)
    grant = s.placer.place(FIRST, list(HOSTS), {}, avoid=frozenset({"h1"}))
    assert sorted(p.host for p in grant.placements) == ["h2", "h3"]
    assert s.queue.enqueued[0][1].hosts == ("h2", "h3")
    s = setup(inventory, tmp_path, workers=3)  # it needs every host: h1 is kept
    grant = s.placer.place(FIRST, list(HOSTS), {}, avoid=frozenset({"h1"}))
    assert sorted(p.host for p in grant.placements) == ["h1", "h2", "h3"]


def test_each_attempt_is_recorded_as_the_same_job_and_a_failed_start_is_forgotten(
        inventory: Inventory, tmp_path: Path) -> None:
    s = setup(inventory, tmp_path, workers=2)
    s.placer.place(FIRST, list(HOSTS), {})
    s.placer.forget_preflight(["h2"])
    s.placer.place(SECOND, s.placer.live_hosts(), {"h1": {20000}})
    records = [(key, record["job_id"], record["attempt"]) for key, _, record, _ in
               s.queue.enqueued]
    assert records == [(FIRST, FIRST, 1), (SECOND, FIRST, 2)]
    assert s.checks.runs == [["h1", "h2"], ["h2"]], "only the forgotten host is asked again"
    assert s.placer.queued == {FIRST, SECOND}
