"""The admin's register of users' node accounts, kept beside the credentials it governs.

``hypertf auth add-user alice`` registers alice's ZooKeeper credential and, on a per-user
cluster (``hypertf_user_accounts: managed|existing``), her node account: its uid (managed:
one free uid from ``UID_BASE`` up, the same on every node) in ``accounts.yml`` and her SSH
public key as ``user.alice.pub`` (the one she gave with ``--ssh-key``, or one made for her:
``user.alice.ssh``, the private key to hand over with her credential). The
``user_accounts`` role asks ``hypertf auth accounts`` for this register (JSON) and makes
every node agree: the account with that uid (managed) or checked as the site has it
(existing), and that key alone in its ``authorized_keys``. The directory is the admin's
(0700): no user writes what their account becomes.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from hypertf.core.accounts import AccountMode, AccountPolicy
from hypertf.core.errors import UsageError
from hypertf.core.rundir import write_private

__all__ = ["REGISTRY", "UID_BASE", "UserAccount", "register", "registered", "to_json"]

REGISTRY = "accounts.yml"
UID_BASE = 20000  # managed accounts' uids start here (above most sites' local and LDAP ranges)
UID_MAX = 59999  # below nobody (65534) and systemd's dynamic users (61184-)


@dataclass(frozen=True)
class UserAccount:
    """One user's account as every node must have it."""

    user: str
    account: str
    uid: int | None  # None: an existing (LDAP) account, whatever uid the site gave it
    public_key: str  # "" until the admin gives one (--ssh-key) or one is made


def _read(directory: Path) -> dict[str, int]:
    path = directory / REGISTRY
    if not path.exists():
        return {}
    raw = yaml.safe_load(path.read_text()) or {}
    uids = raw.get("uids", {}) if isinstance(raw, dict) else {}
    return {str(k): int(v) for k, v in uids.items()} if isinstance(uids, dict) else {}


def _write(directory: Path, uids: dict[str, int]) -> None:
    write_private(directory / REGISTRY,
                  "# HyperTF: the uid of each user's node account (hypertf auth add-user).\n"
                  + yaml.safe_dump({"format": 1, "uids": uids}, sort_keys=True))


def _public_key(directory: Path, user: str) -> str:
    path = directory / f"user.{user}.pub"
    return path.read_text().strip() if path.exists() else ""


def register(directory: Path, policy: AccountPolicy, user: str, ssh_key: Path | None = None,
             uid: int | None = None) -> tuple[UserAccount, Path | None]:
    """Register ``user``'s account (idempotent: a registered uid stays); returns it and the
    private key made for them, if one was (None when they gave their own or had one)."""
    problem = policy.problem(user)
    if problem:
        raise UsageError(problem)
    uids = _read(directory)
    if policy.mode is AccountMode.MANAGED and user not in uids:
        taken = set(uids.values())
        if uid is not None:
            if not UID_BASE <= uid <= UID_MAX or uid in taken:
                raise UsageError(f"--uid {uid} is taken or outside {UID_BASE}-{UID_MAX}")
        else:
            uid = next((n for n in range(UID_BASE, UID_MAX + 1) if n not in taken), None)
            if uid is None:
                raise UsageError(f"no free uid left in {UID_BASE}-{UID_MAX}")
        uids[user] = uid
        _write(directory, uids)
    pub = directory / f"user.{user}.pub"
    made = None
    if ssh_key is not None:
        text = ssh_key.read_text().strip() if ssh_key.is_file() else ""
        if not text.startswith(("ssh-", "ecdsa-", "sk-")) or "PRIVATE KEY" in text:
            raise UsageError(f"--ssh-key {ssh_key} is not an OpenSSH public key (give the "
                             f".pub file, e.g. ~/.ssh/id_ed25519.pub)")
        pub.write_text(text + "\n")
    elif not pub.exists():
        made = directory / f"user.{user}.ssh"
        made.unlink(missing_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                        f"hypertf-{user}", "-f", str(made)], check=True, capture_output=True)
        made.with_name(f"{made.name}.pub").replace(pub)
    pub.chmod(0o644)
    return _account(policy, user, uids, directory), made


def _account(policy: AccountPolicy, user: str, uids: dict[str, int],
             directory: Path) -> UserAccount:
    return UserAccount(user, policy.account_of(user),
                       uids.get(user) if policy.mode is AccountMode.MANAGED else None,
                       _public_key(directory, user))


def registered(directory: Path, policy: AccountPolicy) -> list[UserAccount]:
    """Every registered user's account (a ``user.<name>.yml`` credential each). On a
    managed cluster a user registered without one (``auth init``'s operator, a user from
    before per-user accounts) gets the next free uid here, kept in the register."""
    uids = _read(directory)
    users = sorted(p.name[len("user."):-len(".yml")] for p in directory.glob("user.*.yml"))
    missing = [u for u in users if u not in uids and policy.problem(u) is None]
    if policy.mode is AccountMode.MANAGED and missing:
        for user in missing:
            taken = set(uids.values())
            uids[user] = next(n for n in range(UID_BASE, UID_MAX + 1) if n not in taken)
        _write(directory, uids)
    return [_account(policy, user, uids, directory) for user in users
            if policy.problem(user) is None]


def to_json(accounts: list[UserAccount]) -> str:
    """What the user_accounts role reads."""
    return json.dumps([asdict(a) for a in accounts])
