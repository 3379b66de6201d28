"""Which account the launcher logs in to the nodes as: the job owner's own.

On a per-user cluster (``hypertf_user_accounts: managed|existing``) every SSH session of a
job (its start, watch, stop, log copies, ``hypertf logs``) logs in as the owner's Unix
account, by the admin's mapping (hypertf.core.accounts), with the owner's own SSH key
(``hypertf_user_ssh_key``); the inventory's ``ansible_user`` and its key stay the admin's,
for provisioning and the agents. The node checks it again (``tasknode start``): a login as
another account than the job owner's starts nothing. A ``shared`` cluster logs in as the
inventory says, and says once what that costs.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from hypertf.config.inventory import Inventory
from hypertf.core.accounts import shared_notice
from hypertf.core.errors import UsageError
from hypertf.store.credentials import job_owner

__all__ = ["as_job_owner", "shared_login", "user_key"]


def user_key(template: str, user: str) -> Path:
    """``hypertf_user_ssh_key`` for ``user``: ``{user}`` filled in, ``~`` this login's home."""
    return Path(os.path.expanduser(template.replace("{user}", user)))


def shared_login(inventory: Inventory) -> str | None:
    """The notice a job on a ``shared`` cluster says once with its other notices (every
    user's tasks are one account there), or None."""
    remote = [node for node in inventory.nodes.values() if not node.local]
    if not remote or inventory.cluster.account_policy.per_user:
        return None
    return shared_notice(remote[0].user)


def as_job_owner(inventory: Inventory, owner: str | None = None) -> Inventory:
    """``inventory`` with each SSH node's login set to ``owner``'s account and key (default:
    this command's job owner); unchanged for local nodes and on a shared cluster. A user
    without a usable account name or key is one message naming the fix."""
    remote = [node for node in inventory.nodes.values() if not node.local]
    policy = inventory.cluster.account_policy
    if not remote or not policy.per_user:
        return inventory
    user = owner or job_owner()
    problem = policy.problem(user)
    if problem:
        raise UsageError(problem)
    account = policy.account_of(user)
    key = user_key(inventory.cluster.user_ssh_key, user)
    if not key.is_file():
        raise UsageError(
            f"no SSH key {key} for {user}'s account {account} on the nodes: put the private "
            f"key 'hypertf auth add-user {user}' made (or your own, if the admin authorized "
            f"it) there, or point hypertf_user_ssh_key at it")
    nodes = {name: node if node.local else dataclasses.replace(
        node, user=account, key_file=str(key)) for name, node in inventory.nodes.items()}
    return dataclasses.replace(inventory, nodes=nodes)
