"""Offload: local vs offloaded matrix products, the shared-memory hop, MPI vs a raw socket,
and the cost model's prediction for a real cluster.

* local vs offloaded: C = A @ B in fp32 for n = 512 ... 8192 (quick: 512 and 1024), locally
  with numpy (the BLAS on all cores) and through the channel to an agent with 1, 2 and 4
  processors (quick: 1 and 2); every offloaded result is checked against the local one;
* the shared-memory hop alone (operands into the segment, the semaphore round trip with the
  agent, the result out) beside a memcpy of the same bytes (goal: at most 1.5x);
* MPI (mpiexec, two ranks) moving a buffer beside a raw TCP socket on loopback moving the
  same bytes between the same two processes;
* the cost model (hypertf.offload.plan.CostModel) fitted on these figures, its prediction
  beside the measured offload times, and its prediction for 4 hosts x 64 cores on 25 Gb/s.

On this machine the processors share its few cores with the agent and with each other: the
offloaded products cannot be faster than the local ones here, and the bench says so.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import numpy as np

from hypertf.offload import channel as channel_module
from hypertf.offload.channel import PING, ClientChannel, Header, layout
from hypertf.offload.plan import CostModel
from hypertf.offload.world import World, loopback_env, private_network, world


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def hop(channel: ClientChannel, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The hop without the product: operands in, a PING round trip, C's bytes out."""
    batch, (m, k), n = 1, a.shape, b.shape[1]
    _, _, _, need = layout(batch, m, k, n, 4)
    channel.ensure(need, 30)
    head = Header(op=PING, dtype=0, batch=batch, m=m, k=k, n=n, generation=channel.generation)
    va, vb, vc = channel.arrays(head)
    va[0] = a
    vb[0] = b
    channel.call(head, 30)
    return vc.copy()


# -- MPI vs a raw socket: this file run as two MPI ranks -----------------------------------
def pingpong(size: int, repeat: int) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    buf = np.zeros(size, np.uint8)
    ack = np.zeros(1, np.uint8)
    mpi_times, sock_times = [], []
    if comm.rank == 0:
        listener = socket.create_server(("127.0.0.1", 0))
        comm.send(listener.getsockname()[1], dest=1)
        conn, _ = listener.accept()
        view = memoryview(buf)
        for _ in range(repeat):
            started = time.perf_counter()
            comm.Send(buf, dest=1)
            comm.Recv(ack, source=1)
            mpi_times.append(time.perf_counter() - started)
        for _ in range(repeat):
            started = time.perf_counter()
            conn.sendall(view)
            conn.recv(1)
            sock_times.append(time.perf_counter() - started)
        conn.close()
        listener.close()
        print(json.dumps({"mpi_s": min(mpi_times), "socket_s": min(sock_times)}), flush=True)
    else:
        port = comm.recv(source=0)
        conn = socket.create_connection(("127.0.0.1", port))
        for _ in range(repeat):
            comm.Recv(buf, source=0)
            comm.Send(ack, dest=0)
        view = memoryview(buf)
        for _ in range(repeat):
            got = 0
            while got < size:
                got += conn.recv_into(view[got:], size - got)
            conn.sendall(b"k")
        conn.close()
    return 0


