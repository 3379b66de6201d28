"""The cluster spec every task gets: TF_CONFIG, the legacy TF1 flags, and who finishes the job.

TensorFlow reads these literally (see docs/tensorflow.md), so the tests pin the exact strings.
"""

from __future__ import annotations

import json

import pytest

from hypertf.core.scheduler import Placement, TaskSlot
from hypertf.core.spec import (
    ROLE_ORDER,
    build,
    fatal_servers,
    finishers,
    gpu_env,
    mode,
    slots_for,
)
from hypertf.store import GpuInfo


def place(name: str, host: str = "h1", gpus: tuple[int, ...] = ()) -> Placement:
    role, index = name.split(":")
    return Placement(role, int(index), host, gpus)


def addresses_for(placements: list[Placement]) -> dict[str, str]:
    """A distinct data-network address per task, so a wrong list shows which task moved."""
    return {p.name: f"10.40.0.{n + 1}:{20000 + n}" for n, p in enumerate(placements)}


def placements_of(*names: str) -> list[Placement]:
    return [place(name, host=f"h{n}") for n, name in enumerate(names)]


# Each job in the order slots_for lists its tasks (chief, workers, ps), and what it must give.
JOBS = {
    "mirrored": dict(
        tasks=("worker:0", "worker:1", "worker:2"),
        mode="mirrored",
        finishers={"worker:0", "worker:1", "worker:2"},
        fatal=set(),
    ),
    "mirrored-with-chief": dict(
        tasks=("chief:0", "worker:0", "worker:1"),
        mode="mirrored",
        finishers={"chief:0", "worker:0", "worker:1"},
        fatal=set(),
    ),
    "parameter-server": dict(
        tasks=("chief:0", "worker:0", "worker:1", "ps:0"),
        mode="parameter_server",
        finishers={"chief:0"},
        fatal={"ps:0"},
    ),
    "parameter-server-two-ps": dict(
        tasks=("chief:0", "worker:0", "ps:0", "ps:1"),
        mode="parameter_server",
        finishers={"chief:0"},
        fatal={"ps:0", "ps:1"},
    ),
    "parameter-server-chief-and-ps-only": dict(
        tasks=("chief:0", "ps:0"),
        mode="parameter_server",
        finishers={"chief:0"},
        fatal={"ps:0"},
    ),
    "legacy": dict(
        tasks=("worker:0", "worker:1", "ps:0"),
        mode="legacy",
        finishers={"worker:0", "worker:1"},
        fatal={"ps:0"},
    ),
    "legacy-two-ps": dict(
        tasks=("worker:0", "ps:0", "ps:1"),
        mode="legacy",
        finishers={"worker:0"},
        fatal={"ps:0", "ps:1"},
    ),
    "chief-only": dict(
        tasks=("chief:0",),
        mode="mirrored",
        finishers={"chief:0"},
        fatal=set(),
    ),
    "single-worker": dict(
        tasks=("worker:0",),
        mode="mirrored",
        finishers={"worker:0"},
        fatal=set(),
    ),
}


# --- mode, finishers, fatal servers ---------------------------------------------------------


@pytest.mark.parametrize("job", JOBS.values(), ids=JOBS.keys())
def test_mode_finishers_and_fatal_servers(job):
    placements = placements_of(*job["tasks"])
    assert mode(placements) == job["mode"]
    assert finishers(placements) == job["finishers"]
    assert fatal_servers(placements) == job["fatal"]


@pytest.mark.parametrize("job", JOBS.values(), ids=JOBS.keys())
def test_mode_and_finishers_do_not_depend_on_the_order_of_placements(job):
    """The launcher may hand placements over in any order; roles alone decide."""
    placements = placements_of(*job["tasks"])[::-1]
    assert mode(placements) == job["mode"]
    assert finishers(placements) == job["finishers"]
    assert fatal_servers(placements) == job["fatal"]


def test_a_parameter_server_worker_is_neither_a_finisher_nor_fatal():
    """TF tolerates a dying PS worker, and PS workers never exit by themselves."""
    placements = placements_of("chief:0", "worker:0", "ps:0")
    assert "worker:0" not in finishers(placements)
    assert "worker:0" not in fatal_servers(placements)


def test_every_task_is_a_finisher_or_a_server_and_fatal_ones_are_servers():
    for job in JOBS.values():
        placements = placements_of(*job["tasks"])
        names = {p.name for p in placements}
        assert finishers(placements) <= names
        assert fatal_servers(placements) <= names - finishers(placements)


