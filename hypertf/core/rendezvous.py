"""Every framework's rendezvous for one task, beside TF_CONFIG (docs/frameworks.md).

TensorFlow reads TF_CONFIG (or the legacy flags); Keras 3's distribution API, JAX and
PyTorch read other variables. HyperTF sets them all for every task, from the same grant,
so a script of any of them finds its peers without a hand-written rendezvous:

* the **rank** of a task is its place in TF_CONFIG's order (chief, workers, ps), so rank 0
  is the chief, or worker 0 in a job without one: the coordinator;
* the coordinator's address is rank 0's data address and its granted port: one of the
  ports HyperTF reserves for the job (no other job has it, preflight checked it);
* a **node** is a host, numbered by its first task in rank order (torchrun's NODE_RANK);
  LOCAL_RANK counts the tasks on the same host in rank order.

Pure: the launcher builds it with TF_CONFIG (hypertf.core.spec.build).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypertf.core.scheduler import Placement

# The variables, in the order docs/frameworks.md lists them (taskenv reserves them).
RENDEZVOUS_ENV = (
    "KERAS_DISTRIBUTION_JOB_ADDRESSES",  # every process's host:port, in rank order
    "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "KERAS_DISTRIBUTION_PROCESS_ID",
    "JAX_COORDINATOR_ADDRESS",  # read by jax.distributed.initialize() itself
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
    "MASTER_ADDR",  # torchrun's meanings: one process per task
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
)


def split_address(address: str) -> tuple[str, str]:
    """'10.0.0.1:20001' -> ('10.0.0.1', '20001'); '[fd00::1]:20001' -> ('fd00::1', ...)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), port


def contract(ordered: Sequence[Placement], addresses: Mapping[str, str]
             ) -> dict[str, dict[str, str]]:
    """Task name -> its rendezvous variables. ``ordered``: the tasks in rank order
    (TF_CONFIG's); ``addresses``: task name -> 'host:port' on the data network."""
    if not ordered:
        return {}
    job_addresses = [addresses[p.name] for p in ordered]
    master_addr, master_port = split_address(job_addresses[0])
    node_rank: dict[str, int] = {}
    on_host: dict[str, list[str]] = {}
    for p in ordered:
        node_rank.setdefault(p.host, len(node_rank))
        on_host.setdefault(p.host, []).append(p.name)
    world = str(len(ordered))
    found = {}
    for rank, p in enumerate(ordered):
        local = on_host[p.host]
        found[p.name] = {
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": ",".join(job_addresses),
            "KERAS_DISTRIBUTION_NUM_PROCESSES": world,
            "KERAS_DISTRIBUTION_PROCESS_ID": str(rank),
            "JAX_COORDINATOR_ADDRESS": job_addresses[0],
            "JAX_NUM_PROCESSES": world,
            "JAX_PROCESS_ID": str(rank),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": master_port,
            "RANK": str(rank),
            "WORLD_SIZE": world,
            "LOCAL_RANK": str(local.index(p.name)),
            "LOCAL_WORLD_SIZE": str(len(local)),
            "NODE_RANK": str(node_rank[p.host]),
        }
    return found
