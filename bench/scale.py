"""Scale: the matrix, allocation and status with 1000 hosts x 8 GPUs of agent records.

Real AgentRecord JSON (8 GPUs each, as the agent writes it) is published as ephemeral
znodes from 4 sessions on a ZooKeeper of our own; an inventory of as many hosts is written
(loopback addresses: nothing is ever sent to them). The same steps run at 10, 100 and 1000
hosts, so every figure has its 1000/10 ratio beside it:

read every record; build the matrix (first sync, which writes it) and sync it again (no
change); allocate and release a 1-GPU job and a 64-GPU job (8 workers x 8 GPUs); load the
inventory; ``status.collect`` and ``status.render``; a plain ``get`` of the matrix as the
one-round-trip floor.

The ``matrix`` znode is measured free and fully held (every GPU its own job, one reserved
port each: the worst case), against ZooKeeper's default ``jute.maxbuffer`` (1 MiB - 1
byte; the whole request packet counts). The host count where it crosses the limit is
extrapolated, then checked: a matrix just under it is written, one just over it is
refused; and an ``allocate`` that would push the stored matrix over the limit is run to see
what the user gets.
"""

from __future__ import annotations

import io
import json
import statistics
import time
from collections.abc import Callable

import common
import yaml
from kazoo.exceptions import KazooException
from rich.console import Console

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.config.settings import ClusterSettings
from hypertf.core.errors import StoreError
from hypertf.core.matrix import Matrix
from hypertf.core.placement import Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.store import AgentRecord, GpuInfo, Layout, Store, auth, status
from hypertf.store.allocation import release, sync_matrix
from hypertf.store.jobs import read_job
from hypertf.store.keeper import KeeperThread
from hypertf.store.waitqueue import Admitter, enqueue, submit

GPUS = 8
JUTE_MAXBUFFER = 0xFFFFF  # ZooKeeper's default, 1 MiB - 1 byte
SESSIONS = 4


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


def write_inventory(home, size: int, zk_hosts: str, root: str) -> str:
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


def read_records_pipelined(client, layout: Layout) -> dict[str, AgentRecord]:
    """What Store.records could do: every get sent at once, answers collected after."""
    hosts = client.get_children(layout.hosts)
    pending = [(host, client.get_async(layout.resource(host))) for host in hosts]
    return {host: AgentRecord.from_json(result.get(timeout=30)[0]) for host, result in pending}


def held_matrix(size: int) -> Matrix:
    """Every GPU held by its own job, one reserved port per job: the largest matrix."""
    matrix = Matrix()
    for i in range(size):
        keys = [new_task_key(auth.login_user()) for _ in range(GPUS)]
        matrix.gpus[host_name(i)] = keys
        matrix.ports[host_name(i)] = {str(20000 + g): keys[g] for g in range(GPUS)}
    return matrix


def free_matrix(size: int) -> Matrix:
    return Matrix(gpus={host_name(i): [1] * GPUS for i in range(size)})


