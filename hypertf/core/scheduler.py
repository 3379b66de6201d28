"""Placement policies: pure functions of the free GPUs and the request.

``round_robin`` is the original design's policy: one GPU from each server per round, then
another round. ``pack`` fills a server before the next, to keep a job's traffic local.
Tasks that need no GPU (parameter servers by default) are spread over the live hosts.
Offload slots (``--offload-hosts``: CPU servers that compute the tasks' matrix products) each
take a host of their own, one the job runs no task on, GPU-less hosts first.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum


class Policy(StrEnum):
    """How a job's GPU tasks are spread over the hosts (the request's ``policy``)."""

    ROUND_ROBIN = "round_robin"  # one GPU from each server per round
    PACK = "pack"  # fill a server before the next


POLICIES = tuple(Policy)
OFFLOAD = "offload"  # the role of a host lent to the job's matrix products (hypertf.offload)


@dataclass(frozen=True)
class TaskSlot:
    """One task of the job and the GPUs it needs on a single host."""

    role: str
    index: int
    gpus: int = 1

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"


@dataclass(frozen=True)
class Placement:
    """Where a task runs and which GPUs it gets."""

    role: str
    index: int
    host: str
    gpus: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"


class NoFit(Exception):
    """The request does not fit; carries the slot that could not be placed."""

    def __init__(self, slot: TaskSlot) -> None:
        super().__init__(slot.name)
        self.slot = slot


def schedule(
    free: Mapping[str, Sequence[int]],
    slots: Sequence[TaskSlot],
    policy: str = Policy.ROUND_ROBIN,
    cpu_hosts: Sequence[str] | None = None,
) -> list[Placement]:
    """Place every slot or raise NoFit.

    ``free`` maps each usable host, in inventory order, to its free GPU indices.
    ``cpu_hosts`` (default: the keys of ``free``) are where GPU-less tasks may go.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    hosts = list(free)
    # What is left of the hosts a slot took from; the others are as ``free`` says (at
    # 25,000 hosts, sorting every host's list for a 1-GPU job was most of an admission).
    left: dict[str, list[int]] = {}

    def remaining(host: str) -> Sequence[int]:
        cells = left.get(host)
        return cells if cells is not None else free.get(host, ())

    cpu_hosts = list(hosts if cpu_hosts is None else cpu_hosts)
    placements: dict[TaskSlot, Placement] = {}
    cursor, count = 0, len(hosts)
    for slot in (s for s in slots if s.gpus > 0):
        order = range(count) if policy == Policy.PACK else itertools.chain(
            range(cursor, count), range(cursor))
        at = next((i for i in order if len(remaining(hosts[i])) >= slot.gpus), None)
        if at is None:
            raise NoFit(slot)
        host = hosts[at]
        cells = sorted(remaining(host))
        taken, left[host] = cells[: slot.gpus], cells[slot.gpus :]
        placements[slot] = Placement(slot.role, slot.index, host, tuple(taken))
        if policy == Policy.ROUND_ROBIN:
            cursor = (at + 1) % count
    for turn, slot in enumerate(s for s in slots if s.gpus <= 0 and s.role != OFFLOAD):
        if not cpu_hosts:
            raise NoFit(slot)
        host = cpu_hosts[0] if policy == Policy.PACK else cpu_hosts[turn % len(cpu_hosts)]
        placements[slot] = Placement(slot.role, slot.index, host, ())
    # Offload hosts: each its own, none running a task of the job (its CPUs are the point);
    # hosts with the fewest free GPUs first, so GPU servers stay for GPU jobs.
    offload = [s for s in slots if s.role == OFFLOAD]
    if offload:
        used = {p.host for p in placements.values()}
        spare = sorted((h for h in cpu_hosts if h not in used),
                       key=lambda h: len(remaining(h)))
        for slot in offload:
            if not spare:
                raise NoFit(slot)
            placements[slot] = Placement(slot.role, slot.index, spare.pop(0), ())
    return [placements[slot] for slot in slots]
