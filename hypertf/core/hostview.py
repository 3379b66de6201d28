"""The keeper's view of the hosts (``keeper/status.<shard>``): what ``hypertf status`` shows.

At 25,000 hosts a status that read every agent record moved 37 MB, parsed and checked 25,000
records and synced the matrix itself: 2-4 s before a line was printed. The keeper has all of
it parsed already (its record cache, its synced matrix), so it publishes, per shard of the
matrix, one small entry per host: its agent's state, when ZooKeeper last saw its record
written, its addresses, driver and confinement, its row of cells, the GPUs whose record says
something (a reason, a process), its reserved ports and its unreadable record's error.

Freshness: a shard is rewritten when anything shown but the heartbeat changed (within a
second: the keeper writes shards at most once a second, hypertf.keeper.statusview), and
when only its agents' keep-alives moved, at most every ``REFRESH_S`` (at 25,000 hosts every
shard has a keep-alive within seconds: a rewrite per keep-alive would double ZooKeeper's
writes). So "seen N s ago" read from the view is at most ``REFRESH_S`` older than the truth;
``hypertf status --json`` and ``--direct`` read every record, as before.

Who writes it: the keeper only (ZooKeeper's ACL, hypertf.store.acltable); each shard is an
ephemeral of the keeper's session, so a dead keeper leaves no stale view and ``status``
reads the records directly. A reader still checks every value's type: it prints them.

Pure: the keeper encodes (hypertf.keeper.statusview), the command decodes
(hypertf.store.statusview).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hypertf.core.errors import StoreError
from hypertf.core.matrix import Cell, job_of
from hypertf.core.records import AgentRecord, GpuInfo, decode, encode

VIEW_FORMAT = 1
REFRESH_S = 15.0  # a shard whose only change is keep-alives: rewritten at most this often
SHARD_BYTES_MAX = 512 * 1024  # a larger shard is published as omitted: status reads directly
PROCESSES_SHOWN = 8  # per GPU: a hostile agent cannot grow its shard past what status shows
TRESPASSES_SHOWN = 16  # per host
TEXT_SHOWN = 300  # an unreadable record's error, a confinement or driver text


@dataclass(slots=True)
class HostView:
    """One host as the keeper last saw it (``up``: its agent's record exists and parses)."""

    up: bool
    written: float | None = None  # the record's last write, by ZooKeeper's clock (s)
    data_addr: str | None = None
    mgmt_addr: str | None = None
    gpu_source: str | None = None
    gpu_driver: dict[str, str] = field(default_factory=dict)
    confine: str | None = None
    row: list[Cell] = field(default_factory=list)
    gpus: dict[int, dict[str, Any]] = field(default_factory=dict)  # the GPUs that say something
    ports: int = 0
    cpu_jobs: list[str] = field(default_factory=list)
    unreadable: str = ""
    trespasses: list[dict[str, Any]] = field(default_factory=list)


def host_view(record: AgentRecord | None, written: float | None, row: list[Cell],
              ports: Mapping[str, str], cpu_jobs: list[str], unreadable: str = "") -> HostView:
    """A host's entry from the keeper's parsed record (None: no readable record)."""
    if record is None:
        return HostView(up=False, row=row, ports=len(ports), cpu_jobs=cpu_jobs,
                        unreadable=unreadable[:TEXT_SHOWN])
    gpus: dict[int, dict[str, Any]] = {}
    for gpu in record.gpus:
        if gpu.reason or gpu.processes:
            entry = asdict(gpu)
            entry["processes"] = entry["processes"][:PROCESSES_SHOWN]
            gpus[gpu.index] = entry
    return HostView(up=True, written=written, data_addr=record.data_addr,
                    mgmt_addr=record.mgmt_addr, gpu_source=record.gpu_source,
                    gpu_driver=dict(record.gpu_driver), confine=record.confine[:TEXT_SHOWN],
                    row=row, gpus=gpus, ports=len(ports), cpu_jobs=cpu_jobs,
                    trespasses=[asdict(t) for t in record.trespasses[:TRESPASSES_SHOWN]])


def cpu_jobs(row: Sequence[Cell], ports: Mapping[str, str]) -> list[str]:
    """Jobs with ports on a host but no GPU of it: parameter servers, offload hosts."""
    if not ports:
        return []
    return sorted({key for cell in ports.values() if (key := job_of(str(cell)))}
                  - {key for cell in row if (key := job_of(cell))})


def runs(row: Sequence[Cell]) -> list[list[Any]]:
    """A row as [cell, count] runs: a host held by one job is one run, not 8 keys."""
    out: list[list[Any]] = []
    for cell in row:
        if out and out[-1][0] == cell:
            out[-1][1] += 1
        else:
            out.append([cell, 1])
    return out


_SINGLE: dict[tuple[Cell, int], list[Cell]] = {}  # a row of one run: shared, read-only


def _unrun(runs_: object) -> list[Cell]:
    """The row of stored runs; a one-run row (most hosts) is one shared list per value."""
    if not isinstance(runs_, list):
        raise TypeError("row")
    if len(runs_) == 1 and isinstance(first := runs_[0], list) and len(first) == 2:
        cell, count = first
        shared = _SINGLE.get((cell, count)) if type(count) is int else None
        if shared is not None:
            return shared
    row: list[Cell] = []
    for item in runs_:
        if not (isinstance(item, list) and len(item) == 2 and type(item[1]) is int
                and 0 < item[1] <= 4096 and type(item[0]) in (int, str)):
            raise TypeError("row")
        row.extend([item[0]] * item[1])
    if len(runs_) == 1 and len(_SINGLE) < 100_000:
        _SINGLE[runs_[0][0], runs_[0][1]] = row
    return row


def entry_of(view: HostView, tables: dict[str, list[Any]]) -> list[Any]:
    """A host's entry as the shard stores it, drivers and confinements by table index."""
    def index(name: str, value: Any) -> int:
        table = tables.setdefault(name, [])
        try:
            return table.index(value)
        except ValueError:
            table.append(value)
            return len(table) - 1

    return [int(view.up), view.written, view.data_addr, view.mgmt_addr, view.gpu_source,
            index("driver", view.gpu_driver), index("confine", view.confine), runs(view.row),
            {str(i): gpu for i, gpu in view.gpus.items()}, view.ports, view.cpu_jobs,
            view.unreadable, view.trespasses]


def encode_shard(shard: int, count: int, hosts: Iterable[tuple[str, HostView]]) -> bytes:
    """One shard's znode; ``{"omitted": ...}`` when it would pass SHARD_BYTES_MAX."""
    tables: dict[str, list[Any]] = {}
    entries = {name: entry_of(view, tables) for name, view in hosts}
    data = encode({"shard": shard, "of": count, "tables": tables, "hosts": entries},
                  fmt=VIEW_FORMAT)
    if len(data) > SHARD_BYTES_MAX:
        return encode({"shard": shard, "of": count, "omitted": "too large"}, fmt=VIEW_FORMAT)
    return data


def _text(value: object) -> str | None:
    if value is None or (type(value) is str and len(value) <= 4 * TEXT_SHOWN):
        return value
    raise TypeError("text")


def _gpu(entry: object) -> dict[str, Any]:
    """A GPU that says something, as the record's checks take it (any other shape refused)."""
    if not isinstance(entry, dict):
        raise TypeError("GPU")
    return asdict(GpuInfo.from_dict(dict(entry)))


def _host(entry: object, drivers: list[dict[str, str]], confines: list[str | None]
          ) -> HostView:
    if type(entry) is not list or len(entry) != 13:
        raise TypeError("entry")
    (up, written, data_addr, mgmt_addr, source, driver, confine, row, gpus, ports, cpu_jobs,
     unreadable, trespasses) = entry
    if not (type(up) is int and (written is None or type(written) in (int, float))
            and type(ports) is int and type(unreadable) is str
            and type(gpus) is dict and type(cpu_jobs) is list and type(trespasses) is list):
        raise TypeError("entry")
    if cpu_jobs and not all(type(k) is str for k in cpu_jobs):
        raise TypeError("CPU jobs")
    if trespasses and not all(type(t) is dict and all(type(v) in _SCALARS for v in t.values())
                              for t in trespasses):
        raise TypeError("trespasses")
    return HostView(bool(up), written, _text(data_addr), _text(mgmt_addr), _text(source),
                    drivers[driver], confines[confine], _unrun(row),
                    {int(i): _gpu(g) for i, g in gpus.items()} if gpus else {}, ports,
                    cpu_jobs, unreadable[:TEXT_SHOWN], trespasses)


_SCALARS = (int, float, str, bool, type(None))


def _tables(tables: object) -> tuple[list[dict[str, str]], list[str | None]]:
    """The shard's driver and confinement tables, checked once per shard."""
    if not isinstance(tables, dict):
        raise TypeError("tables")
    drivers, confines = tables.get("driver", []), tables.get("confine", [])
    if not (isinstance(drivers, list) and isinstance(confines, list)
            and all(isinstance(d, dict) and all(type(v) is str for v in d.values())
                    for d in drivers)):
        raise TypeError("tables")
    return drivers, [_text(c) for c in confines]


def decode_shard(data: bytes) -> tuple[int, int, dict[str, HostView] | None]:
    """(shard, count, hosts) of a shard's znode; hosts None when the keeper omitted it.
    StoreError for anything else than what ``encode_shard`` writes. Only the keeper writes
    a shard, and every entry's shape is checked here, so the records' generic walk for
    nesting depth (a third of a status at 25,000 hosts) is left out."""
    payload = decode(data, "keeper's status view", fmt=VIEW_FORMAT,
                     limit=SHARD_BYTES_MAX + 1024, walk=False)
    shard, count = payload.get("shard"), payload.get("of")
    if type(shard) is not int or type(count) is not int or not 0 <= shard < count:
        raise StoreError("the keeper's status view names no shard")
    if "omitted" in payload:
        return shard, count, None
    hosts = payload.get("hosts")
    try:
        if not isinstance(hosts, dict):
            raise TypeError("hosts")
        drivers, confines = _tables(payload.get("tables", {}))
        return shard, count, {str(name): _host(entry, drivers, confines)
                              for name, entry in hosts.items()}
    except (TypeError, ValueError, IndexError, KeyError) as err:
        raise StoreError(f"the keeper's status view has an unreadable {err}") from err
