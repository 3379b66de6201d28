"""Which running jobs a waiting job preempts: tiers, fair share within a tier, the minimum
runtime and its back-off, unpreemptible jobs, fewest GPUs and most recent first, gang fit;
and an hour of two users contending, simulated, with no job preempted back and forth."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace

import pytest

from hypertf.core.admission import Waiting, admission_pass
from hypertf.core.matrix import FREE, Held, Matrix
from hypertf.core.placement import Request
from hypertf.core.preemption import (
    BACKOFF_MAX_S,
    Reason,
    Running,
    Standing,
    exempt_for,
    held_cells,
    requeue_delay,
    victims_for,
)
from hypertf.core.scheduler import TaskSlot

NOW = 100_000.0
HOUR = 3600.0


def key(name: str, user: str) -> str:
    return f"20260101-000000-{name}.{user}"


def waiting(name: str = "w", user: str = "alice", priority: int = 5, workers: int = 1,
            gpus: int = 1, hosts: tuple[str, ...] = ("h1", "h2"), ps: int = 0) -> Waiting:
    slots = tuple(TaskSlot("worker", i, gpus) for i in range(workers)) + tuple(
        TaskSlot("ps", i, 0) for i in range(ps))
    return Waiting(key(name, user), Request(slots, hosts), priority)


def cluster(jobs: list[Running], hosts: dict[str, int]) -> Matrix:
    """Rows of ``hosts`` GPUs each, free except where a running job holds a cell."""
    gpus: dict[str, list[int | str]] = {h: [FREE] * n for h, n in hosts.items()}
    for job in jobs:
        for host, cells in job.gpus.items():
            for i in cells:
                gpus[host][i] = job.task_key
    return Matrix(gpus)


def run(name: str, user: str = "bob", priority: int = 0, age: float = HOUR,
        preemptible: bool = True, preemptions: int = 0,
        displaced: frozenset[str] = frozenset(), **cells: tuple[int, ...]) -> Running:
    return Running(key(name, user), priority, NOW - age, dict(cells), preemptible,
                   preemptions, displaced)


def decide(job: Waiting, jobs: list[Running], hosts: dict[str, int] | None = None,
           min_runtime: float = 600.0, fair_share: Standing | None = None):
    hosts = hosts or {"h1": 2, "h2": 2}
    return victims_for(job, jobs, cluster(jobs, hosts), set(hosts), NOW, min_runtime,
                       fair_share)


def names(decision) -> list[str]:
    return [k.split("-")[2].split(".")[0] for k in decision.victims]


FULL = [run("a", h1=(0, 1)), run("b", h2=(0, 1))]


def test_a_strictly_lower_tier_is_preempted_and_the_same_or_a_higher_one_is_not() -> None:
    decision = decide(waiting(priority=5, gpus=2), FULL)
    assert decision is not None and len(decision.victims) == 1
    assert set(decision.reasons.values()) == {Reason.PRIORITY}
    assert decision.gpus == 2 and decision.placements[0].gpus == (0, 1)
    assert decide(waiting(priority=0, gpus=2), FULL) is None  # the same tier
    high = [replace(job, priority=7) for job in FULL]
    assert decide(waiting(priority=5, gpus=2), high) is None


def test_the_same_tier_is_never_preempted_without_fair_share() -> None:
    jobs = [run("a", priority=5, h1=(0, 1)), run("b", priority=5, h2=(0, 1))]
    assert decide(waiting(priority=5, gpus=2), jobs) is None
    shares = Standing({"alice": 1.0, "bob": 0.1})
    decision = decide(waiting(priority=5, gpus=2), jobs, fair_share=shares)
    assert decision is not None and set(decision.reasons.values()) == {Reason.FAIRSHARE}
    assert decision.displaced == {"bob"}


@pytest.mark.parametrize(("alice", "bob", "preempts"), [
    (1.0, 0.1, True),     # alice below her share, bob above his
    (0.1, 1.0, False),    # the other way round
    (0.54, 0.1, False),   # alice within the margin of her share: not below it
    (1.0, 0.46, False),   # bob within the margin: not above it
    (0.4, 0.1, False),    # both above: less above is not enough
])
def test_within_a_tier_only_a_user_above_their_share_for_one_below_theirs(alice, bob,
                                                                          preempts) -> None:
    jobs = [run("a", priority=5, h1=(0, 1)), run("b", priority=5, h2=(0, 1))]
    shares = Standing(lambda user: {"alice": alice, "bob": bob}[user])
    assert (decide(waiting(priority=5, gpus=2), jobs, fair_share=shares) is not None) \
        is preempts


def test_a_user_the_factors_do_not_name_is_at_their_share() -> None:
    jobs = [run("a", priority=5, h1=(0, 1)), run("b", priority=5, h2=(0, 1))]
    assert decide(waiting(priority=5, gpus=2), jobs, fair_share=Standing({})) is None


def test_the_minimum_runtime_holds_and_grows_with_each_preemption() -> None:
    young = [run("a", age=599, h1=(0, 1)), run("b", age=599, h2=(0, 1))]
    assert decide(waiting(gpus=2), young, min_runtime=600) is None
    assert decide(waiting(gpus=2), young, min_runtime=0) is not None
    once = [run("a", age=1000, preemptions=1, h1=(0, 1)),
            run("b", age=1300, preemptions=1, h2=(0, 1))]
    assert names(decide(waiting(gpus=2), once, min_runtime=600)) == ["b"]  # 1200 s needed
    assert [exempt_for(n, 600) for n in range(4)] == [600, 1200, 2400, 4800]
    assert [exempt_for(n, 0) for n in range(3)] == [0, 120, 240]  # a 60 s floor once preempted
    assert exempt_for(100, 600) == 600 + BACKOFF_MAX_S
    assert [requeue_delay(n) for n in range(1, 6)] == [0, 5, 10, 20, 40]
    assert requeue_delay(50) == 300


def test_an_unpreemptible_job_is_never_a_victim() -> None:
    jobs = [run("a", preemptible=False, h1=(0, 1)), run("b", preemptible=False, h2=(0, 1))]
    assert decide(waiting(gpus=2), jobs) is None
    jobs[1] = replace(jobs[1], preemptible=True)
    assert names(decide(waiting(gpus=2), jobs)) == ["b"]


def test_the_fewest_gpus_that_make_it_fit() -> None:
    # one GPU is free on h2: preempting the 1-GPU job there beats the 2-GPU job on h1
    jobs = [run("big", age=2 * HOUR, h1=(0, 1)), run("small", h2=(1,))]
    assert names(decide(waiting(gpus=2), jobs)) == ["small"]
    # a job spread over two hosts counts all its GPUs, not only the useful ones
    jobs = [run("spread", age=100 * HOUR, h1=(0,), h2=(0,)), run("one", h1=(1,)),
            run("two", h2=(1,), h3=(0,))]
    decision = decide(waiting(gpus=2, hosts=("h1", "h2")), jobs, {"h1": 2, "h2": 2, "h3": 1})
    assert names(decision) == ["one", "spread"] and decision.gpus == 3


def test_lower_tier_first_then_most_recently_started() -> None:
    jobs = [run("t3", priority=3, h1=(0, 1)), run("old", age=3 * HOUR, h2=(0, 1)),
            run("new", age=HOUR, h3=(0, 1))]
    hosts = {"h1": 2, "h2": 2, "h3": 2}
    every = ("h1", "h2", "h3")
    assert names(decide(waiting(gpus=2, hosts=every), jobs, hosts)) == ["new"]
    decision = decide(waiting(workers=2, gpus=2, hosts=every), jobs, hosts)
    assert names(decision) == ["new", "old"]  # still tier 0 before tier 3
    decision = decide(waiting(workers=3, gpus=2, hosts=every), jobs, hosts)
    assert names(decision) == ["new", "old", "t3"]


def test_no_tier_is_touched_to_save_gpus_when_a_lower_one_makes_it_fit() -> None:
    jobs = [run("t0", priority=0, h1=(0, 1)), run("t3", priority=3, h2=(1,))]
    assert names(decide(waiting(gpus=2), jobs)) == ["t0"]


def test_gang_all_or_nothing() -> None:
    # two 2-GPU tasks: the preemptible job frees one host only, the other is exempt
    jobs = [run("a", h1=(0, 1)), run("young", age=10, h2=(0, 1))]
    assert decide(waiting(workers=2, gpus=2), jobs) is None
    # a task of 2 GPUs needs them on one host: two 1-GPU victims on two hosts do not do
    jobs = [run("a", h1=(0,)), run("b", h2=(0,)), run("c", preemptible=False, h1=(1,)),
            run("d", preemptible=False, h2=(1,))]
    assert decide(waiting(gpus=2), jobs) is None
    assert decide(waiting(workers=2, gpus=1), jobs) is not None


def test_mixed_task_sizes_and_gpu_less_tasks_fit_by_the_scheduler() -> None:
    jobs = [run("a", h1=(0, 1, 2, 3)), run("b", h2=(0,)), run("c", age=10, h2=(1, 2, 3))]
    decision = decide(Waiting(key("w", "alice"), Request(
        (TaskSlot("worker", 0, 4), TaskSlot("worker", 1, 1), TaskSlot("ps", 0, 0)),
        ("h1", "h2")), 5), jobs, {"h1": 4, "h2": 4})
    assert sorted(names(decision)) == ["a", "b"]
    assert {p.name: (p.host, p.gpus) for p in decision.placements} == {
        "worker:0": ("h1", (0, 1, 2, 3)), "worker:1": ("h2", (0,)), "ps:0": ("h1", ())}


def test_a_job_that_fits_already_needs_no_victim_and_dead_hosts_do_not_count() -> None:
    decision = decide(waiting(gpus=1), [run("a", h1=(0,))])
    assert decision is not None and decision.victims == () and decision.placements
    jobs = [run("a", h1=(0, 1)), run("b", h2=(0, 1))]
    assert victims_for(waiting(gpus=2), jobs, cluster(jobs, {"h1": 2, "h2": 2}), {"h1"},
                       NOW, 0) is not None
    assert victims_for(waiting(gpus=2, hosts=("h2",)), jobs,
                       cluster(jobs, {"h1": 2, "h2": 2}), {"h1"}, NOW, 0) is None


def test_displaced_users_cannot_take_the_gpus_back_within_the_tier() -> None:
    # alice's job took bob's GPUs: even with bob far below his share now, he cannot
    # preempt it back at the same tier; a strictly higher tier still can
    mine = run("a", user="alice", priority=5, displaced=frozenset({"bob", "carol"}),
               h1=(0, 1), h2=(0, 1))
    shares = Standing({"alice": 0.01, "bob": 1.0, "carol": 1.0, "dave": 1.0})
    assert decide(waiting("w", "bob", priority=5, gpus=2), [mine], fair_share=shares) is None
    assert decide(waiting("w", "carol", priority=5, gpus=2), [mine],
                  fair_share=shares) is None
    assert decide(waiting("w", "dave", priority=5, gpus=2), [mine],
                  fair_share=shares) is not None
    assert decide(waiting("w", "bob", priority=6, gpus=2), [mine]) is not None
    # the preemptor inherits its victims' displaced users, transitively
    decision = decide(waiting("w", "dave", priority=5, gpus=2), [mine], fair_share=shares)
    assert decision.displaced == {"alice", "bob", "carol"}


def test_held_cells_reads_every_job_from_the_matrix_in_one_pass() -> None:
    matrix = Matrix({"h1": [key("a", "bob"), FREE, key("b", "bob")], "h2": [FREE, 0],
                     "h3": [key("a", "bob"), "draining:" + key("c", "bob")]})
    assert held_cells(matrix) == {key("a", "bob"): {"h1": (0,), "h3": (0,)},
                                  key("b", "bob"): {"h1": (2,)}}


def test_cheap_at_25000_hosts_with_1000_running_jobs() -> None:
    """The keeper's pass must stay under 0.5 s at this size: one decision is a fraction
    of it (bench figures in the report; the bound only catches a quadratic turn)."""
    hosts = {f"n{i:05d}": 8 for i in range(25_000)}
    names_ = list(hosts)
    jobs = [Running(key(f"r{j}", f"u{j % 50}"), j % 3, NOW - HOUR - j,
                    {h: tuple(range(8)) for h in names_[j * 25:(j + 1) * 25]})
            for j in range(1000)]
    matrix = cluster(jobs, hosts)
    job = Waiting(key("w", "alice"), Request((TaskSlot("worker", 0, 8),), tuple(names_)), 5)
    start = time.perf_counter()
    decision = victims_for(job, jobs, matrix, set(hosts), NOW, 600)
    took = time.perf_counter() - start
    assert decision is not None and len(decision.victims) == 1
    assert decision.gpus == 200  # a victim holds 25 hosts x 8
    nobody = [replace(j, priority=9) for j in jobs]
    start = time.perf_counter()
    assert victims_for(job, nobody, matrix, set(hosts), NOW, 600) is None
    none_took = time.perf_counter() - start
    assert took < 0.5 and none_took < 0.05, (took, none_took)  # ~7 ms and ~0.1 ms here


# -- an hour of two users contending ------------------------------------------------------
STEP = 10.0
GRACE = 20.0
HALF_LIFE = 900.0
CHECKPOINT_EVERY = 60.0
HOSTS = ("h1", "h2", "h3", "h4")


@dataclass
class SimJob:
    key: str
    submitted: int  # the queue order: a requeued job keeps it
    gpus: int
    work: float  # seconds of training it needs
    done: float = 0.0
    started: float | None = None
    preemptions: int = 0
    eligible_at: float = 0.0
    displaced: frozenset[str] = frozenset()
    cells: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ports: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass
class Sim:
    remember_displaced: bool = True
    now: float = 0.0
    matrix: Matrix = field(default_factory=lambda: Matrix({h: [FREE, FREE] for h in HOSTS}))
    waiting: dict[str, SimJob] = field(default_factory=dict)
    running: dict[str, SimJob] = field(default_factory=dict)
    notices: dict[str, float] = field(default_factory=dict)  # victim -> its deadline
    preempting: dict[str, set[str]] = field(default_factory=dict)  # preemptor -> victims
    usage: dict[str, float] = field(default_factory=lambda: {"alice": 0.0, "bob": 0.0})
    events: list[tuple[float, str, str]] = field(default_factory=list)  # preemptor, victim
    finished: list[str] = field(default_factory=list)
    busy: float = 0.0  # GPU-seconds held by running jobs
    counter: itertools.count = field(default_factory=itertools.count)

    def submit(self, user: str, gpus: int, work: float) -> None:
        n = next(self.counter)
        self.waiting[key(f"{n:04d}", user)] = SimJob(key(f"{n:04d}", user), n, gpus, work)

    def factors(self) -> Standing:
        """Slurm's classic factor, 2^(-usage/share), from usage decayed with a half-life."""
        total = sum(self.usage.values()) or 1.0
        return Standing({u: 2 ** (-(used / total) / 0.5) for u, used in self.usage.items()})

    def free(self, job: SimJob) -> None:
        gpus = {h: list(row) for h, row in self.matrix.gpus.items()}
        for host, cells in job.cells.items():
            for i in cells:
                gpus[host][i] = FREE
        ports = {h: {p: k for p, k in row.items() if k != job.key}
                 for h, row in self.matrix.ports.items()}
        self.matrix = Matrix(gpus, ports)
        job.cells, job.ports, job.started = {}, {}, None

    def start(self, job: SimJob, held: Held) -> None:
        self.matrix = self.matrix.take(job.key, held.gpus, held.ports)
        job.cells, job.ports, job.started = dict(held.gpus), dict(held.ports), self.now
        self.waiting.pop(job.key, None)
        self.running[job.key] = job

    def step(self) -> None:
        self.now += STEP
        decay = 0.5 ** (STEP / HALF_LIFE)
        for user in self.usage:
            self.usage[user] *= decay
        for job in list(self.running.values()):
            self.usage[job.key.rsplit(".", 1)[1]] += job.gpus * STEP
            self.busy += job.gpus * STEP
            job.done += STEP
            if job.done >= job.work and job.key not in self.notices:
                self.free(job)
                del self.running[job.key]
                self.finished.append(job.key)
        for victim_key, deadline in list(self.notices.items()):
            if deadline <= self.now:  # the tasks are dead: cells freed, the job requeued
                del self.notices[victim_key]
                victim = self.running.pop(victim_key)
                self.free(victim)
                victim.done -= victim.done % CHECKPOINT_EVERY  # back to its last checkpoint
                victim.preemptions += 1
                victim.eligible_at = self.now + requeue_delay(victim.preemptions)
                self.waiting[victim_key] = victim
        self.admit()

    def waiting_jobs(self) -> list[Waiting]:
        return [Waiting(job.key, Request((TaskSlot("worker", 0, job.gpus),), HOSTS),
                        0, job.submitted)
                for job in sorted(self.waiting.values(), key=lambda j: j.submitted)
                if job.eligible_at <= self.now]

    def admit(self) -> None:
        # preemptors whose victims are gone are placed first: the freed GPUs are theirs
        ready = [p for p, victims in self.preempting.items() if not victims & set(self.notices)]
        for preemptor in ready:
            del self.preempting[preemptor]
        queue = [w for w in self.waiting_jobs() if w.task_key not in self.preempting]
        for group in ([w for w in queue if w.task_key in ready],
                      [w for w in queue if w.task_key not in ready]):
            for decision in admission_pass(self.matrix, HOSTS, group):
                if decision.admitted:
                    self.start(self.waiting[decision.task_key],
                               Held.of(decision.placements, decision.ports))
        # then one preemption per pass, for the first waiting job it helps
        shares = self.factors()
        candidates = [Running(j.key, 0, j.started or 0.0, j.cells, True, j.preemptions,
                              j.displaced if self.remember_displaced else frozenset())
                      for j in self.running.values() if j.key not in self.notices]
        for job in self.waiting_jobs():
            if job.task_key in self.preempting:
                continue
            decision = victims_for(job, candidates, self.matrix, HOSTS, self.now, 120.0,
                                   shares)
            if decision is None or not decision.victims:
                continue
            self.preempting[job.task_key] = set(decision.victims)
            self.waiting[job.task_key].displaced = decision.displaced
            for victim in decision.victims:
                self.notices[victim] = self.now + GRACE
                self.events.append((self.now, job.task_key, victim))
            break


