"""``hypertf status`` as the terminal shows it: a rich table of hosts x GPUs, or past
``COMPACT_FROM_HOSTS`` hosts one plain line per host, then the footer (confinement, the
keeper's view, ZooKeeper, the jobs holding resources, unreadable records, trespasses).

It renders the report hypertf.store.status assembles and reads nothing itself. rich is the
operator's (hypertf[controller]), imported only to render: ``status --json`` needs none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hypertf.core.hostview import REFRESH_S
from hypertf.core.matrix import GpuState
from hypertf.store.status import AgentState

if TYPE_CHECKING:
    from rich.console import Console

GIB = 1024**3


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
