"""Cluster status: hosts x GPUs, agents' heartbeats, ZooKeeper's health.

``collect`` returns one JSON-ready dict that scripts can rely on::

    {"zookeeper": {...}, "hosts": [{"name": ..., "agent": "up"|"down",
      "gpus": [{"index": 0, "state": "free"|"busy"|"draining"|"unavailable",
                "task_key": null}]}]}

``render`` prints it as a table with rich.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from hypertf.config.inventory import Inventory
from hypertf.core.errors import StoreError
from hypertf.core.hostview import REFRESH_S, HostView, cpu_jobs, decode_shard
from hypertf.core.matrix import Cell, GpuState, job_of, state_of, synced
from hypertf.store import AgentRecord, GpuInfo, Layout, Store, fourletter
from hypertf.store.allocation import read_matrix
from hypertf.store.zkclient import get_many

if TYPE_CHECKING:  # rich is the operator's (hypertf[controller]): `status --json` needs none
    from rich.console import Console

GIB = 1024**3


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
    stored, _ = read_matrix(zk)
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
        return _from_view(zk, inventory, views, len(shards), newest, oldest)
    except (TypeError, ValueError, KeyError, AttributeError):  # a GPU the view got wrong
        return None


def _from_view(zk: Store, inventory: Inventory, views: dict[str, HostView], shards: int,
               newest: float, oldest: float) -> dict[str, Any]:
    leases = zk.leases()
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
    return _report(inventory, zk.layout.root, hosts, leases, trespasses,
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


def _gpu_cell(gpu: dict[str, Any]) -> str:
    foreign = gpu.get("foreign_pids")
    warning = (f" [red]busy-with-foreign-process[/] pid {', '.join(map(str, foreign))}"
               if foreign else "")
    if gpu["state"] == GpuState.FREE:
        return "[green]free[/]" + warning
    if gpu["state"] == GpuState.BUSY:
        return f"[yellow]busy[/] {gpu['task_key']}" + warning
    if gpu["state"] == GpuState.DRAINING:
        return f"[magenta]draining[/] {gpu['task_key']}" + warning
    if foreign:
        return warning.lstrip()
    if gpu.get("reason"):
        return f"[red]unavailable[/] {gpu['reason']}"
    if "utilization" in gpu:
        return (f"[red]unavailable[/] {gpu['utilization']:.0f}% "
                f"{gpu['memory_used'] / GIB:.1f}/{gpu['memory_total'] / GIB:.1f} GiB")
    return "[red]unavailable[/]"


def _driver(host: dict[str, Any]) -> str:
    versions = host.get("gpu_driver") or {}
    return " ".join(f"{k} {v}" for k, v in versions.items()) or (host.get("gpu_source") or "")


COMPACT_FROM_HOSTS = 64  # beyond this a table cell per GPU is unreadable (and slow)


def _compact_gpus(host: dict[str, Any]) -> str:
    """A host's GPUs grouped by state: 'free 0,2; busy KEY 1,3; unavailable (why) 4'."""
    if host["agent"] == AgentState.UP and not host["gpus"]:
        return "no GPU: CPU tasks only"
    if all(gpu["state"] == GpuState.FREE and not gpu.get("foreign_pids") and not gpu.get("reason")
           for gpu in host["gpus"]):
        return "free " + ",".join(str(gpu["index"]) for gpu in host["gpus"])  # most hosts
    groups: dict[str, list[str]] = {}
    for gpu in host["gpus"]:
        label = str(gpu["state"])
        if gpu.get("task_key"):
            label += f" {gpu['task_key']}"
        elif gpu.get("reason"):
            label += f" ({gpu['reason']})"
        if gpu.get("foreign_pids"):
            label += f" busy-with-foreign-process pid {','.join(map(str, gpu['foreign_pids']))}"
        groups.setdefault(label, []).append(str(gpu["index"]))
    return "; ".join(f"{label} {','.join(indices)}" for label, indices in groups.items())


