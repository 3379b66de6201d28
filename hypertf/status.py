"""Cluster status: hosts x GPUs, agents' heartbeats, ZooKeeper's health.

``collect`` returns one JSON-ready dict that scripts can rely on::

    {"zookeeper": {...}, "hosts": [{"name": ..., "agent": "up"|"down",
      "gpus": [{"index": 0, "state": "free"|"busy"|"draining"|"unavailable",
                "task_key": null}]}]}

``render`` prints it as a table with rich.
"""

from __future__ import annotations

import time
from typing import Any

from kazoo.client import KazooClient
from rich.console import Console
from rich.table import Table

from hypertf import zkserver
from hypertf.allocation import read_matrix
from hypertf.inventory import Inventory
from hypertf.matrix import job_of, state_of, synced
from hypertf.store import Layout, Store

GIB = 1024**3


def _zookeeper_health(hosts: str) -> list[dict[str, Any]]:
    servers = []
    for entry in hosts.split("/")[0].split(","):
        address, _, port = entry.strip().rpartition(":")
        started = time.monotonic()
        mode = zkserver.mode(address, int(port))
        servers.append({"server": entry.strip(), "mode": mode or "down",
                        "latency_ms": round(1000 * (time.monotonic() - started), 1)})
    return servers


def collect(client: KazooClient, inventory: Inventory) -> dict[str, Any]:
    """Describe every inventory host: the matrix as the records and leases say it is now.
    A read: it writes nothing (bringing the stored matrix in line is the keeper agent's
    job), so a dead job's GPUs already show as draining here before the keeper has run."""
    layout = Layout(inventory.cluster.zk_root)
    zk = Store(client, layout)
    stored, _ = read_matrix(zk)
    records = zk.records()
    leases = zk.leases()
    matrix = synced(stored, records, leases)
    now = time.time()
    hosts = []
    for name, node in inventory.nodes.items():
        record = records.get(name)
        row = matrix.gpus.get(name, [])
        details = {gpu.index: gpu for gpu in record.gpus} if record else {}
        gpus = []
        for index, cell in enumerate(row):
            gpu = details.get(index)
            key = job_of(cell)
            entry: dict[str, Any] = {"index": index, "state": state_of(cell), "task_key": key}
            if gpu:
                entry.update(name=gpu.name, uuid=gpu.uuid, utilization=gpu.utilization,
                             memory_used=gpu.memory_used, memory_total=gpu.memory_total,
                             reason=gpu.reason, mig=gpu.mig,
                             foreign_pids=[p.pid for p in gpu.foreign_processes(key)])
            gpus.append(entry)
        hosts.append({
            "name": name,
            "address": node.address,
            "agent": "up" if record else "down",
            "heartbeat_age_s": round(now - record.heartbeat, 1) if record else None,
            "data_addr": record.data_addr if record else None,
            "mgmt_addr": record.mgmt_addr if record else None,
            "gpu_source": record.gpu_source if record else None,
            "gpu_driver": record.gpu_driver if record else {},
            "gpus": gpus,
            "ports_reserved": len(matrix.ports.get(name, {})),
        })
    return {
        "inventory": str(inventory.path),
        "zookeeper": {"hosts": inventory.cluster.zookeeper_hosts, "root": layout.root,
                      "servers": _zookeeper_health(inventory.cluster.zookeeper_hosts)},
        "hosts": hosts,
        "jobs": sorted(leases),
    }


def _gpu_cell(gpu: dict[str, Any]) -> str:
    foreign = gpu.get("foreign_pids")
    warning = (f" [red]busy-with-foreign-process[/] pid {', '.join(map(str, foreign))}"
               if foreign else "")
    if gpu["state"] == "free":
        return "[green]free[/]" + warning
    if gpu["state"] == "busy":
        return f"[yellow]busy[/] {gpu['task_key']}" + warning
    if gpu["state"] == "draining":
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


def render(status: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    most = max((len(h["gpus"]) for h in status["hosts"]), default=0)
    width = max(1, most)
    table = Table(title=f"HyperTF cluster ({status['inventory']})")
    table.add_column("host")
    table.add_column("agent")
    table.add_column("data address")
    table.add_column("GPU driver")
    for index in range(width):
        table.add_column(f"GPU {index}" if most else "GPUs")
    for host in status["hosts"]:
        agent = (f"[green]up[/] {host['heartbeat_age_s']:.0f}s ago" if host["agent"] == "up"
                 else "[red]down[/]")
        cells = [_gpu_cell(g) for g in host["gpus"]]
        if host["agent"] == "up" and not host["gpus"]:
            cells = ["no GPU: CPU tasks only"]
        cells += [""] * (width - len(cells))
        table.add_row(host["name"], agent, host["data_addr"] or host["address"], _driver(host),
                      *cells)
    console.print(table)
    servers = ", ".join(f"{s['server']} {s['mode']} ({s['latency_ms']} ms)"
                        for s in status["zookeeper"]["servers"])
    console.print(f"ZooKeeper: {servers}; root {status['zookeeper']['root']}")
    jobs = status["jobs"]
    console.print(f"Jobs holding resources: {', '.join(jobs) if jobs else 'none'}")
