"""The servers x GPUs availability matrix, kept apart from the agents' records.

A cell is ``1`` (free), ``0`` (unavailable: busy with someone else's work, or its node's
agent is gone), a task key (taken by that job) or ``draining:<task key>`` (the job ended
without its launcher's confirmed stop: not allocatable until the node's agent has seen the
job's processes dead). Ports a job reserved are kept beside the
cells, so one version-checked write covers both. Everything here is pure: reading and
writing ZooKeeper is the allocation module's job.

**Shards.** In ZooKeeper the matrix is not one znode (one znode capped the cluster at
about 2,000 hosts, and serialised every writer on one version): each host's row lives in
shard ``shard_of(host, count)`` of a fixed number of shards (``MatrixIndex``, the parent's
data). ``Matrix`` stays the whole, in memory; ``split`` and ``changed_shards`` say which
shards a change touches, so a writer sets only those.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import math
import zlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from hypertf.core.layout import owner_of
from hypertf.core.records import AgentRecord, decode, encode
from hypertf.core.scheduler import Placement

FREE = 1
UNAVAILABLE = 0
DRAINING = "draining:"
Cell = int | str


def _row_ok(row: object) -> bool:
    """A row of cells as the keeper writes them (1, 0 or a task key, held or draining),
    checked at C speed: a row of ints alone (most rows: no job) by its set, a row with
    jobs by its distinct cells."""
    if not isinstance(row, list):
        return False
    types = set(map(type, row))
    if not types <= {int, str}:
        return False
    if str not in types:
        return set(row) <= {FREE, UNAVAILABLE}
    # the distinct cells only (a row of 8 held by one job: one), at C speed until then
    return all(type(c) is str for c in set(row).difference((FREE, UNAVAILABLE)))


def _has_job(row: list[Cell]) -> bool:
    """Whether a cell of the row names a job (held or draining): at C speed, so the
    rows of an idle cluster of 25,000 hosts cost nothing in a pass."""
    return str in map(type, row)


def holder(cell: Cell) -> str | None:
    """The task key of a job that holds the cell (None when free, unavailable or draining)."""
    return cell if isinstance(cell, str) and not cell.startswith(DRAINING) else None


def draining(cell: Cell | str) -> str | None:
    """The task key of the ended job whose processes the cell waits for, if it drains."""
    return cell[len(DRAINING):] if isinstance(cell, str) and cell.startswith(DRAINING) else None


def job_of(cell: Cell | str) -> str | None:
    """The job a cell or port belongs to, holding or draining."""
    return holder(cell) or draining(cell)


class GpuState(StrEnum):
    """A GPU's cell as people read it (``hypertf status``, the agent's metrics)."""

    FREE = "free"
    BUSY = "busy"  # a job holds it
    DRAINING = "draining"  # its ended job's processes are not yet seen dead
    UNAVAILABLE = "unavailable"  # someone else's work, a gone agent, or no cell


def state_of(cell: Cell | None) -> GpuState:
    """A cell as people read it: free, busy, draining or unavailable (None: no cell)."""
    if cell is None:
        return GpuState.UNAVAILABLE
    if holder(cell):
        return GpuState.BUSY
    if draining(cell):
        return GpuState.DRAINING
    return GpuState.FREE if cell == FREE else GpuState.UNAVAILABLE


@dataclass
class Matrix:
    """Cells per host (ordered) and reserved ports per host."""

    gpus: dict[str, list[Cell]] = field(default_factory=dict)
    ports: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return encode({"gpus": self.gpus, "ports": self.ports})

    @classmethod
    def from_json(cls, data: bytes) -> Matrix:
        if not data:
            return cls()
        # every row is checked flat below: no depth walk (a third of a shard's read)
        payload = decode(data, "GPU matrix", walk=False)
        gpus, ports = payload.get("gpus", {}), payload.get("ports", {})
        if not isinstance(gpus, dict) or not isinstance(ports, dict) or not all(
                map(_row_ok, gpus.values())) or not all(
                    isinstance(row, dict) and all(isinstance(k, str) for k in row.values())
                     for row in ports.values()):
            raise ValueError("a GPU matrix shard whose rows are not lists of cells")
        return cls(gpus=gpus, ports=ports)

    def copy(self) -> Matrix:
        """A copy whose rows can change apart (cells are ints and strings: immutable)."""
        return Matrix({host: list(row) for host, row in self.gpus.items()},
                      {host: dict(row) for host, row in self.ports.items()})

    def free(self, host: str) -> list[int]:
        """Indices of the free GPUs of ``host``."""
        return [i for i, cell in enumerate(self.gpus.get(host, [])) if cell == FREE]

    def task_keys(self) -> set[str]:
        """Every job that holds a GPU or a port (draining jobs hold nothing any more)."""
        keys = {key for cell in set(itertools.chain.from_iterable(self.gpus.values()))
                if (key := holder(cell))}  # the distinct cells first, at C speed
        keys.update(key for row in self.ports.values() for v in row.values() if (key := holder(v)))
        return keys

    def hosts_of(self, task_key: str) -> set[str]:
        """Hosts where ``task_key`` has a cell or a port, held or draining."""
        return {host for host, row in self.gpus.items() if any(job_of(c) == task_key for c in row)
                } | {host for host, row in self.ports.items()
                     if any(job_of(k) == task_key for k in row.values())}

    def ended_on(self, host: str, leases: set[str],
                 preempted: Collection[str] = ()) -> set[str]:
        """Jobs whose cells or ports on ``host`` wait for its agent: draining, or still
        held by a job whose lease is gone (not yet drained by a sync). A job whose lease
        lives is never among them on the matrix's word alone (only the owner and the admin
        may end a job, by dropping its lease), except a draining one in ``preempted``: the
        keeper's preemption notice names it (keeper-only, like this matrix), and the keeper
        drains its cells only once the notice's deadline passed."""
        cells = [*self.gpus.get(host, []), *self.ports.get(host, {}).values()]
        return {key for cell in cells
                if (key := job_of(cell)) and (key not in leases or (
                    key in preempted and draining(cell) is not None))}

    def draining_keys(self) -> set[str]:
        """Every ended job with a draining cell or port anywhere."""
        return {key for host in set(self.gpus) | set(self.ports)
                for key in self.draining_on(host)}

    def draining_on(self, host: str) -> set[str]:
        """Ended jobs whose cells or ports on ``host`` wait for its agent's confirmation."""
        keys = {key for cell in self.gpus.get(host, []) if (key := draining(cell))}
        keys.update(key for v in self.ports.get(host, {}).values() if (key := draining(v)))
        return keys

    def drain(self, task_keys: set[str], hosts: Iterable[str] | None = None) -> Matrix:
        """A copy where the cells and ports of ``task_keys`` (on ``hosts``, default all) are
        draining: neither free nor held, until the node confirms the processes dead."""
        result = Matrix(dict(self.gpus), dict(self.ports))  # rows copied where changed
        chosen = set(result.gpus) | set(result.ports) if hosts is None else set(hosts)
        for host in chosen:
            row = result.gpus.get(host, [])
            if _has_job(row):  # most rows of a large cluster hold none: C speed
                cells = [DRAINING + str(cell) if holder(cell) in task_keys else cell
                         for cell in row]
                if cells != row:
                    result.gpus[host] = cells
            ports = result.ports.get(host)
            if ports and any(holder(key) in task_keys for key in ports.values()):
                result.ports[host] = {port: DRAINING + key if holder(key) in task_keys
                                      else key for port, key in ports.items()}
        return result

    def held_by(self, task_key: str) -> dict[str, list[int]]:
        """GPUs that ``task_key`` holds, per host."""
        held = {}
        for host, row in self.gpus.items():
            cells = [i for i, cell in enumerate(row) if cell == task_key]
            if cells:
                held[host] = cells
        return held

    def held_per_user(self) -> dict[str, int]:
        """GPUs each user's running jobs hold (draining cells belong to ended jobs)."""
        used: dict[str, int] = {}
        # every cell counted at C speed (200,000 at 25,000 hosts), then each job once
        for cell, count in collections.Counter(
                itertools.chain.from_iterable(self.gpus.values())).items():
            key = holder(cell)
            if key:
                user = owner_of(key)
                used[user] = used.get(user, 0) + count
        return used

    def reserved_ports(self, host: str) -> set[int]:
        return {int(port) for port in self.ports.get(host, {})}

    def take(self, task_key: str, gpus: Mapping[str, Iterable[int]],
             ports: Mapping[str, Iterable[int]]) -> Matrix:
        """A copy with the given cells and ports marked as held by ``task_key``. Only the
        rows it changes are copied (the others are shared: every method that changes a
        row copies the matrix first), so an admission at 25,000 hosts costs no full copy."""
        result = Matrix(dict(self.gpus), dict(self.ports))
        for host, indices in gpus.items():
            cells = result.gpus[host] = list(result.gpus[host])
            for i in indices:
                if cells[i] != FREE:
                    raise ValueError(f"GPU {i} of {host} is not free")
                cells[i] = task_key
        for host, numbers in ports.items():
            row = result.ports[host] = dict(result.ports.get(host, {}))
            for port in numbers:
                if str(port) in row:
                    raise ValueError(f"port {port} of {host} is reserved")
                row[str(port)] = task_key
        return result

    def release(self, task_keys: set[str], records: Mapping[str, AgentRecord],
                hosts: Iterable[str] | None = None) -> Matrix:
        """A copy without the cells and ports of ``task_keys``, held or draining, on
        ``hosts`` (default all); freed cells follow the agent's record."""
        result = Matrix(dict(self.gpus), dict(self.ports))  # rows copied where changed
        chosen = None if hosts is None else set(hosts)
        for host, row in self.gpus.items():
            if (chosen is not None and host not in chosen) or not _has_job(row):
                continue  # most rows of a large cluster hold no job: C speed
            if not any(job_of(cell) in task_keys for cell in row):
                continue
            record = records.get(host)
            avail = set(record.gpu_avail_list) if record else set()
            result.gpus[host] = [(FREE if i in avail else UNAVAILABLE)
                                 if job_of(cell) in task_keys else cell
                                 for i, cell in enumerate(row)]
        for host in list(result.ports):
            if chosen is not None and host not in chosen:
                continue
            kept = {p: k for p, k in result.ports[host].items() if job_of(k) not in task_keys}
            if kept:
                result.ports[host] = kept
            else:
                del result.ports[host]
        return result


