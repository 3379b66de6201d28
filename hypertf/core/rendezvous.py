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

import ast
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum

from hypertf.core.scheduler import Placement

ROLE_ORDER = ("chief", "worker", "ps")  # TF_CONFIG's order of roles: the ranks' order


def rank_order(placements: Iterable[Placement]) -> list[Placement]:
    """The tasks in TF_CONFIG's order (chief, workers, ps; each by index): rank 0 first."""
    return sorted((p for p in placements if p.role in ROLE_ORDER),
                  key=lambda p: (ROLE_ORDER.index(p.role), p.index))


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


class Readiness(StrEnum):
    """What "started" means for a job, so its start-up deadline waits for the right ports:
    every task's TensorFlow server (TF_CONFIG's peers connect to each), the coordinator
    alone (JAX, Keras 3 on JAX, PyTorch: the others connect to rank 0 only), or no port at
    all (a script that is not distributed)."""

    TF = "tf"
    COORDINATOR = "coordinator"
    NONE = "none"


READINESS_SAID = {  # what each means for the start-up deadline, as said at start
    Readiness.TF: "every task's port must open before the start-up deadline",
    Readiness.COORDINATOR: "only rank 0's port must open before the start-up deadline",
    Readiness.NONE: "no port must open: the tasks are judged by their exits alone",
}

# Imports that say a script rendezvouses on a coordinator, and why, in the words said at start.
COORDINATOR_IMPORTS = {
    "jax": "it imports jax",
    "torch.distributed": "it imports torch.distributed",
    "torch": "it imports torch",
}


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _keras_backend(tree: ast.AST) -> str | None:
    """The KERAS_BACKEND a script sets itself (``os.environ["KERAS_BACKEND"] = "jax"`` or
    ``os.environ.setdefault("KERAS_BACKEND", "jax")``), if it does."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)
                        and target.slice.value == "KERAS_BACKEND"):
                    return str(node.value.value)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "setdefault" and len(node.args) == 2
                and all(isinstance(a, ast.Constant) for a in node.args)
                and node.args[0].value == "KERAS_BACKEND"):  # type: ignore[attr-defined]
            return str(node.args[1].value)  # type: ignore[attr-defined]
    return None


def detect(sources: Iterable[str], env: Mapping[str, str]) -> tuple[Readiness | None, str]:
    """The readiness a script's own code asks for, and why: a coordinator when it (or a
    local module it imports: ``sources``) imports JAX or PyTorch, or Keras with the JAX
    backend (set in the script or in the job's ``env``); None when nothing says (the
    TensorFlow way, as before). Unparsable code says nothing."""
    imports: set[str] = set()
    backend = env.get("KERAS_BACKEND")
    for source in sources:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        imports |= _imports(tree)
        backend = _keras_backend(tree) or backend
    for module, why in COORDINATOR_IMPORTS.items():
        if any(name == module or name.startswith(module + ".") for name in imports):
            return Readiness.COORDINATOR, why
    if backend == "jax" and any(n == "keras" or n.startswith("keras.") for n in imports):
        return Readiness.COORDINATOR, "it imports keras with KERAS_BACKEND=jax"
    return None, ""
