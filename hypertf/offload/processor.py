"""A distributed processor: one MPI rank on an offload host that computes shards with numpy.

It serves rank 0 (the compute agent) until told to stop: each task message names a shard,
carries its block of A and, unless this rank already holds it, the block of B; the answer
is the shard's block of C. B blocks are kept per product, so a product's B crosses the
link once per processor, not once per shard.
"""

from __future__ import annotations

import signal
import sys
import time

import numpy as np

from hypertf.offload import wire


def serve() -> int:
    from mpi4py import MPI

    # mpiexec forwards SIGTERM/SIGINT to every rank: the agent then tells us to stop (and
    # if the agent dies instead, mpiexec ends the whole world).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    comm = MPI.COMM_WORLD
    status = MPI.Status()
    cached_key: tuple[int, int, int, int] | None = None
    cached_b: np.ndarray | None = None
    head = np.empty(wire.TASK_FIELDS, np.int64)
    while True:
        wire.poll(comm, 0, MPI.ANY_TAG, status)
        tag = status.Get_tag()
        comm.Recv(head, source=0, tag=tag)
        if tag == wire.STOP:
            return 0
        if tag == wire.CALIBRATE:
            size = int(head[0])
            x = np.ones((size, size), np.float32)
            started = time.perf_counter()
            np.matmul(x, x)
            comm.Send(np.array([time.perf_counter() - started]), dest=0, tag=wire.CALIBRATE)
            continue
        if tag == wire.ECHO:
            buf = np.empty(int(head[0]), np.uint8)
            comm.Recv(buf, source=0, tag=wire.ECHO)
            comm.Send(buf[:1], dest=0, tag=wire.ECHO)
            continue
        product, index, code, rows, depth, n, has_b, batch, k0 = (int(x) for x in head)
        dtype = wire.DTYPES[code]
        a = np.empty((rows, depth), dtype)
        comm.Recv(a, source=0, tag=wire.TASK)
        key = (product, batch, k0, depth)
        if has_b:
            cached_b = np.empty((depth, n), dtype)
            comm.Recv(cached_b, source=0, tag=wire.TASK)
            cached_key = key
        if cached_key != key or cached_b is None:  # the agent's bookkeeping says it sent it
            raise SystemExit(f"processor {comm.rank}: shard {index} without its B block")
        c = np.matmul(a, cached_b)
        comm.Send(np.array([product, index], np.int64), dest=0, tag=wire.RESULT)
        comm.Send(c, dest=0, tag=wire.RESULT)


def main() -> int:
    return serve()


if __name__ == "__main__":
    sys.exit(main())
