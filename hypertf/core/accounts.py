"""Whose Unix account a HyperTF user's tasks run as on the nodes: the admin's mapping.

A user's ZooKeeper identity (``user.alice``) decides what the store lets her do; on the nodes
the kernel decides, by uid. So every user's tasks run as her own Unix account, the same uid
on every node (made by the roles, or the site's LDAP/SSSD accounts taken as they are), and a
task of hers can neither read another's ``/proc/PID/environ``, files and checkpoints nor
signal his tasks. The mapping of user to account is the admin's (inventory settings, copied
by the roles into each node's agent inventory, written by the agent as a root-owned
``accounts.json`` in the node's workdir); nothing a user writes changes it.

``shared`` is the old layout, every task as the inventory's ``ansible_user``: kept working,
with a notice naming the move (``hypertf_user_accounts: managed`` and ``cluster.setup``).
Pure: no I/O beyond the JSON text handed in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import NamedTuple

__all__ = ["ACCOUNT", "STATE_FILE", "AccountMode", "AccountPolicy", "shared_notice"]

STATE_FILE = "accounts.json"  # in the node's workdir, written by its (root) agent
# A Unix account name as useradd takes it (Debian's NAME_REGEX, at most 32 characters).
ACCOUNT = re.compile(r"^[a-z_][a-z0-9_-]{0,30}[a-z0-9_$-]?$")


class AccountMode(StrEnum):
    """``hypertf_user_accounts``: where the per-user accounts come from."""

    SHARED = "shared"  # every user's tasks as the inventory's ansible_user (the old way)
    MANAGED = "managed"  # the roles make one account per user, one uid on every node
    EXISTING = "existing"  # the site has them (LDAP/SSSD): used as they are, checked only


class AccountPolicy(NamedTuple):
    """The admin's mapping from HyperTF user to Unix account, and who may run as root. A
    NamedTuple, not a dataclass: ``tasknode start`` reads it, and dataclasses imports
    inspect (~8 ms on every node of every job)."""

    mode: AccountMode = AccountMode.SHARED
    prefix: str = ""  # account = prefix + user, unless ``names`` maps the user
    names: Mapping[str, str] = MappingProxyType({})
    root_users: tuple[str, ...] = ()  # users whose tasks may run as root (the admin allows)

    @property
    def per_user(self) -> bool:
        return self.mode is not AccountMode.SHARED

    def account_of(self, user: str) -> str:
        """``user``'s Unix account on every node (per-user modes only)."""
        return self.names.get(user) or f"{self.prefix}{user}"

    def problem(self, user: str) -> str | None:
        """Why ``user`` has no usable account name (a HyperTF user name may hold capitals
        or dots, which useradd refuses), or None."""
        account = self.account_of(user)
        if ACCOUNT.match(account):
            return None
        return (f"user {user}'s Unix account name {account!r} is not one useradd takes "
                f"(lower-case letters, digits, '_' and '-', at most 32): map it with "
                f"hypertf_account_names in the inventory ({{{user}: <account>}})")

    def to_json(self) -> str:
        return json.dumps({"format": 1, "mode": str(self.mode), "prefix": self.prefix,
                           "names": dict(self.names), "root_users": list(self.root_users)})

    @classmethod
    def from_json(cls, text: str) -> AccountPolicy:
        """Read ``accounts.json``; anything malformed is a ValueError (the node then
        refuses to start tasks: it cannot say whose they may be)."""
        raw = json.loads(text[:65536])
        if not isinstance(raw, dict) or raw.get("format") != 1:
            raise ValueError("not an accounts.json of format 1")
        names = raw.get("names") or {}
        roots = raw.get("root_users") or []
        if not isinstance(names, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in names.items()):
            raise ValueError("names must map user names to account names")
        if not isinstance(roots, list) or not all(isinstance(u, str) for u in roots):
            raise ValueError("root_users must be a list of user names")
        return cls(AccountMode(str(raw.get("mode"))), str(raw.get("prefix") or ""),
                   dict(names), tuple(roots))


def shared_notice(account: str | None) -> str:
    """What a launch on a ``shared`` cluster says once: every user is one account there."""
    who = account or "the inventory's ansible_user"
    return (f"hypertf: notice: every user's tasks run as one Unix account ({who}) on this "
            f"cluster, so one user's job can read another's secrets and stop her tasks; "
            f"set hypertf_user_accounts: managed (or existing, for LDAP accounts) in the "
            f"inventory and run 'invoke cluster.setup' (docs/provisioning.md, 'Accounts')")