def synced(matrix: Matrix, records: Mapping[str, AgentRecord], leases: set[str],
           registered: Collection[str] | None = None) -> Matrix:
    """The matrix as the agents' records and the live leases say it should be.

    Rows of hosts whose agent is gone turn unavailable (their cells held by live jobs, and
    draining cells, stay as they are); cells and ports of jobs without a lease (their
    launcher died, or the job was killed) turn draining: only the node's agent frees them,
    once it has seen the job's processes dead there. With ``registered`` (the hosts the
    admin registered), the row of a host that is not, and holds nothing, is removed.
    """
    dead = matrix.task_keys() - leases
    result = matrix.drain(dead) if dead else matrix.copy()
    hosts = list(result.gpus) + sorted(set(records) - set(result.gpus))
    for host in hosts:
        old = result.gpus.get(host, [])
        record = records.get(host)
        if not _has_job(old):  # most rows: only what the record says (cached per shape)
            result.gpus[host] = list(_idle_row(record.gpu, tuple(record.gpu_avail_list))
                                     if record else [UNAVAILABLE] * len(old))
            continue
        held = [i for i, cell in enumerate(old) if isinstance(cell, str)]
        size = record.gpu if record else len(old)
        size = max([size, *(i + 1 for i in held)])
        avail = set(record.gpu_avail_list) if record else set()
        row: list[Cell] = []
        for i in range(size):
            cell = old[i] if i < len(old) else UNAVAILABLE
            row.append(cell if isinstance(cell, str) else (FREE if i in avail else UNAVAILABLE))
        result.gpus[host] = row
    if registered is not None:
        known = set(registered)  # a list of 10,000 hosts: a set, or this is quadratic
        for host in [h for h in result.gpus if h not in known and h not in records]:
            if not any(isinstance(cell, str) for cell in result.gpus[host]) \
                    and not result.ports.get(host):
                del result.gpus[host]
                result.ports.pop(host, None)
    return result


