"""The lab's cluster on its hosts: its ZooKeeper (one server or an ensemble on the bridge
address), the inventory that describes it all, the secured root with its users, the
agents, and the job cgroups they leave.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from hypertf.core.errors import HyperTFError, LabError
from hypertf.ops import labaccounts, labhosts
from hypertf.ops.labhosts import LabHost, refused_keys
from hypertf.ops.zkserver import ZooKeeperServer, ensemble, free_port


class Lab(labhosts.Lab, labaccounts.Lab, Protocol):
    """What this module needs of a lab (hypertf.ops.lab.Lab, which imports this module)."""

    zookeeper: list[dict[str, object]]

    @property
    def hosts(self) -> Sequence[LabHost]: ...
    @property
    def zookeeper_hosts(self) -> str: ...


def start_zookeeper(lab: Lab, members: int) -> None:
    """The lab's ZooKeeper on the bridge address: a quorum ensemble of ``members`` > 1,
    else one standalone server; recorded in lab.json before it starts."""
    if members > 1:
        servers = ensemble(lab.gateway, lab.dir, members)
        lab.zookeeper = [{"address": s.address, "port": s.port, "myid": s.myid,
                          "peers": list(s.peers), "directory": str(s.directory)}
                         for s in servers]
        lab.save()
    else:
        server = ZooKeeperServer(lab.gateway, free_port(lab.gateway), lab.dir / "zookeeper")
        lab.zookeeper = [{"address": server.address, "port": server.port,
                          "directory": str(server.directory)}]
        lab.save()
        server.start(heap="192m", tick_ms=500)


def write_inventory(lab: Lab, gpus: int, session_timeout: float,
                    settings: Mapping[str, Any]) -> Path:
    if sys.prefix == sys.base_prefix:
        raise LabError("run the lab from HyperTF's virtualenv (.venv): its hosts use it")
    ssh_args = (f"-o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes "
                f"-o ControlMaster=no")
    inventory: dict[str, Any] = {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(lab.key_file),
                "ansible_ssh_common_args": ssh_args,
                "ansible_python_interpreter": sys.executable,
                "hypertf_known_hosts": str(lab.known_hosts),
                "hypertf_venv": sys.prefix,
                "hypertf_workdir": "/srv/hypertf",
                "hypertf_zk_session_timeout": session_timeout,
                "hypertf_agent_interval": 1.0,
                "hypertf_gpu_source": "static",
                "hypertf_static_gpus": gpus,
                "hypertf_ssh_timeout": 5.0,
                # The hosts' job cgroups (docs/gpu.md "Confinement"): the machine's cgroup
                # hierarchies are shared by every lab, so each lab has a subtree of its own.
                "hypertf_cgroup_root": cgroup_root(lab),
                # Shared by the lab's hosts (only /srv is private to each).
                "hypertf_zk_credentials": str(lab.dir / "credentials"),
            },
            "children": {
                "gpu_nodes": {"hosts": {h.name: {"ansible_host": h.address} for h in lab.hosts}},
            },
        }
    }
    if lab.per_user:
        inventory["all"]["vars"].update({
            "hypertf_user_accounts": "managed",
            "hypertf_account_prefix": lab.account_prefix,
            "hypertf_user_ssh_key": str(lab.dir / "users" / "{user}" / "id_ed25519"),
        })
    inventory["all"]["vars"].update(settings)
    if lab.zookeeper:
        inventory["all"]["vars"]["hypertf_zookeeper_hosts"] = lab.zookeeper_hosts
    path = lab.dir / "inventory.yml"
    header = f"# Lab {lab.lab_id}: written by 'invoke lab.up'; removed by 'invoke lab.down'.\n"
    path.write_text(header + yaml.safe_dump(inventory, sort_keys=False))
    return path


def secure_lab_root(lab: Lab) -> None:
    """Credentials for the lab's admin, agents and this user, and the secured root."""
    from hypertf import store
    from hypertf.config.inventory import load_inventory

    inventory = load_inventory(lab.inventory)
    store.secure_cluster(inventory.cluster, list(inventory.nodes), own_server=True)
    if lab.per_user:
        from hypertf.store.credentials import job_owner

        labaccounts.add_accounts(lab, [job_owner()])
        labaccounts.node_credentials(lab, inventory)


def add_users(lab: Lab, users: Sequence[str],
              max_priority: Mapping[str, int] | None = None) -> None:
    """Register ``users`` on the lab's store (credentials in the lab's folder, as
    'hypertf auth add-user' makes them) and give some a higher --priority ceiling."""
    from hypertf import store
    from hypertf.config.inventory import load_inventory
    from hypertf.store.bootstrap import set_user_limits

    cluster = load_inventory(lab.inventory).cluster
    store.secure_cluster(cluster, [h.name for h in lab.hosts], users=list(users),
                         own_server=True)
    if lab.per_user:
        labaccounts.add_accounts(lab, list(users))
    admin = store.connect(cluster, identity="admin")
    try:
        for user, ceiling in (max_priority or {}).items():
            set_user_limits(admin, cluster.zk_root, user, ceiling, None)
    finally:
        store.close(admin)


def start_lab_agents(lab: Lab, wait_s: float = 30.0) -> None:
    """Start every host's agent over SSH and wait until each has registered."""
    from hypertf import store
    from hypertf.config.inventory import load_inventory
    from hypertf.ops import agentctl

    inventory = load_inventory(lab.inventory)
    try:
        agentctl.start_agents(inventory, node_inventory=labaccounts.node_inventory
                              if lab.per_user else None)
    except HyperTFError as err:
        refused = refused_keys(lab)
        if not refused:
            raise
        raise LabError(f"{err}; their sshd says: {'; '.join(refused[:3])}") from None
    client = store.connect(inventory.cluster)
    try:
        layout = store.Layout(inventory.cluster.zk_root)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if set(inventory.nodes) <= set(store.Store(client, layout).records()):
                return
            time.sleep(0.1)
        missing = set(inventory.nodes) - set(store.Store(client, layout).records())
        raise LabError(f"agents of {', '.join(sorted(missing))} did not register within "
                       f"{wait_s:.0f} s; see /srv/hypertf/agent.log under {lab.dir}/<host>/srv")
    finally:
        store.close(client)


def cgroup_root(lab: Lab) -> str:
    """The lab's hypertf_cgroup_root: its own subtree of each cgroup hierarchy."""
    return f"hypertf-lab-{lab.lab_id}"


def remove_cgroups(lab: Lab) -> None:
    """The job cgroups the lab's agents left (SIGKILLed with their hosts): their processes
    died with the hosts' PID namespaces, so only empty directories remain, deepest first."""
    from hypertf.node import confine

    for mount in confine.mounts():
        top = Path(mount) / cgroup_root(lab) if mount else None
        if top is not None and top.is_dir():
            for folder, _, _ in sorted(os.walk(top), key=lambda walked: -len(walked[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
