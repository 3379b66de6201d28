"""The pure placement policies: round robin (the original design) and pack."""

from __future__ import annotations

import pytest

from hypertf.core.scheduler import OFFLOAD, POLICIES, NoFit, Placement, TaskSlot, schedule


def workers(n: int, gpus: int = 1, role: str = "worker") -> list[TaskSlot]:
    return [TaskSlot(role, i, gpus) for i in range(n)]


def where(placements: list[Placement]) -> list[tuple[str, tuple[int, ...]]]:
    return [(p.host, p.gpus) for p in placements]


FOUR_EACH = {"h1": [0, 1, 2, 3], "h2": [0, 1, 2, 3], "h3": [0, 1, 2, 3]}


# --- round robin ----------------------------------------------------------------------------


def test_round_robin_takes_one_gpu_per_server_per_round():
    placements = schedule(FOUR_EACH, workers(5), "round_robin")
    assert [p.host for p in placements] == ["h1", "h2", "h3", "h1", "h2"]
    assert [p.gpus for p in placements] == [(0,), (0,), (0,), (1,), (1,)]


def test_round_robin_is_the_default_policy():
    assert schedule(FOUR_EACH, workers(5)) == schedule(FOUR_EACH, workers(5), "round_robin")


def test_round_robin_third_round_and_full_cluster():
    placements = schedule(FOUR_EACH, workers(12), "round_robin")
    assert where(placements) == [
        (host, (gpu,)) for gpu in range(4) for host in ("h1", "h2", "h3")
    ]


def test_round_robin_uneven_gpu_counts_skips_a_full_server():
    free = {"h1": [0], "h2": [0, 1, 2, 3]}
    placements = schedule(free, workers(4), "round_robin")
    assert where(placements) == [("h1", (0,)), ("h2", (0,)), ("h2", (1,)), ("h2", (2,))]


def test_round_robin_partially_busy_nodes_use_the_free_indices():
    free = {"h1": [1, 3], "h2": [2], "h3": [0, 3]}
    placements = schedule(free, workers(5), "round_robin")
    assert where(placements) == [
        ("h1", (1,)), ("h2", (2,)), ("h3", (0,)), ("h1", (3,)), ("h3", (3,)),
    ]


def test_unsorted_free_lists_are_taken_lowest_first_and_input_is_not_mutated():
    free = {"h1": [3, 1, 2]}
    placements = schedule(free, workers(3), "round_robin")
    assert [p.gpus for p in placements] == [(1,), (2,), (3,)]
    assert free == {"h1": [3, 1, 2]}


def test_round_robin_multi_gpu_task_skips_hosts_with_too_few():
    free = {"h1": [0], "h2": [1], "h3": [0, 2, 3]}
    placements = schedule(free, [TaskSlot("worker", 0, gpus=2)], "round_robin")
    assert placements == [Placement("worker", 0, "h3", (0, 2))]


def test_round_robin_multi_gpu_tasks_rotate_over_servers():
    placements = schedule(FOUR_EACH, workers(4, gpus=2), "round_robin")
    assert where(placements) == [
        ("h1", (0, 1)), ("h2", (0, 1)), ("h3", (0, 1)), ("h1", (2, 3)),
    ]


def test_round_robin_cpu_slots_spread_over_cpu_hosts():
    slots = [TaskSlot("ps", i, gpus=0) for i in range(4)]
    placements = schedule({"h1": [0]}, slots, "round_robin", cpu_hosts=["c1", "c2", "c3"])
    assert where(placements) == [("c1", ()), ("c2", ()), ("c3", ()), ("c1", ())]


def test_cpu_hosts_default_to_the_keys_of_free():
    slots = [TaskSlot("ps", 0, gpus=0), TaskSlot("ps", 1, gpus=0)]
    placements = schedule({"h1": [], "h2": []}, slots, "round_robin")
    assert [p.host for p in placements] == ["h1", "h2"]


# --- pack -----------------------------------------------------------------------------------


def test_pack_fills_a_server_before_the_next():
    placements = schedule(FOUR_EACH, workers(6), "pack")
    assert where(placements) == [
        ("h1", (0,)), ("h1", (1,)), ("h1", (2,)), ("h1", (3,)), ("h2", (0,)), ("h2", (1,)),
    ]


def test_pack_uneven_and_partially_busy():
    free = {"h1": [2], "h2": [0, 3], "h3": [1, 2, 3]}
    placements = schedule(free, workers(4), "pack")
    assert where(placements) == [("h1", (2,)), ("h2", (0,)), ("h2", (3,)), ("h3", (1,))]


def test_pack_multi_gpu_task_skips_hosts_with_too_few_then_backfills():
    free = {"h1": [0], "h2": [0, 1, 2]}
    slots = [TaskSlot("worker", 0, gpus=2), TaskSlot("worker", 1, gpus=1),
             TaskSlot("worker", 2, gpus=1)]
    placements = schedule(free, slots, "pack")
    assert where(placements) == [("h2", (0, 1)), ("h1", (0,)), ("h2", (2,))]


