"""Fair share inside a priority tier, pure: the order, the entry charge, the decay with an
injected clock, the reasons (Fairshare, Budget), reservations, and a simulated week of three
users whose GPU-time converges to their shares."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from hypertf.core.admission import (
    BUDGET,
    FAIRSHARE,
    PRIORITY,
    RESOURCES,
    Waiting,
    admission_pass,
)
from hypertf.core.fairshare import DAY_S, Fairshare, accrued, decay, ordered
from hypertf.core.matrix import FREE, Held, Matrix
from hypertf.core.placement import Request
from hypertf.core.scheduler import TaskSlot
from hypertf.core.usage import Attempt, Summary

HALF_LIFE = 7 * DAY_S
T0 = 1_790_000_000.0  # the keeper's clock, injected


def job(n: int, user: str, gpus: int = 1, priority: int = 0, hosts: tuple[str, ...] = ("h1",),
        per_task: int = 1, no_wait: bool = False) -> Waiting:
    slots = tuple(TaskSlot("worker", i, per_task) for i in range(gpus // per_task))
    request = Request(slots=slots, hosts=hosts, port_ranges={h: (20000, 20999) for h in hosts})
    return Waiting(f"20260101-000000-{n:06d}.{user}", request, priority, n, no_wait=no_wait)


def matrix(free: dict[str, int], held: dict[str, tuple[str, int]] | None = None) -> Matrix:
    """Hosts with ``free`` GPUs, and per host GPUs held by a user's running job."""
    gpus: dict[str, list[object]] = {h: [FREE] * n for h, n in free.items()}
    for host, (user, count) in (held or {}).items():
        gpus.setdefault(host, [])
        gpus[host] = [f"20250101-000000-run{host}.{user}"] * count + gpus[host]
    return Matrix(gpus=gpus)  # type: ignore[arg-type]


def admitted(decisions: list) -> list[str]:
    return [d.task_key.rpartition(".")[2] for d in decisions if d.admitted]


def fair(usage: dict[str, float] | None = None, shares: dict[str, float] | None = None,
         half_life: float = HALF_LIFE) -> Fairshare:
    chosen = shares or {}
    return Fairshare(half_life, dict(usage or {}), shares=lambda u: chosen.get(u, 1.0))


# -- the order -------------------------------------------------------------------------

def test_without_fair_share_the_order_is_priority_then_first_come() -> None:
    jobs = [job(3, "bob"), job(1, "bob"), job(2, "alice", priority=5)]
    assert [j.order for j in ordered(jobs, None)] == [2, 1, 3]
    assert [j.order for j in ordered(jobs, fair(half_life=0))] == [2, 1, 3]


def test_a_queue_of_one_user_is_ordered_exactly_as_today() -> None:
    jobs = [job(n, "bob", priority=n % 3) for n in range(30)]
    random.Random(1).shuffle(jobs)
    plain = [j.task_key for j in ordered(jobs, None)]
    assert [j.task_key for j in ordered(jobs, fair({"bob": 1e9}))] == plain
    m = matrix({"h1": 4})
    assert admission_pass(m, ["h1"], jobs) == admission_pass(m, ["h1"], jobs,
                                                             fair=fair({"bob": 1e6}))


def test_tiers_stay_strict_whatever_the_usage() -> None:
    jobs = [job(1, "bob", priority=5), job(2, "alice", priority=0)]
    order = [j.user for j in ordered(jobs, fair({"bob": 1e12, "alice": 0.0}))]
    assert order == ["bob", "alice"]


def test_within_a_tier_the_user_below_their_share_goes_first() -> None:
    jobs = [job(1, "bob"), job(2, "bob"), job(3, "alice")]
    assert [j.user for j in ordered(jobs, fair({"bob": 3600.0}))] == ["alice", "bob", "bob"]


def test_a_larger_share_weighs_the_usage_down() -> None:
    jobs = [job(1, "bob"), job(2, "alice")]
    usage = {"bob": 3 * 3600.0, "alice": 2 * 3600.0}
    assert next(iter(ordered(jobs, fair(usage)))).user == "alice"
    assert next(iter(ordered(jobs, fair(usage, {"bob": 2.0})))).user == "bob"


def test_factors_follow_the_formula() -> None:
    f = fair({"bob": 100.0, "alice": 100.0})
    assert f.factors(["bob", "alice"]) == {"alice": 0.5, "bob": 0.5}
    f = fair({"bob": 300.0, "alice": 100.0}, {"bob": 3.0})
    assert f.factors(["bob", "alice"]) == pytest.approx({"alice": 0.5, "bob": 0.5})
    assert fair().factors(["bob"]) == {"bob": 1.0}


# -- the pass: entry charge, reasons, reservations ---------------------------------------

