"""A waiting job's request, read from a record its owner writes: typed and bounded before
the keeper's pass uses it.

A job record is its owner's to write (docs/zookeeper-layout.md, "Trust"), so the keeper reads
its ``queue`` as hostile input: a float priority of ``Infinity``, a GPU count written as a
string or negative, ten million host names, a field nobody defined. One such record must
never stop the pass for everyone: ``waiting_from_record`` either returns a ``Waiting`` whose
every number is a bounded ``int`` or raises ``InvalidRequest`` with the reason its owner is
shown (the keeper refuses the job with it). Pure: no client.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hypertf.core.admission import Waiting
from hypertf.core.errors import UsageError
from hypertf.core.layout import is_task_key, owner_of
from hypertf.core.placement import MAX_REQUEST_HOSTS, PortRanges, Request, expand_hosts
from hypertf.core.scheduler import OFFLOAD, POLICIES, Policy, TaskSlot

DEFAULT_PORT_RANGE = (20000, 20999)
MAX_RECORD_BYTES = 256 * 1024  # a request over 10,000 hosts is ~120 KB compacted
MAX_SLOTS = 10_000  # tasks in one job
MAX_GPUS_PER_TASK = 64  # more than any host holds
FIRST_TASK_PORT = 1024  # below: the system's services, never a task's
MAX_PRIORITY_ABS = 10**9  # a wish, clamped to the owner's maximum anyway
ROLES = ("chief", "worker", "ps", "evaluator", OFFLOAD)  # OFFLOAD: --offload-hosts
QUEUE_FIELDS = frozenset({"priority", "hosts", "policy", "slots", "port_range",
                          "port_ranges", "exclude_ports", "held", "no_wait", "resumes"})
HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-[]:")


class InvalidRequest(ValueError):
    """A request no keeper may act on; ``str()`` is the reason its owner reads."""


def _int(value: Any, what: str, low: int, high: int) -> int:
    """An ``int`` in [low, high]: a bool, a float (``Infinity``, ``2.5``) or a string is not."""
    if type(value) is not int:
        shown = "Infinity" if isinstance(value, float) and math.isinf(value) else repr(value)
        raise InvalidRequest(f"{what} is {shown[:40]}, not a whole number")
    if not low <= value <= high:
        raise InvalidRequest(f"{what} {value} is outside {low}..{high}")
    return value


def _host(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 253 \
            or not set(value) <= HOST_CHARS:
        raise InvalidRequest(f"{what} {str(value)[:40]!r} is not a host name")
    return value


def _port_range(value: Any, what: str) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise InvalidRequest(f"{what} is not [low, high]")
    # never a system port (sshd's 22, a web server's 443): a task there could pose as it
    low = _int(value[0], f"{what}'s low end", FIRST_TASK_PORT, 65535)
    high = _int(value[1], f"{what}'s high end", low, 65535)
    return low, high


def _slots(value: Any) -> tuple[TaskSlot, ...]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest("slots is not a non-empty list of [role, index, gpus]")
    if len(value) > MAX_SLOTS:
        raise InvalidRequest(f"{len(value)} tasks: at most {MAX_SLOTS:,} in one job")
    slots, names = [], set()
    for item in value:
        if not isinstance(item, list) or len(item) != 3:
            raise InvalidRequest(f"slot {str(item)[:40]} is not [role, index, gpus]")
        role, index, gpus = item
        if role not in ROLES:
            raise InvalidRequest(f"task role {str(role)[:20]!r} is not one of {', '.join(ROLES)}")
        slot = TaskSlot(role, _int(index, f"{role}'s index", 0, MAX_SLOTS),
                        _int(gpus, f"{role}:{index}'s GPU count", 0, MAX_GPUS_PER_TASK))
        if slot.name in names:
            raise InvalidRequest(f"task {slot.name} appears twice")
        names.add(slot.name)
        slots.append(slot)
    return tuple(slots)


def waiting_from_record(record: Mapping[str, Any], order: int, key: str) -> Waiting:
    """The ``Waiting`` job a ``queued`` record asks for, every field checked; raises
    InvalidRequest naming the first wrong one. ``key`` is the task key the record is
    stored under (a record naming another key is refused: it would be admitted as that)."""
    if record.get("task_key") != key:
        raise InvalidRequest(f"the record names task key {str(record.get('task_key'))[:60]!r}, "
                             f"not the key it is stored under")
    queue = record.get("queue")
    if not isinstance(queue, dict):
        raise InvalidRequest("the record has no request ('queue')")
    unknown = sorted(set(queue) - QUEUE_FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown request field(s) {', '.join(map(str, unknown))[:80]}")
    patterns = queue.get("hosts")
    if not isinstance(patterns, list) or not patterns or len(patterns) > MAX_REQUEST_HOSTS:
        raise InvalidRequest("hosts is not a non-empty list of host names")
    try:
        hosts = expand_hosts(tuple(_host(h, "host") for h in patterns))
    except ValueError as err:
        raise InvalidRequest(str(err)) from err
    policy = queue.get("policy", Policy.ROUND_ROBIN)
    if policy not in POLICIES:
        raise InvalidRequest(f"policy {str(policy)[:20]!r} is not one of {', '.join(POLICIES)}")
    common = _port_range(queue.get("port_range", list(DEFAULT_PORT_RANGE)), "port_range")
    differing = queue.get("port_ranges", {})
    exclude = queue.get("exclude_ports", {})
    if not isinstance(differing, dict) or not isinstance(exclude, dict) \
            or len(differing) > len(hosts) or len(exclude) > len(hosts):
        raise InvalidRequest("port_ranges and exclude_ports must map some of its hosts")
    ranges = PortRanges(hosts, common, {_host(h, "port_ranges' host"): _port_range(r, h)
                                        for h, r in differing.items()})
    excluded: dict[str, frozenset[int]] = {}
    for host, ports in exclude.items():
        if not isinstance(ports, list) or len(ports) > 65535:
            raise InvalidRequest(f"exclude_ports of {str(host)[:40]} is not a list of ports")
        excluded[_host(host, "exclude_ports' host")] = frozenset(
            _int(p, "an excluded port", 1, 65535) for p in ports)
    held, no_wait = queue.get("held", False), queue.get("no_wait", False)
    if type(held) is not bool or type(no_wait) is not bool:
        raise InvalidRequest("held and no_wait must be true or false")
    try:
        owner_of(key)
    except UsageError as err:
        raise InvalidRequest(str(err)) from err
    resumes = queue.get("resumes", "")
    if not isinstance(resumes, str) or (resumes and not is_task_key(resumes)):
        raise InvalidRequest(f"resumes {str(resumes)[:40]!r} is not a task key")
    return Waiting(key, Request(slots=_slots(queue.get("slots")), hosts=hosts, policy=policy,
                                port_ranges=ranges),
                   priority=_int(queue.get("priority", 0), "priority", -MAX_PRIORITY_ABS,
                                 MAX_PRIORITY_ABS),
                   order=order, held=held, exclude_ports=excluded, no_wait=no_wait,
                   resumes=resumes)


@dataclass(frozen=True)
class PortBounds:
    """The port ranges the admin's inventory gives each host (``hypertf_port_range``): a
    request's ranges must lie within them, so a user's own record cannot ask for a port
    the inventory did not set aside for tasks (the keeper refuses it before its pass)."""

    common: tuple[int, int]
    differing: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, ranges: Mapping[str, tuple[int, int]]) -> PortBounds | None:
        """From each host's range (the inventory's nodes); None for no hosts."""
        if not ranges:
            return None
        common = Counter(ranges.values()).most_common(1)[0][0]
        return cls(common, {h: r for h, r in ranges.items() if r != common})

    def outside(self, ranges: Mapping[str, tuple[int, int]]) -> str:
        """Why ``ranges`` reach outside these bounds ("" when they do not)."""
        if not isinstance(ranges, PortRanges):
            ranges = PortRanges(tuple(ranges), DEFAULT_PORT_RANGE, dict(ranges))
        special = set(ranges.differing)
        if self.differing:
            special |= set(self.differing).intersection(ranges.hosts)
        for host in sorted(special):
            wanted, bound = ranges[host], self.differing.get(host, self.common)
            if not bound[0] <= wanted[0] <= wanted[1] <= bound[1]:
                return (f"ports {wanted[0]}-{wanted[1]} on {host[:60]} are outside its "
                        f"hypertf_port_range {bound[0]}-{bound[1]}")
        if len(special) < len(ranges.hosts):
            low, high = ranges.common
            if not self.common[0] <= low <= high <= self.common[1]:
                return (f"ports {low}-{high} are outside the inventory's hypertf_port_range "
                        f"{self.common[0]}-{self.common[1]}")
        return ""
