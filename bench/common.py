"""What every benchmark shares: its private state dir, a lab or a ZooKeeper of its own,
processes it started (stopped by PID, even on failure), statistics, and the report.

Each benchmark prints its figures, side-by-side ratios, the machine and its load, and the
exact command that reproduces the run. ``--json PATH`` also writes them as JSON (``invoke
bench`` collects those; ``bench/report.py`` turns them into the tables of docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hypertf import store  # noqa: E402
from hypertf.config.inventory import Inventory  # noqa: E402
from hypertf.core import gctune  # noqa: E402
from hypertf.node import procs  # noqa: E402
from hypertf.ops import lab as lab_module  # noqa: E402
from hypertf.ops.zkserver import ZooKeeperServer, free_port  # noqa: E402
from hypertf.store.fourletter import four_letter  # noqa: E402

PYTHON = sys.executable
FAKE_TF = str(REPO / "tests" / "scripts" / "fake_tf.py")
EXAMPLES = REPO / "examples"


# -- arguments, signals, the private state dir ------------------------------------------------
def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true",
                   help="small sizes: a smoke run of seconds (at most ~30 s; the test suite "
                   "runs every bench this way)")
    p.add_argument("--json", metavar="PATH", help="also write the figures here as JSON")
    return p


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # run every finally block on SIGTERM/SIGHUP too


@contextlib.contextmanager
def bench_home(name: str) -> Iterator[Path]:
    """A private 0700 state dir (HYPERTF_HOME) of its own under ~/.hypertf/, as the tests'.

    Not under the repository: a clone may lie under /tmp, and sshd's StrictModes refuses
    keys below a world-writable directory (the lab's hosts log in with keys kept here). Not
    ~/.hypertf itself either, whose labs someone's ``invoke lab.down`` would remove.
    """
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    gctune.tune()  # what a bench runs in its own process, HyperTF's processes run so
    home = Path.home() / ".hypertf" / f"bench-{name}-{secrets.token_hex(3)}"
    home.mkdir(parents=True, mode=0o700)
    os.environ["HYPERTF_HOME"] = str(home)
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def lab(home: Path, hosts: int, gpus: int, per_user: bool = False,
        ) -> Iterator[lab_module.Lab]:
    """A lab of our own (hosts, sshd, agents, ZooKeeper); always removed. ``per_user``:
    every user's tasks as their own account (hypertf.ops.labaccounts)."""
    started = time.monotonic()
    built = lab_module.up(hosts=hosts, gpus=gpus, base=home / "labs", per_user=per_user)
    try:
        accounts = " (per-user accounts)" if per_user else ""
        print(f"# lab {built.lab_id}: {hosts} hosts x {gpus} GPUs{accounts} up in "
              f"{time.monotonic() - started:.1f} s", flush=True)
        yield built
    finally:
        lab_module.down(built)


@contextlib.contextmanager
def zookeeper(home: Path, tick_ms: int = 500, heap: str = "256m") -> Iterator[ZooKeeperServer]:
    """A standalone ZooKeeper of our own on loopback; always stopped."""
    server = ZooKeeperServer("127.0.0.1", free_port(), home / "zookeeper")
    server.start(heap=heap, tick_ms=tick_ms)
    try:
        yield server
    finally:
        server.stop()


def zk_stat(server: ZooKeeperServer) -> dict[str, str]:
    """``mntr`` as a dict, plus the server's last zxid from ``srvr``."""
    values = {}
    for line in four_letter(server.address, server.port, "mntr").splitlines():
        key, _, value = line.partition("\t")
        values[key] = value.strip()
    for line in four_letter(server.address, server.port, "srvr").splitlines():
        if line.startswith("Zxid:"):
            values["zxid"] = str(int(line.split(":", 1)[1].strip(), 16))
    return values


def process_cpu(pid: int | None = None) -> float:
    """CPU seconds (user + system) a process has used: this one, or ``pid`` (from /proc:
    ZooKeeper's JVM); 0.0 when it is gone."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- processes we start -----------------------------------------------------------------------
class Children:
    """Every process this benchmark starts; ``stop_all`` ends the ones still running."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[Any]] = []

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(list(argv), **kwargs)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                # SIGINT first: a launcher then stops its job and releases its GPUs.
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    procs.stop(proc.pid, grace_s=2)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=5)


@contextlib.contextmanager
def children() -> Iterator[Children]:
    kids = Children()
    try:
        yield kids
    finally:
        kids.stop_all()


# -- polling ----------------------------------------------------------------------------------
def listening(address: str, port: int, timeout: float = 0.2) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout):
        return True
    return False