@functools.lru_cache(maxsize=1024)
def _idle_row(size: int, avail: tuple[int, ...]) -> tuple[Cell, ...]:
    """The row of a host that holds no job: free where its record says available."""
    return tuple(FREE if i in avail else UNAVAILABLE for i in range(size))


def same(a: Matrix, b: Matrix) -> bool:
    """Equal content (cheaper than a write that changes nothing)."""
    return a.gpus == b.gpus and a.ports == b.ports


@dataclass(frozen=True)
class Held:
    """What an admitted job holds, as its admission granted it: GPUs and ports per host."""

    gpus: Mapping[str, tuple[int, ...]]
    ports: Mapping[str, tuple[int, ...]]

    @classmethod
    def of(cls, placements: Iterable[Placement], ports: Mapping[str, int]) -> Held:
        """Placements and their ports (task name -> port) grouped per host: the one place
        a grant becomes what it holds in the matrix."""
        gpus: dict[str, list[int]] = {}
        host_ports: dict[str, list[int]] = {}
        for p in placements:
            gpus.setdefault(p.host, []).extend(int(g) for g in p.gpus)
            host_ports.setdefault(p.host, []).append(int(ports[p.name]))
        return cls({h: tuple(g) for h, g in gpus.items() if g},
                   {h: tuple(n) for h, n in host_ports.items()})


