"""The hop between a TensorFlow process and its compute agent: POSIX shared memory and two
POSIX semaphores.

The agent creates the channel (a small control segment, a data segment, a "request" and a
"done" semaphore) and owns it: it unlinks every name when it stops. The client (the hook in
the TensorFlow process) writes a request's header and operands straight into the shared
pages, posts "request" and waits on "done"; the agent works on those same pages and posts
"done". The semaphores hand the buffers back and forth like a read-write lock: whoever last
received a post may read and write, the other side touches nothing. The operands are copied
once (from TensorFlow's tensors into the segment) and the result once (out of it, as
TensorFlow must own its output); the agent sends and receives MPI messages from and into the
segment itself.

A product larger than the data segment makes the client ask for a larger one first (op
RESIZE): the agent creates a new segment under a new generation's name and unlinks the old.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import struct
import time
from dataclasses import dataclass

import numpy as np
import posix_ipc

from hypertf.core.offloadname import channel_name
from hypertf.offload.wire import CODES, DTYPES

MAGIC = 0x48544F46  # "HTOF"
VERSION = 1
CONTROL_BYTES = 4096
ALIGN = 64
MATMUL, RESIZE, PING = 1, 2, 3
OK, FAILED = 0, 1
# magic, version, agent pid, seq, op, status, dtype, batch, m, k, n, generation, data bytes
HEADER = struct.Struct("<IIqQIIIQQQQQQ")
ERROR_AT = 256
ERROR_BYTES = 512


class ChannelError(Exception):
    """The channel is gone or the agent did not answer: the caller computes locally."""


def new_name() -> str:
    """A channel of this process's own (a standalone world: no task key)."""
    return channel_name(str(os.getpid()), secrets.token_hex(4))


def names(base: str) -> dict[str, str]:
    """Every POSIX name of one channel except the data segments (those carry a generation)."""
    return {"control": base, "request": base + "-req", "done": base + "-done"}


def data_name(base: str, generation: int) -> str:
    return f"{base}-d{generation}"


