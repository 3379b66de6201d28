"""The admission pass as a table: priority, FIFO, gang, the no-starvation rule, user limit,
held jobs, ports, and a request larger than the cluster."""

from __future__ import annotations

import pytest

from hypertf.core.admission import (
    HELD,
    PRIORITY,
    RESOURCES,
    USER_LIMIT,
    Waiting,
    admission_pass,
    fits_cluster,
)
from hypertf.core.matrix import FREE, UNAVAILABLE, Matrix
from hypertf.core.placement import PortRanges, Request, compact_hosts, expand_hosts
from hypertf.core.scheduler import TaskSlot

HOSTS = ("h1", "h2")


def matrix(**rows: str) -> Matrix:
    """h1="11xx": 1 free, x held by a running job of bob, 0 unavailable."""
    cells = {"1": FREE, "0": UNAVAILABLE, "x": "20260101-000000-aaaaaa.bob"}
    return Matrix(gpus={h: [cells[c] for c in row] for h, row in rows.items()})


def job(name: str, workers: int, gpus: int = 1, priority: int = 0, order: int = 0,
        user: str = "alice", hosts: tuple[str, ...] = HOSTS, held: bool = False,
        ps: int = 0) -> Waiting:
    slots = tuple(TaskSlot("worker", i, gpus) for i in range(workers)) + tuple(
        TaskSlot("ps", i, 0) for i in range(ps))
    request = Request(slots=slots, hosts=hosts, port_ranges={h: (20000, 20009) for h in hosts})
    return Waiting(f"20260101-000000-{name}.{user}", request, priority, order, held)


def outcome(decisions) -> dict[str, str]:
    return {d.task_key.split("-")[2].split(".")[0]: d.reason or "admitted" for d in decisions}


CASES = [
    # (free matrix, waiting jobs, user limit, expected)
    ("fits: admitted", dict(h1="1111", h2="1111"), [job("a", 2)], 0, {"a": "admitted"}),
    ("too big now: Resources", dict(h1="xx11", h2="xxxx"), [job("a", 3)], 0,
     {"a": RESOURCES}),
    ("FIFO within a priority", dict(h1="xx11", h2="xxxx"),
     [job("b", 2, order=2), job("a", 2, order=1)], 0, {"a": "admitted", "b": RESOURCES}),
    ("higher priority first, whatever came first", dict(h1="xx11", h2="xxxx"),
     [job("a", 2, order=1), job("b", 2, priority=5, order=2)], 0,
     {"b": "admitted", "a": RESOURCES}),
    ("gang: all tasks or none", dict(h1="xxx1", h2="xxxx"), [job("a", 2)], 0,
     {"a": RESOURCES}),
    ("no starvation: a small later job does not pass a blocked earlier one",
     dict(h1="xx11", h2="xxxx"), [job("big", 4, order=1), job("small", 1, order=2)], 0,
     {"big": RESOURCES, "small": PRIORITY}),
    ("a later job passes on hosts the blocked one cannot use",
     dict(h1="xx11", h2="1111"), [job("big", 3, order=1, hosts=("h1",)),
                                  job("small", 2, order=2, hosts=("h2",))], 0,
     {"big": RESOURCES, "small": "admitted"}),
    ("... or hosts too small for its tasks",
     dict(h1="x1", h2="xxxx"), [job("big", 1, gpus=4, order=1), job("small", 1, order=2)], 0,
     {"big": RESOURCES, "small": "admitted"}),
    ("a GPU-less job competes for nothing", dict(h1="xxxx", h2="xxxx"),
     [job("big", 1, order=1), job("ps", 0, ps=1, order=2)], 0,
     {"big": RESOURCES, "ps": "admitted"}),
    ("user limit: waits, and reserves nothing", dict(h1="xx11", h2="1111"),
     [job("a", 2, user="bob", order=1), job("b", 2, order=2)], 3,
     {"a": USER_LIMIT, "b": "admitted"}),
    ("user limit counts the jobs admitted in the same pass", dict(h1="1111", h2="1111"),
     [job("a", 2, order=1), job("b", 2, order=2)], 3, {"a": "admitted", "b": USER_LIMIT}),
    ("held: waits, and reserves nothing", dict(h1="1111", h2="xxxx"),
     [job("a", 4, order=1, held=True), job("b", 4, order=2)], 0,
     {"a": HELD, "b": "admitted"}),
    ("two admitted in one pass do not share a GPU", dict(h1="1111", h2="xxxx"),
     [job("a", 2, order=1), job("b", 2, order=2), job("c", 1, order=3)], 0,
     {"a": "admitted", "b": "admitted", "c": RESOURCES}),
]


@pytest.mark.parametrize(("free", "waiting", "limit", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_admission_table(free, waiting, limit, expected):
    assert outcome(admission_pass(matrix(**free), list(free), waiting, limit)) == expected


def test_a_host_whose_agent_is_gone_is_not_used():
    assert outcome(admission_pass(matrix(h1="1111", h2="1111"), ["h1"], [job("a", 5)])) == {
        "a": RESOURCES}


def test_admitted_jobs_get_distinct_gpus_and_ports():
    decisions = admission_pass(matrix(h1="1111", h2="xxxx"), ["h1", "h2"],
                               [job("a", 2, order=1), job("b", 2, order=2)])
    gpus = [g for d in decisions for p in d.placements for g in p.gpus]
    ports = [port for d in decisions for port in d.ports.values()]
    assert sorted(gpus) == [0, 1, 2, 3]
    assert len(set(ports)) == 4


def test_positions_follow_the_queue_order():
    decisions = admission_pass(matrix(h1="xxxx", h2="xxxx"), ["h1", "h2"],
                               [job("c", 1, order=3), job("a", 1, priority=1, order=9),
                                job("b", 1, order=2)])
    assert [(outcome([d]).popitem()[0], d.position) for d in decisions] == [
        ("a", 1), ("b", 2), ("c", 3)]


def test_fits_cluster_counts_busy_and_unavailable_gpus():
    m = matrix(h1="x0x1", h2="xxxx")
    assert fits_cluster(job("a", 2, gpus=4).request, m, ["h1", "h2"])
    assert not fits_cluster(job("a", 1, gpus=5).request, m, ["h1", "h2"])
    assert not fits_cluster(job("a", 2, gpus=4).request, m, ["h1"])  # h2's agent is gone


# --- a waiting job's hosts, compact --------------------------------------------------------


def test_hosts_are_kept_as_ranges_in_order_and_expand_back():
    hosts = ("node00007", "node00008", "node00009", "node00010", "gpu-a", "n9", "n10",
             "node00012", "x1", "x2", "x3")
    compact = compact_hosts(hosts)
    assert compact == ["node[00007:00010]", "gpu-a", "n9", "n10", "node00012", "x[1:3]"]
    assert expand_hosts(tuple(compact)) == hosts
    many = tuple(f"node{i:05d}" for i in range(10_000))
    assert compact_hosts(many) == ["node[00000:09999]"]
    assert expand_hosts(("node[00000:09999]",)) == many


def test_a_forged_range_is_refused_not_expanded():
    with pytest.raises(ValueError):
        expand_hosts(("x[0:999999999]",))
    with pytest.raises(ValueError):
        expand_hosts(("x[10:9]",))


def test_port_ranges_name_the_shared_range_once():
    ranges = PortRanges(("a", "b", "c"), (20000, 20999), {"b": (30000, 30010)})
    assert dict(ranges) == {"a": (20000, 20999), "b": (30000, 30010), "c": (20000, 20999)}
    assert ranges.get("c", (1, 2)) == (20000, 20999) and len(ranges) == 3
