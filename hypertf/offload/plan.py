"""The shard plan and the cost model: pure arithmetic, no MPI, no TensorFlow.

A product C[b] = A[b] @ B[b] (b batches of m x k by k x n) is cut into shards that offload
processors compute independently. Rows of A (and so of C) are the natural cut: a shard's
operands are a contiguous block of A plus B, its result a contiguous block of C, and no
addition is needed. When m is too small to give every processor work but k is large, the
cut goes along k instead and the partial products are added (accumulated) into C.

The cost model is the one the plan and docs/offload.md use to say when offloading pays:
the agent's link carries A and C once and B once per processor; the processors compute in
parallel; with pipelining the transfer and the compute overlap, so the time is about the
larger of the two plus one shard's worth of the other.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

ROWS = "rows"
DEPTH = "k"


@dataclass(frozen=True)
class Shard:
    """One piece of a product: batch ``batch``, rows [row0, row1) of A, k range [k0, k1)."""

    index: int
    batch: int
    row0: int
    row1: int
    k0: int
    k1: int


@dataclass(frozen=True)
class Plan:
    """How one product is cut: the split, the shards, and whether they must be added."""

    split: str
    shards: tuple[Shard, ...]

    @property
    def accumulate(self) -> bool:
        return self.split == DEPTH


@dataclass(frozen=True)
class CostModel:
    """Measured rates: flop/s of one offload host and of the local kernel, the link's bytes/s,
    and a fixed cost per message (latency plus the handshake)."""

    host_flops: float
    local_flops: float
    link_bytes_s: float
    message_s: float = 50e-6
    hop_bytes_s: float = 5e9  # the shared-memory hop between TensorFlow and its agent

    def local_s(self, m: int, k: int, n: int, batch: int = 1) -> float:
        return flops(m, k, n, batch) / self.local_flops

    def offload_s(self, m: int, k: int, n: int, hosts: int, batch: int = 1,
                  itemsize: int = 4, shards: int | None = None) -> float:
        """Predicted seconds for the product on ``hosts`` processors, pipelined."""
        count = shards or max(1, 2 * hosts)
        a, b, c = (batch * m * k * itemsize, batch * k * n * itemsize, batch * m * n * itemsize)
        hop = (a + b + 2 * c) / self.hop_bytes_s  # operands in, result out (and back)
        wire = (a + b * hosts + c) / self.link_bytes_s + count * self.message_s
        compute = flops(m, k, n, batch) / (hosts * self.host_flops)
        # Pipelined: the larger of transfer and compute, plus one shard of the other.
        return hop + max(wire, compute) + min(wire, compute) / count

    def speedup(self, n: int, hosts: int) -> float:
        return self.local_s(n, n, n) / self.offload_s(n, n, n, hosts)

    def crossover(self, hosts: int, limit: int = 1 << 16) -> int | None:
        """The smallest square n (a power of two, then refined) where offloading is faster."""
        n = 16
        while n <= limit and self.speedup(n, hosts) <= 1.0:
            n *= 2
        if n > limit:
            return None
        low, high = n // 2, n
        while high - low > 1:
            mid = (low + high) // 2
            if self.speedup(mid, hosts) > 1.0:
                high = mid
            else:
                low = mid
        return high


def flops(m: int, k: int, n: int, batch: int = 1) -> int:
    """Multiply-adds counted as two flops, as everyone counts them."""
    return 2 * batch * m * k * n


def shard_rows(m: int, k: int, n: int, workers: int, model: CostModel | None = None,
               itemsize: int = 4, min_rows: int = 8) -> int:
    """Rows per shard: at least two shards per worker (one computes while the next travels),
    and no shard so small that its message cost outweighs its compute."""
    per_worker = max(1, math.ceil(m / (2 * workers)))
    if model is not None:
        row_compute = 2 * k * n / model.host_flops
        row_bytes = (k + n) * itemsize / model.link_bytes_s
        # A shard should cost at least ~10 message latencies, else the overhead dominates.
        floor = math.ceil(10 * model.message_s / max(row_compute + row_bytes, 1e-12))
        per_worker = max(per_worker, min(floor, m))
    return max(min(per_worker, m), min(min_rows, m))


def make_plan(batch: int, m: int, k: int, n: int, workers: int,
              model: CostModel | None = None, itemsize: int = 4) -> Plan:
    """The shards of one product for ``workers`` processors."""
    if min(batch, m, k, n) < 1 or workers < 1:
        raise ValueError(f"cannot plan an empty product {batch}x{m}x{k}x{n} on {workers}")
    rows_total = batch * m
    if rows_total < 2 * workers and k >= 4 * workers * max(1, m):
        # Few rows, deep k: cut k and add the partial products.
        pieces = min(2 * workers, k)
        bounds = [round(i * k / pieces) for i in range(pieces + 1)]
        cuts = [(b, k0, k1) for b in range(batch) for k0, k1 in itertools.pairwise(bounds)]
        shards = tuple(Shard(i, b, 0, m, k0, k1) for i, (b, k0, k1) in enumerate(cuts))
        return Plan(DEPTH, shards)
    rows = shard_rows(m, k, n, workers, model, itemsize)
    out: list[Shard] = []
    for b in range(batch):
        for row0 in range(0, m, rows):
            out.append(Shard(len(out), b, row0, min(m, row0 + rows), 0, k))
    return Plan(ROWS, tuple(out))