def layout(batch: int, m: int, k: int, n: int, itemsize: int) -> tuple[int, int, int, int]:
    """Offsets of A, B and C in the data segment, and the bytes they need."""

    def up(x: int) -> int:
        return -(-x // ALIGN) * ALIGN

    a = 0
    b = up(a + batch * m * k * itemsize)
    c = up(b + batch * k * n * itemsize)
    return a, b, c, up(c + batch * m * n * itemsize)


@dataclass
class Header:
    agent_pid: int = 0
    seq: int = 0
    op: int = 0
    status: int = OK
    dtype: int = 0
    batch: int = 0
    m: int = 0
    k: int = 0
    n: int = 0
    generation: int = 0
    data_bytes: int = 0

    def pack_into(self, buf: mmap.mmap) -> None:
        HEADER.pack_into(buf, 0, MAGIC, VERSION, self.agent_pid, self.seq, self.op, self.status,
                         self.dtype, self.batch, self.m, self.k, self.n, self.generation,
                         self.data_bytes)

    @classmethod
    def unpack_from(cls, buf: mmap.mmap) -> Header:
        magic, version, *fields = HEADER.unpack_from(buf, 0)
        if magic != MAGIC or version != VERSION:
            raise ChannelError(f"not an offload channel (magic {magic:#x}, version {version})")
        return cls(*fields)


def _map(name: str, size: int | None = None) -> mmap.mmap:
    if size is None:
        shm = posix_ipc.SharedMemory(name)
    else:
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
    try:
        return mmap.mmap(shm.fd, shm.size)
    finally:
        shm.close_fd()


def unlink_all(base: str, generations: int = 64) -> None:
    """Remove every name of a channel that exists (the agent's exit, or its caller's cleanup
    after the agent died)."""
    for key, name in names(base).items():
        with contextlib.suppress(posix_ipc.ExistentialError):
            if key == "control":
                posix_ipc.unlink_shared_memory(name)
            else:
                posix_ipc.unlink_semaphore(name)
    for gen in range(generations):
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(data_name(base, gen))


class Endpoint:
    """What both sides share: the control page, the data segment, the two semaphores."""

    def __init__(self, base: str, control: mmap.mmap, request: posix_ipc.Semaphore,
                 done: posix_ipc.Semaphore) -> None:
        self.base = base
        self.control = control
        self.request = request
        self.done = done
        self.data: mmap.mmap | None = None
        self.generation = -1
        self.seq = 0

    def header(self) -> Header:
        return Header.unpack_from(self.control)

    def map_data(self, generation: int) -> mmap.mmap:
        if self.generation != generation or self.data is None:
            if self.data is not None:
                self.data.close()
            self.data = _map(data_name(self.base, generation))
            self.generation = generation
        return self.data

    def arrays(self, head: Header) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A, B and C as numpy views of the data segment (no copy)."""
        assert self.data is not None
        dtype = DTYPES[head.dtype]
        a, b, c, _ = layout(head.batch, head.m, head.k, head.n, dtype.itemsize)
        shapes = ((head.batch, head.m, head.k), (head.batch, head.k, head.n),
                  (head.batch, head.m, head.n))
        return tuple(  # type: ignore[return-value]
            np.ndarray(shape, dtype, buffer=self.data, offset=off)
            for shape, off in zip(shapes, (a, b, c), strict=False))

    def error(self) -> str:
        raw = bytes(self.control[ERROR_AT:ERROR_AT + ERROR_BYTES])
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    def set_error(self, text: str) -> None:
        raw = text.encode()[:ERROR_BYTES - 1] + b"\0"
        self.control[ERROR_AT:ERROR_AT + len(raw)] = raw

    def close(self) -> None:
        for buf in (self.data, self.control):
            if buf is not None:
                with contextlib.suppress(BufferError):
                    buf.close()
        for sem in (self.request, self.done):
            sem.close()


class ServerChannel(Endpoint):
    """The agent's side: creates the names, serves requests, unlinks everything at the end."""

    @classmethod
    def create(cls, base: str, data_bytes: int = 64 << 20) -> ServerChannel:
        unlink_all(base)
        try:
            control = _map(base, CONTROL_BYTES)
            request = posix_ipc.Semaphore(names(base)["request"], posix_ipc.O_CREX, 0o600, 0)
            done = posix_ipc.Semaphore(names(base)["done"], posix_ipc.O_CREX, 0o600, 0)
        except BaseException:
            unlink_all(base)
            raise
        self = cls(base, control, request, done)
        self.resize(data_bytes)
        return self

    def resize(self, data_bytes: int) -> None:
        generation = self.generation + 1
        old = self.generation
        _map(data_name(self.base, generation), max(data_bytes, ALIGN)).close()
        self.map_data(generation)
        if old >= 0:
            with contextlib.suppress(posix_ipc.ExistentialError):
                posix_ipc.unlink_shared_memory(data_name(self.base, old))
        Header(agent_pid=os.getpid(), generation=generation,
               data_bytes=max(data_bytes, ALIGN)).pack_into(self.control)

    def wait(self, timeout: float) -> Header | None:
        """The next request, or None if none came within ``timeout`` seconds."""
        try:
            self.request.acquire(timeout)
        except (posix_ipc.BusyError, posix_ipc.SignalError):
            return None
        return self.header()

    def answer(self, head: Header, status: int = OK, error: str = "") -> None:
        head.status = status
        head.agent_pid = os.getpid()
        head.generation = self.generation
        assert self.data is not None
        head.data_bytes = len(self.data)
        if error:
            self.set_error(error)
        head.pack_into(self.control)
        self.done.release()

    def destroy(self) -> None:
        self.close()
        unlink_all(self.base, self.generation + 2)


class ClientChannel(Endpoint):
    """The TensorFlow process's side: one request at a time (the caller holds a lock)."""

    @classmethod
    def attach(cls, base: str) -> ClientChannel:
        try:
            control = _map(base)
            request = posix_ipc.Semaphore(names(base)["request"])
            done = posix_ipc.Semaphore(names(base)["done"])
        except posix_ipc.ExistentialError as exc:
            raise ChannelError(f"no offload channel {base}: {exc}") from exc
        self = cls(base, control, request, done)
        self.map_data(self.header().generation)
        return self

    def agent_alive(self, pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", "rb") as handle:
            if handle.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return False
        return True

    def call(self, head: Header, timeout: float) -> Header:
        """Post a request and wait for its answer; ChannelError if the agent is gone or late."""
        pid = self.header().agent_pid
        self.seq += 1
        head.seq = self.seq
        head.agent_pid = pid
        head.pack_into(self.control)
        self.request.release()
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.done.acquire(0.2)
                break
            except posix_ipc.BusyError as err:
                if not self.agent_alive(pid):
                    raise ChannelError(f"the offload agent (PID {pid}) is gone") from err
                if time.monotonic() > deadline:
                    raise ChannelError(f"the offload agent did not answer in {timeout:.0f} s"
                                       ) from err
        answer = self.header()
        if answer.seq != head.seq:
            raise ChannelError(f"answer {answer.seq} for request {head.seq}")
        if answer.status != OK:
            raise ChannelError(f"the offload agent failed: {self.error()}")
        return answer

    def ensure(self, need: int, timeout: float) -> None:
        """A data segment of at least ``need`` bytes (asks the agent for a larger one)."""
        head = self.header()
        if head.data_bytes >= need and self.generation == head.generation:
            return
        if head.data_bytes < need:
            head = self.call(Header(op=RESIZE, data_bytes=need), timeout)
        self.map_data(head.generation)

    def matmul(self, a: np.ndarray, b: np.ndarray, timeout: float) -> np.ndarray:
        """C = A @ B computed by the agent, for A (..., m, k) and B (..., k, n) with the same
        leading dimensions. Strided views (a transpose) are copied once, into the segment."""
        lead, (m, k), n = a.shape[:-2], a.shape[-2:], b.shape[-1]
        batch = int(np.prod(lead, dtype=np.int64)) if lead else 1
        dtype = np.result_type(a, b)
        _, _, _, need = layout(batch, m, k, n, dtype.itemsize)
        self.ensure(need, timeout)
        head = Header(op=MATMUL, dtype=CODES[dtype], batch=batch, m=m, k=k, n=n,
                      generation=self.generation)
        va, vb, vc = self.arrays(head)
        va.reshape(a.shape)[...] = a
        vb.reshape(b.shape)[...] = b
        self.call(head, timeout)
        return vc.reshape(*lead, m, n).copy()
