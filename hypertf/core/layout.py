"""The znode paths of one HyperTF root (docs/zookeeper-layout.md): pure, no client, so both
the store and the ACL table (hypertf.store.acltable) can name paths without importing each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hypertf.core.errors import UsageError
from hypertf.core.taskkey import key_owner

RESOURCE_LEAF = "agent"  # a host's agent record's name in the host's folder

# A task key as readers accept it: a stamp without dots (``new_task_key`` makes
# ``20261122-085000-a1b2c3``), a dot, its owner's name (hypertf.store.credentials.NAME). At most
# 129 characters: a user may create any name in its own folders (ZooKeeper bounds a name
# only by jute.maxbuffer, 1 MiB), and every reader of ``leases/<user>`` and
# ``jobs/<user>`` skips what does not match, so junk never reaches a decision or an output.
TASK_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\.[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
TASK_KEY_MAX = 129


def is_task_key(name: str, owner: str | None = None) -> bool:
    """Whether ``name`` looks like a task key (of ``owner``, when given): what every reader
    of a user's folder checks before the name goes anywhere (a length check first: a
    100 KB name costs no regex)."""
    if len(name) > TASK_KEY_MAX or not TASK_KEY.fullmatch(name):
        return False
    return owner is None or name.partition(".")[2] == owner


@dataclass(frozen=True)
class Layout:
    """The znode paths under one root; nothing else spells them out."""

    root: str = "/hypertf"

    @property
    def hosts(self) -> str:
        """One persistent child per registered host, made by the admin (``auth init``)."""
        return f"{self.root}/hosts"

    @property
    def matrix(self) -> str:
        """The matrix's parent: its data says how many shards hold the rows."""
        return f"{self.root}/matrix"

    def matrix_shard(self, index: int) -> str:
        """One shard of the matrix: the rows of the hosts that hash to ``index``."""
        return f"{self.matrix}/{index}"

    @property
    def limits(self) -> str:
        """Each user's maximum priority and GPU limit: only the admin writes it."""
        return f"{self.root}/limits"

    @property
    def jobs(self) -> str:
        return f"{self.root}/jobs"

    @property
    def usage(self) -> str:
        """The usage ledger (hypertf.core.usage): its data is each user's decayed usage;
        only the keeper writes it and its chunks."""
        return f"{self.root}/usage"

    def usage_chunk(self, index: str) -> str:
        """One chunk of a day of the ledger, ``<YYYY-MM-DD>.<n>``."""
        return f"{self.usage}/{index}"

    @property
    def preempts(self) -> str:
        """The keeper's preemption notices (hypertf.core.preemptnotice), one per victim."""
        return f"{self.root}/preempts"

    def preempt(self, task_key: str) -> str:
        return f"{self.preempts}/{task_key}"

    @property
    def leases(self) -> str:
        return f"{self.root}/leases"

    @property
    def keeper(self) -> str:
        return f"{self.root}/keeper"

    @property
    def grants(self) -> str:
        """One child per admitted job, written only by the keeper's identity (and the
        admin): the one place a launcher reads where its tasks may run."""
        return f"{self.root}/grants"

    def grant(self, task_key: str) -> str:
        return f"{self.grants}/{task_key}"

    @property
    def keeper_lease(self) -> str:
        """Ephemeral, held by the matrix keeper's session (its data: the keeper's host)."""
        return f"{self.keeper}/lease"

    @property
    def queue_view(self) -> str:
        """Ephemeral, of the keeper's session: the waiting jobs' positions and reasons."""
        return f"{self.keeper}/queue"

    def status_view(self, index: int) -> str:
        """Ephemeral, of the keeper's session: one shard of its view of the hosts, for
        ``hypertf status`` (hypertf.core.hostview)."""
        return f"{self.keeper}/status.{index}"

    def host(self, host: str) -> str:
        """A registered host's parent: only that host's agent (and the admin) may create in
        it, so no agent can make a record for another host."""
        return f"{self.hosts}/{host}"

    def resource(self, host: str) -> str:
        """The host's agent record: ephemeral, of the agent's session."""
        return f"{self.host(host)}/{RESOURCE_LEAF}"

    def user_jobs(self, user: str) -> str:
        return f"{self.jobs}/{user}"

    def user_leases(self, user: str) -> str:
        return f"{self.leases}/{user}"

    def job(self, task_key: str) -> str:
        return f"{self.jobs}/{owner_of(task_key)}/{task_key}"

    def lease(self, task_key: str) -> str:
        return f"{self.leases}/{owner_of(task_key)}/{task_key}"


def owner_of(task_key: str) -> str:
    """The user a task key belongs to (the part after its first dot)."""
    user = key_owner(task_key)
    if not user:
        raise UsageError(f"{task_key[:80]!r} is not a task key (they look like "
                         f"20261122-085000-a1b2c3.alice; list them with 'hypertf jobs')")
    return user


def path_names() -> tuple[str, ...]:
    """Every path a ``Layout`` names, by its name there, in order: ``root``, then each public
    property and method that returns one (``-> str``). Read from the class, so a new path is
    in it at once: hypertf.store.acltable.RULES keys who may touch each path by these names, and
    a path without a rule fails tests/unit/test_acl_table.py."""
    names = ["root"]
    for name, member in vars(Layout).items():
        function = member.fget if isinstance(member, property) else member
        returns = getattr(function, "__annotations__", {}).get("return")
        if not name.startswith("_") and returns in ("str", str):
            names.append(name)
    return tuple(names)
