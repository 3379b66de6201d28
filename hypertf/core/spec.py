"""The TensorFlow cluster spec for every task: TF_CONFIG and the legacy flags (and, from the
same order, the other frameworks' rendezvous: hypertf.core.rendezvous).

Which tasks *finish* and which *serve* depends on the mode (see docs/tensorflow.md):
mirrored jobs (no ps) finish on every task; parameter-server jobs with a chief finish when the
chief does (workers and ps serve forever); legacy jobs (ps, no chief) finish when the workers
do (ps serve forever).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hypertf.core import rendezvous
from hypertf.core.records import GpuInfo
from hypertf.core.rendezvous import rank_order
from hypertf.core.scheduler import OFFLOAD, Placement, TaskSlot


def slots_for(ps: int, workers: int, chief: bool, worker_gpus: int, ps_gpus: int,
              offload_hosts: int = 0, chief_gpus: int | None = None) -> tuple[TaskSlot, ...]:
    """The job's tasks, chief first, in the order TF_CONFIG lists them, then the offload
    hosts (no task of TF_CONFIG: they compute the tasks' matrix products). The chief takes
    ``chief_gpus``, else as many as a worker."""
    slots = [TaskSlot("chief", 0, worker_gpus if chief_gpus is None else chief_gpus)] \
        if chief else []
    slots += [TaskSlot("worker", i, worker_gpus) for i in range(workers)]
    slots += [TaskSlot("ps", i, ps_gpus) for i in range(ps)]
    slots += [TaskSlot(OFFLOAD, i, 0) for i in range(offload_hosts)]
    return tuple(slots)


def tasks_of(placements: Sequence[Placement]) -> list[Placement]:
    """The placements that run a TensorFlow task (the offload hosts run none)."""
    return [p for p in placements if p.role != OFFLOAD]


def offload_hosts(placements: Sequence[Placement]) -> list[str]:
    """The hosts lent to the job's matrix products, in slot order."""
    return [p.host for p in sorted(placements, key=lambda p: p.index) if p.role == OFFLOAD]


def mode(placements: Sequence[Placement]) -> str:
    roles = {p.role for p in placements}
    if "ps" not in roles:
        return "mirrored"
    return "parameter_server" if "chief" in roles else "legacy"


def finishers(placements: Sequence[Placement]) -> set[str]:
    """Tasks whose exit 0 ends the job; every other task is a server the launcher stops."""
    job_mode = mode(placements)
    if job_mode == "mirrored":
        return {p.name for p in placements}
    if job_mode == "parameter_server":
        return {p.name for p in placements if p.role == "chief"}
    return {p.name for p in placements if p.role == "worker"}


def start_rank(placement: Placement) -> int:
    """Where a task comes in a node's start order: the ps first (every worker waits for
    them), then the chief or worker 0 (it initialises the variables), then the others."""
    if placement.role == "ps":
        return 0
    return 1 if placement.role == "chief" or placement.index == 0 else 2


def start_after(placements: Sequence[Placement], addresses: Mapping[str, str]
                ) -> dict[str, str]:
    """Task name -> the address ('host:port') it starts after, once that listens. In a TF1
    between-graph job (ps, no chief) the other workers wait for worker 0: a non-chief that
    asks for the model before worker 0 has initialised it sleeps TF's recovery_wait_secs
    (30 s), and when every worker starts at once, it does. Other modes start together."""
    if mode(placements) != "legacy":
        return {}
    return {p.name: addresses["worker:0"] for p in placements
            if p.role == "worker" and p.index > 0 and "worker:0" in addresses}


def fatal_servers(placements: Sequence[Placement]) -> set[str]:
    """Servers whose exit fails the job (a ps always; a PS-mode worker is tolerated)."""
    return {p.name for p in placements if p.role == "ps"}

ROLE_ORDER = rendezvous.ROLE_ORDER  # TF_CONFIG's order of roles


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs to know about the cluster."""

    placement: Placement
    tf_config: str
    flags: tuple[str, ...]
    rendezvous: dict[str, str] = field(default_factory=dict)  # Keras 3, JAX, torchrun


def build(placements: Sequence[Placement], addresses: Mapping[str, str]) -> list[TaskSpec]:
    """``addresses`` maps task name ('worker:0') to 'host:port' on the data network."""
    ordered = rank_order(placements)  # TF_CONFIG's order: the other frameworks' ranks
    cluster: dict[str, list[str]] = {}
    for p in ordered:
        cluster.setdefault(p.role, []).append(addresses[p.name])
    others = rendezvous.contract(ordered, addresses)
    specs = []
    for p in placements:
        tf_config = json.dumps({"cluster": cluster, "task": {"type": p.role, "index": p.index}},
                               separators=(",", ":"))
        flags = (
            f"--ps_hosts={','.join(cluster.get('ps', []))}",
            f"--worker_hosts={','.join(cluster.get('worker', []))}",
            f"--job_name={p.role}",
            f"--task_index={p.index}",
        )
        specs.append(TaskSpec(p, tf_config, flags, others.get(p.name, {})))
    return specs


def gpu_env(indices: Sequence[int], gpus: Sequence[GpuInfo]) -> dict[str, str]:
    """Pin a task to the GPUs it was granted, by UUID.

    CUDA numbers devices fastest-first unless told ``PCI_BUS_ID`` order, while NVML (and so
    the matrix) numbers them by PCI bus: on a node with mixed GPUs an index could name
    another GPU than the one granted. A UUID cannot. ``HYPERTF_GPUS`` keeps the NVML
    indices for tools that want them (valid with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``). A GPU
    whose UUID the agent did not report falls back to its index.
    """
    uuids = {gpu.index: gpu.uuid for gpu in gpus if gpu.uuid}
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(uuids.get(i, str(i)) for i in indices),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "HYPERTF_GPUS": ",".join(map(str, indices)),
    }
