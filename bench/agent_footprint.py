"""Agent footprint: a real ``hypertf agent``'s memory, CPU per probe interval and ZooKeeper traffic.

Three processes run side by side for the same window, each against a ZooKeeper server of
its own (so the server's counters belong to one client):

* ``hypertf agent`` with ``hypertf_agent_interval: 1`` (the lab's setting), 8 static GPUs;
* ``hypertf agent`` with the default interval, 5 s;
* the same 5 s agent while a job starts or ends every second (a lease znode appears or
  goes): every agent watches ``leases/`` and ``hosts/``;
* a bare kazoo client (no HyperTF imported) that ``set``s a record of the same size every
  1 s: the floor any ZooKeeper heartbeat costs in Python.

Each agent is alone on its cluster, so it is also the matrix keeper (it syncs the matrix on
every heartbeat): the busiest an agent gets. Measured after a warm-up: RSS (sampled every
second, from /proc), CPU seconds (utime+stime) per probe interval (the window divided by
the agent's interval: an agent probes every interval but writes its record only when it
changed, or for the keep-alive, so its record writes no longer count its work), record
writes (versions of its record znode), ZooKeeper writes (the server's zxid advances once
per write transaction) and requests received (``mntr`` zk_packets_received, pings
included) per minute. The bare client's interval is its 1 s ``set``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import common
import yaml

CLK_TCK = os.sysconf("SC_CLK_TCK")
SCHEDSTAT = Path("/proc/self/schedstat").exists()


def bare(zk_hosts: str, path: str, size: int, interval: float) -> int:
    """The baseline: one ephemeral znode, ``set`` every ``interval`` until killed."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zk_hosts, timeout=4.0)
    client.start(timeout=30)
    client.ensure_path(path.rsplit("/", 1)[0])
    client.create(path, b"x" * size, ephemeral=True)
    while True:
        time.sleep(interval)
        client.set(path, json.dumps({"heartbeat": time.time()}).encode().ljust(size))


