"""What each registered user makes ZooKeeper hold (``hypertf auth footprint``), and the
admin's removal of one user's junk.

A user may create any name in its own ``leases/<user>`` and ``jobs/<user>``; readers skip
every name that is not one of its task keys (``layout.is_task_key``), but ZooKeeper still
holds it. Per folder this reads what the server counts for the quota
(``<QUOTA_ROOT><folder>/zookeeper_stats``: znodes, the folder itself included, and their
data's bytes), the quota's limits, and one listing of the folder: its names, their total
length, and how many of them are junk. The server refuses names over 255 characters
(hypertf.ops.zkbounds), so one listing is bounded by the quota's count.

Only the admin runs either: the view and the deletion refuse any other credential before
touching a folder (ZooKeeper would refuse another user's delete anyway).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError, NotEmptyError

from hypertf.core.errors import NotAllowed, UsageError
from hypertf.core.layout import Layout, is_task_key
from hypertf.store.quotas import (
    QUOTA_LIMITS,
    QUOTA_ROOT,
    QUOTA_STATS,
    parse_quota_text,
    users_limit,
)
from hypertf.store.zkclient import answer, get_many, pipelined
from hypertf.store.zkstore import StoreReads

__all__ = ["FolderFootprint", "Footprint", "JunkDeleted", "QuotaUse", "StoreFootprint",
           "UserFootprint"]

DELETES_PER_ROUND = 1000  # pipelined exists/deletes in flight at once


def _limit(fields: dict[str, int], soft: str, hard: str) -> int | None:
    """``users_limit``, None where there is none."""
    value = users_limit(fields, soft, hard)
    return value if value >= 0 else None


@dataclass(frozen=True)
class QuotaUse:
    """What ZooKeeper counts in one folder's subtree for its quota, and the limits its users
    are held to (None: not known, or no limit)."""

    znodes: int | None = None
    data_bytes: int | None = None
    znode_limit: int | None = None
    byte_limit: int | None = None

    @classmethod
    def of(cls, stats: bytes | None, limits: bytes | None) -> QuotaUse:
        used, limit = parse_quota_text(stats), parse_quota_text(limits)
        return cls(znodes=used.get("count"), data_bytes=used.get("bytes"),
                   znode_limit=_limit(limit, "count", "countHardLimit"),
                   byte_limit=_limit(limit, "bytes", "byteHardLimit"))


@dataclass(frozen=True)
class FolderFootprint:
    """One user folder: its quota's counts and limits, and one listing of its names
    (``listed``: False when the folder is not there)."""

    path: str
    quota: QuotaUse
    names: int = 0
    name_bytes: int = 0
    junk: int = 0
    listed: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "znodes": self.quota.znodes,
                "znode_limit": self.quota.znode_limit, "data_bytes": self.quota.data_bytes,
                "byte_limit": self.quota.byte_limit, "names": self.names,
                "name_bytes": self.name_bytes, "junk": self.junk, "listed": self.listed}


@dataclass(frozen=True)
class UserFootprint:
    """One registered user's two folders."""

    user: str
    leases: FolderFootprint
    jobs: FolderFootprint

    @property
    def folders(self) -> tuple[FolderFootprint, FolderFootprint]:
        return self.leases, self.jobs

    @property
    def data_bytes(self) -> int:
        return sum(f.quota.data_bytes or 0 for f in self.folders)

    @property
    def name_bytes(self) -> int:
        return sum(f.name_bytes for f in self.folders)

    @property
    def junk(self) -> int:
        return sum(f.junk for f in self.folders)

    @property
    def total_bytes(self) -> int:
        """Data and names: what the user's folders make the server hold, roughly."""
        return self.data_bytes + self.name_bytes

    def as_dict(self) -> dict[str, Any]:
        return {"user": self.user, "leases": self.leases.as_dict(),
                "jobs": self.jobs.as_dict(), "data_bytes": self.data_bytes,
                "name_bytes": self.name_bytes, "junk": self.junk,
                "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class Footprint:
    """Every registered user's footprint, the largest (data and name bytes) first."""

    root: str
    users: tuple[UserFootprint, ...]

    def of(self, user: str) -> UserFootprint:
        return next(u for u in self.users if u.user == user)

    @property
    def data_bytes(self) -> int:
        return sum(u.data_bytes for u in self.users)

    @property
    def name_bytes(self) -> int:
        return sum(u.name_bytes for u in self.users)

    @property
    def junk(self) -> int:
        return sum(u.junk for u in self.users)

    @property
    def total_bytes(self) -> int:
        return self.data_bytes + self.name_bytes

    def as_dict(self) -> dict[str, Any]:
        return {"root": self.root, "users": [u.as_dict() for u in self.users],
                "total": {"data_bytes": self.data_bytes, "name_bytes": self.name_bytes,
                          "junk": self.junk, "total_bytes": self.total_bytes}}


@dataclass
class JunkDeleted:
    """What ``delete_junk`` removed from one user's folders: znodes (a junk name's subtree
    counted whole), their data's bytes and their names' bytes; ``refused``: junk names the
    admin could not delete (a subtree whose ACL its creator closed to the admin: ZooKeeper's
    super user can)."""

    user: str
    names: int = 0
    znodes: int = 0
    data_bytes: int = 0
    name_bytes: int = 0
    refused: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"user": self.user, "names": self.names, "znodes": self.znodes,
                "data_bytes": self.data_bytes, "name_bytes": self.name_bytes,
                "refused": len(self.refused)}


