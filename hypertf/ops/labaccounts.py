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
from typing import TYPE_CHECKING, Any

import yaml

from hypertf.core.errors import LabError

if TYPE_CHECKING:
    from hypertf.config.inventory import Inventory, Node
    from hypertf.ops.lab import Lab

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
    for directory in _closed_dirs():
        if not shutil.which("setfacl"):
            raise LabError(f"a per-user lab's accounts cannot reach this Python through "
                           f"{directory} (closed to other users): apt-get install acl, or "
                           f"use a Python and checkout others may enter")
        lab.opened.append(str(directory))
        lab.save()
        _run("setfacl", "-m", f"g:{lab.group}:x", str(directory))


def add_accounts(lab: Lab, users: list[str]) -> None:
    """Make ``users``' accounts (those not made yet) with their keys; recorded in lab.json
    first, so ``down`` removes even a half-made one."""
    for user in users:
        account = f"{lab.account_prefix}{user}"
        if account in lab.accounts:
            continue
        lab.accounts.append(account)
        lab.save()
        _run("useradd", "--create-home", "--user-group", "--groups", lab.group,
             "--shell", "/bin/bash",
             "--comment", f"HyperTF lab {lab.lab_id} user {user}", account)
        _run("usermod", "-p", "*", account)  # unlocked, no password: sshd takes its key
        keys = lab.user_dir(user)
        keys.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = keys / "id_ed25519"
        if not key.exists():
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{account}",
                 "-f", str(key))
        home = Path(os.path.expanduser(f"~{account}"))
        ssh = home / ".ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        authorized = ssh / "authorized_keys"
        authorized.write_text(key.with_suffix(".pub").read_text())
        authorized.chmod(0o600)
        shutil.chown(ssh, account, account)
        shutil.chown(authorized, account, account)


def remove_accounts(lab: Lab) -> None:
    """``userdel -r`` each account the lab made (their processes died with the hosts), its
    group, and the ACL entries that let them through closed directories."""
    for directory in lab.opened:
        subprocess.run(["setfacl", "-x", f"g:{lab.group}", directory], capture_output=True,
                       timeout=60)
    for account in lab.accounts:
        subprocess.run(["userdel", "--force", "--remove", account], capture_output=True,
                       timeout=60)
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
