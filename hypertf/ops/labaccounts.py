"""A per-user lab (``lab.up(per_user=True)``): what a real per-user cluster has, on this
machine. Every HyperTF user of the lab gets a Unix account of its own,
``htf<lab id>-<user>`` (the namespaces share this machine's ``/etc/passwd``, so it is one
account with one uid on every lab host: the LDAP case), with its own home, its own SSH key
(kept in ``<lab>/users/<user>/``, where the lab's user would keep it) authorized for that
account only. Each host's agent reads an inventory of its own from the host's private
``/srv`` with only its own credential there (and ``keeper.yml`` on keeper hosts), as the
hypertf_agent role installs them. The accounts are removed with the lab.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from hypertf.core.errors import LabError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from hypertf.config.inventory import Inventory, Node


class _Host(Protocol):
    name: str
    address: str


class Lab(Protocol):
    """What this module needs of a lab (hypertf.ops.lab.Lab, which imports this module)."""

    lab_id: str
    inventory: str
    accounts: list[str]
    groups: list[str]
    opened: list[str]

    @property
    def hosts(self) -> Sequence[_Host]: ...
    @property
    def dir(self) -> Path: ...
    @property
    def account_prefix(self) -> str: ...
    @property
    def group(self) -> str: ...
    def user_dir(self, user: str) -> Path: ...
    def save(self) -> None: ...

__all__ = [
    "add_accounts",
    "node_credentials",
    "node_inventory",
    "open_path",
    "remove_accounts",
]

NODE_WORKDIR = "/srv/hypertf"  # the lab's hypertf_workdir, private to each host
NODE_INVENTORY = f"{NODE_WORKDIR}/agent-inventory.yml"


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed: {done.stderr.strip() or done.returncode}")


def _closed_dirs() -> list[Path]:
    """The directories above this Python, its virtualenv and HyperTF's code that other
    accounts may not enter (pyenv's Python under /root, 0700, is the common one)."""
    targets = [Path(sys.executable).resolve(), Path(sys.prefix),
               Path(__file__).resolve().parent.parent.parent]
    closed: list[Path] = []
    for target in targets:
        for directory in (target.parent, *target.parent.parents):
            if not directory.stat().st_mode & stat.S_IXOTH and directory not in closed:
                closed.append(directory)
    return closed


def open_path(lab: Lab) -> None:
    """Let the lab's accounts (its group) through the closed directories above this
    Python and checkout: traverse only (an ACL entry ``g:<group>:x``, no listing, no
    reading), removed with the lab. A real node installs the venv under /opt instead."""
    _run("groupadd", lab.group)
    lab.groups.append(lab.group)
    lab.save()
    closed = _closed_dirs()
    if closed and not shutil.which("setfacl"):
        raise LabError(f"a per-user lab's accounts cannot reach this Python through "
                       f"{closed[0]} (closed to other users): apt-get install acl, or use a "
                       f"Python and checkout others may enter")
    for directory in closed:
        lab.opened.append(str(directory))
        lab.save()
        _run("setfacl", "-m", f"g:{lab.group}:x", str(directory))


def add_accounts(lab: Lab, users: list[str]) -> None:
    """Make ``users``' accounts (those not made yet) with their keys, registered as
    ``hypertf auth add-user`` registers them (so the user_accounts role, run on the lab,
    finds them as they are); recorded in lab.json first, so ``down`` removes even a
    half-made one."""
    from hypertf import store
    from hypertf.config.inventory import load_inventory
    from hypertf.ops import accounts

    inventory = load_inventory(lab.inventory)
    directory = store.credentials_dir(inventory.cluster)
    for user in users:
        account = f"{lab.account_prefix}{user}"
        if account in lab.accounts:
            continue
        lab.accounts.append(account)
        lab.save()
        keys = lab.user_dir(user)
        keys.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = keys / "id_ed25519"
        if not key.exists():
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", account, "-f", str(key))
        uid = _useradd(lab, account, user)
        accounts.register(directory, inventory.cluster.account_policy, user,
                          key.with_suffix(".pub"), uid)
        _run("usermod", "-p", "*", account)  # unlocked, no password: sshd takes its key
        home = Path(os.path.expanduser(f"~{account}"))
        ssh = home / ".ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        authorized = ssh / "authorized_keys"
        authorized.write_text(key.with_suffix(".pub").read_text())
        authorized.chmod(0o600)
        shutil.chown(ssh, account, account)
        shutil.chown(authorized, account, account)


def _useradd(lab: Lab, account: str, user: str) -> int:
    """``account`` made with the first uid from 20000 up that this machine does not use
    (another lab may take one at the same moment: the next is tried), its group the same
    id; returns the uid."""
    import grp
    import pwd

    from hypertf.ops.accounts import UID_BASE

    uid = UID_BASE
    for _ in range(50):
        while _taken(uid, pwd.getpwuid) or _taken(uid, grp.getgrgid):
            uid += 1
        done = subprocess.run(["groupadd", "--gid", str(uid), account], capture_output=True,
                              text=True, timeout=60)
        if done.returncode == 0:
            made = subprocess.run(
                ["useradd", "--create-home", "--uid", str(uid), "--gid", str(uid),
                 "--groups", lab.group, "--shell", "/bin/bash",
                 "--comment", f"HyperTF lab {lab.lab_id} user {user}", account],
                capture_output=True, text=True, timeout=60)
            if made.returncode == 0:
                return uid
            subprocess.run(["groupdel", account], capture_output=True, timeout=60)
        uid += 1
    raise LabError(f"cannot make the lab account {account}: no free uid from {UID_BASE}")


def _taken(number: int, lookup: Any) -> bool:
    try:
        lookup(number)
    except KeyError:
        return False
    return True


def remove_accounts(lab: Lab) -> None:
    """``userdel -r`` each account the lab made (their processes died with the hosts), its
    group, and the ACL entries that let them through closed directories."""
    for directory in lab.opened:
        subprocess.run(["setfacl", "-x", f"g:{lab.group}", directory], capture_output=True,
                       timeout=60)
    for account in lab.accounts:
        subprocess.run(["userdel", "--force", "--remove", account], capture_output=True,
                       timeout=60)
        subprocess.run(["groupdel", account], capture_output=True, timeout=60)
    for group in lab.groups:
        subprocess.run(["groupdel", group], capture_output=True, timeout=60)


def node_inventory(node: Node) -> str:
    """Where a per-user lab host's agent reads its own inventory (on the host)."""
    return NODE_INVENTORY


def node_credentials(lab: Lab, inventory: Inventory) -> None:
    """Each host's own credential (and the keeper's on keeper hosts) in its private
    ``/srv/hypertf/credentials`` (root, 0700/0600), and its agent inventory naming it."""
    from hypertf import store

    shared = store.credentials_dir(inventory.cluster)
    raw: dict[str, Any] = yaml.safe_load(Path(lab.inventory).read_text())
    variables = {k: v for k, v in raw["all"]["vars"].items()
                 if k not in ("ansible_ssh_private_key_file", "hypertf_zk_credentials")}
    for host in lab.hosts:
        workdir = lab.dir / host.name / "srv" / "hypertf"
        credentials = workdir / "credentials"
        credentials.mkdir(mode=0o700, parents=True, exist_ok=True)
        workdir.chmod(0o755)
        wanted = [f"agent.{host.name}.yml"]
        if host.name in inventory.keeper_hosts:
            wanted.append("keeper.yml")
        for name in wanted:
            target = credentials / name
            shutil.copyfile(shared / name, target)
            target.chmod(0o600)
        own = {"all": {"vars": {**variables, "hypertf_zk_credentials":
                                f"{NODE_WORKDIR}/credentials"},
                       "children": {inventory.cluster.gpu_group: {"hosts": {
                           host.name: {"ansible_host": host.address}}}}}}
        (workdir / "agent-inventory.yml").write_text(
            f"# {host.name}'s view of lab {lab.lab_id}, read by its agent.\n"
            + yaml.safe_dump(own, sort_keys=False))
