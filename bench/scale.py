"""Scale: 25,000 hosts x 8 GPUs of agent records and matrix rows in a real ZooKeeper.

The agents are simulated by writer processes (``--agents``): each creates its share of
real AgentRecord JSON (8 GPUs, as the agent writes it) as ephemeral znodes and keeps them
up with the agent's own write rule (``hypertf.node.agent.WritePolicy``: a write when the
record changes, else a keep-alive), every second, for the whole run. An inventory of as
many hosts is written (loopback addresses: nothing is ever sent to them). The same steps run
at 10, 1,000 and 25,000 hosts (``--quick``: 10 and 200; ``--sizes``), side by side:

- the matrix: its first build and a sync with no change (the keeper's), a read of every
  shard, the shard count, the largest shard free and with every GPU held by its own job;
- submit -> granted on an idle cluster (the keeper in a thread, as an agent's keeper) for a
  1-GPU and a 64-GPU job, and their release;
- a command's start: loading the inventory (the parse, then the cache), and the whole
  ``hypertf status`` and ``hypertf queue`` commands as a user runs them (a new process),
  which read the keeper's views (issue 55; the keeper thread runs meanwhile), and the same
  with ``--direct`` (every record read, the pass run in the command: as before);
  ``status.collect``/``render`` and ``queueview.collect``/``render`` in the process;
- with every GPU held by running jobs (one per 8 hosts, with their leases) and 1,000 jobs
  waiting (``--quick``: 20; each asks for 8 workers x 1 GPU over every host, as the launcher
  asks): the keeper's pass (``KeeperRole.keep``: sync, read the queue, admit, publish the
  queue's and the hosts' views) with
  nothing to admit, first and again, and once 8 GPUs are freed (it admits one);
- the largest znode (agent record, shard, waiting job's record, the queue's view, the
  status view's largest shard);
- at the largest size: ZooKeeper's writes per second from the idle simulated agents (its
  zxid over a window of one keep-alive period, with nothing else writing).

Fair share (issue 51): ``--users N`` spreads the waiting jobs over N registered users (the
admin's session enqueues them in their folders, standing in for their launchers) and seeds
the keeper's ledger with a different decayed usage for each, so the pass orders by real
factors; ``--fairshare on`` (the default) or ``off`` (``hypertf_fairshare_half_life: 0``;
also ``--fairshare-off``) sets the keeper's; ``both`` runs the keeper's passes on the same
waiting jobs with each setting, in alternating rounds (off, on, on, off: a keeper started
afresh each time, its first pass, the pass again, and a pass admitting one job after 8 GPUs
of another host were freed), and gives the ratio on / off (issue 51's goal: <= 1.2x).
``--keeper-only`` leaves out what the pass does not need (the inventory, ``hypertf
status``/``queue``, the idle agents' writes).

Each figure with a goal (issue 43 item 2) prints it beside its value, judged at the largest
size, met or MISSED; the script exits 0 either way. ``--profile`` also prints where the time
of ``hypertf status`` and ``hypertf queue`` (the whole commands, under cProfile) and of a
keeper pass goes at the largest size. The code measured is the ``hypertf`` this script
imports, which it names: to measure another commit, run a copy of bench/ from a worktree
of it (``cd WORKTREE && PYTHONPATH=WORKTREE /work/main/.venv/bin/python bench/scale.py``;
the bench puts its own checkout first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import common
import yaml
from rich.console import Console

import hypertf
from hypertf import store
from hypertf.cli import statustable
from hypertf.config.inventory import load_inventory
from hypertf.config.settings import ClusterSettings
from hypertf.core.fairshare import DAY_S
from hypertf.core.matrix import Matrix, joined, shard_count, split
from hypertf.core.placement import Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.core.usage import Summary, month_of
from hypertf.keeper import queueview
from hypertf.keeper.role import KeeperRole
from hypertf.keeper.sync import sync_matrix
from hypertf.keeper.thread import KeeperThread
from hypertf.node.agent import WritePolicy
from hypertf.store import AgentRecord, GpuInfo, Layout, Store, credentials, status

GPUS = 8
SESSIONS = 4  # writer processes standing in for the agents
HOSTS_PER_JOB = 8  # the running jobs that hold every GPU: one per 8 hosts
AGENT_INTERVAL = 1.0  # the lab's hypertf_agent_interval (the default is 5 s)
KIB = 1024
HALF_LIFE = {"on": 7.0, "off": 0.0}  # hypertf_fairshare_half_life (days) per --fairshare
# Issue 43 item 2's goals, judged at the largest size: the figure (as the bench names it,
# {waiters} filled in) -> (comparison, bound in the figure's unit: ms, bytes or /s).
GOALS = {
    "`hypertf status`, the whole command (new process)": ("<=", 1000.0),
    "`hypertf queue`, the whole command (new process)": ("<=", 1000.0),
    "keeper pass, {waiters} waiting, nothing to admit: again": ("<=", 500.0),
    "keeper pass, {waiters} waiting, nothing to admit: again, ratio fair share on / off": (
        "<=", 1.2),
    "keeper pass, {waiters} waiting, 8 GPUs freed: admits": ("<=", 500.0),
    "keeper pass, {waiters} waiting, 8 GPUs freed: admits, ratio fair share on / off": (
        "<=", 1.2),
    "submit -> granted, idle cluster, 1-GPU job (p50)": ("<=", 100.0),
    "submit -> granted, idle cluster, 64-GPU job (8 x 8 GPUs) (p50)": ("<=", 100.0),
    "ZooKeeper writes/s from idle agents": ("<=", 1000.0),
    "the largest znode (bytes)": ("<=", 512.0 * KIB),  # issue 55 (issue 43: 256 KiB)
    "load the inventory, unchanged (cache): a command's start": ("<=", 500.0),
    "load the inventory, first time (ansible-core parse)": ("<=", 30_000.0),
}


def host_name(i: int) -> str:
    return f"node{i:05d}"


def record(i: int) -> AgentRecord:
    address = f"127.{1 + i // 65536}.{(i // 256) % 256}.{i % 256}"
    name = host_name(i)
    gpus = [GpuInfo(index=g, name="NVIDIA A100-SXM4-80GB", uuid=f"GPU-{name}-{g:02d}-0000-0000",
                    utilization=0.0, memory_used=0, memory_total=85899345920, available=True)
            for g in range(GPUS)]
    return AgentRecord(host=name, mgmt_addr=address, data_addr=address, port=20000 + i % 1000,
                       gpu=GPUS, gpu_avail_list=list(range(GPUS)), gpus=gpus,
                       gpu_source="nvml", heartbeat=time.time(), pid=1000 + i,
                       hostname=name)


def write_inventory(home: Path, size: int, zk_hosts: str, root: str) -> str:
    hosts = {host_name(i): {"ansible_host": record(i).mgmt_addr} for i in range(size)}
    data = {"all": {"vars": {"hypertf_zookeeper_hosts": zk_hosts, "hypertf_zk_root": root,
                             "hypertf_zk_session_timeout": 10, "ansible_user": "root"},
                    "children": {"gpu_nodes": {"hosts": hosts}}}}
    path = home / f"inventory-{size}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def timed(action: Callable[[], object], repeat: int = 3) -> float:
    """Median seconds of ``repeat`` runs."""
    samples = []
    for _ in range(repeat):
        t0 = time.monotonic()
        action()
        samples.append(time.monotonic() - t0)
    return statistics.median(samples)


def unique_keys(count: int) -> list[str]:
    """Task keys of this user, none twice (2,000 keys made in one second share a time stamp,
    and their 24 random bits collide now and then)."""
    keys: dict[str, None] = {}
    while len(keys) < count:
        keys[new_task_key(credentials.login_user())] = None
    return list(keys)


def held_matrix(size: int) -> Matrix:
    """Every GPU held by its own job, one reserved port per job: the largest matrix."""
    matrix = Matrix()
    for i in range(size):
        keys = [new_task_key(credentials.login_user()) for _ in range(GPUS)]  # sizes only
        matrix.gpus[host_name(i)] = keys
        matrix.ports[host_name(i)] = {str(20000 + g): keys[g] for g in range(GPUS)}
    return matrix


def free_matrix(size: int) -> Matrix:
    return Matrix(gpus={host_name(i): [1] * GPUS for i in range(size)})


# -- the simulated agents ----------------------------------------------------------------
def agents_main(argv: list[str]) -> int:
    """``scale.py --agents ZK ROOT FIRST SIZE STEP INTERVAL``: create the records of hosts
    FIRST, FIRST+STEP, ... below SIZE (as the admin: it stands in for their agents), print
    "ready", then keep them up with the agent's write rule every INTERVAL seconds until
    SIGTERM."""
    zk_hosts, root, first, size, step = argv[0], argv[1], *map(int, argv[2:5])
    interval = float(argv[5])
    cluster = ClusterSettings("gpu_nodes", zk_hosts, root, 30.0, "/nonexistent", 5.0)
    client = store.connect(cluster, identity="admin", long_lived=True)
    layout = Layout(root)
    mine = list(range(first, size, step))
    records = {i: record(i) for i in mine}
    contents = {i: replace(r, heartbeat=0.0).to_json() for i, r in records.items()}
    policies = {i: WritePolicy(interval) for i in mine}
    pending = [client.create_async(layout.resource(host_name(i)), records[i].to_json(),
                                   ephemeral=True) for i in mine]
    for result in pending:
        result.get(timeout=120)
    now = time.monotonic()
    for i in mine:
        policies[i].wrote(contents[i], now)
    print("ready", flush=True)
    try:
        while True:
            time.sleep(interval)
            now = time.monotonic()
            due = [i for i in mine if policies[i].due(contents[i], now)]
            sets = [client.set_async(layout.resource(host_name(i)),
                                     replace(records[i], heartbeat=time.time()).to_json())
                    for i in due]
            for i, result in zip(due, sets, strict=True):
                result.get(timeout=60)
                policies[i].wrote(contents[i], now)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        store.close(client)
    return 0


def start_agents(kids: common.Children, zk_hosts: str, root: str, size: int,
                 interval: float) -> None:
    procs = [kids.popen([sys.executable, __file__, "--agents", zk_hosts, root, str(k),
                         str(size), str(SESSIONS), str(interval)], stdout=subprocess.PIPE,
                        text=True)
             for k in range(SESSIONS)]
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"a simulated agent process failed (exit {proc.poll()})")


def cli(inventory: str, *argv: str) -> float:
    """Seconds of one whole ``hypertf`` command, as a user runs it (a new process)."""
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hypertf.cli", *argv, "-i", inventory],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, credentials.IDENTITY_ENV: ""})
    elapsed = time.monotonic() - t0
    if done.returncode != 0:
        raise RuntimeError(f"hypertf {' '.join(argv)}: exit {done.returncode}: "
                           f"{done.stderr[-500:]}")
    return elapsed


def whole_commands(rows: dict[str, float], inventory: str, verb: str, reps: int,
                   direct: str) -> None:
    """``hypertf VERB`` as a user runs it (the keeper's view) and with ``--direct`` (what
    ``direct`` says it does), each the median of ``reps`` runs."""
    rows[f"`hypertf {verb}`, the whole command (new process)"] = statistics.median(
        cli(inventory, verb) for _ in range(reps))
    rows[f"`hypertf {verb} --direct` ({direct})"] = statistics.median(
        cli(inventory, verb, "--direct") for _ in range(reps))


def profile_command(inventory: str, *argv: str) -> None:
    """Where one whole ``hypertf`` command's time goes: the command under cProfile (which
    inflates every part), its largest cumulative entries printed."""
    out = Path(inventory).with_suffix(".prof")
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "hypertf.cli",
                    *argv, "-i", inventory], capture_output=True, timeout=300, check=True,
                   env={**os.environ, credentials.IDENTITY_ENV: ""})
    print(f"# profile of `hypertf {' '.join(argv)}` ({time.monotonic() - t0:.2f} s under "
          f"cProfile), by cumulative time:", flush=True)
    print_profile(pstats.Stats(str(out)))


def profile_call(what: str, action: Callable[[], object]) -> None:
    """Where one call's time goes in this process (cProfile), its largest entries printed."""
    profiler = cProfile.Profile()
    t0 = time.monotonic()
    profiler.runcall(action)
    print(f"# profile of {what} ({time.monotonic() - t0:.2f} s under cProfile), by "
          f"cumulative time:", flush=True)
    print_profile(pstats.Stats(profiler))


