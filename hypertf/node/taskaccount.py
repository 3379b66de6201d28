"""The node's side of per-user accounts: the agent writes the admin's mapping where its
tasknode reads it, and tasknode checks every start and every wrapper against it.

``<workdir>/accounts.json`` is written by the agent (root, from the node's agent inventory,
which the admin's roles write) and believed only while root (or the workdir's owner) owns it
and nobody else may write it. On a per-user node the agent makes ``runs/``, ``checkpoints/``
and ``tensorboard/`` sticky and open (1777, as /tmp), so each account makes its own 0700
directories in them and may remove only its own. Standard library only: ``tasknode start``
reads this on every job's critical path.
"""

from __future__ import annotations

import functools
import os
import pwd
import stat
from pathlib import Path

from hypertf.core.accounts import STATE_FILE, AccountPolicy
from hypertf.core.rundir import CHECKPOINTS, RUNS, TENSORBOARD, replace_readable
from hypertf.core.taskkey import key_owner

__all__ = ["account_name", "expected_uid", "prepare_workdir", "publish",
           "read_policy", "secret_problems", "start_problem", "write_policy"]

SHARED_DIRS = (RUNS, CHECKPOINTS, TENSORBOARD)



def write_policy(workdir: str | Path, policy: AccountPolicy) -> None:
    """``accounts.json`` replaced in one rename, 0644: every task account reads it."""
    replace_readable(Path(workdir) / STATE_FILE, policy.to_json())


def prepare_workdir(workdir: str | Path, policy: AccountPolicy) -> None:
    """On a per-user node, the folders every account writes its own directories into: made
    1777 (sticky: one account cannot remove or rename another's). The workdir itself stays
    the agent's (0755): nobody else writes ``accounts.json`` or ``cgroups.json``."""
    if not policy.per_user:
        return
    for name in SHARED_DIRS:
        folder = Path(workdir) / name
        folder.mkdir(parents=True, exist_ok=True)
        if folder.is_symlink():
            raise OSError(f"{folder} is a link")
        os.chmod(folder, 0o1777)


def publish(workdir: str | Path, policy: AccountPolicy) -> None:
    """The agent's start: the admin's mapping written for tasknode (which then starts only
    the job owner's account's tasks), the shared folders made for it. A node that cannot
    write it logs why; its tasknode then finds no mapping (a shared node)."""
    try:
        prepare_workdir(workdir, policy)
        write_policy(workdir, policy)
    except OSError as err:
        import logging

        logging.getLogger(__name__).error(
            "cannot write the account mapping in %s (%s): per-user tasks are not checked "
            "here", workdir, err)


def read_policy(workdir: str | Path) -> AccountPolicy | str:
    """The agent's mapping on this node; ``AccountPolicy()`` (shared) where no agent wrote
    one; a text saying why when the file is there but cannot be believed."""
    path = Path(workdir) / STATE_FILE
    try:
        info = path.lstat()
    except FileNotFoundError:
        return AccountPolicy()
    except OSError as err:
        return f"{path} unreadable ({err.strerror})"
    try:
        trusted = {0, os.stat(workdir).st_uid}
    except OSError:
        trusted = {0}
    if not stat.S_ISREG(info.st_mode) or info.st_uid not in trusted or \
            info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is not the agent's (owner uid {info.st_uid}, mode " \
               f"{stat.S_IMODE(info.st_mode):o}): refused"
    try:
        return AccountPolicy.from_json(path.read_text())
    except (OSError, ValueError, KeyError) as err:
        return f"{path} is damaged ({err})"


@functools.cache
def _uid_of(account: str) -> int | None:
    try:
        return pwd.getpwnam(account).pw_uid
    except KeyError:
        return None


def account_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def expected_uid(workdir: str | Path, task_key: str) -> int | None:
    """The uid job ``task_key``'s tasks must run as here: its owner's account's on a
    per-user node; None where any account may (a shared node). A node whose mapping cannot
    be read, or an owner without an account, expects uid -1: nothing proves itself."""
    policy = read_policy(workdir)
    if isinstance(policy, str):
        return -1
    if not policy.per_user:
        return None
    owner = key_owner(task_key)
    if not owner:
        return -1
    uid = _uid_of(policy.account_of(owner))
    return -1 if uid is None else uid


def start_problem(workdir: str | Path, task_key: str) -> str | None:
    """Why this account may not start job ``task_key``'s tasks on this node, or None: on a
    per-user node only the job owner's account may (never root, unless the admin allows
    that user's tasks to run as root)."""
    policy = read_policy(workdir)
    if isinstance(policy, str):
        return f"this node's account mapping cannot be read: {policy}"
    if not policy.per_user:
        return None
    owner = key_owner(task_key)
    if not owner:
        return f"{task_key!r} is not a task key"
    account = policy.account_of(owner)
    me = os.geteuid()
    if _uid_of(account) is None:
        return (f"job {task_key}'s owner {owner} has no account {account!r} on this node: "
                f"the admin runs 'hypertf auth add-user {owner}' (or cluster.setup)")
    if me != _uid_of(account):
        return (f"job {task_key} is {owner}'s, whose tasks run as {account}, not as "
                f"{account_name(me)}")
    if me == 0 and owner not in policy.root_users:
        return (f"{owner}'s tasks would run as root, which the admin has not allowed "
                f"(hypertf_root_task_users)")
    return None


def secret_problems(workdir: str | Path) -> list[str]:
    """The node's credential files this (task) account could read, for the preflight: the
    agent's and the keeper's are root's alone (0600 in a 0700 folder). Root reads them
    anyway: a shared cluster's root tasks are the launch notice's, not this check's."""
    if os.geteuid() == 0:
        return []
    folder = Path(workdir) / "credentials"
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []  # not there, or closed to this account: as it should be
    readable = [n for n in names if n.endswith(".yml") and os.access(folder / n, os.R_OK)]
    if not readable:
        return []
    return [f"this node's credentials ({', '.join(readable)} in {folder}) are readable by "
            f"the task account {account_name(os.geteuid())}, so any job's task could steal "
            f"them: the admin makes them root's alone (chmod 700 {folder}; chmod 600 its "
            f"files; invoke cluster.setup does it)"]