def arrivals(minute: int) -> list[tuple[str, int, float]]:
    """Every 4 minutes the heavy user of the quarter hour (bob, then alice, in turn)
    submits two 2-GPU jobs of 8 to 14 minutes, the other one every 8 minutes one of 15:
    more than the 8 GPUs can run, and usage that swings from one user to the other."""
    if minute % 4:
        return []
    heavy, light = ("bob", "alice") if minute // 15 % 2 == 0 else ("alice", "bob")
    jobs = [(heavy, 2, 600.0 + 60 * (minute % 5)), (heavy, 2, 480.0)]
    return [*jobs, (light, 2, 900.0)] if minute % 8 == 0 else jobs


def simulate(remember_displaced: bool = True) -> Sim:
    sim = Sim(remember_displaced)
    while sim.now < HOUR:
        if sim.now % 60 == 0:
            for user, gpus, work in arrivals(int(sim.now // 60)):
                sim.submit(user, gpus, work)
        sim.step()
    return sim


def preempted_back(events: list[tuple[float, str, str]]) -> list[tuple[str, str]]:
    """Pairs (P, V) where V's user later preempted P: the GPUs taken back."""
    owner = {k: k.rsplit(".", 1)[1] for _, p, v in events for k in (p, v)}
    back = []
    for i, (_, p1, v1) in enumerate(events):
        for _, p2, v2 in events[i + 1:]:
            if v2 == p1 and owner[p2] == owner[v1]:
                back.append((p1, v1))
    return back


def test_two_users_contending_for_an_hour_never_preempt_each_other_back() -> None:
    sim = simulate()
    assert len(sim.events) >= 3, sim.events  # fair share did preempt, within the tier
    assert preempted_back(sim.events) == []
    victims = [v for _, _, v in sim.events]
    assert max(victims.count(v) for v in victims) <= 2  # nobody is the victim every time
    done = {u: sum(k.endswith("." + u) for k in sim.finished) for u in ("alice", "bob")}
    assert min(done.values()) >= 5, done  # both make progress
    assert sim.busy >= 0.85 * 8 * HOUR, sim.busy  # and the GPUs stay busy


def test_without_the_displaced_rule_the_same_hour_preempts_back() -> None:
    """The control: switched off, the rule's absence shows as jobs taking GPUs back."""
    sim = simulate(remember_displaced=False)
    assert preempted_back(sim.events)
