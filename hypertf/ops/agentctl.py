"""Start and stop agents on many nodes at once over SSH, from the operator's machine, where
the nodes have no service manager (these machines, the lab): each node runs ``hypertf
agent-ctl`` (hypertf.node.service). Real servers use the Ansible role's systemd unit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from hypertf.config.inventory import Inventory, Node
from hypertf.launch.remote import Cluster, Result, Session, command_line

NodeInventory = Callable[[Node], str]  # a node's own agent inventory, as a path on it


def _ctl(node: Node, action: str, inventory_path: str) -> str:
    return command_line(
        [f"{node.settings.venv}/bin/hypertf", "agent-ctl", action,
         "--inventory", inventory_path, "--host", node.name]
    )


def _run_everywhere(inventory: Inventory, names: Iterable[str] | None, action: str,
                    node_inventory: NodeInventory | None = None) -> dict[str, Result]:
    chosen = list(inventory.nodes if names is None else names)
    nodes = [inventory.node(name) for name in chosen]
    shared = str(Path(inventory.path).resolve())
    with Cluster(nodes, inventory.cluster) as cluster:
        results = cluster.each(
            lambda s: _run(s, action, node_inventory(s.node) if node_inventory else shared),
            names=[n.name for n in nodes]
        )
    results.raise_failed(f"agent {action}", noun="node")
    return results.succeeded


def _run(session: Session, action: str, inventory_path: str) -> Result:
    return session.run(_ctl(session.node, action, inventory_path), timeout=60)


def start_agents(inventory: Inventory, names: Iterable[str] | None = None,
                 node_inventory: NodeInventory | None = None) -> dict[str, Result]:
    """Start the agent on each node (all GPU nodes by default), in parallel over SSH; each
    reads the operator's inventory, or its own (``node_inventory``: the path on the node
    of what the hypertf_agent role writes there, as a per-user lab keeps it)."""
    return _run_everywhere(inventory, names, "start", node_inventory)


def stop_agents(inventory: Inventory, names: Iterable[str] | None = None) -> dict[str, Result]:
    return _run_everywhere(inventory, names, "stop")
