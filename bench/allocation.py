"""Allocation: submit+release latency and throughput on a real ZooKeeper, beside plain sets.

Every job goes through the keeper (Store.queue.submit: a request in the user's
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

Fair share (issue 51): ``--fairshare on`` (the default, as the inventory's default
``hypertf_fairshare_half_life: 7``), ``off`` (``hypertf_fairshare_half_life: 0``; also
``--fairshare-off``) or ``both``: the keeper is restarted with the other setting between
rounds, which alternate (off, on; then on, off with ``--rounds 2``...), and each figure is
given for both with the ratio on / off. ``--users N`` spreads the submitters over N users
(registered ones, each thread with its user's credential), so fair share has users to
order; the default, 1, is the login user, as before. ``--levels 32`` runs one level only.
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
from dataclasses import replace
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
from hypertf.store import AgentRecord, Layout, Store, credentials

HOSTS = tuple(f"n{i:02d}" for i in range(1, 17))
GPUS_PER_HOST = 8
HOLD_S = 0.01
SESSION_TIMEOUT = 15.0  # 64 sessions on 2 cores: short sessions starve and expire
GOAL_PER_S = 500  # issue 43: admissions (allocate+release cycles) per second, 32 submitters


def settings(zk_hosts: str, root: str, half_life_days: float = 7.0) -> ClusterSettings:
    """The bench's cluster; ``half_life_days`` 0: fair share off (the keeper's setting).
    ``job_records_max`` far above the default: a round makes ~2,500 job records and only
    the keeper's prune (past 10,000 a user) removes them, so the folder quota that auth init
    derives from it (issue 48) refused the 11,000th record of a run (StoreError)."""
    return replace(ClusterSettings("gpu_nodes", zk_hosts, root, SESSION_TIMEOUT,
                                   "/nonexistent", 5.0), fairshare_half_life=half_life_days,
                   job_records_max=1_000_000)


HALF_LIFE = {"on": 7.0, "off": 0.0}  # hypertf_fairshare_half_life per --fairshare mode


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
    users = args.user_names.split(",") if args.user_names else []
    owners = [users[(args.offset + t) % len(users)] if users else credentials.login_user()
              for t in range(args.threads)]
    clients = [store.connect(settings(args.zk, args.root),
                             **({"identity": f"user.{owner}"} if users else {}))
               for owner in owners]
    payload = b"x" * args.payload

    def loop(client, owner: str) -> None:
        session = Store(client, layout)  # one session: its known records and grant watches
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
            key = new_task_key(owner)
            t0 = time.monotonic()
            try:
                grant = session.queue.submit(one_gpu(), key)
            except StoreError as err:
                mine.append({"failed": str(err)})
                continue
            t1 = time.monotonic()
            granted = time.time()
            placement = grant.placements[0]
            time.sleep(HOLD_S)
            releasing = time.time()
            t2 = time.monotonic()
            session.matrix.release(key)
            t3 = time.monotonic()
            mine.append({"key": key, "host": placement.host, "gpu": placement.gpus[0],
                         "granted": granted, "releasing": releasing, "retries": grant.retries,
                         "allocate_s": t1 - t0, "release_s": t3 - t2})
        with lock:
            events.extend(mine)

    threads = [threading.Thread(target=loop, args=(c, o))
               for c, o in zip(clients, owners, strict=True)]
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
    session = Store(client, layout)  # one session: its known records and grant watches
    matrix_size = max(len(client.get(layout.matrix_shard(i))[0])  # the largest shard
                      for i in range(session.matrix.read()[1].shards))
    set_path = f"{layout.root}/plain-set"  # made by the driver, with the matrix's ACL
    payload = b"x" * matrix_size
    for _ in range(cycles):
        key = new_task_key(credentials.login_user())
        t0 = time.monotonic()
        session.queue.submit(one_gpu(), key)
        t1 = time.monotonic()
        session.matrix.release(key)
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
               kids: common.Children, payload: int, users: list[str]) -> dict:
    processes = min(count, 8)
    per = [count // processes + (1 if i < count % processes else 0) for i in range(processes)]
    start_at = time.time() + 2.0 + 0.25 * processes
    started = [
        kids.popen([common.PYTHON, __file__, "--worker-mode", mode, "--zk", zk_hosts, "--root",
                    root, "--threads", str(n), "--start-at", str(start_at), "--duration",
                    str(duration), "--payload", str(payload), "--set-path",
                    f"{root}/plain-set", "--user-names", ",".join(users), "--offset",
                    str(sum(per[:i]))], stdout=subprocess.PIPE, text=True)
        for i, n in enumerate(per)
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
    matrix, _ = Store(client, layout).matrix.read()  # the keeper syncs it
    free = all(cell == FREE for row in matrix.gpus.values() for cell in row)
    return free and not matrix.ports and not store.Store(client, layout).leases()


def keeper_for(zk_hosts: str, root: str, mode: str) -> KeeperThread:
    """The keeper with fair share ``mode`` (on/off), as an agent's keeper would run."""
    return KeeperThread(settings(zk_hosts, root, HALF_LIFE[mode])).start()