def restored(matrix: Matrix, grants: Mapping[str, Held], leases: set[str],
             ) -> tuple[Matrix, list[str]]:
    """The matrix with every live job's granted cells and ports held by it again.

    Whoever wrote the matrix last (an agent's or the admin's credential, by mistake or not),
    a running job keeps what it was granted: a cell of a live grant that reads free,
    unavailable, draining or held by a job without a lease is given back to its job. A cell
    that another live job holds is left alone and reported (two live grants never overlap,
    so that is a forged or damaged matrix a person must look at). Returns the matrix and
    the repairs made, as lines for the log."""
    result = matrix.copy()
    repairs: list[str] = []
    for key, held in sorted(grants.items()):
        if key not in leases:
            continue
        for host, indices in held.gpus.items():
            row = result.gpus.setdefault(host, [])
            row.extend([UNAVAILABLE] * (max(indices, default=-1) + 1 - len(row)))
            for i in indices:
                cell = row[i]
                if cell == key:
                    continue
                other = holder(cell)
                if other is not None and other in leases:
                    repairs.append(f"GPU {i} of {host}: granted to {key} but held by {other}; "
                                   f"left as it is")
                    continue
                row[i] = key
                repairs.append(f"GPU {i} of {host}: restored to {key} (was {cell!r})")
        for host, numbers in held.ports.items():
            row_ports = result.ports.setdefault(host, {})
            for port in numbers:
                port_holder = row_ports.get(str(port))
                if port_holder == key:
                    continue
                other = holder(port_holder) if port_holder is not None else None
                if other is not None and other in leases:
                    continue
                row_ports[str(port)] = key
                repairs.append(f"port {port} of {host}: restored to {key}")
    return result, repairs


# -- shards ------------------------------------------------------------------------------
INDEX_FORMAT = 2  # the parent's format: 1 was the whole matrix in one znode
HOSTS_PER_SHARD = 128  # fully held (every GPU its own job, a port each): ~90 KB a shard
MIN_SHARDS = 4