def inventory(home: Path, zk_hosts: str, interval: float, name: str) -> str:
    data = {"all": {"vars": {
        "hypertf_zookeeper_hosts": zk_hosts, "hypertf_zk_root": "/hypertf",
        "hypertf_zk_session_timeout": 4, "hypertf_venv": sys.prefix,
        "hypertf_workdir": str(home / f"work-{name}"), "hypertf_gpu_source": "static",
        "hypertf_static_gpus": 8, "hypertf_agent_interval": interval},
                    "children": {"gpu_nodes": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_host": "127.0.0.1"}}}}}}
    path = home / f"inventory-{name}.yml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def cpu_s(pid: int) -> float:
    """CPU time of every thread, in nanoseconds from the scheduler (/proc/PID/task/*/
    schedstat) where the kernel keeps them: the 10 ms ticks of /proc/PID/stat count a
    bare client's minute in 4-6 ticks, too coarse for a ratio. Only threads alive at both
    readings count; the processes here keep theirs."""
    if not SCHEDSTAT:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except OSError:  # a thread that ended just now
            continue
    return total / 1e9


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def counters(server, client, path: str) -> dict[str, int]:
    """The server's counters and the versions of the record and the matrix.

    ``client`` is a session opened before the window: a session's creation and closing are
    write transactions too, and must not be counted as the subject's."""
    stats = common.zk_stat(server)
    stat = client.exists(path)
    shards = client.get_children("/hypertf/matrix") if client.exists("/hypertf/matrix") else []
    versions = [client.exists(f"/hypertf/matrix/{shard}") for shard in shards]
    return {"zxid": int(stats["zxid"]), "packets": int(stats["zk_packets_received"]),
            "record_version": stat.version if stat else -1,
            "matrix_version": sum(v.version for v in versions if v)}  # writes to any shard


def main() -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--bare", nargs=4, metavar=("ZK", "PATH", "SIZE", "INTERVAL"),
                   help=argparse.SUPPRESS)
    p.add_argument("--window", type=float, help="seconds measured (default 60, --quick 5)")
    p.add_argument("--before-code", metavar="DIR",
                   help="also run a 1 s agent of the hypertf package in DIR (a checkout of an "
                   "earlier commit), side by side in the same window")
    args = p.parse_args()
    if args.bare:
        zk_hosts, path, size, interval = args.bare
        return bare(zk_hosts, path, int(size), float(interval))
    window = args.window or (5.0 if args.quick else 60.0)
    report = common.Report("agent_footprint", args)
    report.start()
    churn = "agent 5 s, a job starting or ending every 1 s"
    subjects = {"agent 1 s": 1.0, "agent 5 s": 5.0, churn: 5.0, "bare kazoo 1 s": 1.0}
    earlier = "agent 1 s, earlier code"
    if args.before_code:
        subjects[earlier] = 1.0
    with common.bench_home("footprint") as home, common.children() as kids:
        servers = {}
        try:
            for name in subjects:
                servers[name] = common.ZooKeeperServer(
                    "127.0.0.1", common.free_port(), home / f"zk-{name.replace(' ', '-')}")
                servers[name].start(heap="128m", tick_ms=500)
            from kazoo.client import KazooClient

            from hypertf import store
            from hypertf.config.inventory import load_inventory
            from hypertf.store import AgentRecord, credentials

            record_path = store.Layout("/hypertf").resource("localhost")
            pids = {}
            clusters = {}
            for name, interval in subjects.items():
                if name.startswith("agent"):
                    inv = inventory(home, servers[name].hosts, interval,
                                    str(list(subjects).index(name)))
                    clusters[name] = load_inventory(inv).cluster
                    store.secure_cluster(clusters[name], ["localhost"])  # a secured root
                    env = dict(os.environ)
                    if name == earlier:  # the earlier checkout's package comes first
                        env["PYTHONPATH"] = str(Path(args.before_code).resolve())
                    pids[name] = kids.popen(
                        [common.PYTHON, "-m", "hypertf.cli", "agent", "--inventory", inv,
                         "--host", "localhost"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL, cwd=home, env=env).pid
            # the agents' stores are secured: observe them as the admin
            observers = {n: store.connect(clusters[n], timeout=30, identity="admin")
                         if n in clusters else KazooClient(hosts=servers[n].hosts, timeout=10)
                         for n in subjects}
            for client in observers.values():
                if not client.connected:
                    client.start(timeout=30)
            # the baseline writes a record as large as the agent's first one
            first = observers["agent 1 s"]
            common.wait_until(lambda: first.exists(record_path), 60, "the agent's record", 0.1)
            size = len(first.get(record_path)[0])
            AgentRecord.from_json(first.get(record_path)[0])
            zk = servers["bare kazoo 1 s"]
            pids["bare kazoo 1 s"] = kids.popen(
                [common.PYTHON, __file__, "--bare", zk.hosts, record_path, str(size), "1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid
            time.sleep(3.0 if args.quick else 6.0)  # warm-up: imports, first heartbeats
            before = {n: counters(servers[n], observers[n], record_path) for n in subjects}
            cpu0 = {n: cpu_s(pids[n]) for n in subjects}
            started = time.monotonic()
            rss: dict[str, list[float]] = {n: [] for n in subjects}
            user = credentials.login_user()
            lease = f"/hypertf/leases/{user}/20260101-000000-bench0.{user}"
            lease_acl = store.acls(observers[churn]).lease()
            ticks = 0
            while time.monotonic() - started < window:
                for n in subjects:
                    rss[n].append(rss_mib(pids[n]))
                # a job's lease appears, then goes: what every job start and end does
                if ticks % 2 == 0:
                    observers[churn].create(lease, b"{}", acl=lease_acl, ephemeral=True)
                else:
                    observers[churn].delete(lease)
                ticks += 1
                time.sleep(1.0)
            elapsed = time.monotonic() - started
            cpu1 = {n: cpu_s(pids[n]) for n in subjects}
            after = {n: counters(servers[n], observers[n], record_path) for n in subjects}
            for client in observers.values():
                client.stop()
                client.close()
        finally:
            kids.stop_all()
            for server in servers.values():
                server.stop()
    per_min = 60.0 / elapsed
    figures = {}
    for n in subjects:
        beats = after[n]["record_version"] - before[n]["record_version"]
        intervals = elapsed / subjects[n]  # probe intervals in the window
        cpu = cpu1[n] - cpu0[n]
        figures[n] = {
            "beats": beats, "intervals": intervals, "rss": max(rss[n]),
            "cpu_per_interval_ms": 1000 * cpu / intervals, "cpu_pct": 100 * cpu / elapsed,
            "writes_min": (after[n]["zxid"] - before[n]["zxid"]) * per_min,
            "record_writes_min": beats * per_min,
            "matrix_writes_min": (after[n]["matrix_version"] - before[n]["matrix_version"])
            * per_min,
            "requests_per_interval": (after[n]["packets"] - before[n]["packets"]) / intervals,
            "requests_min": (after[n]["packets"] - before[n]["packets"]) * per_min,
        }
    print()
    report.add("record size (the agent's, copied by the baseline)", size, "bytes")
    for n, f in figures.items():
        report.add(f"{n}: record writes in {elapsed:.0f} s ({f['intervals']:.0f} probe "
                   f"intervals)", f["beats"])
        report.add(f"{n}: RSS (max)", f["rss"], "MiB")
        report.add(f"{n}: CPU per probe interval", f["cpu_per_interval_ms"], "ms")
        report.add(f"{n}: CPU share of one core", f["cpu_pct"], "%")
        report.add(f"{n}: ZooKeeper writes per minute (zxid)", f["writes_min"], "/min")
        report.add(f"{n}:   of which record sets / matrix writes",
                   f"{f['record_writes_min']:.0f} / {f['matrix_writes_min']:.0f}", "/min")
        report.add(f"{n}: ZooKeeper requests per probe interval (pings included)",
                   f["requests_per_interval"], "")
        report.add(f"{n}: ZooKeeper requests per minute", f["requests_min"], "/min")
    a1, a5, b = figures["agent 1 s"], figures["agent 5 s"], figures["bare kazoo 1 s"]
    c5 = figures[churn]
    report.add("ratio agent/bare kazoo (1 s): RSS", common.ratio(a1["rss"], b["rss"]), "x")
    report.add("ratio agent/bare kazoo (1 s): CPU per probe interval (target <= 2x)",
               common.ratio(a1["cpu_per_interval_ms"], b["cpu_per_interval_ms"]), "x")
    report.add("ratio agent/bare kazoo (1 s): requests per probe interval",
               common.ratio(a1["requests_per_interval"], b["requests_per_interval"]), "x")
    if earlier in figures:
        report.add(f"ratio {earlier}/bare kazoo (1 s): CPU per probe interval",
                   common.ratio(figures[earlier]["cpu_per_interval_ms"],
                                b["cpu_per_interval_ms"]), "x")
        report.add(f"ratio agent 1 s / {earlier}: CPU per probe interval",
                   common.ratio(a1["cpu_per_interval_ms"],
                                figures[earlier]["cpu_per_interval_ms"]), "x")
    report.add("ratio agent 1 s / agent 5 s: writes per minute",
               common.ratio(a1["writes_min"], a5["writes_min"]), "x")
    report.add("ratio agent 1 s / agent 5 s: CPU share",
               common.ratio(a1["cpu_pct"], a5["cpu_pct"]), "x")
    report.add("ratio agent 5 s with job churn / quiet: record writes per minute",
               common.ratio(c5["record_writes_min"], a5["record_writes_min"]), "x")
    report.note(f"window {elapsed:.0f} s after a 6 s warm-up; each agent is alone, so it is "
                f"the matrix keeper; 8 static GPUs; each process has its own ZooKeeper. Job "
                f"churn: this script creates and deletes a lease znode on alternate seconds "
                f"(the lease's own writes are not counted as the agent's record writes)")
    report.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