def test_the_issue_example_alice_goes_before_bobs_remaining_jobs() -> None:
    """bob submitted 6 one-GPU jobs, 2 run; alice submitted 3 after: the 2 free GPUs go to
    alice, and bob's earlier jobs show Fairshare."""
    waiting = [job(n, "bob") for n in range(3, 7)] + [job(n, "alice") for n in range(7, 10)]
    m = matrix({"h1": 2}, {"h1": ("bob", 2)})
    decisions = admission_pass(m, ["h1"], waiting, fair=fair({"bob": 60.0}))
    assert admitted(decisions) == ["alice", "alice"]
    reasons = {d.task_key: d.reason for d in decisions if not d.admitted}
    assert {reasons[j.task_key] for j in waiting if j.user == "bob"} == {FAIRSHARE}
    assert reasons[waiting[-1].task_key] == RESOURCES


def test_with_share_3_bob_keeps_three_of_four_gpus() -> None:
    """Nothing runs yet, equal histories: the entry charge spreads the 4 GPUs by share."""
    waiting = [job(n, "bob") for n in range(6)] + [job(n, "alice") for n in range(6, 9)]
    decisions = admission_pass(matrix({"h1": 4}), ["h1"], waiting,
                               fair=fair({}, {"bob": 3.0}))
    assert Counter(admitted(decisions)) == {"bob": 3, "alice": 1}
    decisions = admission_pass(matrix({"h1": 4}), ["h1"], waiting, fair=fair())
    assert Counter(admitted(decisions)) == {"bob": 2, "alice": 2}


def test_the_entry_charge_stops_a_burst_within_one_pass() -> None:
    """50 waiting jobs of bob, submitted first, cannot take 8 freed GPUs at once."""
    waiting = [job(n, "bob") for n in range(50)] + [job(n, "alice") for n in range(50, 60)]
    decisions = admission_pass(matrix({"h1": 8}), ["h1"], waiting, fair=fair())
    assert Counter(admitted(decisions)) == {"bob": 4, "alice": 4}
    assert Counter(admitted(admission_pass(matrix({"h1": 8}), ["h1"], waiting))) == {"bob": 8}


def test_usage_from_yesterday_orders_as_the_formula_says() -> None:
    """alice used 100 GPU-hours ending a day ago, bob 60 ending now: with a half-life of a
    day alice's count 50 and she goes first; with a week's, 91 and bob does."""
    now = T0 + DAY_S
    summary = Summary().closed([Attempt("20260101-000000-aaaaaa.alice", "alice", 100, {},
                                        (), T0 - 3600.0, T0)], T0, DAY_S)
    summary = summary.closed([Attempt("20260101-000000-bbbbbb.bob", "bob", 60, {}, (),
                                      now - 3600.0, now)], now, DAY_S)
    usage = {u: summary.decayed(u, now, DAY_S) for u in ("alice", "bob")}
    assert usage["alice"] / 3600 == pytest.approx(100 / 2 * accrued(1, 0, 3600, DAY_S) / 3600,
                                                  rel=1e-9)
    waiting = [job(1, "bob"), job(2, "alice")]
    first = admission_pass(matrix({"h1": 1}), ["h1"], waiting, fair=fair(usage,
                                                                         half_life=DAY_S))
    assert admitted(first) == ["alice"]
    week = Summary().closed([Attempt("20260101-000000-aaaaaa.alice", "alice", 100, {}, (),
                                     T0 - 3600.0, T0)], T0, HALF_LIFE)
    week = week.closed([Attempt("20260101-000000-bbbbbb.bob", "bob", 60, {}, (),
                                now - 3600.0, now)], now, HALF_LIFE)
    usage = {u: week.decayed(u, now, HALF_LIFE) for u in ("alice", "bob")}
    assert usage["alice"] == pytest.approx(decay(accrued(100, 0, 3600, HALF_LIFE), DAY_S,
                                                 HALF_LIFE))
    assert admitted(admission_pass(matrix({"h1": 1}), ["h1"], waiting,
                                   fair=fair(usage))) == ["bob"]


def test_reservations_keep_working_under_fair_share() -> None:
    """alice's 4-GPU job is first (no usage) and waits for h1: bob's small job may not take
    h1's free GPUs, though it would fit; on h2, which alice's job cannot use, it may."""
    big = job(5, "alice", gpus=4, per_task=4, hosts=("h1",))
    small = job(1, "bob", hosts=("h1",))
    elsewhere = job(2, "bob", hosts=("h2",))
    m = matrix({"h1": 2, "h2": 1}, {"h1": ("carol", 2)})
    decisions = {d.task_key: d for d in admission_pass(
        m, ["h1", "h2"], [small, elsewhere, big], fair=fair({"bob": 1e6}))}
    assert decisions[big.task_key].reason == RESOURCES
    assert decisions[small.task_key].reason == FAIRSHARE  # alice's later job went first
    assert decisions[elsewhere.task_key].admitted