def render_compact(status: dict[str, Any], console: Console) -> None:
    """Plain aligned lines, one per host, GPUs grouped by state: for large clusters, where
    a rich table would take seconds to lay out (1000 hosts x 8 GPUs)."""
    hosts = status["hosts"]
    free = sum(g["state"] == GpuState.FREE for h in hosts for g in h["gpus"])
    total = sum(len(h["gpus"]) for h in hosts)
    up = sum(h["agent"] == AgentState.UP for h in hosts)
    name_w = max((len(h["name"]) for h in hosts), default=4)
    addr_w = max((len(h["data_addr"] or h["address"] or "") for h in hosts), default=7)
    drivers: dict[str, int] = {}
    for host in hosts:
        if host["agent"] == AgentState.UP:
            drivers[_driver(host) or "none"] = drivers.get(_driver(host) or "none", 0) + 1
    lines = [f"HyperTF cluster ({status['inventory']}): {len(hosts)} hosts ({up} agents up), "
             f"{free} of {total} GPUs free",
             "GPU driver: " + "; ".join(f"{name} ({count} hosts)"
                                        for name, count in sorted(drivers.items())),
             f"{'host':<{name_w}}  {'agent':<16}  {'data address':<{addr_w}}  GPUs"]
    said: dict[tuple[int, str], str] = {}  # hosts that share a row (collect) share its text
    for host in hosts:
        # the age of the agent's last heartbeat, not how long it has been up
        agent = (f"up, seen {host['heartbeat_age_s']:.0f}s ago"
                 if host["agent"] == AgentState.UP else "down")
        address = host["data_addr"] or host["address"] or ""
        cpu = "; CPU only " + ",".join(host["cpu_jobs"]) if host.get("cpu_jobs") else ""
        gpus = said.get(shared := (id(host["gpus"]), host["agent"]))
        if gpus is None:
            gpus = said[shared] = _compact_gpus(host)
        lines.append(f"{host['name']:<{name_w}}  {agent:<16}  {address:<{addr_w}}  {gpus}{cpu}")
    console.file.write("\n".join(lines) + "\n")  # plain text: rich's wrapping of 10,000
    console.file.flush()  # lines took longer than building them


def _confinement(hosts: list[dict[str, Any]]) -> str:
    """One line: how many hosts enforce what (hypertf.node.confine), the agents up only."""
    counts: dict[str, int] = {}
    for host in hosts:
        if host.get("confine"):
            counts[host["confine"]] = counts.get(host["confine"], 0) + 1
    return "Confinement: " + ("; ".join(f"{label} ({count} hosts)"
                                        for label, count in sorted(counts.items())) or "-")


def render(status: dict[str, Any], console: Console | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    if len(status["hosts"]) > COMPACT_FROM_HOSTS:
        render_compact(status, console)
        _render_footer(status, console)
        return
    most = max((len(h["gpus"]) for h in status["hosts"]), default=0)
    width = max(1, most)
    table = Table(title=f"HyperTF cluster ({status['inventory']})")
    table.add_column("host")
    table.add_column("agent")
    table.add_column("data address")
    table.add_column("GPU driver")
    table.add_column("confined")
    for index in range(width):
        table.add_column(f"GPU {index}" if most else "GPUs")
    cpu_jobs = any(h.get("cpu_jobs") for h in status["hosts"])
    if cpu_jobs:
        table.add_column("CPU only (ps, offload)")
    for host in status["hosts"]:
        agent = (f"[green]up[/], seen {host['heartbeat_age_s']:.0f}s ago"
                 if host["agent"] == AgentState.UP else "[red]down[/]")
        cells = [_gpu_cell(g) for g in host["gpus"]]
        if host["agent"] == AgentState.UP and not host["gpus"]:
            cells = ["no GPU: CPU tasks only"]
        cells += [""] * (width - len(cells))
        if cpu_jobs:
            cells.append(", ".join(f"[yellow]{key}[/]" for key in host.get("cpu_jobs", ())))
        table.add_row(host["name"], agent, host["data_addr"] or host["address"], _driver(host),
                      host.get("confine") or "", *cells)
    console.print(table)
    _render_footer(status, console)


def _render_footer(status: dict[str, Any], console: Console) -> None:
    console.print(_confinement(status["hosts"]), highlight=False)
    if "view" in status:
        view = status["view"]
        console.print(f"Hosts from the keeper's view ({view['shards']} shards, written "
                      f"{view['newest_s']:.0f}-{view['oldest_s']:.0f} s ago; an agent's "
                      f"'seen' may be up to {REFRESH_S:.0f} s older): 'hypertf status "
                      f"--direct' reads every agent record", highlight=False)
    servers = ", ".join(f"{s['server']} {s['mode']} ({s['latency_ms']} ms)"
                        for s in status["zookeeper"]["servers"])
    console.print(f"ZooKeeper: {servers}; root {status['zookeeper']['root']}")
    jobs = status["jobs"]
    line = f"Jobs holding resources: {', '.join(jobs) if jobs else 'none'}"
    if len(jobs) > COMPACT_FROM_HOSTS:  # plain: rich's wrapping of 3,000 keys took 0.2 s
        console.file.write(line + "\n")
        console.file.flush()
    else:
        console.print(line)
    from rich.markup import escape

    for host in status["hosts"]:
        if "unreadable" in host:
            console.print(f"[red]UNREADABLE[/] {host['name']}: "
                          f"{escape(host['unreadable'][:300])}", highlight=False)
    for t in status.get("trespasses", ()):
        console.print(f"[red]TRESPASS[/] {t['host']} GPU {t['gpu']}: pid {t['pid']} "
                      f"({t['user'] or '?'}, job {t['claims'] or 'none'}) on a GPU granted to "
                      f"{t['holder'] or 'no job'}; "
                      + ("stopped" if t["stopped"] else "running (hypertf_gpu_enforce: report)"))
