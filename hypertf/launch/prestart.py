"""A cold ``hypertf train``'s SSH connections, begun before the launcher's modules are imported.

Importing the launcher takes ~0.1 s of a 0.3 s cold launch, and the first network work used
to wait for all of it. ``connect_early`` begins the SSH connections to the hosts the job
surely uses, with each node's ``tasknode start --watch`` (``Sessions.connect_soon``), as
soon as the inventory is read and the SSH modules are imported: the handshakes and the
nodes' Python starts (the longest wait before a task can start) overlap the rest of the
imports. The ``Job`` it is handed (hypertf.launch.launcher) owns the sessions from then on.

Measured and left out: the ZooKeeper connect begun early too (in a thread) gained nothing
(1 host: 6 ms slower, median of 16 pairs; 8 hosts: no difference): the nodes' start is the
longer wait, and its threads took the GIL from the SSH handshakes. It stays in ``Job.plan``.
"""

from __future__ import annotations

from hypertf.config.inventory import Inventory
from hypertf.core.scheduler import Policy
from hypertf.launch.preflight import EARLY_PREFLIGHT_HOSTS
from hypertf.launch.request import TrainRequest
from hypertf.launch.sessions import Sessions

__all__ = ["connect_early", "likely_hosts"]


def likely_hosts(inventory: Inventory, request: TrainRequest) -> list[str]:
    """The hosts a job surely uses, known before ZooKeeper is asked: every GPU node of a
    small inventory that has no more nodes than the job has tasks, placed round robin (a
    GPU per server per round reaches each node). Otherwise none: the dry run names them
    later (``KeeperPlacer.place``)."""
    nodes = list(inventory.nodes)
    tasks = len(request.slots(cpu_only=False)) - request.offload_hosts
    if request.policy != Policy.ROUND_ROBIN or len(nodes) > min(tasks, EARLY_PREFLIGHT_HOSTS):
        return []
    return nodes


def connect_early(inventory: Inventory, request: TrainRequest) -> Sessions:
    """The job's sessions, the likely hosts' connections already under way; the caller
    closes them unless a ``Job`` took them. A request the job would refuse connects
    nowhere: it is checked first, as ``Job`` checks it."""
    request.validate()
    sessions = Sessions(inventory)
    sessions.connect_soon(likely_hosts(inventory, request))
    return sessions
