"""Who may do what on every znode: the ACL rule table (``RULES``) and the ACLs one
credential writes from it (``Acls``).

Besides the admin (everything) and every member (read), each kind of znode names what its
owner (its host's agent, its user) and the keeper may do. ZooKeeper checks CREATE and
DELETE on the parent, so per-user parents are what keeps one user from ending another's
job; a client with no credentials can read, change and delete nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazoo.security import ACL, Id, Permissions

from hypertf.store.credentials import Credential

WORLD_WRITES = Permissions.WRITE | Permissions.CREATE | Permissions.DELETE | Permissions.ADMIN


def digest_acl(digest_id: str, perms: int) -> ACL:
    """One ACL entry for a digest identity."""
    return ACL(perms, Id("digest", digest_id))


R, W, C, D = Permissions.READ, Permissions.WRITE, Permissions.CREATE, Permissions.DELETE


@dataclass(frozen=True)
class Rule:
    """Who may do what on one kind of znode besides the admin (everything) and every member
    (read): its owner (the identity it belongs to: its host's agent, its user) and the
    keeper identity, each with ZooKeeper's permission bits (0: no entry)."""

    owner: int = 0
    keeper: int = 0
    why: str = ""


# Who may touch each znode, by the name of its path in ``Layout`` (hypertf.core.layout):
# the one table of it. docs/zookeeper-layout.md ("Access control") shows it, and
# tests/unit/test_acl_table.py checks that every Layout path has its rule here and that
# the doc says what the rules say. ZooKeeper checks CREATE and DELETE on the parent: a
# folder's rule is what keeps one identity out of another's names.
RULES: dict[str, Rule] = {
    "root": Rule(why="the admin's; nothing is created at the root but by it"),
    "matrix": Rule(keeper=R | W, why="users and agents read it; only the keeper (its sync "
                   "and admissions, freeing cells an agent reported "
                   "drained) and the admin write it"),
    "matrix_shard": Rule(keeper=R | W, why="as the matrix's index"),
    "limits": Rule(why="users' ceilings, shares and budgets: the admin's alone to write"),
    "usage": Rule(keeper=R | W | C | D, why="the usage ledger: only the keeper writes each "
                  "user's usage and a day's chunks (and compacts "
                  "them)"),
    "usage_chunk": Rule(keeper=R | W, why="a day of the ledger: the keeper's"),
    "preempts": Rule(keeper=R | C | D, why="the keeper's preemption notices: only it creates "
                     "one (no user preempts, cancels a notice or makes "
                     "his job exempt) and deletes it once served"),
    "preempt": Rule(keeper=R | W, why="one notice: the victim's launcher and nodes read it"),
    "hosts": Rule(why="the admin registers hosts; nobody else creates or deletes one"),
    "host": Rule(owner=R | W | C, why="only the host's own agent may create its record "
                 "here; W only so that it can prove its credential "
                 "and registration (check_access)"),
    "resource": Rule(owner=R | W, why="the agent's record, made by the agent itself"),
    "keeper": Rule(keeper=R | C, why="only the keeper identity may take the keeper's lease"),
    "keeper_lease": Rule(keeper=R | W, why="the keeper's"),
    "queue_view": Rule(keeper=R | W, why="the keeper's"),
    "status_view": Rule(keeper=R | W, why="the keeper's view of the hosts, for hypertf "
                        "status: only the keeper writes what it shows"),
    "grants": Rule(keeper=R | C | D, why="the keeper creates a job's grant when it admits "
                   "it and deletes it once the job is over"),
    "grant": Rule(keeper=R | W, why="the one thing a launcher starts tasks on"),
    "leases": Rule(why="the admin registers users"),
    "user_leases": Rule(owner=R | W | C | D, why="the user's own leases; W: as for host"),
    "lease": Rule(owner=R | W, why="made by its launcher"),
    "jobs": Rule(why="the admin registers users"),
    "user_jobs": Rule(owner=R | C | D, keeper=D, why="the user creates and deletes its "
                      "records; the keeper prunes ended ones"),
    "job": Rule(owner=R | W, keeper=W, why="the keeper writes admissions, refusals and lost "
                "in it (never what a launcher starts on: the "
                "grant)"),
}


class Acls:
    """The ACL of every znode, from one credential's point of view: ``of(name)`` by RULES."""

    def __init__(self, credential: Credential) -> None:
        self.credential = credential

    def of(self, path: str, owner_id: str | None = None) -> list[ACL]:
        """The ACL of the znode that ``Layout`` names ``path`` (``"grant"``,
        ``"user_jobs"``...): the admin's everything, every member's read and the rule's
        entries; its owner is ``owner_id`` (the digest id of the agent or user it belongs
        to), by default this credential's own identity (a record made by its owner)."""
        rule = RULES[path]
        acl = [digest_acl(self.credential.admin_id, Permissions.ALL),
               digest_acl(self.credential.member_id, R)]
        if rule.owner:
            acl.append(digest_acl(owner_id or self.credential.digest_id, rule.owner))
        if rule.keeper:
            acl.append(digest_acl(self.credential.keeper_id, rule.keeper))
        return acl

    # The shorthands the writers of these znodes use.

    def root(self) -> list[ACL]:
        return self.of("root")

    def matrix(self) -> list[ACL]:
        return self.of("matrix")

    def agent_record(self) -> list[ACL]:
        return self.of("resource")

    def keeper_lease(self) -> list[ACL]:
        """The keeper's lease and the queue's view (one rule)."""
        return self.of("keeper_lease")

    def grant(self) -> list[ACL]:
        return self.of("grant")

    def lease(self) -> list[ACL]:
        return self.of("lease")

    def job(self) -> list[ACL]:
        return self.of("job")
