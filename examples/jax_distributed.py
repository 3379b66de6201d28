"""JAX across processes: ``jax.distributed.initialize`` and one cross-process collective.

HyperTF gives every task ``JAX_COORDINATOR_ADDRESS`` (read by JAX itself), and
``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` for the one line JAX needs outside Slurm, Open
MPI and TPU VMs (docs/frameworks.md). Each process contributes ``rank + 1``; every process
gathers all of them (``process_allgather``, over gloo on CPUs) and prints their sum, which
must be ``n (n + 1) / 2``.

``hypertf train --script examples/jax_distributed.py --worker 2`` (JAX on the nodes).
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils


def main() -> int:
    jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                               process_id=int(os.environ["JAX_PROCESS_ID"]))
    rank, world = jax.process_index(), jax.process_count()
    gathered = multihost_utils.process_allgather(jnp.array([rank + 1.0]))
    total = float(gathered.sum())
    print(f"process {rank} of {world}: gathered {gathered.ravel().tolist()} sum={total:g}",
          flush=True)
    jax.distributed.shutdown()
    return 0 if total == world * (world + 1) / 2 else 1


if __name__ == "__main__":
    sys.exit(main())