def test_a_user_past_the_budget_waits_and_reserves_nothing() -> None:
    waiting = [job(1, "bob", gpus=4, per_task=4), job(2, "alice"),
               job(3, "bob", no_wait=True)]
    decisions = {d.task_key: d for d in admission_pass(
        matrix({"h1": 2}), ["h1"], waiting, fair=fair(), over_budget=frozenset({"bob"}))}
    assert decisions[waiting[0].task_key].reason == BUDGET
    assert decisions[waiting[1].task_key].admitted  # bob's big job reserved nothing
    assert decisions[waiting[2].task_key].refused and \
        decisions[waiting[2].task_key].reason == BUDGET


def test_without_fair_share_no_fairshare_reason_is_shown() -> None:
    waiting = [job(1, "bob", gpus=2, per_task=2), job(2, "alice")]
    decisions = admission_pass(matrix({"h1": 1}, {"h1": ("carol", 1)}), ["h1"], waiting)
    assert {d.reason for d in decisions} <= {RESOURCES, PRIORITY, ""}


# -- a simulated week ---------------------------------------------------------------------

def simulate(days: int, shares: dict[str, float], profiles: dict[str, tuple[int, float]],
             step_s: float = 600.0, seed: int = 7) -> dict[str, float]:
    """16 GPUs (4 hosts of 4); each user always has work waiting (``profiles``: GPUs per
    job and mean hours); the keeper's pass every ``step_s`` with the ledger's usage. The
    first user floods the queue first. Returns GPU-seconds per user from day 2 on."""
    rng = random.Random(seed)
    hosts = tuple(f"h{i}" for i in range(4))
    m = Matrix(gpus={h: [FREE] * 4 for h in hosts})
    summary = Summary()
    running: dict[str, tuple[str, int, float, float, Held]] = {}
    waiting: list[Waiting] = []
    counter = 0
    used: Counter[str] = Counter()
    measure_from = T0 + DAY_S

    def submit(user: str, count: int) -> None:
        nonlocal counter
        gpus, _ = profiles[user]
        for _ in range(count):
            counter += 1
            slots = (TaskSlot("worker", 0, gpus),)
            request = Request(slots=slots, hosts=hosts,
                              port_ranges={h: (20000, 20999) for h in hosts})
            waiting.append(Waiting(f"20260101-000000-{counter:06d}.{user}", request, 0,
                                   counter))

    submit(next(iter(profiles)), 200)  # the flood comes first
    now = T0
    while now < T0 + days * DAY_S:
        ended = [k for k, (_, _, _, end, _) in running.items() if end <= now]
        attempts = []
        for key in ended:
            user, gpus, start, end, held = running.pop(key)
            attempts.append(Attempt(key, user, gpus, {}, (), start, end))
            used[user] += gpus * max(0.0, end - max(start, measure_from))
            rows = {h: [FREE if c == key else c for c in row] for h, row in m.gpus.items()}
            ports = {h: {p: k for p, k in row.items() if k != key}
                     for h, row in m.ports.items()}
            m = Matrix(rows, ports)  # type: ignore[arg-type]
        summary = summary.closed(attempts, now, HALF_LIFE)
        for user in profiles:
            mine = sum(1 for w in waiting if w.user == user)
            if mine < 20:
                submit(user, 20 - mine)
        usage = {u: summary.decayed(u, now, HALF_LIFE) for u in profiles}
        for user, gpus, start, _, _ in running.values():
            usage[user] += accrued(gpus, start, now, HALF_LIFE)
        standing = Fairshare(HALF_LIFE, usage, shares=shares.__getitem__,
                             expected=summary.expected,
                             default_expected_s=summary.default_expected(3600.0))
        decisions = admission_pass(m, hosts, waiting, fair=standing)
        gone = set()
        for d in decisions:
            if not d.admitted:
                continue
            held = Held.of(d.placements, d.ports)
            m = m.take(d.task_key, held.gpus, held.ports)
            user = d.task_key.rpartition(".")[2]
            gpus, hours = profiles[user]
            length = rng.uniform(0.5, 1.5) * hours * 3600
            running[d.task_key] = (user, gpus, now, now + length, held)
            gone.add(d.task_key)
        waiting = [w for w in waiting if w.task_key not in gone]
        now += step_s
    for user, gpus, start, _, _ in running.values():
        used[user] += gpus * max(0.0, now - max(start, measure_from))
    return dict(used)


def test_a_simulated_week_converges_to_the_shares_within_10_percent() -> None:
    """Three users with different job sizes and lengths, shares 1:2:1, the first one
    flooding the queue first: from the second day on, each user's GPU-time is within 10%
    of their share of the cluster (FIFO would give the flooder everything for a day)."""
    shares = {"ann": 1.0, "ben": 2.0, "cid": 1.0}
    profiles = {"ann": (1, 2.0), "ben": (2, 3.0), "cid": (4, 1.0)}
    used = simulate(7, shares, profiles)
    total = sum(used.values())
    for user, share in shares.items():
        wanted = share / sum(shares.values())
        assert used[user] / total == pytest.approx(wanted, rel=0.10), (user, used)
