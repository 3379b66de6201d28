"""What a job asks for and what it gets: the request, the grant, task keys, ports, and why a
request does not fit. Pure: the keeper's admission and the launcher share it."""

from __future__ import annotations

import functools
import re
import secrets
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from hypertf.core.errors import InsufficientResources
from hypertf.core.matrix import Matrix
from hypertf.core.scheduler import NoFit, Placement, Policy, TaskSlot, schedule


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
    policy: str = Policy.ROUND_ROBIN
    port_ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @functools.cached_property
    def gpus(self) -> int:
        """Computed once: the keeper asks it of every waiting job at every pass."""
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
class PortRanges(Mapping[str, tuple[int, int]]):
    """Each host's port range as a waiting job's record keeps it: one range most hosts
    share and the few that differ, so a request over 10,000 hosts is not 10,000 entries
    (in the record, nor in the keeper's memory for each of 1,000 waiting jobs)."""

    hosts: tuple[str, ...]
    common: tuple[int, int]
    differing: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def __getitem__(self, host: str) -> tuple[int, int]:
        return self.differing.get(host, self.common)

    def __iter__(self) -> Iterator[str]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)


_NUMBERED = re.compile(r"^(.*?)(\d+)$")
_RANGE = re.compile(r"^(.*)\[(\d+):(\d+)\]$")
MAX_REQUEST_HOSTS = 100_000  # a record is its owner's to write: never expand past this


def compact_hosts(hosts: Sequence[str]) -> list[str]:
    """Hosts in order, each run of 3 or more consecutive numbers of one prefix and width
    written as an Ansible-style range (``node[00000:09999]``; host names hold no ``[``):
    a waiting job's record names every host it may use, 10,000 names are 120 KB. A
    launcher asks it for the same inventory at every job: the answers are kept."""
    return list(_compacted(tuple(hosts)))


@functools.lru_cache(maxsize=32)
def _compacted(hosts: tuple[str, ...]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(hosts):
        j = i + 1
        match = _NUMBERED.match(hosts[i])
        if match:
            prefix, digits = match.groups()
            while j < len(hosts):
                nxt = _NUMBERED.match(hosts[j])
                if (not nxt or nxt.group(1) != prefix or len(nxt.group(2)) != len(digits)
                        or int(nxt.group(2)) != int(digits) + j - i):
                    break
                j += 1
        if j - i >= 3 and match:
            out.append(f"{match.group(1)}[{match.group(2)}:{hosts[j - 1][len(match.group(1)):]}]")
        else:
            out.extend(hosts[i:j])
        i = j
    return tuple(out)


@functools.lru_cache(maxsize=64)
def expand_hosts(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """The hosts ``compact_hosts`` wrote (plain names stay as they are); memoised: 1,000
    waiting jobs over one inventory share one tuple. ValueError past MAX_REQUEST_HOSTS."""
    hosts: list[str] = []
    for pattern in patterns:
        match = _RANGE.match(pattern)
        if not match:
            hosts.append(pattern)
            continue
        prefix, first, last = match.groups()
        if len(first) != len(last) or int(last) < int(first):
            raise ValueError(f"host range {pattern!r} is not first:last of one width")
        if len(hosts) + int(last) - int(first) >= MAX_REQUEST_HOSTS:
            raise ValueError(f"a request over more than {MAX_REQUEST_HOSTS:,} hosts")
        hosts.extend(f"{prefix}{n:0{len(first)}d}" for n in range(int(first), int(last) + 1))
    return tuple(hosts)


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
