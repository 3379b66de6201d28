"""Making and checking the root: ``secure_root`` (``hypertf auth init``: the secured root,
its folders, the quotas, the matrix and the migrations from older layouts), the check every
client makes after connecting (``check_access``) and the admin's user limits.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoAuthError, NodeExistsError, NoNodeError
from kazoo.retry import ForceRetryError
from kazoo.security import ACL

from hypertf.core.errors import StoreError
from hypertf.core.grants import grant_to_json
from hypertf.core.jobrecord import held_of, placements_of, ports_of
from hypertf.core.layout import Layout, is_task_key
from hypertf.core.limits import UserLimits
from hypertf.core.matrix import (
    MIN_SHARDS,
    Held,
    Matrix,
    MatrixIndex,
    joined,
    shard_count,
    split,
)
from hypertf.core.records import decode
from hypertf.store.acltable import WORLD_WRITES, Acls
from hypertf.store.credentials import Credential, check_name, known, load
from hypertf.store.quotas import QUOTA_ROOT, UserQuotas, quota_acl, set_quotas
from hypertf.store.retry import until_committed


def root_is_open(client: KazooClient, root: str) -> bool:
    """True when anyone may change the root (made by a HyperTF without credentials)."""
    acls, _ = client.get_acls(root)
    return any(a.id.scheme == "world" and a.perms & WORLD_WRITES for a in acls)


SERVER_FOLDERS = ("/", QUOTA_ROOT)  # ZooKeeper's own, open to the world by default


def lock_server(client: KazooClient, admin: Credential) -> None:
    """On a ZooKeeper that is the cluster's own (the zookeeper role's, the lab's): its
    ``/`` and ``/zookeeper/quota`` become the admin's to create in (anyone may still read).
    ZooKeeper makes both world-writable, and a create the world may make never reaches
    HyperTF's provider: anyone who could reach the port, with no credential at all, could
    fill them with names of 1 MiB. A shared ensemble's ``/`` is its owners' business
    (an inventory without a ``zookeeper`` group names one it does not provision)."""
    locked = quota_acl(admin)
    for path in SERVER_FOLDERS:
        acls, _ = client.get_acls(path)
        if sorted(map(str, acls)) != sorted(map(str, locked)):
            client.set_acls(path, locked)


def secure_root(client: KazooClient, root: str, directory: Path, reset: bool = False,
                hosts: int = 0, quotas: UserQuotas | None = None,
                own_server: bool = False) -> None:
    """Create (or bring up to date) the root, its parents, the matrix and the per-user
    parents with their ACLs and quotas; idempotent. ``client`` is the admin's. An open
    root made before credentials existed is refused unless ``reset`` (which deletes it).
    The matrix gets shards for the registered hosts (or ``hosts``, if more). ``quotas``
    (default: from the settings' defaults) are written for every user's folders.
    ``own_server``: the server is this cluster's own (``lock_server``)."""
    admin = load(directory, "admin")
    acls = Acls(admin)
    layout = Layout(root)
    try:
        if client.exists(root) is not None and root_is_open(client, root):
            if not reset:
                raise StoreError(open_root_message(root))
            client.delete(root, recursive=True)
    except NoAuthError as err:
        raise StoreError(f"ZooKeeper refused the admin credential {admin.path} for {root}: "
                         f"the root was secured with another; use that cluster's admin.yml "
                         f"(hypertf_zk_credentials)") from err
    parent = root.rpartition("/")[0]
    if parent:
        client.ensure_path(parent)
    agents = known(directory, "agent")
    users = known(directory, "user")
    had_grants = client.exists(layout.grants) is not None
    nodes = [(getattr(layout, name), acls.of(name))
             for name in ("root", "hosts", "leases", "jobs", "keeper", "grants", "usage",
                          "preempts")]
    for host, agent in agents.items():
        nodes.append((layout.host(host), acls.of("host", agent.digest_id)))
    for name, user in users.items():
        nodes.append((layout.user_leases(name), acls.of("user_leases", user.digest_id)))
        nodes.append((layout.user_jobs(name), acls.of("user_jobs", user.digest_id)))
    for path, acl in nodes:
        try:
            client.create(path, b"", acl=acl)
        except NodeExistsError:
            client.set_acls(path, acl)
    set_quotas(client, layout, admin, list(users), quotas or UserQuotas.of())
    if own_server:
        lock_server(client, admin)
    try:
        client.create(layout.limits, UserLimits().to_json(), acl=acls.of("limits"))
    except NodeExistsError:
        client.set_acls(layout.limits, acls.of("limits"))
    ensure_matrix(client, layout, acls.matrix(), shard_count(max(len(agents), hosts)))
    _migrate_jobs(client, layout, acls, users, grants=not had_grants)


def _migrate_jobs(client: KazooClient, layout: Layout, acls: Acls,
                  users: dict[str, Credential], grants: bool) -> None:
    """Bring the records of a root secured by an older HyperTF up to date: each job record's
    ACL lets the keeper (not every agent) write it, and, the first time, every running job
    whose matrix cells and ports say what its record says gets its grant (the admin vouches
    for it here; afterwards only the keeper's admissions make grants)."""
    matrix = _whole_matrix(client, layout) if grants else None
    for name, user in users.items():
        try:
            keys = [key for key in client.get_children(layout.user_jobs(name))
                    if is_task_key(key, owner=name)]
        except NoNodeError:
            continue
        acl = acls.of("job", user.digest_id)
        pending = [client.set_acls_async(f"{layout.user_jobs(name)}/{key}", acl) for key in keys]
        for result in pending:
            with contextlib.suppress(NoNodeError):
                result.get(timeout=30)
        if matrix is None:
            continue
        for key in keys:
            if client.exists(f"{layout.user_leases(name)}/{key}") is None:
                continue
            with contextlib.suppress(NoNodeError, ValueError, KeyError, TypeError, StoreError):
                record = decode(client.get(f"{layout.user_jobs(name)}/{key}")[0], "job record")
                held = held_of(record)
                if (held.gpus or held.ports) and _holds(matrix, key, held):
                    client.create(layout.grant(key), grant_to_json(
                        key, placements_of(record), ports_of(record)), acl=acls.grant())


def _holds(matrix: Matrix, key: str, held: Held) -> bool:
    """Whether the matrix shows ``key`` holding every cell and port of ``held``."""
    cells = all(j < len(matrix.gpus.get(h, [])) and matrix.gpus[h][j] == key
                for h, indices in held.gpus.items() for j in indices)
    return cells and all(matrix.ports.get(h, {}).get(str(p)) == key
                         for h, ps in held.ports.items() for p in ps)


def _whole_matrix(client: KazooClient, layout: Layout) -> Matrix:
    index = MatrixIndex.from_json(client.get(layout.matrix)[0])
    count = index.shards if index else 0
    return joined(_shard_or_empty(client, layout, i)[0] for i in range(count))


def _shard_or_empty(client: KazooClient, layout: Layout, i: int,
                    ) -> tuple[Matrix, int | None, bool]:
    """A shard, its version and whether it is damaged: a damaged one reads as empty (the
    keeper restores its running jobs' cells from their grants), a missing one as empty,
    damaged, with no version."""
    try:
        data, stat = client.get(layout.matrix_shard(i))
    except NoNodeError:
        return Matrix(), None, True
    try:
        return Matrix.from_json(data), stat.version, False
    except (StoreError, ValueError, TypeError, AttributeError):
        return Matrix(), stat.version, True


def ensure_matrix(client: KazooClient, layout: Layout, acl: list[ACL], wanted: int,
                  deadline_s: float = 60.0, fallback: Matrix | None = None) -> None:
    """The sharded matrix with at least ``wanted`` shards, in one transaction: made empty,
    migrated from the previous layout (the whole matrix in the parent's data), resharded
    for a larger cluster (cells and ports kept), or repaired: a damaged index is rewritten
    for the shards there are, a damaged or missing shard as empty (the keeper gives running
    jobs their cells back from their grants at its next pass); else only the ACLs are set.
    Every writer checks the parent's version, so none writes a shard of the old count.
    Another writer meanwhile means reading again, until ``deadline_s``. ``fallback`` (the
    keeper's last good read) fills a damaged shard's rows instead of nothing."""
    def attempt(_lost: int) -> None:
        try:
            data, stat = client.get(layout.matrix)
        except NoNodeError:
            data, stat = None, None
        try:
            index = MatrixIndex.from_json(data) if data is not None else None
            old_layout = stat is not None and index is None
        except (ValueError, StoreError):  # damaged: as many shards as there are
            index, old_layout = None, False
            data = b""
        if index is not None:
            count = index.shards
        else:  # damaged (or none): as many shards as there are
            count = max(_shard_children(client, layout), default=-1) + 1 if stat else 0
        shards_read = {i: _shard_or_empty(client, layout, i) for i in range(count)} \
            if not old_layout else {}
        broken = {i for i, (_, _, bad) in shards_read.items() if bad}
        read = {i: (part, version) for i, (part, version, _) in shards_read.items()}
        if fallback is not None and broken and count:
            rows = split(fallback, count)
            read.update({i: (rows[i], read[i][1]) for i in broken})
        if count >= wanted and index is not None and not broken:
            pending = [client.set_acls_async(path, acl) for path in
                       [layout.matrix, *(layout.matrix_shard(i) for i in range(count))]]
            for result in pending:
                result.get(timeout=30)
            return
        shards = max(count, wanted, MIN_SHARDS)  # an index of no shards is damaged
        if old_layout:  # the previous layout: the whole matrix in this znode
            whole = Matrix.from_json(data or b"")
        else:
            whole = joined(part for part, _ in read.values())
        tx = client.transaction()
        if stat is None:
            tx.create(layout.matrix, MatrixIndex(shards).to_json(), acl=acl)
        else:
            tx.set_data(layout.matrix, MatrixIndex(shards).to_json(), version=stat.version)
        for i, part in enumerate(split(whole, shards)):
            version = read[i][1] if i in read else None
            if version is not None:
                tx.set_data(layout.matrix_shard(i), part.to_json(), version=version)
            else:
                tx.create(layout.matrix_shard(i), part.to_json(), acl=acl)
        errors = [r for r in tx.commit() if isinstance(r, Exception)]
        if not errors:
            return
        refused = (f"ZooKeeper refused to lay out the GPU matrix under {layout.root}: "
                   f"{errors}")
        if not any(isinstance(e, (BadVersionError, NodeExistsError)) for e in errors):
            raise StoreError(refused)
        raise ForceRetryError(refused)  # the keeper wrote meanwhile: read again

    until_committed(attempt, "laying out the GPU matrix", deadline_s=deadline_s, max_tries=-1)


def _shard_children(client: KazooClient, layout: Layout) -> list[int]:
    try:
        return sorted(int(c) for c in client.get_children(layout.matrix) if c.isdigit())
    except NoNodeError:
        return []


def open_root_message(root: str) -> str:
    return (f"ZooKeeper root {root} was made without credentials (anyone can change "
            f"it): stop its jobs and agents, then secure it with 'hypertf auth init --reset "
            f"-i INVENTORY' as the cluster admin (it deletes the old records)")


def previous_layout_message(root: str) -> str:
    """A root secured by an older HyperTF: without ``limits`` users could still write its
    matrix; without ``hosts`` any agent could create another host's record. ``auth init``
    brings it up to date (agents of the older HyperTF keep writing the old place)."""
    return (f"ZooKeeper root {root} is in a previous layout (no per-host folders, no user "
            f"limits, or the GPU matrix in one znode): the cluster admin runs 'hypertf auth "
            f"init -i INVENTORY' to migrate it (running jobs and queued ones are kept), then "
            f"upgrades the agents")


def current_layout(client: KazooClient, root: str) -> bool:
    """The root has what this HyperTF's layout adds (``limits``, ``hosts``, a sharded
    matrix): one round trip."""
    layout = Layout(root)
    pending = [client.exists_async(path) for path in (layout.limits, layout.hosts,
                                                      layout.grants)]
    matrix = client.get_async(layout.matrix)
    if not all(result.get(timeout=30) is not None for result in pending):
        return False
    try:
        return MatrixIndex.from_json(matrix.get(timeout=30)[0]) is not None
    except (NoNodeError, StoreError, ValueError):
        return False


def check_access(client: KazooClient, root: str, credential: Credential) -> None:
    """After connecting: the root exists, is secured, and knows this credential (its digest
    id is in the ACL where the admin registered it: ZooKeeper accepts any secret at login
    and only refuses operations later, so a stale file is caught here, not mid-job)."""
    layout = Layout(root)
    registered_at = {"user": layout.user_leases(credential.name),
                     "agent": layout.host(credential.name)}.get(credential.kind, root)
    try:
        if root_is_open(client, root):
            raise StoreError(open_root_message(root))
        client.get(root)
        # A write no version can match: ZooKeeper checks the ACL first, so BadVersion means
        # "this identity may write here" and nothing changes. (Digest hashes in ACLs are
        # hidden from readers without ADMIN, so they cannot be compared instead.)
        client.set(registered_at, b"", version=2**31 - 1)
    except BadVersionError as err:
        if not current_layout(client, root):
            raise StoreError(previous_layout_message(root)) from err
        return
    except NoNodeError:
        if registered_at != root and client.exists(root) is not None:
            if not current_layout(client, root):
                raise StoreError(previous_layout_message(root)) from None
            register = ("'hypertf auth init -i INVENTORY' with this host in the inventory"
                        if credential.kind == "agent" else
                        f"'hypertf auth add-user {credential.name}'")
            raise StoreError(f"{credential.identity} is not registered in ZooKeeper root "
                             f"{root}: the cluster admin runs {register}") from None
        raise StoreError(f"ZooKeeper has no HyperTF root {root} yet: run 'hypertf auth init "
                         f"-i INVENTORY' as the admin ('invoke zk.start' does it for the "
                         f"local cluster)") from None
    except NoAuthError:
        pass
    raise StoreError(f"ZooKeeper refused the credential {credential.path} for {root}: it is "
                     f"stale or for another cluster; ask the admin for a new one")


def set_user_limits(client: KazooClient, root: str, user: str, max_priority: int | None,
                    gpu_limit: int | None, share: float | None = None,
                    gpu_hours_per_month: float | None = None,
                    no_preempt_ok: bool | None = None) -> UserLimits:
    """``hypertf auth limits USER``: the admin's ceiling, share, budget and preemption
    exemption (``no_preempt_ok``; None keeps it) for one user (``client`` is the admin's;
    the znode refuses anyone else). Returns the limits as stored."""
    path = Layout(root).limits
    check_name("user", user)

    def attempt(_lost: int) -> UserLimits:
        try:
            data, stat_ = client.get(path)
        except NoNodeError:
            raise StoreError(f"ZooKeeper root {root} has no user limits yet: run 'hypertf auth "
                             f"init -i INVENTORY' as the admin") from None
        limits = UserLimits.from_json(data).with_user(user, max_priority, gpu_limit, share,
                                                      gpu_hours_per_month, no_preempt_ok)
        try:
            client.set(path, limits.to_json(), version=stat_.version)
        except BadVersionError as err:  # another admin command meanwhile: read again
            raise ForceRetryError("gave up setting user limits: other admin commands kept "
                                  "changing them; try again") from err
        except NoAuthError as err:
            raise StoreError("only the cluster admin may set user limits "
                             "(HYPERTF_ZK_IDENTITY=admin)") from err
        return limits

    return until_committed(attempt, "setting user limits", deadline_s=30.0, max_tries=-1)