def test_gpus_and_hosts_do_not_change_the_mode():
    placements = [place("worker:0", "h1", (0, 1)), place("ps:0", "h1", (2,))]
    assert mode(placements) == "legacy"
    assert finishers(placements) == {"worker:0"}


# --- slots_for ------------------------------------------------------------------------------


@pytest.mark.parametrize("ps, workers, chief, worker_gpus, ps_gpus, expected", [
    (0, 2, False, 1, 0, [("worker", 0, 1), ("worker", 1, 1)]),
    (0, 2, True, 2, 0, [("chief", 0, 2), ("worker", 0, 2), ("worker", 1, 2)]),
    (1, 2, True, 1, 0, [("chief", 0, 1), ("worker", 0, 1), ("worker", 1, 1), ("ps", 0, 0)]),
    (2, 1, False, 4, 1, [("worker", 0, 4), ("ps", 0, 1), ("ps", 1, 1)]),
    (0, 0, True, 1, 0, [("chief", 0, 1)]),
    (1, 0, True, 0, 0, [("chief", 0, 0), ("ps", 0, 0)]),
    (0, 3, False, 0, 0, [("worker", 0, 0), ("worker", 1, 0), ("worker", 2, 0)]),
    (0, 0, False, 1, 0, []),
])
def test_slots_for_lists_chief_then_workers_then_ps_with_their_gpus(
        ps, workers, chief, worker_gpus, ps_gpus, expected):
    """The chief gets a worker's GPUs; ps get their own count (0 by default elsewhere)."""
    slots = slots_for(ps, workers, chief, worker_gpus, ps_gpus)
    assert isinstance(slots, tuple)
    assert slots == tuple(TaskSlot(role, index, gpus) for role, index, gpus in expected)


def test_slots_for_order_matches_the_tf_config_role_order():
    slots = slots_for(ps=2, workers=3, chief=True, worker_gpus=1, ps_gpus=0)
    roles = [s.role for s in slots]
    assert roles == sorted(roles, key=ROLE_ORDER.index)
    assert [s.name for s in slots] == [
        "chief:0", "worker:0", "worker:1", "worker:2", "ps:0", "ps:1",
    ]


def test_role_order_is_chief_worker_ps():
    assert ROLE_ORDER == ("chief", "worker", "ps")


# --- build: TF_CONFIG -----------------------------------------------------------------------

A = {
    "chief:0": "10.40.0.9:20009",
    "worker:0": "10.40.0.1:20000",
    "worker:1": "10.40.0.2:20001",
    "worker:2": "10.40.0.3:20002",
    "ps:0": "10.40.0.7:20007",
    "ps:1": "10.40.0.8:20008",
}


def tf_config(cluster: str, role: str, index: int) -> str:
    return f'{{"cluster":{cluster},"task":{{"type":"{role}","index":{index}}}}}'


MIRRORED = '{"worker":["10.40.0.1:20000","10.40.0.2:20001"]}'
PS = '{"chief":["10.40.0.9:20009"],"worker":["10.40.0.1:20000","10.40.0.2:20001"],' \
     '"ps":["10.40.0.7:20007"]}'
LEGACY = '{"worker":["10.40.0.1:20000","10.40.0.2:20001"],' \
         '"ps":["10.40.0.7:20007","10.40.0.8:20008"]}'
CHIEF_ONLY = '{"chief":["10.40.0.9:20009"]}'

BUILD_CASES = {
    "mirrored": (("worker:0", "worker:1"), MIRRORED),
    "parameter-server": (("chief:0", "worker:0", "worker:1", "ps:0"), PS),
    "legacy": (("worker:0", "worker:1", "ps:0", "ps:1"), LEGACY),
    "chief-only": (("chief:0",), CHIEF_ONLY),
}


@pytest.mark.parametrize("tasks, cluster", BUILD_CASES.values(), ids=BUILD_CASES.keys())
def test_tf_config_is_the_exact_compact_json(tasks, cluster):
    specs = build(placements_of(*tasks), A)
    for spec in specs:
        p = spec.placement
        assert spec.tf_config == tf_config(cluster, p.role, p.index)