def shard_count(hosts: int) -> int:
    """The shards for a cluster of ``hosts``: about 128 hosts each, so a shard stays far
    below 256 KiB even with every GPU held by its own job."""
    return max(MIN_SHARDS, math.ceil(hosts / HOSTS_PER_SHARD))


def shard_of(host: str, count: int) -> int:
    """The shard of a host's row: a stable hash (the same in every process and version,
    unlike Python's ``hash``), remembered per host (a keeper's pass asks for 25,000)."""
    known = _crcs.get(host)
    if known is None:
        if len(_crcs) >= MAX_REMEMBERED_HOSTS:
            _crcs.clear()
        known = _crcs[host] = zlib.crc32(host.encode())
    return known % count


MAX_REMEMBERED_HOSTS = 200_000
_crcs: dict[str, int] = {}  # host -> crc32 of its name (only ever the same value: no lock)


@dataclass(frozen=True)
class MatrixIndex:
    """The matrix parent's data: how many shards hold the rows. Only ``auth init``
    changes it (a larger cluster, or the migration from the one-znode matrix)."""

    shards: int

    def to_json(self) -> bytes:
        return encode({"shards": self.shards}, fmt=INDEX_FORMAT)

    @classmethod
    def from_json(cls, data: bytes) -> MatrixIndex | None:
        """The index; None for the previous layout (the whole matrix in this znode)."""
        if not data or _format_of(data) == 1:
            return None
        payload = decode(data, "GPU matrix index", fmt=INDEX_FORMAT)
        shards = payload.get("shards")
        if type(shards) is not int or shards < 1:
            raise ValueError(f"a GPU matrix index with {shards!r} shards")
        return cls(shards)


def _format_of(data: bytes) -> object:
    try:
        payload = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return payload.get("format") if isinstance(payload, dict) else None


def split(matrix: Matrix, count: int) -> list[Matrix]:
    """The matrix as ``count`` shards: each host's row and ports in ``shard_of(host)``."""
    parts = [Matrix() for _ in range(count)]
    for host, row in matrix.gpus.items():
        parts[shard_of(host, count)].gpus[host] = row
    for host, ports in matrix.ports.items():
        parts[shard_of(host, count)].ports[host] = ports
    return parts


def joined(parts: Iterable[Matrix]) -> Matrix:
    """The whole matrix from its shards (or from some of them: those hosts only)."""
    whole = Matrix()
    for part in parts:
        whole.gpus.update(part.gpus)
        whole.ports.update(part.ports)
    return whole


def changed_shards(old: Matrix, new: Matrix, count: int) -> dict[int, Matrix]:
    """The shards whose content differs between ``old`` and ``new``, with their new
    content: what a writer sets (each with its own version check). The hosts whose row or
    ports differ are found first (a row ``take`` did not copy is the same object: no
    comparison), and only their shards are built: an admission at 25,000 hosts split both
    matrices into 196 shards and compared them all."""
    dirty = {shard_of(host, count) for host in _changed_hosts(old, new)}
    if not dirty:
        return {}
    parts = {i: Matrix() for i in sorted(dirty)}
    for host, row in new.gpus.items():
        part = parts.get(shard_of(host, count))
        if part is not None:
            part.gpus[host] = row
    for host, ports in new.ports.items():
        part = parts.get(shard_of(host, count))
        if part is not None:
            part.ports[host] = ports
    return parts


def _changed_hosts(old: Matrix, new: Matrix) -> set[str]:
    """Hosts whose row or ports are not equal in ``old`` and ``new`` (or in one only)."""
    hosts: set[str] = set()
    sides: tuple[tuple[Mapping[str, object], Mapping[str, object]], ...] = (
        (old.gpus, new.gpus), (old.ports, new.ports))
    for before, after in sides:
        for host, value in after.items():
            was = before.get(host)
            if was is not value and was != value:
                hosts.add(host)
        hosts.update(host for host in before if host not in after)
    return hosts