def measure(size: int, zk_hosts: str, home, report_rows: dict) -> None:
    root = f"/scale-{size}"
    layout = Layout(root)
    cluster = ClusterSettings("gpu_nodes", zk_hosts, root, 10.0, "/nonexistent", 5.0)
    store.secure_cluster(cluster, [])  # a secured root, as in production
    agents = [store.connect(cluster, identity="admin") for _ in range(SESSIONS)]  # stand-ins
    client = store.connect(cluster)
    rows = report_rows.setdefault(size, {})
    try:
        common.register_hosts(agents[0], root, [host_name(i) for i in range(size)])
        t0 = time.monotonic()
        pending = [agents[i % SESSIONS].create_async(layout.resource(host_name(i)),
                                                     record(i).to_json(), ephemeral=True)
                   for i in range(size)]
        for result in pending:
            result.get(timeout=60)
        rows["publish every record (async, 4 sessions)"] = time.monotonic() - t0
        rows["one agent record"] = len(record(0).to_json())
        t0 = time.monotonic()
        sync_matrix(Store(agents[0], layout))  # the keeper's first sync
        rows["build the matrix (first sync, writes it)"] = time.monotonic() - t0
        rows["read every agent record"] = timed(lambda: Store(client, layout).records())
        rows["read every agent record, pipelined (get_async)"] = timed(
            lambda: read_records_pipelined(client, layout))
        rows["sync the matrix again (no change)"] = timed(
            lambda: sync_matrix(Store(agents[0], layout)))
        rows["plain get of the matrix (1 round trip)"] = timed(
            lambda: client.get(layout.matrix), 20)
        rows["matrix znode, all free"] = len(client.get(layout.matrix)[0])
        hosts = tuple(host_name(i) for i in range(size))

        keeper = KeeperThread(cluster).start()  # admits the jobs, as an agent's keeper would

        def cycle(request: Request) -> tuple[float, float]:
            key = new_task_key(auth.login_user())
            t0 = time.monotonic()
            submit(Store(client, layout), request, key)
            t1 = time.monotonic()
            release(Store(client, layout), key)
            return t1 - t0, time.monotonic() - t1

        small = Request(slots=(TaskSlot("worker", 0, 1),), hosts=hosts)
        big = Request(slots=tuple(TaskSlot("worker", i, 8) for i in range(8)), hosts=hosts)
        for label, request in (("1-GPU job", small), ("64-GPU job (8 x 8 GPUs)", big)):
            samples = [cycle(request) for _ in range(3)]
            rows[f"allocate a {label}"] = statistics.median(s[0] for s in samples)
            rows[f"release a {label}"] = statistics.median(s[1] for s in samples)
        keeper.stop()
        inventory_path = write_inventory(home, size, zk_hosts, root)
        load_inventory(inventory_path)  # the first load also imports ansible-core
        rows["load the inventory (ansible-core parser)"] = timed(
            lambda: load_inventory(inventory_path), 1)
        inventory = load_inventory(inventory_path)
        rows["status: collect"] = timed(lambda: status.collect(client, inventory))
        report = status.collect(client, inventory)
        console = Console(file=io.StringIO(), width=250, color_system=None)
        rows["status: render the table"] = timed(lambda: status.render(report, console), 1)
        held = held_matrix(size).to_json()
        rows["matrix znode, every GPU its own job (worst case)"] = len(held)
        t0 = time.monotonic()
        agents[0].set(layout.matrix, held)  # only agents and the admin write it
        rows["write the worst-case matrix"] = time.monotonic() - t0
    finally:
        store.close(client)
        for agent in agents:
            store.close(agent)