def test_tf_config_matches_the_minimal_examples_tensorflow_accepts():
    """The shapes from docs/tensorflow.md: mirrored and parameter-server."""
    addresses = {"worker:0": "h1:p1", "worker:1": "h2:p2"}
    [first, _] = build(placements_of("worker:0", "worker:1"), addresses)
    assert json.loads(first.tf_config) == {
        "cluster": {"worker": ["h1:p1", "h2:p2"]}, "task": {"type": "worker", "index": 0},
    }
    addresses = {"chief:0": "h1:p", "worker:0": "h2:p", "worker:1": "h3:p", "ps:0": "h4:p"}
    specs = build(placements_of("chief:0", "worker:0", "worker:1", "ps:0"), addresses)
    assert json.loads(specs[3].tf_config) == {
        "cluster": {"chief": ["h1:p"], "worker": ["h2:p", "h3:p"], "ps": ["h4:p"]},
        "task": {"type": "ps", "index": 0},
    }


def test_cluster_lists_roles_chief_worker_ps_and_members_by_index_whatever_the_input_order():
    shuffled = placements_of("ps:1", "worker:2", "ps:0", "worker:0", "chief:0", "worker:1")
    specs = build(shuffled, A)
    expected_cluster = {
        "chief": [A["chief:0"]],
        "worker": [A["worker:0"], A["worker:1"], A["worker:2"]],
        "ps": [A["ps:0"], A["ps:1"]],
    }
    for spec in specs:
        config = json.loads(spec.tf_config)
        assert list(config) == ["cluster", "task"]
        assert list(config["cluster"]) == ["chief", "worker", "ps"]
        assert config["cluster"] == expected_cluster
        assert config["task"] == {"type": spec.placement.role, "index": spec.placement.index}


def test_build_gives_one_spec_per_placement_in_the_input_order():
    placements = placements_of("ps:0", "worker:1", "chief:0", "worker:0")
    specs = build(placements, A)
    assert [s.placement for s in specs] == placements
    assert all(s.placement is p for s, p in zip(specs, placements, strict=True))


def test_every_task_sees_the_same_cluster():
    specs = build(placements_of("chief:0", "worker:0", "worker:1", "ps:0", "ps:1"), A)
    clusters = {json.dumps(json.loads(s.tf_config)["cluster"]) for s in specs}
    assert len(clusters) == 1


def test_roles_without_tasks_are_left_out_of_the_cluster():
    """As in docs/tensorflow.md: a mirrored job has no 'ps' key, not 'ps': []."""
    specs = build(placements_of("worker:0"), A)
    assert json.loads(specs[0].tf_config)["cluster"] == {"worker": [A["worker:0"]]}


def test_addresses_of_other_tasks_are_ignored():
    specs = build(placements_of("worker:0"), {**A, "worker:7": "elsewhere:1"})
    assert "elsewhere" not in specs[0].tf_config
    assert "elsewhere" not in " ".join(specs[0].flags)


def test_tf_config_uses_the_given_address_not_the_placement_host():
    """Placement hosts are management names; TF must talk over the data network."""
    placements = [place("worker:0", host="node1"), place("worker:1", host="node2")]
    specs = build(placements, {"worker:0": "10.40.0.1:20000", "worker:1": "10.40.0.2:20000"})
    assert "node1" not in specs[0].tf_config
    assert json.loads(specs[1].tf_config)["cluster"]["worker"] == [
        "10.40.0.1:20000", "10.40.0.2:20000",
    ]


def test_no_placements_build_no_specs():
    assert build([], A) == []


# --- build: legacy flags --------------------------------------------------------------------


