"""The compute agent beside a task: MPI rank 0 of the offload world.

It serves the task's channel (shared memory, see channel.py). Each product is cut by the
shard plan (plan.py) and its shards go round-robin to the processors (ranks 1..K), at most
``depth`` in flight per processor, so one shard travels while the one before computes. A
receiver thread takes result shards off MPI into a queue while an accumulator thread copies
(row split) or adds (k split) them into C in the shared segment; then the client is told.

Started by mpiexec as ``python -m hypertf.offload.agent --channel NAME`` with the
processors as the other ranks; it stops on SIGTERM/SIGINT (mpiexec forwards them), tells the
processors to stop, and unlinks its shared memory and semaphores.
"""

from __future__ import annotations

import argparse
import json
import queue
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from hypertf.offload import wire
from hypertf.offload.channel import FAILED, MATMUL, PING, RESIZE, Header, ServerChannel
from hypertf.offload.plan import CostModel, Plan, make_plan

DEPTH = 2  # shards in flight per processor: one computing, one on the wire


class Agent:
    """Rank 0: the channel on one side, the processors on the other."""

    def __init__(self, comm: Any, channel: ServerChannel, depth: int = DEPTH) -> None:
        self.comm = comm
        self.channel = channel
        self.depth = depth
        self.workers = comm.size - 1
        self.model: CostModel | None = None
        self.products = 0
        self.bytes = 0
        self.seconds = 0.0

    # -- calibration: the measured rates the shard size is chosen from ------------------
    def calibrate(self, size: int = 256, payload: int = 4 << 20) -> CostModel:
        head = np.zeros(wire.TASK_FIELDS, np.int64)
        head[0] = size
        self.comm.Send(head, dest=1, tag=wire.CALIBRATE)
        took = np.empty(1)
        self.comm.Recv(took, source=1, tag=wire.CALIBRATE)
        host_flops = 2 * size**3 / max(float(took[0]), 1e-9)
        buf = np.zeros(payload, np.uint8)
        ack = np.empty(1, np.uint8)
        head[0] = payload
        started = time.perf_counter()
        self.comm.Send(head, dest=1, tag=wire.ECHO)
        self.comm.Send(buf, dest=1, tag=wire.ECHO)
        self.comm.Recv(ack, source=1, tag=wire.ECHO)
        link = payload / max(time.perf_counter() - started, 1e-9)
        self.model = CostModel(host_flops=host_flops, local_flops=host_flops, link_bytes_s=link)
        return self.model

    # -- one product ----------------------------------------------------------------------
    def matmul(self, head: Header) -> None:
        a, b, c = self.channel.arrays(head)
        plan = make_plan(head.batch, head.m, head.k, head.n, self.workers, self.model,
                         a.dtype.itemsize)
        started = time.perf_counter()
        self.run(plan, a, b, c, product=head.seq)
        self.seconds += time.perf_counter() - started
        self.products += 1
        self.bytes += a.nbytes + b.nbytes + c.nbytes

    def run(self, plan: Plan, a: np.ndarray, b: np.ndarray, c: np.ndarray, product: int) -> None:
        if plan.accumulate:
            c[...] = 0
        comm = self.comm
        shards = {s.index: s for s in plan.shards}
        in_flight = [0] * (self.workers + 1)
        cond = threading.Condition()
        results: queue.Queue[tuple[int, np.ndarray] | None] = queue.Queue()
        errors: list[BaseException] = []

        def receive() -> None:
            try:
                head = np.empty(2, np.int64)
                from mpi4py import MPI

                status = MPI.Status()
                for _ in range(len(shards)):
                    wire.poll(comm, MPI.ANY_SOURCE, wire.RESULT, status, idle_max_s=0.0005)
                    source = status.Get_source()
                    comm.Recv(head, source=source, tag=wire.RESULT)
                    shard = shards[int(head[1])]
                    part = np.empty((shard.row1 - shard.row0, c.shape[2]), c.dtype)
                    comm.Recv(part, source=source, tag=wire.RESULT)
                    results.put((shard.index, part))
                    with cond:
                        in_flight[source] -= 1
                        cond.notify()
            except BaseException as exc:
                errors.append(exc)
            finally:
                results.put(None)

        def accumulate() -> None:
            while (item := results.get()) is not None:
                index, part = item
                s = shards[index]
                if plan.accumulate:
                    c[s.batch, s.row0:s.row1] += part
                else:
                    c[s.batch, s.row0:s.row1] = part

        receiver = threading.Thread(target=receive, name="offload-receive", daemon=True)
        adder = threading.Thread(target=accumulate, name="offload-accumulate", daemon=True)
        receiver.start()
        adder.start()
        pending = []
        last_b: dict[int, tuple[int, int, int, int]] = {}
        for i, s in enumerate(plan.shards):
            dest = 1 + i % self.workers
            with cond:
                while in_flight[dest] >= self.depth and not errors:
                    cond.wait(0.5)
                in_flight[dest] += 1
            key = (product, s.batch, s.k0, s.k1 - s.k0)
            block_a = a[s.batch, s.row0:s.row1, s.k0:s.k1]
            if not block_a.flags.c_contiguous:
                block_a = np.ascontiguousarray(block_a)
            send_b = last_b.get(dest) != key
            head = np.array([product, s.index, wire.CODES[a.dtype], s.row1 - s.row0,
                             s.k1 - s.k0, c.shape[2], int(send_b), s.batch, s.k0], np.int64)
            pending.append(comm.Isend(head, dest=dest, tag=wire.TASK))
            pending.append(comm.Isend(block_a, dest=dest, tag=wire.TASK))
            if send_b:
                pending.append(comm.Isend(b[s.batch, s.k0:s.k1], dest=dest, tag=wire.TASK))
                last_b[dest] = key
            pending.append(head)  # keep the buffers alive until the sends complete
            pending.append(block_a)
        from mpi4py import MPI

        wire.wait_all([r for r in pending if isinstance(r, MPI.Request)])
        receiver.join()
        adder.join()
        if errors:
            raise errors[0]

    # -- the service loop -----------------------------------------------------------------
    def serve(self, stop: threading.Event) -> None:
        while not stop.is_set():
            head = self.channel.wait(0.25)
            if head is None:
                continue
            try:
                if head.op == MATMUL:
                    self.matmul(head)
                elif head.op == RESIZE:
                    self.channel.resize(head.data_bytes)
                elif head.op != PING:
                    raise ValueError(f"unknown request {head.op}")
            except Exception as exc:
                self.channel.answer(head, FAILED, f"{type(exc).__name__}: {exc}")
                continue
            self.channel.answer(head)

    def stop_processors(self) -> None:
        head = np.zeros(wire.TASK_FIELDS, np.int64)
        for rank in range(1, self.comm.size):
            self.comm.Send(head, dest=rank, tag=wire.STOP)

    def stats(self) -> dict[str, Any]:
        return {"products": self.products, "bytes": self.bytes,
                "seconds": round(self.seconds, 4), "processors": self.workers}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hypertf.offload.agent",
                                description="The compute agent beside a task (MPI rank 0).")
    p.add_argument("--channel", required=True, help="the channel's POSIX name (/hypertf-...)")
    p.add_argument("--data-mb", type=int, default=64, help="initial data segment size")
    p.add_argument("--stats", help="write the agent's counts here as JSON at exit")
    p.add_argument("--ready", help="touch this file once the channel exists")
    args = p.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.rank != 0 or comm.size < 2:
        print("hypertf offload: the agent must be rank 0 of a world with processors "
              "(mpiexec -n 1 agent : -n K processor)", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    channel = ServerChannel.create(args.channel, args.data_mb << 20)
    agent = Agent(comm, channel)
    try:
        agent.calibrate()
        if args.ready:
            Path(args.ready).write_text(json.dumps({"model": vars(agent.model)}))
        agent.serve(stop)
        agent.stop_processors()
    finally:
        channel.destroy()
        if args.stats:
            Path(args.stats).write_text(json.dumps(agent.stats()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