def limit_checks(zk_hosts: str, per_host_held: float, base: float, report: common.Report,
                 ) -> None:
    """Write matrices just under and just over the limit; then an allocate that crosses it."""
    root = "/scale-limit"
    layout = Layout(root)
    cluster = ClusterSettings("gpu_nodes", zk_hosts, root, 10.0, "/nonexistent", 5.0)
    store.secure_cluster(cluster, [])  # a secured root (with an empty matrix)
    client = store.connect(cluster)
    agents = store.connect(cluster, identity="admin")  # stands in for an agent
    try:
        crossing = int((JUTE_MAXBUFFER - base) / per_host_held)
        for hosts, label in ((int(crossing * 0.97), "3% under"), (int(crossing * 1.03),
                                                                   "3% over")):
            matrix = held_matrix(hosts)
            try:
                data = matrix.to_json()
                agents.set(layout.matrix, data)
                outcome = "written"
            except StoreError as err:  # HyperTF's own check, before ZooKeeper sees it
                data = json.dumps({"gpus": matrix.gpus, "ports": matrix.ports}).encode()
                outcome = f"refused by HyperTF before sending: {err!s:.60}..."
            except KazooException as err:
                outcome = f"refused: {type(err).__name__} (the server drops the connection)"
            common.wait_until(lambda: agents.connected, 30, "the client to reconnect", 0.05)
            report.add(f"worst-case matrix of {hosts:,} hosts ({len(data):,} bytes, {label} "
                       f"the extrapolated crossing)", outcome)
        # A stored matrix a few hundred bytes under the limit (rows of hosts that left keep
        # their cells, so they stay in the matrix), one live agent, then a 1-GPU allocate.
        agent = record(0)
        common.register_hosts(agents, root, [agent.host])
        agents.create(layout.resource(agent.host), agent.to_json(), ephemeral=True)
        matrix = Matrix(gpus={agent.host: [1] * GPUS})
        target = store.MAX_ZNODE_BYTES - 400  # what HyperTF itself still writes
        row = len(b'"gone000000":[0,0,0,0,0,0,0,0],')
        for filler in range((target - len(matrix.to_json())) // row):
            matrix.gpus[f"gone{filler:06d}"] = [0] * GPUS
        remaining = target - len(matrix.to_json()) - len(b',"tune":[]')
        matrix.gpus["tune"] = [0] * max(0, remaining // 2)  # ",0" per cell
        # registered hosts whose agents are gone: the keeper keeps their rows
        common.register_hosts(agents, root, list(matrix.gpus))
        agents.set(layout.matrix, matrix.to_json())
        stored = len(client.get(layout.matrix)[0])
        request = Request(slots=(TaskSlot("worker", 0, 1),), hosts=(agent.host,))
        t0 = time.monotonic()
        key = new_task_key(auth.login_user())
        enqueue(Store(client, layout), key, request, {})
        try:  # the keeper's pass, as an agent's keeper runs it
            Admitter(Store(agents, layout)).keep()
            outcome = (read_job(Store(client, layout), key) or {}).get("state", "?")
        except Exception as err:
            outcome = f"{type(err).__module__}.{type(err).__name__}" + (
                f": {err!s:.80}" if str(err) else " (no message)")
        report.add(f"admit 1 GPU with the stored matrix at {stored:,} bytes "
                   f"({time.monotonic() - t0:.2f} s)", outcome)
    finally:
        store.close(client)
        store.close(agents)


def main() -> int:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    sizes = [10, 200] if args.quick else [10, 100, 1000]
    report = common.Report("scale", args)
    report.start()
    rows: dict[int, dict[str, float]] = {}
    with common.bench_home("scale") as home, common.zookeeper(home, heap="512m") as zk:
        for size in sizes:
            print(f"# {size} hosts x {GPUS} GPUs", flush=True)
            measure(size, zk.hosts, home, rows)
        top, low = max(sizes), min(sizes)
        print()
        sizes_label = " / ".join(str(s) for s in sizes)
        for figure, value in rows[top].items():
            is_bytes = "znode" in figure or figure == "one agent record"
            values = [rows[s][figure] if is_bytes else 1000 * rows[s][figure] for s in sizes]
            shown = " / ".join(f"{v:,.0f}" if is_bytes else common.fmt(v) for v in values)
            per_size = {f"at_{s}": v for s, v in zip(sizes, values, strict=True)}
            report.add(f"{figure} ({sizes_label} hosts)", shown,
                       "bytes" if is_bytes else "ms", **per_size)
            if figure != "one agent record":
                report.add(f"  ratio {top}/{low} hosts", common.ratio(value, rows[low][figure]),
                           "x")
        report.add(f"{top} hosts: bytes read per allocate or release (every record)",
                   int(rows[top]["one agent record"] * top), "bytes")
        free_small, free_big = (rows[s]["matrix znode, all free"] for s in (low, top))
        held_small, held_big = (rows[s]["matrix znode, every GPU its own job (worst case)"]
                                for s in (low, top))
        per_free = (free_big - free_small) / (top - low)
        per_held = (held_big - held_small) / (top - low)
        base_free = free_big - per_free * top
        base_held = held_big - per_held * top
        report.add(f"matrix bytes per host ({GPUS} GPUs), all free", per_free, "bytes")
        report.add(f"matrix bytes per host ({GPUS} GPUs), worst case", per_held, "bytes")
        report.add(f"{top} hosts: matrix all free / 1 MiB limit",
                   100 * free_big / JUTE_MAXBUFFER, "%")
        report.add(f"{top} hosts: matrix worst case / 1 MiB limit",
                   100 * held_big / JUTE_MAXBUFFER, "%")
        report.add("hosts where the matrix crosses 1 MiB, all free (extrapolated)",
                   int((JUTE_MAXBUFFER - base_free) / per_free))
        report.add("hosts where the matrix crosses 1 MiB, worst case (extrapolated)",
                   int((JUTE_MAXBUFFER - base_held) / per_held))
        limit_checks(zk.hosts, per_held, base_held, report)
    report.note("ZooKeeper on loopback, tickTime 500 ms, 512 MB heap; timings are medians of "
                "3 (the plain get: 20; inventory load and render: 1)")
    report.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
