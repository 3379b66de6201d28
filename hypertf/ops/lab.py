"""The lab: a real multi-host cluster on this machine, one network namespace per host.

Each host has its own address on a private bridge, its own hostname, a private ``/srv``, its
own sshd, a host key pinned in the lab's known_hosts, and, unless asked otherwise, a HyperTF
agent with a static GPU source. A ZooKeeper for the lab listens on the bridge address. Names
and the subnet carry a random lab id, so two labs (or a lab and a CI run) never collide.
Everything the lab creates is recorded in ``lab.json`` and removed by ``down``.

This module is the lab's record and its lifecycle (``up``, ``down``, ``find``); the hosts
(namespaces, sshd, keys) are hypertf.ops.labhosts', the cluster on them (ZooKeeper, the
inventory, the secured root, users, agents) hypertf.ops.labcluster's, a per-user lab's
accounts hypertf.ops.labaccounts'.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hypertf.config.paths import state_home
from hypertf.core.errors import LabError
from hypertf.ops import labaccounts, labcluster, labhosts
from hypertf.ops.labhosts import LabHost, StartupFiles
from hypertf.ops.zkserver import ZooKeeperServer


@dataclass
class Lab:
    """What one lab created; enough to tear it down from another process."""

    lab_id: str
    directory: str
    bridge: str
    gateway: str
    hosts: list[LabHost] = field(default_factory=list)
    zookeeper: list[dict[str, object]] = field(default_factory=list)
    inventory: str = ""
    per_user: bool = False  # hypertf_user_accounts: managed (one Unix account per user)
    accounts: list[str] = field(default_factory=list)  # the Unix accounts it made
    groups: list[str] = field(default_factory=list)  # the Unix group it made (its accounts')
    opened: list[str] = field(default_factory=list)  # closed dirs its group may traverse

    @property
    def group(self) -> str:
        return f"htf{self.lab_id}"

    @property
    def account_prefix(self) -> str:
        """The lab's users' accounts are ``htf<lab id>-<user>``: two labs never share one."""
        return f"htf{self.lab_id}-"

    def user_dir(self, user: str) -> Path:
        """Where the lab keeps ``user``'s own SSH key (``id_ed25519``), as the user would."""
        return self.dir / "users" / user

    @property
    def dir(self) -> Path:
        return Path(self.directory)

    @property
    def key_file(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    def zk_servers(self) -> list[ZooKeeperServer]:
        """The lab's ZooKeeper members (one, or an ensemble)."""
        return [
            ZooKeeperServer(str(z["address"]), int(str(z["port"])), Path(str(z["directory"])),
                            int(str(z.get("myid", 0))),
                            tuple(str(p) for p in z.get("peers", ()) or ()))  # type: ignore[attr-defined]
            for z in self.zookeeper
        ]

    def zk_server(self) -> ZooKeeperServer | None:
        servers = self.zk_servers()
        return servers[0] if servers else None

    @property
    def zookeeper_hosts(self) -> str:
        return ",".join(f"{z['address']}:{z['port']}" for z in self.zookeeper)

    def host(self, name: str) -> LabHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise LabError(f"lab {self.lab_id} has no host {name!r}")

    def save(self) -> None:
        (self.dir / "lab.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, directory: Path) -> Lab:
        payload = json.loads((directory / "lab.json").read_text())
        payload["hosts"] = [LabHost(**h) for h in payload["hosts"]]
        return cls(**payload)

    def cut(self, name: str) -> None:
        """Take a host off the network (its link down): ssh times out, sessions expire."""
        labhosts.ip("link", "set", self.host(name).veth, "down")

    def restore(self, name: str) -> None:
        labhosts.ip("link", "set", self.host(name).veth, "up")


def labs_home() -> Path:
    path = state_home() / "labs"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def up(hosts: int = 3, gpus: int = 4, agents: bool = True, zookeeper: bool = True,
       session_timeout: float = 6.0, base: Path | None = None, zookeeper_members: int = 1,
       startup_files: StartupFiles | None = None,
       settings: Mapping[str, Any] | None = None, per_user: bool = False) -> Lab:
    """Build a lab; on any failure, remove what was built and raise LabError.

    ``zookeeper_members`` > 1 runs a quorum ensemble on the bridge address instead of one
    standalone server. ``settings``: more ``hypertf_*`` settings for every host (what
    the agents read at their start: hypertf_preempt...). ``startup_files``: the hosts'
    user has these (see StartupFiles); by default the lab's commands read none.
    ``per_user``: every HyperTF user of the lab is a Unix account of its own
    (``htf<lab id>-<user>``, removed with the lab) that runs that user's tasks and logs in
    with that user's own key; each host keeps only its own credentials, as a real node does
    (hypertf.ops.labaccounts).
    """
    if not 1 <= hosts <= 50:
        raise LabError(f"--hosts must be between 1 and 50, not {hosts}")
    if not 0 <= gpus <= 64:
        raise LabError(f"--gpus must be between 0 and 64, not {gpus}")
    labhosts.check_requirements()
    lab_id = secrets.token_hex(3)
    directory = (base or labs_home()) / lab_id
    problem = labhosts.strict_modes_problem(directory / "authorized_keys")
    if problem:
        raise LabError(f"sshd's StrictModes would refuse the lab's SSH keys under {directory}: "
                       f"{problem}; build the lab under a private directory (HYPERTF_HOME, "
                       f"default ~/.hypertf)")
    directory.mkdir(mode=0o700, parents=True)
    net = labhosts.pick_subnet()
    addresses = list(net.hosts())
    lab = Lab(lab_id=lab_id, directory=str(directory), bridge=f"htf{lab_id}",
              gateway=str(addresses[0]), per_user=per_user)
    lab.hosts = [
        LabHost(name=f"h{i}", namespace=f"htf-{lab_id}-h{i}", veth=f"htf{lab_id}-{i}",
                address=str(addresses[10 + i]))
        for i in range(1, hosts + 1)
    ]
    lab.save()
    try:
        labhosts.link(lab, net.prefixlen)
        labhosts.start_hosts(lab, startup_files)
        if zookeeper:
            labcluster.start_zookeeper(lab, zookeeper_members)
        lab.inventory = str(labcluster.write_inventory(lab, gpus, session_timeout,
                                                       settings or {}))
        lab.save()
        if per_user:
            labaccounts.open_path(lab)
        if zookeeper:
            labcluster.secure_lab_root(lab)
        if agents:
            labcluster.start_lab_agents(lab)
    except BaseException:
        down(lab)
        raise
    return lab


def down(lab: Lab) -> None:
    """Remove everything the lab created; safe to call twice and on half-built labs."""
    labhosts.stop_hosts(lab)
    for server in lab.zk_servers():
        server.stop()
    labhosts.unlink(lab)
    labaccounts.remove_accounts(lab)
    labcluster.remove_cgroups(lab)
    shutil.rmtree(lab.dir, ignore_errors=True)


def all_labs(base: Path | None = None) -> list[Lab]:
    home = base or labs_home()
    labs = []
    for directory in sorted(home.iterdir()):
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            labs.append(Lab.load(directory))
    return labs


def find(lab_id: str | None, base: Path | None = None) -> list[Lab]:
    """One lab by id, or every lab when ``lab_id`` is None."""
    labs = all_labs(base)
    if lab_id is None:
        return labs
    chosen = [lab for lab in labs if lab.lab_id == lab_id]
    if not chosen:
        known = ", ".join(each.lab_id for each in labs) or "none"
        raise LabError(f"no lab {lab_id!r}; labs: {known}")
    return chosen
