"""Allocation: submit+release latency and throughput on a real ZooKeeper, beside plain sets.

Every job goes through the keeper (hypertf.store.waitqueue.submit: a request in the user's
folder, admitted by the keeper's pass; here hypertf.keeper.thread.KeeperThread in the driver, as
an agent's keeper would). "allocate" below is that: submit -> granted.

A ZooKeeper of our own (loopback, tickTime 500 ms) holds real agent records for 16 hosts x
8 GPUs (ephemeral, from one separate session, like agents). Then:

* latency, one client: allocate 1 GPU + release it, K times (median, p99), beside K plain
  ``set`` calls of a payload as large as the matrix on the same server;
* concurrency: C = 1, 8, 32, 64 submitters, each a thread with its own ZooKeeper session,
  spread over up to 8 processes, cycling allocate -> hold 10 ms -> release for a fixed
  time; throughput (cycles/s), conflict retries (Grant.retries), latency under contention,
  and double-bookings: for every GPU the intervals [granted, release called] of all its
  grants must not overlap (recorded inside the true holding interval, so an overlap is a
  real double-booking); the same C clients doing plain ``set`` calls give the ceiling.
After each round every GPU must be free and no lease left.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import common
from kazoo.security import make_acl

from hypertf import store
from hypertf.config.settings import ClusterSettings
from hypertf.core.errors import StoreError
from hypertf.core.matrix import FREE
from hypertf.core.placement import Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.keeper.sync import sync_matrix
from hypertf.keeper.thread import KeeperThread
from hypertf.store import AgentRecord, Layout, Store, auth
from hypertf.store.allocation import read_matrix, release
from hypertf.store.waitqueue import submit

HOSTS = tuple(f"n{i:02d}" for i in range(1, 17))
GPUS_PER_HOST = 8
HOLD_S = 0.01
SESSION_TIMEOUT = 15.0  # 64 sessions on 2 cores: short sessions starve and expire
GOAL_PER_S = 500  # issue 43: admissions (allocate+release cycles) per second, 32 submitters


def settings(zk_hosts: str, root: str) -> ClusterSettings:
    return ClusterSettings("gpu_nodes", zk_hosts, root, SESSION_TIMEOUT, "/nonexistent", 5.0)


def one_gpu() -> Request:
    return Request(slots=(TaskSlot("worker", 0, 1),), hosts=HOSTS)


def publish_agents(client, layout: Layout) -> None:
    common.register_hosts(client, layout.root, HOSTS)
    for i, host in enumerate(HOSTS):
        record = AgentRecord(host=host, mgmt_addr=f"127.0.1.{i + 1}",
                             data_addr=f"127.0.1.{i + 1}", port=20000, gpu=GPUS_PER_HOST,
                             gpu_avail_list=list(range(GPUS_PER_HOST)), heartbeat=time.time())
        client.create(layout.resource(host), record.to_json(), ephemeral=True)


# -- the worker process: THREADS clients, each with its own session --------------------------
def worker(args: argparse.Namespace) -> int:
    layout = Layout(args.root)
    events: list[dict] = []
    lock = threading.Lock()
    clients = [store.connect(settings(args.zk, args.root)) for _ in range(args.threads)]
    payload = b"x" * args.payload

    def loop(client) -> None:
        mine = []
        while time.time() < args.start_at:
            time.sleep(0.001)
        end = args.start_at + args.duration
        while time.time() < end:
            if args.mode == "set":
                t0 = time.monotonic()
                client.set(args.set_path, payload)
                mine.append({"set_s": time.monotonic() - t0})
                continue
            key = new_task_key(auth.login_user())
            t0 = time.monotonic()
            try:
                grant = submit(Store(client, layout), one_gpu(), key)
            except StoreError as err:
                mine.append({"failed": str(err)})
                continue
            t1 = time.monotonic()
            granted = time.time()
            placement = grant.placements[0]
            time.sleep(HOLD_S)
            releasing = time.time()
            t2 = time.monotonic()
            release(Store(client, layout), key)
            t3 = time.monotonic()
            mine.append({"key": key, "host": placement.host, "gpu": placement.gpus[0],
                         "granted": granted, "releasing": releasing, "retries": grant.retries,
                         "allocate_s": t1 - t0, "release_s": t3 - t2})
        with lock:
            events.extend(mine)

    threads = [threading.Thread(target=loop, args=(c,)) for c in clients]
    late = time.time() > args.start_at
    cpu = common.process_cpu()  # imports and connects done: the round's CPU only
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cpu = common.process_cpu() - cpu
    for client in clients:
        store.close(client)
    json.dump({"late": late, "events": events, "cpu_s": cpu}, sys.stdout)
    return 0


# -- the driver --------------------------------------------------------------------------------
def latency(client, layout: Layout, cycles: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = defaultdict(list)
    matrix_size = max(len(client.get(layout.matrix_shard(i))[0])  # the largest shard
                      for i in range(read_matrix(Store(client, layout))[1].shards))
    set_path = f"{layout.root}/plain-set"  # made by the driver, with the matrix's ACL
    payload = b"x" * matrix_size
    for _ in range(cycles):
        key = new_task_key(auth.login_user())
        t0 = time.monotonic()
        submit(Store(client, layout), one_gpu(), key)
        t1 = time.monotonic()
        release(Store(client, layout), key)
        t2 = time.monotonic()
        client.set(set_path, payload)
        t3 = time.monotonic()
        figures["allocate"].append(t1 - t0)
        figures["release"].append(t2 - t1)
        figures["allocate+release"].append(t2 - t0)
        figures["set"].append(t3 - t2)
    figures["matrix_bytes"] = [matrix_size]
    return figures


def concurrent(zk_hosts: str, root: str, mode: str, count: int, duration: float,
               kids: common.Children, payload: int) -> dict:
    processes = min(count, 8)
    per = [count // processes + (1 if i < count % processes else 0) for i in range(processes)]
    start_at = time.time() + 2.0 + 0.25 * processes
    started = [
        kids.popen([common.PYTHON, __file__, "--worker-mode", mode, "--zk", zk_hosts, "--root",
                    root, "--threads", str(n), "--start-at", str(start_at), "--duration",
                    str(duration), "--payload", str(payload), "--set-path",
                    f"{root}/plain-set"], stdout=subprocess.PIPE, text=True)
        for n in per
    ]
    events, late, cpu = [], False, 0.0
    for proc in started:
        out, _ = proc.communicate(timeout=duration + 120)
        if proc.returncode:
            raise RuntimeError(f"allocator process failed ({proc.returncode})")
        result = json.loads(out)
        events.extend(result["events"])
        late = late or result["late"]
        cpu += result.get("cpu_s", 0.0)
    return {"events": events, "late": late, "processes": processes, "cpu_s": cpu}


def double_bookings(events: list[dict]) -> int:
    by_gpu = defaultdict(list)
    for e in events:
        if "key" in e:
            by_gpu[(e["host"], e["gpu"])].append((e["granted"], e["releasing"]))
    overlaps = 0
    for intervals in by_gpu.values():
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            overlaps += start < end
    return overlaps


def all_free(client, layout: Layout) -> bool:
    matrix, _ = read_matrix(Store(client, layout))  # the keeper syncs it
    free = all(cell == FREE for row in matrix.gpus.values() for cell in row)
    return free and not matrix.ports and not store.Store(client, layout).leases()


def main() -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--worker-mode", choices=("alloc", "set"), help=argparse.SUPPRESS)
    for name in ("--zk", "--root", "--set-path"):
        p.add_argument(name, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    p.add_argument("--payload", type=int, help=argparse.SUPPRESS)
    p.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    p.add_argument("--duration", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker_mode:
        args.mode = args.worker_mode
        return worker(args)

    cycles = 20 if args.quick else 300
    levels = [4] if args.quick else [1, 8, 32, 64]
    duration = 1.0 if args.quick else 8.0
    report = common.Report("allocation", args)
    report.start()
    with common.bench_home("alloc") as home, common.zookeeper(home) as zk, \
            common.children() as kids:
        root = "/bench-alloc"
        layout = Layout(root)
        store.secure_cluster(settings(zk.hosts, root), [])  # a secured root, as in production
        agents = store.connect(settings(zk.hosts, root), identity="admin")  # stands in for them
        client = store.connect(settings(zk.hosts, root))  # a user, as a launcher is
        try:
            publish_agents(agents, layout)
            member = store.credential_of(agents).member_id  # users may write the baseline
            admin_id = store.credential_of(agents).admin_id
            agents.create(f"{root}/plain-set", b"", acl=[
                make_acl("digest", admin_id, all=True),
                make_acl("digest", member, read=True, write=True)])
            sync_matrix(Store(agents, layout))
            keeper = KeeperThread(settings(zk.hosts, root)).start()
            for _ in range(5 if args.quick else 20):  # warm up: ZooKeeper's JIT, imports
                key = new_task_key(auth.login_user())
                submit(Store(client, layout), one_gpu(), key)
                release(Store(client, layout), key)
            lat = latency(client, layout, cycles)
            matrix_bytes = lat.pop("matrix_bytes")[0]
            print()
            for what in ("allocate+release", "allocate", "release", "set"):
                values = lat[what]
                report.add(f"{what} latency median (1 client, {cycles} cycles)",
                           1000 * common.median(values), "ms")
                report.add(f"{what} latency p99", 1000 * common.percentile(values, 99), "ms")
            for q, label in ((50, "median"), (99, "p99")):
                report.add(f"ratio allocate+release / plain set, {label}", common.ratio(
                    common.percentile(lat["allocate+release"], q),
                    common.percentile(lat["set"], q)), "x")
            report.add("matrix znode during the latency test", matrix_bytes, "bytes")
            assert all_free(client, layout), "GPUs left held after the latency test"

            for count in levels:
                rounds = {}
                for mode in ("alloc", "set"):
                    before = common.zk_stat(zk)
                    # the keeper is a thread of this process, which does nothing else then
                    cpu = (common.process_cpu(), common.process_cpu(zk.pid()))
                    rounds[mode] = concurrent(zk.hosts, root, mode, count, duration, kids,
                                              matrix_bytes)
                    if mode == "alloc":
                        keeper_s = common.process_cpu() - cpu[0]
                        server_s = common.process_cpu(zk.pid()) - cpu[1]
                        after = common.zk_stat(zk)
                        sent = {f: int(after[f]) - int(before[f])
                                for f in ("zk_packets_received", "zxid")}
                alloc, sets = rounds["alloc"]["events"], rounds["set"]["events"]
                grants = [e for e in alloc if "key" in e]
                failed = [e for e in alloc if "failed" in e]
                retries = [e["retries"] for e in grants]
                through = len(grants) / duration
                set_rate = len(sets) / duration
                tag = f"C={count}"
                report.add(f"{tag} allocate+release cycles/s ({rounds['alloc']['processes']} "
                           f"processes, own sessions)", through, "/s", n=count,
                           goal=(">=", GOAL_PER_S) if count == 32 else None)
                report.add(f"{tag} ZooKeeper requests / transactions per cycle "
                           f"(server's count, with connects and pings)",
                           f"{common.ratio(sent['zk_packets_received'], len(grants)):.1f} / "
                           f"{common.ratio(sent['zxid'], len(grants)):.2f}")
                client_s = rounds["alloc"]["cpu_s"]
                report.add(f"{tag} CPU per cycle: submitters / keeper / ZooKeeper = total",
                           " / ".join(f"{1000 * common.ratio(x, len(grants)):.2f}" for x in
                                      (client_s, keeper_s, server_s,
                                       client_s + keeper_s + server_s)), "ms",
                           client_ms=1000 * common.ratio(client_s, len(grants)),
                           keeper_ms=1000 * common.ratio(keeper_s, len(grants)),
                           server_ms=1000 * common.ratio(server_s, len(grants)))
                report.add(f"{tag} plain set/s, same clients", set_rate, "/s")
                report.add(f"{tag} ratio set/s / cycles/s", common.ratio(set_rate, through), "x")
                report.add(f"{tag} conflict retries per grant, mean",
                           common.ratio(sum(retries), len(retries)), "")
                report.add(f"{tag} conflict retries p99 / max",
                           f"{common.percentile(retries, 99):.0f} / {max(retries, default=0)}")
                report.add(f"{tag} allocate latency median / p99",
                           f"{1000 * common.median([e['allocate_s'] for e in grants]):.1f} / "
                           f"{1000 * common.percentile([e['allocate_s'] for e in grants], 99):.1f}",
                           "ms")
                report.add(f"{tag} release latency median",
                           1000 * common.median([e["release_s"] for e in grants]), "ms")
                report.add(f"{tag} allocations given up (StoreError)", len(failed))
                booked = double_bookings(alloc)
                report.add(f"{tag} double-bookings", booked, goal=("<=", 0))
                if rounds["alloc"]["late"] or rounds["set"]["late"]:
                    report.note(f"{tag}: a worker process started after the common start time")
                common.wait_until(lambda: all_free(client, layout), 30,
                                  "every GPU free and no lease after the round", interval=0.2)
                if booked:
                    raise AssertionError(f"{booked} double-bookings with {count} allocators")
            report.note(f"{len(HOSTS)} hosts x {GPUS_PER_HOST} GPUs of real agent records; "
                        f"1-GPU jobs, round_robin; hold {HOLD_S * 1000:.0f} ms; "
                        f"{duration:.0f} s per round; session timeout {SESSION_TIMEOUT:.0f} s; "
                        f"after every round all GPUs were free and no lease was left (checked)")
        finally:
            if "keeper" in locals():
                keeper.stop()
            store.close(client)
            store.close(agents)
    report.finish()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