def warm_up(client, layout: Layout, cycles: int, owner: str) -> None:
    """A few cycles through a fresh keeper (its first pass loads everything)."""
    session = Store(client, layout)  # one session: what it learns serves every cycle
    for _ in range(cycles):
        key = new_task_key(owner)
        session.queue.submit(one_gpu(), key)
        session.matrix.release(key)


def main() -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--fairshare", choices=("on", "off", "both"), default="on",
                   help="the keeper's fair share: on (hypertf_fairshare_half_life 7, the "
                   "default), off (0) or both, side by side in alternating rounds")
    p.add_argument("--fairshare-off", action="store_true",
                   help="the same as --fairshare off")
    p.add_argument("--levels", type=lambda text: [int(x) for x in text.split(",")],
                   help="submitter counts (default 1,8,32,64; --quick: 4)")
    p.add_argument("--users", type=int, default=1,
                   help="spread the submitters over this many users (default 1: the login "
                   "user, as before)")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds per level and fair share mode (with both: they alternate)")
    p.add_argument("--worker-mode", choices=("alloc", "set"), help=argparse.SUPPRESS)
    for name in ("--zk", "--root", "--set-path"):
        p.add_argument(name, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    p.add_argument("--payload", type=int, help=argparse.SUPPRESS)
    p.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    p.add_argument("--duration", type=float, help=argparse.SUPPRESS)
    p.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--user-names", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker_mode:
        args.mode = args.worker_mode
        return worker(args)

    modes = {"on": ["on"], "off": ["off"], "both": ["off", "on"]}[
        "off" if args.fairshare_off else args.fairshare]
    both = len(modes) > 1
    users = [f"u{i:03d}" for i in range(args.users)] if args.users > 1 else []
    cycles = 20 if args.quick else 300
    levels = args.levels or ([4] if args.quick else [1, 8, 32, 64])
    duration = 1.0 if args.quick else 8.0
    report = common.Report("allocation", args)
    report.start()
    with common.bench_home("alloc") as home, common.zookeeper(home) as zk, \
            common.children() as kids:
        root = "/bench-alloc"
        layout = Layout(root)
        # a secured root, as in production, with the submitters' users registered
        store.secure_cluster(settings(zk.hosts, root), [], users=users)
        agents = store.connect(settings(zk.hosts, root), identity="admin")  # stands in for them
        client = store.connect(settings(zk.hosts, root))  # a user, as a launcher is
        keeper: KeeperThread | None = None
        running = ""

        def use(mode: str) -> None:
            """The keeper with fair share ``mode``, restarted when it had the other."""
            nonlocal keeper, running
            if keeper is not None and running == mode:
                return
            if keeper is not None:
                keeper.stop()
            keeper, running = keeper_for(zk.hosts, root, mode), mode
            warm_up(client, layout, 5 if args.quick else 20, credentials.login_user())

        try:
            publish_agents(agents, layout)
            member = store.credential_of(agents).member_id  # users may write the baseline
            admin_id = store.credential_of(agents).admin_id
            agents.create(f"{root}/plain-set", b"", acl=[
                make_acl("digest", admin_id, all=True),
                make_acl("digest", member, read=True, write=True)])
            sync_matrix(Store(agents, layout))
            matrix_bytes = 0
            for mode in modes:
                use(mode)
                lat = latency(client, layout, cycles)
                matrix_bytes = lat.pop("matrix_bytes")[0]
                print()
                tag = f" (fair share {mode})" if both else ""
                for what in ("allocate+release", "allocate", "release", "set"):
                    values = lat[what]
                    report.add(f"{what} latency median (1 client, {cycles} cycles){tag}",
                               1000 * common.median(values), "ms")
                    report.add(f"{what} latency p99{tag}",
                               1000 * common.percentile(values, 99), "ms")
                for q, label in ((50, "median"), (99, "p99")):
                    report.add(f"ratio allocate+release / plain set, {label}{tag}",
                               common.ratio(common.percentile(lat["allocate+release"], q),
                                            common.percentile(lat["set"], q)), "x")
                assert all_free(client, layout), "GPUs left held after the latency test"
            report.add("matrix znode during the latency test", matrix_bytes, "bytes")

            for count in levels:
                per_mode: dict[str, list[dict]] = {mode: [] for mode in modes}
                for r in range(args.rounds):
                    for mode in (modes if r % 2 == 0 else modes[::-1]):
                        use(mode)
                        before = common.zk_stat(zk)
                        # the keeper is a thread of this process, which does nothing else then
                        cpu = (common.process_cpu(), common.process_cpu(zk.pid()))
                        got = concurrent(zk.hosts, root, "alloc", count, duration, kids,
                                         matrix_bytes, users)
                        got["keeper_s"] = common.process_cpu() - cpu[0]
                        got["server_s"] = common.process_cpu(zk.pid()) - cpu[1]
                        after = common.zk_stat(zk)
                        got["sent"] = {f: int(after[f]) - int(before[f])
                                       for f in ("zk_packets_received", "zxid")}
                        per_mode[mode].append(got)
                        common.wait_until(lambda: all_free(client, layout), 30,
                                          "every GPU free and no lease after the round",
                                          interval=0.2)
                sets = concurrent(zk.hosts, root, "set", count, duration, kids, matrix_bytes,
                                  users)
                set_rate = len(sets["events"]) / duration
                through = {}
                for mode in modes:
                    through[mode] = level_figures(report, count, per_mode[mode], duration,
                                                  set_rate, f" fair share {mode}" if both
                                                  else "")
                if sets["late"]:
                    report.note(f"C={count}: a set worker process started after the common "
                                f"start time")
                if both:
                    report.add(f"C={count} ratio cycles/s, fair share on / off "
                               f"({args.rounds} round(s) each, alternating)",
                               common.ratio(through["on"], through["off"]), "x",
                               goal=(">=", 1.0) if count == 32 else None)
            report.note(f"{len(HOSTS)} hosts x {GPUS_PER_HOST} GPUs of real agent records; "
                        f"1-GPU jobs, round_robin; hold {HOLD_S * 1000:.0f} ms; "
                        f"{duration:.0f} s per round; session timeout {SESSION_TIMEOUT:.0f} s; "
                        f"submitters of {len(users) or 1} user(s); fair share "
                        f"{' and '.join(modes)}; after every round all GPUs were free and no "
                        f"lease was left (checked)")
        finally:
            if keeper is not None:
                keeper.stop()
            store.close(client)
            store.close(agents)
    report.finish()
    return 0


def level_figures(report: common.Report, count: int, rounds: list[dict], duration: float,
                  set_rate: float, label: str) -> float:
    """One level's figures over its ``rounds`` (one fair share mode); returns cycles/s."""
    alloc = [e for got in rounds for e in got["events"]]
    grants = [e for e in alloc if "key" in e]
    failed = [e for e in alloc if "failed" in e]
    retries = [e["retries"] for e in grants]
    through = len(grants) / (duration * len(rounds))
    sent = {f: sum(got["sent"][f] for got in rounds) for f in ("zk_packets_received", "zxid")}
    client_s, keeper_s, server_s = (sum(got[k] for got in rounds)
                                    for k in ("cpu_s", "keeper_s", "server_s"))
    tag = f"C={count}{label}"
    report.add(f"{tag} allocate+release cycles/s ({rounds[0]['processes']} "
               f"processes, own sessions)", through, "/s", n=count,
               goal=(">=", GOAL_PER_S) if count == 32 else None)
    if len(rounds) > 1:
        report.add(f"{tag} cycles/s of each round, in order",
                   " / ".join(f"{sum('key' in e for e in got['events']) / duration:.0f}"
                              for got in rounds), "/s")
    report.add(f"{tag} ZooKeeper requests / transactions per cycle "
               f"(server's count, with connects and pings)",
               f"{common.ratio(sent['zk_packets_received'], len(grants)):.1f} / "
               f"{common.ratio(sent['zxid'], len(grants)):.2f}")
    report.add(f"{tag} CPU per cycle: submitters / keeper / ZooKeeper = total",
               " / ".join(f"{1000 * common.ratio(x, len(grants)):.2f}" for x in
                          (client_s, keeper_s, server_s, client_s + keeper_s + server_s)),
               "ms", client_ms=1000 * common.ratio(client_s, len(grants)),
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
               f"{1000 * common.percentile([e['allocate_s'] for e in grants], 99):.1f}", "ms")
    report.add(f"{tag} release latency median",
               1000 * common.median([e["release_s"] for e in grants]), "ms")
    report.add(f"{tag} allocations given up (StoreError)", len(failed))
    if failed:
        report.note(f"{tag}: the first StoreError: {failed[0]['failed'][:300]}")
    booked = double_bookings(alloc)
    report.add(f"{tag} double-bookings", booked, goal=("<=", 0))
    if any(got["late"] for got in rounds):
        report.note(f"{tag}: a worker process started after the common start time")
    if booked:
        raise AssertionError(f"{booked} double-bookings with {count} allocators")
    return through


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