def _folders(layout: Layout, user: str) -> tuple[str, str]:
    return layout.user_leases(user), layout.user_jobs(user)


def _data(result: Any) -> bytes | None:
    """A multi-read's answer: the data, or None where it failed (no such quota znode)."""
    return None if isinstance(result, Exception) else bytes(result[0])


def _listing(client: KazooClient, path: str) -> list[str] | None:
    try:
        return list(client.get_children(path))
    except NoNodeError:
        return None


def _folder(client: KazooClient, path: str, user: str, quota: QuotaUse) -> FolderFootprint:
    names = _listing(client, path)
    if names is None:
        return FolderFootprint(path, quota, listed=False)
    return FolderFootprint(path, quota, names=len(names),
                           name_bytes=sum(len(name.encode()) for name in names),
                           junk=sum(not is_task_key(name, owner=user) for name in names))


def _chunks(names: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(names), DELETES_PER_ROUND):
        yield names[start:start + DELETES_PER_ROUND]


def _delete_trees(client: KazooClient, parent: str, names: list[str], done: JunkDeleted,
                  ) -> int:
    """Delete ``parent/<name>`` for each name, children first, pipelined; what went is
    added to ``done``, what ZooKeeper refused to ``done.refused`` (a name gone meanwhile
    is neither). Returns how many of ``names`` it deleted."""
    deleted = 0
    for chunk in _chunks(names):
        paths = [f"{parent}/{name}" for name in chunk]
        with pipelined(client):
            pending = [client.exists_async(path) for path in paths]
        stats = [answer(client, result, functools.partial(client.exists, path))
                 for path, result in zip(paths, pending, strict=True)]
        doomed = []
        for name, path, stat in zip(chunk, paths, stats, strict=True):
            if stat is None:
                continue
            if stat.numChildren and not _delete_children(client, path, done):
                done.refused.append(path)
                continue
            doomed.append((name, path, stat))
        with pipelined(client):
            deletes = [client.delete_async(path) for _, path, _ in doomed]
        for (name, path, stat), result in zip(doomed, deletes, strict=True):
            try:
                answer(client, result, functools.partial(client.delete, path))
            except NoNodeError:
                continue
            except (NoAuthError, NotEmptyError):  # closed to the admin; grew meanwhile
                done.refused.append(path)
                continue
            deleted += 1
            done.znodes += 1
            done.data_bytes += stat.dataLength
            done.name_bytes += len(name.encode())
    return deleted


def _delete_children(client: KazooClient, path: str, done: JunkDeleted) -> bool:
    """Empty ``path``'s subtree; False when ZooKeeper refused part of it."""
    try:
        children = list(client.get_children(path))
    except NoNodeError:
        return True
    except NoAuthError:
        return False
    refused = len(done.refused)
    _delete_trees(client, path, children, done)
    if len(done.refused) == refused:
        return True
    del done.refused[refused:]  # the junk name itself is reported, not each descendant
    return False


class StoreFootprint:
    """The admin's view of what each user makes the store hold, and the removal of one
    user's junk: a recipe of one session (``StoreFootprint(store)``)."""

    def __init__(self, reads: StoreReads) -> None:
        self.reads = reads

    def require_admin(self, what: str) -> None:
        """Refuse before touching anything unless this session logged in as the admin."""
        credential = self.reads.credential
        if credential.kind != "admin":
            raise NotAllowed(f"only the cluster admin may {what}; this session is "
                             f"{credential.identity}: run it as HYPERTF_ZK_IDENTITY=admin "
                             f"(the admin's credential, admin.yml)")

    def registered_users(self) -> list[str]:
        """The registered users: the children of ``<root>/leases`` (only the admin makes them)."""
        return self.reads.users(self.reads.layout.leases)

    def footprint(self) -> Footprint:
        """Every registered user's footprint (admin only). The quota znodes of every folder in
        multi-reads, then each folder listed once, one user at a time (a listing may be a few
        MB; none is kept)."""
        self.require_admin("read every user's footprint")
        users = self.registered_users()
        folders = [path for user in users for path in _folders(self.reads.layout, user)]
        quota_paths = [f"{QUOTA_ROOT}{path}/{leaf}" for path in folders
                       for leaf in (QUOTA_STATS, QUOTA_LIMITS)]
        quota = iter(get_many(self.reads.client, quota_paths))
        rows = []
        for user in users:
            leases, jobs = (_folder(self.reads.client, path, user, QuotaUse.of(
                _data(next(quota)), _data(next(quota))))
                for path in _folders(self.reads.layout, user))
            rows.append(UserFootprint(user, leases, jobs))
        rows.sort(key=lambda row: (-row.total_bytes, row.user))
        return Footprint(self.reads.layout.root, tuple(rows))

    def delete_junk(self, user: str) -> JunkDeleted:
        """Delete every name in ``user``'s two folders that is not one of its task keys, with
        its subtree if it has one (admin only; the user's task keys are never touched)."""
        self.require_admin("delete a user's junk")
        if user not in self.registered_users():
            raise UsageError(f"{user!r} is not a registered user of ZooKeeper root "
                             f"{self.reads.layout.root}: 'hypertf auth footprint' lists them")
        done = JunkDeleted(user)
        for folder in _folders(self.reads.layout, user):
            junk = [name for name in _listing(self.reads.client, folder) or []
                    if not is_task_key(name, owner=user)]
            done.names += _delete_trees(self.reads.client, folder, junk, done)
        return done