def wait_until(predicate: Callable[[], object], timeout: float, what: str,
               interval: float = 0.01) -> float:
    """Poll until true; returns time.monotonic() at the first true answer."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def wait_listening(endpoints: Sequence[tuple[str, int]], timeout: float, what: str) -> float:
    """Time (monotonic) at which every endpoint has accepted a connection once.

    Each endpoint is polled only until its first success: a stand-in task that never
    accept()s would otherwise fill its backlog (see processes_with_env for the other way).
    """
    pending = set(endpoints)

    def check() -> bool:
        for endpoint in list(pending):
            if listening(*endpoint, timeout=0.1):
                pending.discard(endpoint)
        return not pending

    return wait_until(check, timeout, what, interval=0.005)


def processes_with_env(variable: str, value: str) -> dict[int, dict[str, str]]:
    """Live processes (not zombies) whose environment has ``variable=value``: pid -> env.

    The lab's hosts are namespaces of this machine's kernel, so /proc here sees their
    processes. This is how the benchmarks see a task die: polling its port with connect()
    is no use for that, as a stand-in task that never accept()s fills its backlog and then
    looks closed while it still runs.
    """
    needle = f"{variable}={value}".encode()
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                raw = handle.read()
            if needle not in raw:
                continue
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state == b"Z":
            continue
        env = dict(item.decode(errors="replace").partition("=")[::2]
                   for item in raw.split(b"\0") if item)
        if env.get(variable) == value:
            found[int(entry.name)] = env
    return found


def job_tasks(task_key: str) -> dict[str, int]:
    """Per task name ('worker:0'), how many live processes a hypertf job has on the lab."""
    tasks: dict[str, int] = {}
    for env in processes_with_env("HYPERTF_TASK_KEY", task_key).values():
        name = env.get("HYPERTF_TASK", "?")
        tasks[name] = tasks.get(name, 0) + 1
    return tasks


STARTED = re.compile(r"hypertf: job (\S+): started \d+ tasks?: (.*)$")
ENDPOINT = re.compile(r"(\w+:\d+)@(\S+?):(\d+)")


def parse_started(line: str) -> tuple[str, dict[str, tuple[str, int]]] | None:
    """'hypertf: job KEY: started 3 tasks: worker:0@h1:20000 GPU 0, ...' -> key, tasks."""
    match = STARTED.search(line)
    if not match:
        return None
    tasks = {m.group(1): (m.group(2), int(m.group(3))) for m in ENDPOINT.finditer(match.group(2))}
    return match.group(1), tasks


@functools.cache
def inventory_of(path: str) -> Inventory:
    """The bench's own reading of an inventory, once per path. The bench runs this
    checkout's code even when it measures an earlier one (``PYTHONPATH``), and the
    inventory cache's key names the parser's files: a read here after each run replaced
    the earlier code's entry, and every one of its commands parsed the inventory again
    (~0.15 s, on the 'before' side only). Benches that compare code read it here, once,
    before the runs."""
    from hypertf.config.inventory import load_inventory

    return load_inventory(path)


def remote_processes(inventory: str, needle: str) -> dict[str, list[str]]:
    """Per lab host, live processes whose command line contains ``needle``."""
    from hypertf.launch.remote import Cluster

    inv = inventory_of(str(inventory))
    with Cluster(inv.nodes.values(), inv.cluster) as cluster:
        results = cluster.each(lambda s: s.run("ps -eo pid,stat,args", timeout=20))
    found = {}
    for host, result in results.items():
        if isinstance(result, BaseException):
            found[host] = [f"unreachable: {result}"]
            continue
        lines = [line for line in result.stdout.splitlines()
                 if needle in line and " Z" not in line and "ps -eo" not in line]
        if lines:
            found[host] = lines
    return found


def job_cells(client: Any, root: str, task_key: str, draining_only: bool = False) -> int:
    """GPU cells plus ports the matrix still gives to ``task_key``, held or draining (only
    draining with ``draining_only``): a draining cell is not free either."""
    from hypertf.core.matrix import draining, job_of
    from hypertf.store import Layout, Store

    matrix, _ = (Store(client, Layout(root))).matrix.read()  # every shard
    owner = draining if draining_only else job_of
    cells = sum(owner(cell) == task_key for row in matrix.gpus.values() for cell in row)
    ports = sum(owner(key) == task_key for row in matrix.ports.values()
                for key in row.values())
    return cells + ports


# -- statistics -------------------------------------------------------------------------------
def register_hosts(admin: Any, root: str, hosts: Sequence[str]) -> None:
    """Stand-in hosts' folders, as 'hypertf auth init' makes them for real hosts (with the
    admin's ACL here: the admin's sessions stand in for their agents). Pipelined."""
    from kazoo.exceptions import NodeExistsError

    layout = store.Layout(root)
    acl = store.acls(admin).of("hosts")  # the admin's alone, as the hosts folder
    pending = [admin.create_async(layout.host(host), b"", acl=acl) for host in hosts]
    for result in pending:
        with contextlib.suppress(NodeExistsError):
            result.get(timeout=60)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0-100): p99 of 300 samples is the 297th."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


# -- the report -------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
    return {"nproc": os.cpu_count(), "memory_gib": round(mem_kib / 1024**2, 1),
            "cpu": model, "loadavg": os.getloadavg(), "python": sys.version.split()[0]}


@dataclass
class Report:
    """Figures in order, printed as they come and once more at the end, with the command."""

    name: str
    args: argparse.Namespace
    started: float = field(default_factory=time.time)
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine)
    load: list[float] = field(default_factory=list)

    def _sample_load(self) -> None:
        while True:
            self.load.append(os.getloadavg()[0])
            time.sleep(2.0)

    @property
    def command(self) -> str:
        argv = [a for a in sys.argv[1:]]
        if "--json" in argv:  # where the JSON goes is not part of the figures
            i = argv.index("--json")
            del argv[i:i + 2]
        rel = Path(sys.argv[0]).resolve().relative_to(REPO)
        return f"cd {REPO} && .venv/bin/python {shlex.join([str(rel), *argv])}"

    def add(self, figure: str, value: float | int | str, unit: str = "",
            goal: tuple[str, float] | None = None, judged: float | None = None,
            goal_where: str = "", **extra: Any) -> None:
        """One figure; ``goal`` (``("<=", 1.0)``: the value must be at most 1.0, in
        ``unit``) is printed beside it with whether it is met. A missed goal is a figure
        like any other: the bench still exits 0 (issue 43 item 4). A value shown as text
        (``"12 / 340 / 980"``, one per size) is judged by ``judged``, the one of those the
        goal is about, which ``goal_where`` names (``"at 25,000 hosts"``)."""
        row = {"figure": figure, "value": value, "unit": unit, **extra}
        if goal is not None:
            row["goal"] = f"{goal[0]} {fmt(goal[1])} {unit} {goal_where}".strip()
            row["met"] = meets(value if judged is None else judged, goal)
        self.rows.append(row)
        print(f"  {figure}: {fmt(value)} {unit}{goal_text(row)}".rstrip(), flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}", flush=True)

    def start(self) -> None:
        m = self.machine
        print(f"== bench/{self.name}.py{' --quick' if self.args.quick else ''}: "
              f"{m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB, "
              f"load average at start {' '.join(f'{x:.2f}' for x in m['loadavg'])}", flush=True)
        threading.Thread(target=self._sample_load, daemon=True).start()

    def finish(self) -> None:
        elapsed = time.time() - self.started
        print(f"\n== {self.name}: figures ({elapsed:.0f} s)")
        width = max((len(r["figure"]) for r in self.rows), default=10)
        for row in self.rows:
            print(f"  {row['figure']:<{width}}  {fmt(row['value'])} {row['unit']}"
                  f"{goal_text(row)}".rstrip())
        goals = [row for row in self.rows if "goal" in row]
        if goals:
            missed = [row["figure"] for row in goals if not row["met"]]
            print(f"  goals: {len(goals) - len(missed)} of {len(goals)} met"
                  + (f"; missed: {'; '.join(missed)}" if missed else ""))
        for text in self.notes:
            print(f"  note: {text}")
        load = self.load or [os.getloadavg()[0]]
        during = {"mean": round(sum(load) / len(load), 2), "max": round(max(load), 2)}
        print(f"  1-min load average during the run: mean {during['mean']:.2f}, "
              f"max {during['max']:.2f} ({self.machine['nproc']} CPUs)")
        print(f"  reproduce: {self.command}", flush=True)
        if self.args.json:
            path = Path(self.args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({
                "name": self.name, "quick": self.args.quick, "command": self.command,
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.started)),
                "elapsed_s": round(elapsed, 1), "machine": self.machine,
                "load_at_end": os.getloadavg(), "load_during": during,
                "rows": self.rows, "notes": self.notes,
            }, indent=2))


def meets(value: float | int | str, goal: tuple[str, float]) -> bool:
    """Whether ``value`` meets ``goal`` (``("<=", x)`` or ``(">=", x)``); a value that is
    no number (n/a) does not."""
    if not isinstance(value, (int, float)) or value != value:
        return False
    return value <= goal[1] if goal[0] == "<=" else value >= goal[1]


def goal_text(row: dict[str, Any]) -> str:
    if "goal" not in row:
        return ""
    return f"   [goal {row['goal']}: {'met' if row['met'] else 'MISSED'}]"


def fmt(value: float | int | str) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "n/a"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        if abs(value) >= 0.1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