def mpi_vs_socket(size: int, repeat: int) -> dict[str, float]:
    env = {**os.environ, **loopback_env()}
    out = subprocess.run(
        [*private_network(), "mpiexec", "-launcher", "fork", "-hosts", "localhost", "-iface",
         "lo", "-n", "2", sys.executable, __file__, "--pingpong", str(size),
         "--repeat", str(repeat)],
        env=env, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- --pin: what a weak node gains from K helpers ----------------------------------------------
PINNED = "HYPERTF_BENCH_PINNED"  # set once this process runs on the task's cores
GOAL = ("16 cores, C = 2, 3 processors of 4 cores: offloaded >= 2x faster than local for "
        "n >= 4,096, and within 1.3x of the model")


def pin_plan(cpus: list[int], task_cores: int | None,
             processors: int | None) -> tuple[list[int], list[list[int]]]:
    """The task's C CPUs (default 2 from 8 CPUs up, else 1) and K disjoint sets of the
    others, one per processor (default: up to 3 of 4 CPUs each; at least 1 of 1)."""
    c = task_cores or (2 if len(cpus) >= 8 else 1)
    if not 0 < c < len(cpus):
        raise SystemExit(f"--task-cores {c}: this machine has {len(cpus)} CPUs; leave at "
                         f"least one to the processors")
    rest = cpus[c:]
    k = processors or max(1, min(3, len(rest) // 4))
    if k > len(rest):
        raise SystemExit(f"--processors {k}: only {len(rest)} CPUs are left after the task's")
    each = len(rest) // k
    return cpus[:c], [rest[i * each:(i + 1) * each] for i in range(k)]


def pin_self(task: list[int]) -> None:
    """Run this bench again on the task's CPUs, its BLAS with as many threads: the thread
    count is read when numpy loads, and a thread keeps the CPUs it was created with."""
    if os.environ.get(PINNED) == "1":
        return
    threads = str(len(task))
    os.environ.update({PINNED: "1", "OMP_NUM_THREADS": threads,
                       "OPENBLAS_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
    os.sched_setaffinity(0, task)
    os.execv(sys.executable, [sys.executable, __file__, *sys.argv[1:]])


def pinned(args) -> int:
    """Local on C CPUs vs offloaded to K processors on CPUs of their own, n = 1,024 ...
    8,192 (quick: 1,024), the model's prediction beside each, the hop vs a memcpy."""
    cpus = sorted(os.sched_getaffinity(0)) if os.environ.get(PINNED) != "1" else sorted(
        int(c) for c in os.environ["HYPERTF_BENCH_CPUS"].split(","))
    task, sets = pin_plan(cpus, args.task_cores, args.processors)
    os.environ["HYPERTF_BENCH_CPUS"] = ",".join(map(str, cpus))
    pin_self(task)
    sizes = [1024] if args.quick else [1024, 2048, 4096, 8192]
    repeat = 2 if args.quick else 3
    report = common.Report("offload", args)
    report.start()
    report.note(f"pinned: the task (and its agent) on CPUs {task}, {len(sets)} processor(s) on "
                f"{' | '.join(','.join(map(str, s)) for s in sets)}")
    rng = np.random.default_rng(0)
    local: dict[int, float] = {}
    offloaded: dict[int, float] = {}
    for n in sizes:
        a, b = (rng.random((n, n), np.float32) for _ in range(2))
        local[n] = best(lambda a=a, b=b: a @ b, repeat if n <= 4096 else 1)
        report.add(f"local n={n} on {len(task)} CPU(s)", 1000 * local[n], "ms",
                   gflops=2 * n**3 / local[n] / 1e9)
    per_cpu = 2 * sizes[-1] ** 3 / local[sizes[-1]] / len(task)
    moved = mpi_vs_socket(16 << 20, 3)
    link = (16 << 20) / moved["mpi_s"]
    pin = tuple(",".join(map(str, s)) for s in (task, *sets))
    with tempfile.TemporaryDirectory(prefix="bench-offload-") as tmp:
        w = World(channel_module.new_name(), len(sets), Path(tmp), pin=pin)
        try:
            w.start(60)
            channel = ClientChannel.attach(w.channel)
            try:
                n = 2048 if not args.quick else 1024
                a, b = (rng.random((n, n), np.float32) for _ in range(2))
                hop_s = best(lambda: hop(channel, a, b), 10)
                src = np.concatenate([a.ravel(), b.ravel(), a.ravel()])
                copy = np.empty_like(src)
                memcpy_s = best(lambda: np.copyto(copy, src), 10)
                report.add(f"shared-memory hop n={n} ({src.nbytes >> 20} MiB)", 1000 * hop_s,
                           "ms")
                report.add("memcpy of the same bytes", 1000 * memcpy_s, "ms")
                report.add("ratio hop/memcpy (goal <= 1.5)", common.ratio(hop_s, memcpy_s), "x")
                model = CostModel(host_flops=per_cpu * len(sets[0]),
                                  local_flops=per_cpu * len(task), link_bytes_s=link,
                                  hop_bytes_s=src.nbytes / hop_s)
                for n in sizes:
                    a, b = (rng.random((n, n), np.float32) for _ in range(2))
                    out = channel.matmul(a, b, 600)  # warm: the segment sized
                    error = float(np.abs(out - a @ b).max() / max(np.abs(a @ b).max(), 1))
                    offloaded[n] = best(lambda a=a, b=b: channel.matmul(a, b, 600),
                                        repeat if n <= 4096 else 1)
                    predicted = model.offload_s(n, n, n, len(sets))
                    report.add(f"offloaded n={n} on {len(sets)} processor(s)",
                               1000 * offloaded[n], "ms", relative_error=error,
                               model_ms=round(1000 * predicted, 2))
                    report.add(f"speed-up local/offloaded n={n} (goal >= 2 from 4,096)",
                               common.ratio(local[n], offloaded[n]), "x")
                    report.add(f"measured/model n={n} (goal <= 1.3)",
                               common.ratio(offloaded[n], predicted), "x")
            finally:
                channel.close()
        finally:
            w.stop()
    report.note(f"model: {per_cpu / 1e9:.1f} Gflop/s per CPU (measured locally on the task's "
                f"CPUs) x {len(sets[0])} per processor, {link / 1e9:.2f} GB/s MPI on loopback, "
                f"the hop as measured")
    report.note(f"goal: {GOAL}")
    if len(cpus) < 8:
        report.note(f"this machine has {len(cpus)} CPUs: it cannot show a speed-up (the task "
                    f"keeps {len(task)}, {len(sets)} processor(s) get the rest); run it on 8 "
                    f"or more (README 'Measured')")
    elif not args.quick:
        met = all(local[n] / offloaded[n] >= 2 for n in sizes if n >= 4096)
        report.note(f"speed-up goal {'met' if met else 'NOT met'} on {len(cpus)} CPUs")
    report.finish()
    return 0


def main() -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--pingpong", type=int, help=argparse_hidden())
    p.add_argument("--repeat", type=int, default=5, help=argparse_hidden())
    p.add_argument("--pin", action="store_true",
                   help="pin the task to --task-cores CPUs and each processor to CPUs of its "
                        "own: local vs offloaded as a weak node helped by others would see it")
    p.add_argument("--task-cores", type=int, metavar="C",
                   help="with --pin: the task's CPUs (default 2 on 8+ CPUs, else 1)")
    p.add_argument("--processors", type=int, metavar="K",
                   help="with --pin: processors (default: up to 3 of 4 CPUs each)")
    args = p.parse_args()
    if args.pingpong:
        return pingpong(args.pingpong, args.repeat)
    if args.pin:
        return pinned(args)
    sizes = [512, 1024] if args.quick else [512, 1024, 2048, 4096, 8192]
    counts = [1, 2] if args.quick else [1, 2, 4]
    repeat = 2 if args.quick else 3
    report = common.Report("offload", args)
    report.start()
    cores = os.cpu_count() or 1
    rng = np.random.default_rng(0)
    operands = {n: (rng.random((n, n), np.float32), rng.random((n, n), np.float32))
                for n in sizes}
    local = {}
    for n in sizes:
        a, b = operands[n]
        local[n] = best(lambda a=a, b=b: a @ b, repeat if n <= 4096 else 1)
        report.add(f"local n={n}", 1000 * local[n], "ms", gflops=2 * n**3 / local[n] / 1e9)
    local_flops = 2 * sizes[-1] ** 3 / local[sizes[-1]]
    offloaded: dict[tuple[int, int], float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-offload-") as tmp:
        for count in counts:
            # the processors' BLAS threads share this machine's cores between them
            os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(
                max(1, cores // count))
            with world(count, Path(tmp), timeout=60) as w:
                channel = ClientChannel.attach(w.channel)
                try:
                    for n in sizes:
                        a, b = operands[n]
                        out = channel.matmul(a, b, 600)  # warm: the segment sized
                        error = float(np.abs(out - a @ b).max() / max(np.abs(a @ b).max(), 1))
                        took = best(lambda a=a, b=b, c=channel: c.matmul(a, b, 600),
                                    repeat if n <= 4096 else 1)
                        offloaded[(count, n)] = took
                        report.add(f"offloaded n={n} on {count} processor(s)", 1000 * took,
                                   "ms", relative_error=error)
                        report.add(f"ratio offloaded/local n={n}, {count} processor(s)",
                                   common.ratio(took, local[n]), "x")
                    if count == counts[0]:
                        n = sizes[-1] if args.quick else 2048
                        a, b = operands[n]
                        hop_s = best(lambda a=a, b=b, c=channel: hop(c, a, b), 10)
                        copy = np.empty(3 * n * n, np.float32)
                        src = np.concatenate([a.ravel(), b.ravel(), a.ravel()])
                        memcpy_s = best(lambda d=copy, s=src: np.copyto(d, s), 10)
                        report.add(f"shared-memory hop n={n} ({3 * n * n * 4 >> 20} MiB)",
                                   1000 * hop_s, "ms")
                        report.add("memcpy of the same bytes", 1000 * memcpy_s, "ms")
                        report.add("ratio hop/memcpy (goal <= 1.5)",
                                   common.ratio(hop_s, memcpy_s), "x")
                finally:
                    channel.close()
    os.environ.pop("OMP_NUM_THREADS", None)
    os.environ.pop("OPENBLAS_NUM_THREADS", None)

    size = (16 << 20) if args.quick else (64 << 20)
    moved = mpi_vs_socket(size, 3 if args.quick else 10)
    report.add(f"MPI send of {size >> 20} MiB (2 ranks, loopback)", 1000 * moved["mpi_s"], "ms",
               gbytes_s=size / moved["mpi_s"] / 1e9)
    report.add(f"raw TCP socket, {size >> 20} MiB", 1000 * moved["socket_s"], "ms",
               gbytes_s=size / moved["socket_s"] / 1e9)
    report.add("ratio MPI/socket", common.ratio(moved["mpi_s"], moved["socket_s"]), "x")

    # The model, fitted on this run: a processor's flop rate from the largest product on one
    # processor (its time bounds the compute from above), the link from the MPI figure.
    link = size / moved["mpi_s"]
    largest = sizes[-1]
    host_flops = 2 * largest**3 / offloaded[(counts[0], largest)]
    here = CostModel(host_flops=host_flops, local_flops=local_flops, link_bytes_s=link)
    for (count, n), took in sorted(offloaded.items()):
        if n == sizes[-1]:
            report.add(f"model/measured n={n}, {count} processor(s)",
                       common.ratio(here.offload_s(n, n, n, count), took), "x")
    per_core = local_flops / cores
    cluster = CostModel(host_flops=64 * per_core, local_flops=64 * per_core,
                        link_bytes_s=25e9 / 8)
    cross = cluster.crossover(hosts=4)
    report.add("model: 4 hosts x 64 cores, 25 Gb/s: crossover n",
               cross if cross is not None else "none up to 65536")
    for n in (4096, 8192, 16384):
        report.add(f"model: 4 hosts x 64 cores, 25 Gb/s: speed-up ratio at n={n}",
                   cluster.speedup(n, 4), "x")
    report.note(f"this machine has {cores} CPU cores: the processors share them with the agent "
                "and each other, so no speed-up is expected here; the offloaded/local ratios "
                "show the offload's overhead, not what K real hosts give (see the model)")
    report.note(f"model fitted here: {here.host_flops / 1e9:.1f} Gflop/s per processor, "
                f"{link / 1e9:.2f} GB/s MPI link; the cluster case assumes "
                f"{per_core / 1e9:.1f} Gflop/s per core (this machine's) x 64")
    report.finish()
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