@pytest.mark.parametrize("tasks, expected", [
    (("worker:0", "worker:1"), {
        "worker:0": ("--ps_hosts=", "--worker_hosts=10.40.0.1:20000,10.40.0.2:20001",
                     "--job_name=worker", "--task_index=0"),
        "worker:1": ("--ps_hosts=", "--worker_hosts=10.40.0.1:20000,10.40.0.2:20001",
                     "--job_name=worker", "--task_index=1"),
    }),
    (("worker:0", "worker:1", "ps:0", "ps:1"), {
        "worker:0": ("--ps_hosts=10.40.0.7:20007,10.40.0.8:20008",
                     "--worker_hosts=10.40.0.1:20000,10.40.0.2:20001",
                     "--job_name=worker", "--task_index=0"),
        "worker:1": ("--ps_hosts=10.40.0.7:20007,10.40.0.8:20008",
                     "--worker_hosts=10.40.0.1:20000,10.40.0.2:20001",
                     "--job_name=worker", "--task_index=1"),
        "ps:0": ("--ps_hosts=10.40.0.7:20007,10.40.0.8:20008",
                 "--worker_hosts=10.40.0.1:20000,10.40.0.2:20001",
                 "--job_name=ps", "--task_index=0"),
        "ps:1": ("--ps_hosts=10.40.0.7:20007,10.40.0.8:20008",
                 "--worker_hosts=10.40.0.1:20000,10.40.0.2:20001",
                 "--job_name=ps", "--task_index=1"),
    }),
    (("chief:0", "worker:0", "ps:0"), {
        "chief:0": ("--ps_hosts=10.40.0.7:20007", "--worker_hosts=10.40.0.1:20000",
                    "--job_name=chief", "--task_index=0"),
        "worker:0": ("--ps_hosts=10.40.0.7:20007", "--worker_hosts=10.40.0.1:20000",
                     "--job_name=worker", "--task_index=0"),
        "ps:0": ("--ps_hosts=10.40.0.7:20007", "--worker_hosts=10.40.0.1:20000",
                 "--job_name=ps", "--task_index=0"),
    }),
    (("chief:0",), {
        "chief:0": ("--ps_hosts=", "--worker_hosts=", "--job_name=chief", "--task_index=0"),
    }),
], ids=["mirrored", "legacy", "parameter-server", "chief-only"])
def test_legacy_flags_are_exactly_four_in_order(tasks, expected):
    specs = build(placements_of(*tasks), A)
    assert {s.placement.name: s.flags for s in specs} == expected
    assert all(isinstance(s.flags, tuple) and len(s.flags) == 4 for s in specs)


def test_legacy_host_lists_follow_task_index_not_input_order():
    specs = build(placements_of("ps:1", "worker:1", "ps:0", "worker:0"), A)
    for spec in specs:
        assert spec.flags[:2] == (
            "--ps_hosts=10.40.0.7:20007,10.40.0.8:20008",
            "--worker_hosts=10.40.0.1:20000,10.40.0.2:20001",
        )


def test_flags_and_tf_config_agree():
    """A script may read either; they must describe the same cluster and task."""
    specs = build(placements_of("worker:0", "worker:1", "worker:2", "ps:0", "ps:1"), A)
    for spec in specs:
        config = json.loads(spec.tf_config)
        flags = dict(flag[2:].split("=", 1) for flag in spec.flags)
        assert flags["ps_hosts"].split(",") == config["cluster"]["ps"]
        assert flags["worker_hosts"].split(",") == config["cluster"]["worker"]
        assert flags["job_name"] == config["task"]["type"]
        assert int(flags["task_index"]) == config["task"]["index"]


def test_specs_for_scheduled_slots_end_to_end():
    """slots_for -> placements -> build: the chain the launcher runs."""
    slots = slots_for(ps=1, workers=2, chief=True, worker_gpus=1, ps_gpus=0)
    placements = [Placement(s.role, s.index, f"h{n}", tuple(range(s.gpus)))
                  for n, s in enumerate(slots)]
    specs = build(placements, addresses_for(placements))
    assert [s.placement.name for s in specs] == ["chief:0", "worker:0", "worker:1", "ps:0"]
    assert specs[0].tf_config == tf_config(
        '{"chief":["10.40.0.1:20000"],"worker":["10.40.0.2:20001","10.40.0.3:20002"],'
        '"ps":["10.40.0.4:20003"]}', "chief", 0)
    assert mode(placements) == "parameter_server"
    assert finishers(placements) == {"chief:0"}
    assert fatal_servers(placements) == {"ps:0"}


def test_gpu_env_pins_by_uuid_in_pci_bus_order():
    gpus = [GpuInfo(i, "GPU", f"GPU-{i:08x}-aaaa", 0.0, 0, 1, True) for i in range(4)]
    assert gpu_env([2, 0], gpus) == {"CUDA_VISIBLE_DEVICES": "GPU-00000002-aaaa,GPU-00000000-aaaa",
                                     "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "HYPERTF_GPUS": "2,0"}
    # A CPU task sees no GPU; a GPU whose UUID is unknown (an old agent) keeps its index.
    assert gpu_env([], gpus)["CUDA_VISIBLE_DEVICES"] == ""
    assert gpu_env([1], [GpuInfo(1, "GPU", "", 0.0, 0, 1, True)])["CUDA_VISIBLE_DEVICES"] == "1"
