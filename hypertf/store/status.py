"""Cluster status: hosts x GPUs, agents' heartbeats, ZooKeeper's health.

``collect`` returns one JSON-ready dict that scripts can rely on::

    {"zookeeper": {...}, "hosts": [{"name": ..., "agent": "up"|"down",
      "gpus": [{"index": 0, "state": "free"|"busy"|"draining"|"unavailable",
                "task_key": null}]}]}

The store only reads and assembles: the terminal's table and lines are
hypertf.cli.statustable's (``status --json`` on a node needs no rich).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from enum import StrEnum
from typing import Any, Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from hypertf.config.inventory import Inventory
from hypertf.core.errors import StoreError
from hypertf.core.hostview import HostView, cpu_jobs, decode_shard
from hypertf.core.matrix import Cell, GpuState, job_of, state_of, synced
from hypertf.store import AgentRecord, GpuInfo, Layout, Store, fourletter
from hypertf.store.zkclient import get_many


class AgentState(StrEnum):
    """A host's ``agent`` in the status: whether its agent's record exists now."""

    UP = "up"
    DOWN = "down"


# A GPU's fields as status shows them; the record's JSON leaves out empty reason and mig.
GPU_DEFAULTS: dict[str, Any] = {"name": None, "uuid": None, "utilization": None,
                                "memory_used": None, "memory_total": None, "available": None,
                                "reason": "", "mig": False}


def _zookeeper_health(hosts: str) -> list[dict[str, Any]]:
    servers = []
    for entry in hosts.split("/")[0].split(","):
        address, _, port = entry.strip().rpartition(":")
        started = time.monotonic()
        mode = fourletter.mode(address, int(port))
        servers.append({"server": entry.strip(), "mode": mode or "down",
                        "latency_ms": round(1000 * (time.monotonic() - started), 1)})
    return servers


def collect(client: KazooClient, inventory: Inventory,
            gpu_details: bool = True) -> dict[str, Any]:
    """Describe every inventory host: the matrix as the records and leases say it is now.
    A read: it writes nothing (bringing the stored matrix in line is the keeper agent's
    job), so a dead job's GPUs already show as draining here before the keeper has run.

    Without ``gpu_details`` (the compact view of a large cluster, never the JSON), equal
    plain GPUs and rows are shared entries (``_GpuEntries``)."""
    layout = Layout(inventory.cluster.zk_root)
    zk = Store(client, layout)
    stored, _ = zk.matrix.read()
    records: dict[str, AgentRecord] = {}
    details: dict[str, dict[Any, dict[str, Any]]] = {}  # the GPUs as the records' JSON says
    written: dict[str, float] = {}
    unreadable: dict[str, str] = {}
    for host, (data, at) in zk.raw_records_written(zk.hosts()).items():
        try:
            records[host], gpu_list = AgentRecord.without_gpus(data)
        except StoreError as err:  # hostile or damaged: that host is down, the rest shown
            unreadable[host] = str(err)
            continue
        details[host] = {gpu.get("index"): gpu for gpu in gpu_list if _plain_gpu(gpu)}
        written[host] = at
    trespasses = [{"host": host, **asdict(t)} for host, record in sorted(records.items())
                  for t in record.trespasses]
    leases = zk.leases()
    matrix = synced(stored, records, leases)
    now = time.time()
    entries = _GpuEntries(gpu_details)
    hosts = []
    for name, node in inventory.nodes.items():
        record = records.get(name)
        row, ports = matrix.gpus.get(name, []), matrix.ports.get(name, {})
        hosts.append(_host_row(name, node.address, record, written.get(name, now), now,
                               entries.row(row, details.get(name, {})), len(ports),
                               cpu_jobs(row, ports), unreadable.get(name, "")))
    return _report(inventory, layout.root, hosts, leases, trespasses)


class _Shown(Protocol):
    """What a host's row shows of its agent: its record's fields, or the keeper's view's."""

    @property
    def data_addr(self) -> str | None: ...
    @property
    def mgmt_addr(self) -> str | None: ...
    @property
    def gpu_source(self) -> str | None: ...
    @property
    def gpu_driver(self) -> dict[str, str]: ...
    @property
    def confine(self) -> str | None: ...


def _host_row(name: str, address: str, shown: _Shown | None, written: float, now: float,
              gpus: list[dict[str, Any]], ports: int, cpu: list[str],
              unreadable: str) -> dict[str, Any]:
    """One host of the report (``shown`` None: its agent is down)."""
    return {
        "name": name, "address": address,
        "agent": AgentState.UP if shown else AgentState.DOWN,
        # by ZooKeeper's clock (when the record was written), not the agent's
        "heartbeat_age_s": round(max(0.0, now - written), 1) if shown else None,
        "data_addr": shown.data_addr if shown else None,
        "mgmt_addr": shown.mgmt_addr if shown else None,
        "gpu_source": shown.gpu_source if shown else None,
        "gpu_driver": shown.gpu_driver if shown else {},
        # what the node enforces (hypertf.node.confine); '' from an older agent
        "confine": (shown.confine or "unknown (an older agent)") if shown else None,
        "gpus": gpus, "ports_reserved": ports,
        **({"unreadable": unreadable} if unreadable else {}),
        # jobs here without a GPU of this host: parameter servers, offload hosts
        "cpu_jobs": cpu,
    }


def _report(inventory: Inventory, root: str, hosts: list[dict[str, Any]], leases: set[str],
            trespasses: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {
        "inventory": str(inventory.path),
        "zookeeper": {"hosts": inventory.cluster.zookeeper_hosts, "root": root,
                      "servers": _zookeeper_health(inventory.cluster.zookeeper_hosts)},
        "hosts": hosts,
        "jobs": sorted(leases),
        # processes on GPUs their job was not granted, as each host's agent reports them
        "trespasses": trespasses,
        **more,
    }


def collect_view(client: KazooClient, inventory: Inventory) -> dict[str, Any] | None:
    """``collect(gpu_details=False)`` from what the keeper publishes (hypertf.core.hostview):
    a few hundred small reads instead of every record, the matrix and a sync. None when the
    view is not whole (no keeper now, an older one, a shard it omitted or cannot be read):
    then the caller collects directly."""
    layout = Layout(inventory.cluster.zk_root)
    zk = Store(client, layout)
    try:
        names = client.get_children(layout.keeper)
    except NoNodeError:
        return None
    prefix = layout.status_view(0).rpartition("/")[2][:-1]
    shards = sorted(int(n[len(prefix):]) for n in names
                    if n.startswith(prefix) and n[len(prefix):].isdigit())
    if not shards or shards != list(range(len(shards))):
        return None
    views: dict[str, HostView] = {}
    newest = oldest = 0.0
    for result in get_many(client, [layout.status_view(i) for i in shards]):
        if isinstance(result, Exception):
            return None
        try:
            _, count, hosts = decode_shard(result[0])
        except StoreError:
            return None
        if hosts is None or count != len(shards):
            return None
        views.update(hosts)
        at = result[1].mtime / 1000
        newest, oldest = max(newest, at), min(oldest or at, at)
    try:
        return _from_view(zk.leases(), zk.layout.root, inventory, views, len(shards),
                          newest, oldest)
    except (TypeError, ValueError, KeyError, AttributeError):  # a GPU the view got wrong
        return None


def _from_view(leases: set[str], root: str, inventory: Inventory, views: dict[str, HostView],
               shards: int, newest: float, oldest: float) -> dict[str, Any]:
    now = time.time()
    entries = _GpuEntries(False)
    hosts = []
    for name, node in inventory.nodes.items():
        view = views.get(name) or HostView(up=False)
        hosts.append(_host_row(name, node.address, view if view.up else None,
                               view.written or now, now, entries.row(view.row, view.gpus),
                               view.ports, view.cpu_jobs, view.unreadable))
    trespasses = [{"host": name, **t} for name, view in sorted(views.items())
                  for t in view.trespasses]
    # where the hosts came from: the keeper's view, its shards written so long ago
    return _report(inventory, root, hosts, leases, trespasses,
                   view={"shards": shards, "newest_s": round(max(0.0, now - newest), 1),
                         "oldest_s": round(max(0.0, now - oldest), 1)})


_NUMBER = (int, float)


def _plain_gpu(gpu: dict[str, Any]) -> bool:
    """Whether a record's GPU entry has the types status shows (an integer index, a
    number's fields numbers): a hostile record's others are left out, not printed.
    Unrolled: at 25,000 hosts x 8 GPUs it runs 200,000 times a ``status``."""
    get = gpu.get
    return (type(get("index")) is int and type(get("utilization", 0)) in _NUMBER
            and type(get("memory_used", 0)) in _NUMBER
            and type(get("memory_total", 0)) in _NUMBER and type(get("name", "")) is str
            and type(get("uuid", "")) is str and type(get("reason", "")) is str)


class _GpuEntries:
    """A host's GPUs as status lists them: the matrix's cell with the record's details.
    Without ``gpu_details`` (the compact view of a large cluster, never the JSON), a GPU
    with no reason and no process is one shared entry of its index, state and job, and a
    row of such GPUs seen before is the same list again: at 10,000 hosts, building 80,000
    entries one by one was a third of the command's time."""

    def __init__(self, gpu_details: bool) -> None:
        self.gpu_details = gpu_details
        self.cells: dict[Cell, tuple[GpuState, str | None]] = {}  # a few distinct values
        self.plain: dict[tuple[int, Cell], dict[str, Any]] = {}
        self.plain_rows: dict[tuple[Cell, ...], list[dict[str, Any]]] = {}

    def row(self, row: list[Cell], shown: dict[Any, dict[str, Any]]) -> list[dict[str, Any]]:
        """The entries of one host's ``row``; ``shown``: its record's GPUs by index."""
        if not self.gpu_details and not any(map(_says_something, shown.values())):
            shared = self.plain_rows.get(cells := tuple(row))
            if shared is None:
                shared = self.plain_rows[cells] = [self._plain(index, cell)
                                                   for index, cell in enumerate(row)]
            return shared
        gpus = []
        for index, cell in enumerate(row):
            gpu = shown.get(index)
            if gpu is None or not (self.gpu_details or _says_something(gpu)):
                gpus.append(self._plain(index, cell))
                continue
            state, key = self._state(cell)
            entry = {"index": index, "state": state, "task_key": key, **GPU_DEFAULTS, **gpu}
            del entry["available"]  # the matrix's state says it
            entry["foreign_pids"] = [p.pid for p in GpuInfo.from_dict(
                dict(gpu)).foreign_processes(key)] if entry.pop("processes", None) else []
            gpus.append(entry)
        return gpus

    def _state(self, cell: Cell) -> tuple[GpuState, str | None]:
        seen = self.cells.get(cell)
        if seen is None:
            seen = self.cells[cell] = (state_of(cell), job_of(cell))
        return seen

    def _plain(self, index: int, cell: Cell) -> dict[str, Any]:
        """``{"index", "state", "task_key"}``: shared by equal GPUs unless ``gpu_details``."""
        entry = None if self.gpu_details else self.plain.get((index, cell))
        if entry is None:
            state, key = self._state(cell)
            entry = {"index": index, "state": state, "task_key": key}
            if not self.gpu_details:
                self.plain[index, cell] = entry
        return entry


def _says_something(gpu: dict[str, Any]) -> bool:
    """A GPU the compact view shows with its own entry: a reason or a process on it."""
    return bool(gpu.get("reason") or gpu.get("processes"))