def test_pack_cpu_slots_all_go_to_the_first_cpu_host():
    slots = [TaskSlot("ps", i, gpus=0) for i in range(3)]
    placements = schedule({"h1": [0]}, slots, "pack", cpu_hosts=["c1", "c2"])
    assert [p.host for p in placements] == ["c1", "c1", "c1"]
    assert all(p.gpus == () for p in placements)


# --- both policies --------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_placements_come_back_in_slot_order(policy):
    slots = [TaskSlot("ps", 0, 0), TaskSlot("worker", 0, 2), TaskSlot("chief", 0, 1),
             TaskSlot("ps", 1, 0), TaskSlot("worker", 1, 1)]
    placements = schedule(FOUR_EACH, slots, policy)
    assert [(p.role, p.index) for p in placements] == [(s.role, s.index) for s in slots]
    assert [p.name for p in placements] == [s.name for s in slots]
    assert [len(p.gpus) for p in placements] == [s.gpus for s in slots]


@pytest.mark.parametrize("policy", POLICIES)
def test_no_gpu_is_given_twice(policy):
    free = {"h1": [0, 1, 2], "h2": [1, 2], "h3": [0]}
    placements = schedule(free, [*workers(2, gpus=2), *workers(2, role="x")], policy)
    pairs = [(p.host, g) for p in placements for g in p.gpus]
    assert len(pairs) == len(set(pairs)) == 6
    assert all(g in free[h] for h, g in pairs)


@pytest.mark.parametrize("policy", POLICIES)
def test_too_many_tasks_raise_nofit_with_the_slot_that_did_not_fit(policy):
    free = {"h1": [0, 1], "h2": [0]}
    slots = workers(4)
    with pytest.raises(NoFit) as err:
        schedule(free, slots, policy)
    assert err.value.slot == slots[3]
    assert str(err.value) == "worker:3"


@pytest.mark.parametrize("policy", POLICIES)
def test_multi_gpu_task_larger_than_any_host_raises_nofit(policy):
    free = {"h1": [0, 1], "h2": [0, 1]}  # 4 GPUs in all, but never 3 on one host
    slot = TaskSlot("worker", 0, gpus=3)
    with pytest.raises(NoFit) as err:
        schedule(free, [TaskSlot("ps", 0, 0), slot], policy)
    assert err.value.slot is slot


@pytest.mark.parametrize("policy", POLICIES)
def test_empty_free_hosts(policy):
    assert schedule({}, [], policy) == []
    with pytest.raises(NoFit) as err:
        schedule({}, workers(1), policy)
    assert err.value.slot == TaskSlot("worker", 0)
    with pytest.raises(NoFit) as err:
        schedule({}, [TaskSlot("ps", 0, gpus=0)], policy)
    assert err.value.slot == TaskSlot("ps", 0, 0)


@pytest.mark.parametrize("policy", POLICIES)
def test_hosts_without_free_gpus_only_take_cpu_tasks(policy):
    free = {"h1": [], "h2": []}
    assert schedule(free, [TaskSlot("ps", 0, 0)], policy)[0].host == "h1"
    with pytest.raises(NoFit):
        schedule(free, workers(1), policy)


@pytest.mark.parametrize("policy", POLICIES)
def test_cpu_slot_without_cpu_hosts_raises_nofit(policy):
    slot = TaskSlot("ps", 0, gpus=0)
    with pytest.raises(NoFit) as err:
        schedule({"h1": [0]}, [slot], policy, cpu_hosts=[])
    assert err.value.slot is slot


def test_unknown_policy_is_a_value_error_naming_the_choices():
    with pytest.raises(ValueError, match=r"unknown policy 'random'.*round_robin, pack"):
        schedule(FOUR_EACH, workers(1), "random")


def test_slot_and_placement_names():
    assert TaskSlot("worker", 2).name == "worker:2"
    assert TaskSlot("worker", 2).gpus == 1
    assert Placement("ps", 0, "h1", ()).name == "ps:0"


# --- offload hosts (--offload-hosts) ---------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_offload_hosts_are_hosts_of_their_own_without_the_jobs_tasks(policy):
    slots = [*workers(2), TaskSlot("ps", 0, 0), *workers(2, 0, OFFLOAD)]
    free = {"h1": [0, 1], "h2": [0, 1], "h3": [0, 1], "h4": [0, 1]}
    placed = schedule(free, slots, policy)
    tasks = {p.host for p in placed if p.role != OFFLOAD}
    offload = [p.host for p in placed if p.role == OFFLOAD]
    assert len(set(offload)) == 2 and not tasks & set(offload)
    assert all(p.gpus == () for p in placed if p.role == OFFLOAD)


def test_offload_hosts_take_gpu_less_hosts_first():
    placed = schedule({"h1": [0], "h2": [0, 1, 2], "h3": []},
                      [*workers(1), *workers(2, 0, OFFLOAD)], cpu_hosts=["h1", "h2", "h3"])
    assert where(placed) == [("h1", (0,)), ("h3", ()), ("h2", ())]


def test_too_few_spare_hosts_for_the_offload_is_nofit():
    with pytest.raises(NoFit) as caught:
        schedule(FOUR_EACH, [*workers(2), *workers(2, 0, OFFLOAD)])
    assert caught.value.slot == TaskSlot(OFFLOAD, 1, 0)
