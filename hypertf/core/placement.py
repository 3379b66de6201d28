"""What a job asks for and what it gets: the request, the grant, task keys, ports, and why a
request does not fit. Pure: the keeper's admission and the launcher share it."""

from __future__ import annotations

import secrets
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from hypertf.core.errors import InsufficientResources
from hypertf.core.matrix import Matrix
from hypertf.core.scheduler import NoFit, Placement, TaskSlot, schedule


class PortsExhausted(InsufficientResources):
    """A host's port range is used up: planning again elsewhere does not help."""


def new_task_key(user: str, now: float | None = None) -> str:
    """Time-based (sortable, readable), random (unique across launchers), then the owner
    (whose ``leases/<user>`` and ``jobs/<user>`` hold the job)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(3)}.{user}"


@dataclass(frozen=True)
class Request:
    """What a job asks for, on which hosts, with which policy."""

    slots: tuple[TaskSlot, ...]
    hosts: tuple[str, ...]
    policy: str = "round_robin"
    port_ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return sum(slot.gpus for slot in self.slots)

    def describe(self) -> str:
        groups: dict[tuple[str, int], int] = {}
        for slot in self.slots:
            groups[(slot.role, slot.gpus)] = groups.get((slot.role, slot.gpus), 0) + 1
        parts = []
        for (role, gpus), count in groups.items():
            need = f"{gpus} GPU{'s' if gpus != 1 else ''} each" if gpus else "no GPU"
            parts.append(f"{count} {role} ({need})")
        total = self.gpus
        return f"{', '.join(parts)}: {total} GPU{'s' if total != 1 else ''} in all"


@dataclass(frozen=True)
class Grant:
    """What a job got: where each task runs, its GPUs and its port."""

    task_key: str
    placements: tuple[Placement, ...]
    ports: Mapping[str, int]  # task name ("worker:0") -> port
    retries: int = 0

    def address(self, placement: Placement, addresses: Mapping[str, str]) -> str:
        return f"{addresses[placement.host]}:{self.ports[placement.name]}"


def describe_free(matrix: Matrix, live: Collection[str], hosts: Sequence[str]) -> str:
    """'h1: 1 of 4 free (GPU 3); h2: agent down' - what the user can ask for instead."""
    parts = []
    for host in hosts:
        if host not in live:
            parts.append(f"{host}: agent down")
            continue
        row = matrix.gpus.get(host, [])
        free = matrix.free(host)
        listed = f" (GPU {', '.join(map(str, free))})" if free else ""
        parts.append(f"{host}: {len(free)} of {len(row)} free{listed}")
    return "; ".join(parts) or "no hosts"


def pick_ports(matrix: Matrix, placements: Sequence[Placement],
                ranges: Mapping[str, tuple[int, int]], exclude: Mapping[str, set[int]],
                ) -> dict[str, int]:
    """One port per task: the lowest in the host's range not reserved and not excluded.

    Predictable ports are easier to firewall and to read in logs; a port found in use by
    something else is excluded on the retry (see the launcher).
    """
    ports: dict[str, int] = {}
    used: dict[str, set[int]] = {}
    for placement in placements:
        host = placement.host
        taken = used.setdefault(host, matrix.reserved_ports(host) | exclude.get(host, set()))
        low, high = ranges.get(host, (20000, 20999))
        port = next((p for p in range(low, high + 1) if p not in taken), None)
        if port is None:
            raise PortsExhausted(
                f"no free port left on {host} in {low}-{high}: widen hypertf_port_range"
            )
        taken.add(port)
        ports[placement.name] = port
    return ports


def cannot_place(request: Request, matrix: Matrix, live: Collection[str]) -> str | None:
    """Why ``request`` does not fit on ``matrix``'s free cells of the live hosts now (None
    when it fits): the message names what is free where."""
    hosts = [host for host in request.hosts if host in live]
    try:
        schedule({host: matrix.free(host) for host in hosts}, request.slots, request.policy,
                 cpu_hosts=hosts)
    except NoFit as err:
        gpus = err.slot.gpus
        need = f"{gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "a live host"
        return (f"cannot place {err.slot.name} ({need} on one host): asked for "
                f"{request.describe()}; free now: {describe_free(matrix, live, request.hosts)}. "
                f"Ask for fewer tasks or GPUs, or wait for running jobs (hypertf status).")
    return None