def print_profile(stats: pstats.Stats, lines: int = 25) -> None:
    stream = io.StringIO()
    stats.stream = stream  # type: ignore[attr-defined]
    stats.strip_dirs().sort_stats("cumulative").print_stats(lines)
    body = stream.getvalue()
    print(body[body.find("ncalls"):].rstrip(), flush=True)


def code_measured() -> str:
    """The checkout whose ``hypertf`` this process imported, and its commit."""
    where = Path(hypertf.__file__).resolve().parent.parent
    done = subprocess.run(["git", "-C", str(where), "log", "-1", "--format=%h %cs"],
                          capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "hypertf"],
                           capture_output=True, text=True).stdout.strip()
    return (f"hypertf from {where} ({done.stdout.strip() or 'no git'}"
            f"{', hypertf/ changed since' if dirty else ''})")


# -- one size ----------------------------------------------------------------------------
class Rows(dict[str, float]):
    """The figures of one size, printed as they come (a 10,000-host run takes minutes)."""

    def __setitem__(self, figure: str, value: float) -> None:
        super().__setitem__(figure, value)
        print(f"  {figure}: {common.fmt(value)}", flush=True)


def measure(size: int, waiters: int, zk: common.ZooKeeperServer, home: Path,
            rows: dict[str, float], kids: common.Children, idle_window: float,
            args: argparse.Namespace, largest_size: bool) -> None:
    root = f"/scale-{size}"
    layout = Layout(root)
    modes = fairshare_modes(args)
    # user_queue_limit 0: the login user's folders hold every running job (3,125 at 25,000
    # hosts) and, with one user, the waiting ones: the quotas auth init sets for it then
    # allow hypertf_job_records_max (10,000) live jobs instead of 200 (since issue 48)
    cluster = replace(ClusterSettings("gpu_nodes", zk.hosts, root, 10.0, "/nonexistent", 5.0),
                      fairshare_half_life=HALF_LIFE[modes[-1]], user_queue_limit=0)
    users = [f"u{i:03d}" for i in range(args.users)] if args.users > 1 else []
    store.secure_cluster(cluster, [], matrix_hosts=size,  # as auth init for SIZE hosts
                         users=users)
    admin = store.connect(cluster, identity="admin")  # stands in for the keeper agent
    client = store.connect(cluster)  # a user's
    names = tuple(host_name(i) for i in range(size))
    largest: dict[str, int] = {}
    try:
        common.register_hosts(admin, root, names)
        t0 = time.monotonic()
        start_agents(kids, zk.hosts, root, size, args.agent_interval)
        rows["start the simulated agents (records created)"] = time.monotonic() - t0
        largest["one agent record"] = len(record(0).to_json())
        t0 = time.monotonic()
        keeper_store, reader = Store(admin, layout), Store(client, layout)  # one session each
        sync_matrix(keeper_store)  # the keeper's first sync
        rows["build the matrix (first sync, writes it)"] = time.monotonic() - t0
        rows["sync the matrix again (no change)"] = timed(lambda: sync_matrix(keeper_store))
        rows["read every agent record (pipelined)"] = timed(lambda: reader.records())
        rows["read the matrix (every shard, pipelined)"] = timed(
            lambda: reader.matrix.read(), 5)
        _, version = reader.matrix.read()
        rows["matrix shards"] = version.shards
        largest["largest shard, all free"] = max(
            len(client.get(layout.matrix_shard(i))[0]) for i in range(version.shards))
        worst = split(held_matrix(size), version.shards)
        largest["largest shard, every GPU its own job (worst case)"] = max(
            len(part.to_json()) for part in worst)

        keeper = KeeperThread(cluster).start()  # admits, as an agent's keeper would
        user = Store(client, layout)

        def cycle(request: Request) -> tuple[float, float]:
            key = new_task_key(credentials.login_user())
            t0 = time.monotonic()
            user.queue.submit(request, key)
            t1 = time.monotonic()
            user.matrix.release(key)
            return t1 - t0, time.monotonic() - t1

        small = Request(slots=(TaskSlot("worker", 0, 1),), hosts=names)
        big = Request(slots=tuple(TaskSlot("worker", i, 8) for i in range(8)), hosts=names)
        passes = cProfile.Profile() if args.profile and largest_size else None
        if passes is not None:  # the keeper thread's passes while the 1-GPU jobs cycle
            keep, profiler = keeper.role.keep, passes

            def profiled() -> list[object]:
                profiler.enable()
                try:
                    return keep()
                finally:
                    profiler.disable()

            keeper.role.keep = profiled  # type: ignore[method-assign]
        for label, request, repeat in (("1-GPU job", small, 7),
                                       ("64-GPU job (8 x 8 GPUs)", big, 3)):
            samples = [cycle(request) for _ in range(repeat)]
            if passes is not None and request is small:
                keeper.role.keep = keep  # type: ignore[method-assign]
                print("# profile of the keeper's passes while 7 1-GPU jobs were submitted "
                      "and released, by cumulative time:", flush=True)
                print_profile(pstats.Stats(passes))
                passes = None
            rows[f"submit -> granted, idle cluster, {label} (p50)"] = statistics.median(
                s[0] for s in samples)
            rows[f"release, {label} (p50)"] = statistics.median(s[1] for s in samples)
        if args.keeper_only:
            keeper.stop()
        else:
            inventory_path = write_inventory(home, size, zk.hosts, root)
            t0 = time.monotonic()
            load_inventory(inventory_path)  # parsed (ansible-core), then cached
            rows["load the inventory, first time (ansible-core parse)"] = time.monotonic() - t0
            rows["load the inventory, unchanged (cache): a command's start"] = timed(
                lambda: load_inventory(inventory_path), 5)
            inventory = load_inventory(inventory_path)
            rows["status: collect"] = timed(lambda: status.collect(client, inventory))
            rows["status: collect, compact view (no GPU details: what the command does past "
                 "64 hosts)"] = timed(lambda: status.collect(client, inventory, gpu_details=False))
            report = status.collect(client, inventory)
            console = Console(file=io.StringIO(), width=250, color_system=None)
            rows["status: render"] = timed(lambda: statustable.render(report, console), 1)
            # The keeper thread has run all along: its view of the hosts (issue 55), which
            # the command reads past 64 hosts; --direct reads every record as before.
            common.wait_until(lambda: status.collect_view(client, inventory), 300,
                              "the keeper's status view")
            rows["status: collect from the keeper's view"] = timed(
                lambda: status.collect_view(client, inventory))
            largest["the status view's largest shard"] = max(
                len(client.get(layout.status_view(i))[0]) for i in range(version.shards))
            cli(inventory_path, "status")  # warm the page cache for the imports
            whole_commands(rows, inventory_path, "status", args.reps,
                           "every record read, as before issue 55")
            if args.profile and largest_size:
                profile_command(inventory_path, "status")
            keeper.stop()

        # Every GPU held by running jobs (with their leases and records), then waiters.
        keys = unique_keys(-(-size // HOSTS_PER_JOB) + waiters)
        running, waiting_keys = keys[:-waiters], keys[-waiters:]
        busy = Matrix(gpus={h: [running[i // HOSTS_PER_JOB]] * GPUS
                            for i, h in enumerate(names)})
        for key in running:
            user.queue.enqueue(key, Request((TaskSlot("worker", 0, 0),), names[:1]), {})
        for first in range(0, len(running), 100):  # as the keeper's admission leaves them
            tx = admin.transaction()  # (a transaction stays far below 1 MiB)
            for key in running[first:first + 100]:
                data, _ = client.get(layout.job(key))
                tx.set_data(layout.job(key), store.encode({**store.decode(data, "job"),
                                                           "state": "allocated"}))
            tx.commit()
        Store(admin, layout).matrix.overwrite(busy)
        request = Request(slots=tuple(TaskSlot("worker", i, 1) for i in range(8)), hosts=names,
                          port_ranges={h: (20000, 20999) for h in names})
        if users:  # the admin enqueues in each user's folder, standing in for their launchers
            waiting_keys = user_keys(users, waiters)
            seed_ledger(admin, layout, users)
        submitter = Store(admin, layout) if users else user
        t0 = time.monotonic()
        for n, key in enumerate(waiting_keys):
            submitter.queue.enqueue(key, request, {"script": "train.py"}, priority=n % 3)
        rows[f"queue {waiters} waiting jobs (lease + record each)"] = time.monotonic() - t0
        largest["a waiting job's record (every host named)"] = len(
            client.get(layout.job(waiting_keys[0]))[0])
        for figure, value in keeper_passes(admin, layout, names, modes, args.reps,
                                           args.profile and largest_size, waiters).items():
            rows[figure] = value
        largest[f"the queue's view ({waiters} waiting)"] = len(
            client.get(layout.queue_view)[0]) if admin.exists(layout.queue_view) else 0
        if args.keeper_only:
            return
        rows["queue: collect"] = timed(lambda: queueview.collect(user))
        rows["queue: render"] = timed(lambda: queueview.render(queueview.collect(user)), 1)
        whole_commands(rows, inventory_path, "queue", args.reps,
                       "the pass run in the command, as before issue 55")
        if args.profile and largest_size:
            profile_command(inventory_path, "queue")

        t0 = time.monotonic()
        Store(admin, layout).matrix.overwrite(joined(worst))  # ZooKeeper takes every shard
        rows["write the worst-case matrix (transactions of <= 512 KB)"] = (
            time.monotonic() - t0)
        for what, size_bytes in largest.items():
            rows[f"{what} (bytes)"] = size_bytes
        rows["the largest znode (bytes)"] = max(largest.values())
        if idle_window:
            idle_writes(zk, size, idle_window, rows, args.agent_interval)
    finally:
        for proc in kids.procs:  # the simulated agents: their sessions simply expire
            proc.kill()
            proc.wait(timeout=30)
        kids.procs.clear()
        store.close(client)
        store.close(admin)


def fairshare_modes(args: argparse.Namespace) -> list[str]:
    """The keeper's fair share settings to measure, in the order of the first round."""
    return {"on": ["on"], "off": ["off"], "both": ["off", "on"]}[
        "off" if args.fairshare_off else args.fairshare]


def user_keys(users: list[str], count: int) -> list[str]:
    """``count`` task keys, round robin over ``users``, none twice."""
    keys: dict[str, None] = {}
    n = 0
    while len(keys) < count:
        key = new_task_key(users[n % len(users)])
        if key not in keys:
            keys[key] = None
            n += 1
    return list(keys)


def seed_ledger(admin: Any, layout: Layout, users: list[str]) -> None:
    """The ledger's summary as the keeper would have left it: user i used i+1 GPU-hours
    (decayed to now), their jobs ran about an hour: every factor differs."""
    now = time.time()
    used = {user: (3600.0 * (i + 1), now) for i, user in enumerate(users)}
    summary = Summary(used, month_of(now), {u: v for u, (v, _) in used.items()}, "",
                      {user: 3600.0 for user in users})
    admin.set(layout.usage, summary.to_json())


def keeper_passes(admin: Any, layout: Layout, names: tuple[str, ...], modes: list[str],
                  reps: int, profile: bool, waiters: int) -> dict[str, float]:
    """The keeper's pass with each fair share setting on the same waiting jobs: a keeper
    (its role, as an agent holding the keeper lease runs it: its record cache follows every
    host by watches) started afresh, its first pass, the pass again (median of ``reps``),
    and ``reps`` passes that each admit one job once 8 GPUs of another host were freed.
    With two settings, two rounds in alternating order (off, on, on, off)."""
    both = len(modes) > 1
    order = modes + modes[::-1] if both else modes
    samples: dict[str, dict[str, list[float]]] = {m: {"first": [], "again": [], "admits": [],
                                                      "admitted": []} for m in modes}
    freed_host = 0
    admits = max(1, min(reps if both else 1, len(names) // len(order)))  # a host each
    for mode in order:
        role = KeeperRole(Store(admin, layout), wake=lambda: None,
                          half_life_s=HALF_LIFE[mode] * DAY_S).start()
        t0 = time.monotonic()
        role.keep()  # the whole pass: with the status view it publishes (issue 55)
        samples[mode]["first"].append(time.monotonic() - t0)
        for _ in range(reps):
            t0 = time.monotonic()
            role.keep()
            samples[mode]["again"].append(time.monotonic() - t0)
        if profile and mode == order[-1]:
            profile_call(f"a keeper pass, {waiters} waiting, nothing to admit (fair share "
                         f"{mode})", role.keep)
        for _ in range(admits):
            matrix, _ = Store(admin, layout).matrix.read()
            matrix.gpus[names[freed_host % len(names)]] = [1] * GPUS
            freed_host += 1
            Store(admin, layout).matrix.overwrite(matrix)
            t0 = time.monotonic()
            decisions = role.keep()
            samples[mode]["admits"].append(time.monotonic() - t0)
            samples[mode]["admitted"].append(sum(d.admitted for d in decisions))
        role.stop()
    rows: dict[str, float] = {}
    for mode in modes:
        tag = f" (fair share {mode})" if both else ""
        got = samples[mode]
        rows[f"keeper pass, {waiters} waiting, nothing to admit: first{tag}"] = \
            statistics.median(got["first"])
        rows[f"keeper pass, {waiters} waiting, nothing to admit: again{tag}"] = \
            statistics.median(got["again"])
        rows[f"keeper pass, {waiters} waiting, 8 GPUs freed: admits{tag}"] = \
            statistics.median(got["admits"])
        rows[f"  jobs admitted by that pass{tag}"] = statistics.median(got["admitted"])
    if both:
        for what in ("nothing to admit: first", "nothing to admit: again",
                     "8 GPUs freed: admits"):
            figure = f"keeper pass, {waiters} waiting, {what}"
            rows[f"{figure}, ratio fair share on / off"] = (
                rows[f"{figure} (fair share on)"] / rows[f"{figure} (fair share off)"])
    return rows


def idle_writes(zk: common.ZooKeeperServer, size: int, window: float,
                rows: dict[str, float], interval: float) -> None:
    """ZooKeeper's transactions per second while only the simulated agents run (idle:
    their records do not change, so each writes its keep-alive only)."""
    before = int(common.zk_stat(zk)["zxid"])
    t0 = time.monotonic()
    time.sleep(window)
    after = int(common.zk_stat(zk)["zxid"])
    rows[f"ZooKeeper writes/s from idle agents ({size:,} hosts, {interval:g} s interval, "
         f"{window:.0f} s window)"] = (after - before) / (time.monotonic() - t0)


def goal_of(figure: str, waiters: int) -> tuple[str, float] | None:
    for name, goal in sorted(GOALS.items(), key=lambda item: -len(item[0])):  # longest first
        if figure.startswith(name.format(waiters=waiters)):
            return goal
    return None


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--agents":
        return agents_main(sys.argv[2:])
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                   help="host counts (default 10,1000,25000; --quick: 10,200)")
    p.add_argument("--reps", type=int, default=3,
                   help="runs of each whole command (hypertf status, queue), median taken")
    p.add_argument("--agent-interval", type=float, default=AGENT_INTERVAL,
                   help="the simulated agents' hypertf_agent_interval in seconds (default: "
                   "the lab's 1 s; the inventory's default is 5 s: keep-alives every "
                   "45-60 s instead of 22.5-30 s)")
    p.add_argument("--profile", action="store_true",
                   help="at the largest size, also print where `hypertf status` and "
                   "`hypertf queue` (the whole commands) and a keeper pass spend their "
                   "time (cProfile)")
    p.add_argument("--users", type=int, default=1,
                   help="spread the waiting jobs over this many users (default 1: the login "
                   "user, as before; issue 51's figure: 100)")
    p.add_argument("--fairshare", choices=("on", "off", "both"), default="on",
                   help="the keeper's fair share: on (hypertf_fairshare_half_life 7, the "
                   "default), off (0) or both, side by side on the same waiting jobs")
    p.add_argument("--fairshare-off", action="store_true", help="the same as --fairshare off")
    p.add_argument("--keeper-only", action="store_true",
                   help="only what the keeper's pass needs: no inventory, no hypertf status "
                   "or queue, no idle agents' writes")
    args: argparse.Namespace = p.parse_args()
    sizes = args.sizes or ([10, 200] if args.quick else [10, 1000, 25000])
    waiters = 20 if args.quick else 1000
    window = 5.0 if args.quick else 65.0  # the keep-alive: 30 intervals, at most 60 s
    report = common.Report("scale", args)
    report.start()
    measured = code_measured()
    print(f"# {measured}", flush=True)
    rows: dict[int, dict[str, float]] = {}
    top, low = max(sizes), min(sizes)
    with common.bench_home("scale") as home, common.zookeeper(home, heap="2g") as zk, \
            common.children() as kids:
        for size in sizes:
            print(f"# {size:,} hosts x {GPUS} GPUs ({shard_count(size)} shards), "
                  f"{waiters} waiting", flush=True)
            rows[size] = Rows()
            measure(size, waiters, zk, home, rows[size], kids,
                    window if size == top and not args.keeper_only else 0.0, args,
                    size == top)
    label = " / ".join(f"{s:,}" for s in sizes)
    for figure in rows[top]:
        raw = [rows[s].get(figure, float("nan")) for s in sizes]
        plain = ("bytes" in figure or "shards" in figure or "admitted" in figure
                 or "writes/s" in figure or "ratio" in figure)
        values = raw if plain else [1000 * v for v in raw]
        unit = "bytes" if "bytes" in figure else "/s" if "writes/s" in figure else \
            "x" if "ratio" in figure else "" if plain else "ms"
        shown = " / ".join(common.fmt(v if not plain else
                                      (int(v) if v == v and v == int(v) else v))
                           for v in values)
        report.add(f"{figure} ({label} hosts)", shown, unit, goal=goal_of(figure, waiters),
                   judged=values[sizes.index(top)],
                   goal_where=f"at {top:,} hosts",
                   **{f"at_{s}": v for s, v in zip(sizes, values, strict=True)})
        if not plain and low != top and rows[low].get(figure):
            report.add(f"  ratio {top:,}/{low:,} hosts",
                       common.ratio(rows[top][figure], rows[low][figure]), "x")
    report.note(measured)
    report.note(f"ZooKeeper 3.8 on loopback, tickTime 500 ms, 2 GB heap; {SESSIONS} writer "
                f"processes simulate the agents ({args.agent_interval:g} s interval, the "
                f"agent's WritePolicy); timings are medians of 3 (matrix read and warm "
                f"inventory load: 5; 1-GPU submit: 7; 64-GPU submit: 3; whole commands: "
                f"{args.reps}; first inventory load, render and first keeper pass: 1); "
                f"the whole commands include Python's start and imports; goals (issue 43 "
                f"item 2) are judged at {top:,} hosts; waiting jobs of {args.users} user(s); "
                f"the keeper's fair share {' and '.join(fairshare_modes(args))}")
    report.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
