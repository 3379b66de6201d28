"""ZooKeeper's quotas on each user's folders: how many znodes (and bytes) one user's
``leases/<user>`` and ``jobs/<user>`` may hold, from the settings (docs/zookeeper-layout.md,
"Bounds"), set by ``hypertf auth init`` and enforced by the server whoever the client is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Id, Permissions

from hypertf.core.errors import StoreError
from hypertf.core.layout import Layout
from hypertf.store.acltable import digest_acl
from hypertf.store.credentials import Credential

# ZooKeeper's quota znodes (org.apache.zookeeper.Quotas): a path P's limits live in
# <QUOTA_ROOT>P/zookeeper_limits, what P's subtree holds (P itself included) in
# <QUOTA_ROOT>P/zookeeper_stats, which the server keeps up to date.
QUOTA_ROOT = "/zookeeper/quota"


QUOTA_LIMITS, QUOTA_STATS = "zookeeper_limits", "zookeeper_stats"


RUNNING_MARGIN = 256  # a user's running jobs (each holds a lease) beside its waiting ones


RECORD_CHURN = 1000  # records that end between two of the keeper's prunes


LEASE_BYTES = 1024  # a lease's data: its launcher's user, host, pid, since (~150 bytes)


# Room above a user's own byte bound in its records folder for the keeper's writes in them
# (admitted, refused, lost: each a few hundred bytes more than the record it rewrites);
# past it the keeper leaves that one job out of its transaction (hypertf.keeper.commit).
KEEPER_ROOM = 4 << 20


@dataclass(frozen=True)
class FolderQuota:
    """Hard limits ZooKeeper enforces on one folder (``zookeeper.enforceQuota``, 3.7+):
    its znodes, the folder itself included, and their data's bytes (-1: none). A create or
    set past them fails with QuotaExceeded whoever the client is: a user's raw client
    cannot pass them."""

    count: int
    data_bytes: int = -1
    user_bytes: int = -1  # the folder's users' own bound, below data_bytes (-1: the same)

    def limits_data(self) -> bytes:
        """ZooKeeper's StatsTrack text, as ``setquota -N COUNT -B BYTES`` writes it. The
        server enforces the hard limits on everyone; HyperTF's provider holds the folder's
        users (who may create in it) to the soft ones (``count``, ``bytes``), with their
        requests in flight counted, so the keeper's writes in their records keep the room
        between the two (hypertf/ops/zookeeper/BoundedDigestProvider.java)."""
        return (f"count={self.count},bytes={self.user_bytes}=;byteHardLimit="
                f"{self.data_bytes};countHardLimit={self.count}").encode()


# What ZooKeeper's heap holds per znode besides its name (the DataNode, its stat, the path
# and child entries): 1,864 bytes a znode with a 255-character name, measured on Debian's
# 3.8 (docs/zookeeper-layout.md, "Bounds"), of which the name twice (path and child).
ZNODE_HEAP = 1340
# A listing's transient cost in the server, as a multiple of its names (the strings, the
# response record and its serialised buffer): about 7, measured in the finding.
LISTING_FACTOR = 7


@dataclass(frozen=True)
class UserQuotas:
    """The quotas of each user's ``leases/<user>`` and ``jobs/<user>``, from the settings
    (docs/zookeeper-layout.md, "Bounds"): leases for the waiting jobs
    (``hypertf_user_queue_limit``; 0: ``hypertf_job_records_max``) and RUNNING_MARGIN
    running ones, LEASE_BYTES each; job records for ``hypertf_job_records_max`` finished
    ones, the live ones and RECORD_CHURN more, and ``hypertf_user_records_mb`` of data
    (the user's bound; the hard limit leaves KEEPER_ROOM for the keeper's writes in them:
    ZooKeeper counts those against the same quota)."""

    leases: FolderQuota
    jobs: FolderQuota

    @classmethod
    def of(cls, user_queue_limit: int = 200, job_records_max: int = 10000,
           user_records_mb: int = 16) -> UserQuotas:
        live = (user_queue_limit or job_records_max) + RUNNING_MARGIN
        lease_bytes = (1 + live) * LEASE_BYTES
        record_bytes = user_records_mb << 20
        return cls(leases=FolderQuota(1 + live, lease_bytes, lease_bytes),
                   jobs=FolderQuota(1 + job_records_max + live + RECORD_CHURN,
                                    record_bytes + KEEPER_ROOM, record_bytes))


    def worst_heap(self, name_max: int = 255) -> int:
        """The most one user can make the server hold (bytes): both folders full of the
        longest names, their data at the hard limits, and one listing of the larger being
        sent (the server disconnects a reader that leaves more waiting)."""
        znodes = self.leases.count + self.jobs.count
        names = znodes * (ZNODE_HEAP + 2 * (name_max + 7))
        data = max(self.leases.data_bytes, 0) + max(self.jobs.data_bytes, 0)
        listing = LISTING_FACTOR * self.jobs.count * (name_max + 4)
        return names + data + listing


def quota_acl(admin: Credential) -> list[ACL]:
    """Quota znodes: only the admin changes them; anyone reads (``listquota``)."""
    return [digest_acl(admin.admin_id, Permissions.ALL),
            ACL(Permissions.READ, Id("world", "anyone"))]


NO_LIMIT = FolderQuota(-1)


def set_quota(client: KazooClient, path: str, quota: FolderQuota, acl: list[ACL],
              root: str) -> None:
    """What ZooKeeper's SetQuotaCommand does for ``path`` (kazoo has no quota API): the
    mirror path under QUOTA_ROOT, its limits (written again when they differ), then its
    stats node, on whose creation the server counts the subtree. ``/zookeeper/quota`` is
    open to the world (and shared by every root on the server), so the mirror of ``root``
    and everything below it get the admin's ACL: nobody else can lift these quotas or set
    one of theirs (a count of 1 on ``grants`` would stop every admission)."""
    mirror = f"{QUOTA_ROOT}{path}"
    ours = f"{QUOTA_ROOT}{root}"
    parts = mirror.split("/")
    for i in range(len(QUOTA_ROOT.split("/")) + 1, len(parts) + 1):
        node = "/".join(parts[:i])
        mine = len(node) >= len(ours)  # above the root's mirror: shared with other roots
        try:
            client.create(node, b"", acl=acl if mine else OPEN_ACL_UNSAFE)
        except NodeExistsError:
            if mine:
                _take_quota_node(client, node, acl)
    wanted = quota.limits_data()
    try:
        client.create(f"{mirror}/{QUOTA_LIMITS}", wanted, acl=acl)
    except NodeExistsError:
        _take_quota_node(client, f"{mirror}/{QUOTA_LIMITS}", acl)
        if client.get(f"{mirror}/{QUOTA_LIMITS}")[0] != wanted:
            client.set(f"{mirror}/{QUOTA_LIMITS}", wanted)
    try:
        client.create(f"{mirror}/{QUOTA_STATS}", b"count=0,bytes=0", acl=acl)
    except NodeExistsError:
        _take_quota_node(client, f"{mirror}/{QUOTA_STATS}", acl)


def _take_quota_node(client: KazooClient, node: str, acl: list[ACL]) -> None:
    """A quota znode made before (by this admin, or by anyone while it was open)."""
    try:
        client.set_acls(node, acl)
    except NoAuthError as err:
        raise StoreError(f"ZooKeeper's quota znode {node} belongs to another identity: "
                         f"only this cluster's admin may hold quotas on its root; remove it "
                         f"with ZooKeeper's super user (zkCli.sh delquota)") from err


def set_quotas(client: KazooClient, layout: Layout, admin: Credential, users: list[str],
               quotas: UserQuotas) -> None:
    """The root itself gets a quota without limits (so no quota set on an ancestor of a
    nested root applies below it: ZooKeeper checks only the nearest), every user's folders
    theirs."""
    acl = quota_acl(admin)
    set_quota(client, layout.root, NO_LIMIT, acl, layout.root)
    for name in users:
        set_quota(client, layout.user_leases(name), quotas.leases, acl, layout.root)
        set_quota(client, layout.user_jobs(name), quotas.jobs, acl, layout.root)


@dataclass(frozen=True)
class FolderUse:
    """What ZooKeeper counts in one quota'd folder (its ``zookeeper_stats``) and its
    limits: znodes (the folder itself included) and data bytes."""

    count: int
    data_bytes: int
    count_max: int
    bytes_max: int  # the users' bound: the soft limit, else the hard one (-1: none)

    def full(self, margin_bytes: int = 0) -> str | None:
        """Which limit a create of ``margin_bytes`` more would pass, in words, or None."""
        if 0 <= self.count_max <= self.count:
            return f"{self.count - 1} of {self.count_max - 1} znodes"
        if 0 <= self.bytes_max < self.data_bytes + margin_bytes:
            return f"{self.data_bytes:,} of {self.bytes_max:,} bytes"
        return None


QUOTA_TEXT_MAX = 4096  # a quota znode's text is ~80 bytes; more is not read
_PAIR = re.compile(r"([A-Za-z]+)=(-?\d+)")


def parse_quota_text(data: bytes | None) -> dict[str, int]:
    """ZooKeeper's StatsTrack text (``count=12,bytes=3456``, or the limits'
    ``count=-1,bytes=-1=;byteHardLimit=-1;countHardLimit=458``) as its integer fields;
    anything else in it (a stray ``=``, an unknown key, non-UTF-8) is skipped. Anyone may
    have written a quota znode of a server HyperTF does not own: read as hostile."""
    if not data:
        return {}
    text = data[:QUOTA_TEXT_MAX].decode("utf-8", errors="replace")
    return {key: int(value) for key, value in _PAIR.findall(text)}


def users_limit(limits: dict[str, int], soft: str, hard: str) -> int:
    """The limit a folder's users are held to: the soft one where set (HyperTF's provider
    holds them to it; the hard one leaves the keeper room), else the hard one; -1: none."""
    value = limits.get(soft, -1)
    value = value if value >= 0 else limits.get(hard, -1)
    return value if value >= 0 else -1


def folder_use(client: KazooClient, path: str) -> FolderUse | None:
    """The use and limits of the quota on ``path`` (world-readable), or None where none."""
    try:
        stats = parse_quota_text(client.get(f"{QUOTA_ROOT}{path}/{QUOTA_STATS}")[0])
        limits = parse_quota_text(client.get(f"{QUOTA_ROOT}{path}/{QUOTA_LIMITS}")[0])
    except (NoNodeError, NoAuthError):
        return None
    return FolderUse(stats.get("count", 0), stats.get("bytes", 0),
                     users_limit(limits, "count", "countHardLimit"),
                     users_limit(limits, "bytes", "byteHardLimit"))
