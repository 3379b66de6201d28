"""ZooKeeper's quotas on each user's folders: how many znodes (and bytes) one user's
``leases/<user>`` and ``jobs/<user>`` may hold, from the settings (docs/zookeeper-layout.md,
"Bounds"), set by ``hypertf auth init`` and enforced by the server whoever the client is.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError
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


@dataclass(frozen=True)
class FolderQuota:
    """Hard limits ZooKeeper enforces on one folder (``zookeeper.enforceQuota``, 3.7+):
    its znodes, the folder itself included, and their data's bytes (-1: none). A create or
    set past them fails with QuotaExceeded whoever the client is: a user's raw client
    cannot pass them."""

    count: int
    data_bytes: int = -1

    def limits_data(self) -> bytes:
        """ZooKeeper's StatsTrack text, as ``setquota -N COUNT -B BYTES`` writes it (the
        soft limits, which only log, off)."""
        return (f"count=-1,bytes=-1=;byteHardLimit={self.data_bytes};"
                f"countHardLimit={self.count}").encode()


@dataclass(frozen=True)
class UserQuotas:
    """The quotas of each user's ``leases/<user>`` and ``jobs/<user>``, from the settings
    (docs/zookeeper-layout.md, "Bounds"): leases for the waiting jobs
    (``hypertf_user_queue_limit``; 0: ``hypertf_job_records_max``) and RUNNING_MARGIN
    running ones, LEASE_BYTES each; job records for ``hypertf_job_records_max`` finished
    ones, the live ones and RECORD_CHURN more. Job records get no byte quota: ZooKeeper
    counts the keeper's writes in them (admitted, refused, lost) against it, so a user who
    filled it would make the keeper's admitting transaction fail for everyone."""

    leases: FolderQuota
    jobs: FolderQuota

    @classmethod
    def of(cls, user_queue_limit: int = 200, job_records_max: int = 10000) -> UserQuotas:
        live = (user_queue_limit or job_records_max) + RUNNING_MARGIN
        return cls(leases=FolderQuota(1 + live, (1 + live) * LEASE_BYTES),
                   jobs=FolderQuota(1 + job_records_max + live + RECORD_CHURN))


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
