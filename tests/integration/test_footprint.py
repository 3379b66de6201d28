"""``hypertf auth footprint`` against a real ZooKeeper (the conftest's, with quotas enforced
and names over 255 characters refused): bob's real jobs and the junk his own raw client
leaves in his folders, as the admin sees them; ``--delete-junk bob`` removes the junk and
nothing else; bob's own credential is refused before anything is read or deleted."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_acl

from hypertf import store
from hypertf.cli.main import main
from hypertf.config.inventory import load_inventory
from hypertf.config.settings import ClusterSettings
from hypertf.core.errors import NotAllowed, UsageError
from hypertf.core.layout import is_task_key
from hypertf.core.placement import Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.store import Layout, Store, credentials, footprint, quotas
from hypertf.store.quotas import UserQuotas

QUEUE, RECORDS = 4, 10
QUOTAS = UserQuotas.of(QUEUE, RECORDS)
JOBS = 2  # bob's real jobs: a record and a lease each
LEASE_JUNK = ["x1", "not-a-key", "20261122-085000-a1b2c3.alice"]  # alice's key: junk in bob's
JOB_JUNK = ["junk", "a" * 250, "20261122-085000-a1b2c3.alice", "tree"]
TREE = ["c1", "c2"]  # children of jobs/bob/tree


@pytest.fixture
def bounded(secured: ClusterSettings) -> ClusterSettings:
    return dataclasses.replace(secured, user_queue_limit=QUEUE, job_records_max=RECORDS)


@pytest.fixture
def bob(bounded: ClusterSettings) -> Iterator[Store]:
    """bob, registered, with his own session: JOBS real jobs (each a record and a lease)."""
    store.secure_cluster(bounded, [], users=["bob"])
    client = store.connect(bounded, identity="user.bob")
    session = Store(client, Layout(bounded.zk_root))
    for _ in range(JOBS):
        session.queue.enqueue(new_task_key("bob"), Request((TaskSlot("worker", 0, 0),),
                                                           ("n1",)), {})
    yield session
    store.close(client)


def make_junk(bob: Store, admin: KazooClient) -> None:
    """bob's own credential, his raw calls: names no reader takes, some with data, with the
    ACLs his real records carry (the server refuses a child open to others); a name over
    255 characters the server refuses. One junk name has children, which the server no
    longer lets bob make (his folders stay flat): the admin makes them here, as a server
    without HyperTF's bounds let bob."""
    layout, client = bob.layout, bob.client
    for name in LEASE_JUNK:
        client.create(f"{layout.user_leases('bob')}/{name}", b"lease junk",
                      acl=bob.acls.lease(), ephemeral=True)
    for name in JOB_JUNK:
        client.create(f"{layout.user_jobs('bob')}/{name}", b"j" * 100, acl=bob.acls.job())
    for name in TREE:
        admin.create(f"{layout.user_jobs('bob')}/tree/{name}", b"deep")
    with pytest.raises(NoAuthError):
        client.create(f"{layout.user_jobs('bob')}/{'n' * 256}", b"", acl=bob.acls.job())
    with pytest.raises(NoAuthError):
        client.create(f"{layout.user_jobs('bob')}/tree/c3", b"", acl=bob.acls.job())


def held(admin: KazooClient, folder: str) -> tuple[int, int]:
    """(znodes, data bytes) of ``folder``'s subtree, the folder included, walked by hand."""
    _, stat = admin.get(folder)
    znodes, size = 1, stat.dataLength
    for name in admin.get_children(folder):
        more = held(admin, f"{folder}/{name}")
        znodes, size = znodes + more[0], size + more[1]
    return znodes, size


@pytest.fixture
def admin(bounded: ClusterSettings) -> Iterator[Store]:
    client = store.connect(bounded, identity="admin")
    yield Store(client, Layout(bounded.zk_root))
    store.close(client)


def test_the_footprint_shows_bobs_counts_names_and_junk(bob, admin):
    make_junk(bob, admin.client)
    seen = footprint.StoreFootprint(admin).footprint().of("bob")
    leases, jobs = seen.leases, seen.jobs
    assert (leases.names, leases.junk) == (JOBS + len(LEASE_JUNK), len(LEASE_JUNK))
    assert (jobs.names, jobs.junk) == (JOBS + len(JOB_JUNK), len(JOB_JUNK))
    for folder in (leases, jobs):
        names = admin.client.get_children(folder.path)
        assert folder.name_bytes == sum(len(name) for name in names)
        # ZooKeeper's own count for the quota, the folder and the tree's children included
        assert (folder.quota.znodes, folder.quota.data_bytes) == held(admin.client,
                                                                       folder.path)
    assert (leases.quota.znode_limit, leases.quota.byte_limit) == (QUOTAS.leases.count,
                                                                   QUOTAS.leases.data_bytes)
    assert jobs.quota.znode_limit == QUOTAS.jobs.count
    assert jobs.quota.byte_limit == footprint.QuotaUse.of(
        None, QUOTAS.jobs.limits_data()).byte_limit  # the users' bound, if there is one
    assert seen.junk == len(LEASE_JUNK) + len(JOB_JUNK)
    assert seen.total_bytes == seen.data_bytes + seen.name_bytes > 250
    users = footprint.StoreFootprint(admin).footprint().users
    assert [u.total_bytes for u in users] == sorted((u.total_bytes for u in users),
                                                    reverse=True)
    assert {u.user for u in users} >= {"bob", credentials.job_owner()}


def test_deleting_bobs_junk_leaves_his_jobs(bob, admin):
    make_junk(bob, admin.client)
    before = footprint.StoreFootprint(admin).footprint().of("bob")
    keys = {path: sorted(admin.keys_of(parent, "bob")) for path, parent in
            ((before.leases.path, admin.layout.leases), (before.jobs.path, admin.layout.jobs))}
    deleted = footprint.StoreFootprint(admin).delete_junk("bob")
    assert deleted.names == len(LEASE_JUNK) + len(JOB_JUNK) and not deleted.refused
    assert deleted.znodes == deleted.names + len(TREE)
    assert deleted.data_bytes == (len(LEASE_JUNK) * len(b"lease junk") + len(JOB_JUNK) * 100
                                  + len(TREE) * len(b"deep"))
    junk_names = LEASE_JUNK + JOB_JUNK + TREE
    assert deleted.name_bytes == sum(len(name) for name in junk_names)
    after = footprint.StoreFootprint(admin).footprint().of("bob")
    for folder in after.folders:
        names = sorted(admin.client.get_children(folder.path))
        assert names == keys[folder.path] and len(names) == JOBS
        assert all(is_task_key(name, owner="bob") for name in names)
        assert folder.junk == 0
    assert after.jobs.quota.znodes == 1 + JOBS
    # bob's jobs are as they were: their records read, their leases live
    assert all(bob.jobs.read(key) for key in keys[after.jobs.path])
    assert admin.leases() >= set(keys[after.leases.path])
    # nothing left: nothing to do
    assert footprint.StoreFootprint(admin).delete_junk("bob").names == 0


def test_junk_closed_to_the_admin_is_counted_as_refused(bob, admin):
    """A junk name whose subtree the admin may not list or empty (made before the server's
    bounds; made here by the admin, who then hands it to bob alone) stays, counted as
    refused (ZooKeeper's super user can remove it); a leaf closed to the admin still goes
    (a delete is checked against the parent: bob's folder)."""
    folder = bob.layout.user_jobs("bob")
    only_bob = [make_acl("digest", bob.credential.digest_id, read=True, write=True,
                         delete=True)]
    bob.client.create(f"{folder}/leaf", b"", acl=only_bob)
    admin.client.create(f"{folder}/closed/child", b"", makepath=True)
    admin.client.set_acls(f"{folder}/closed", only_bob)
    deleted = footprint.StoreFootprint(admin).delete_junk("bob")
    assert deleted.refused == [f"{folder}/closed"] and deleted.names == 1
    assert sorted(admin.client.get_children(folder)) == sorted(
        [*admin.keys_of(admin.layout.jobs, "bob"), "closed"])


def test_only_the_admin_may_read_or_delete(bob, admin):
    make_junk(bob, admin.client)
    for attempt in (lambda: footprint.StoreFootprint(bob).footprint(),
                    lambda: footprint.StoreFootprint(bob).delete_junk("bob")):
        with pytest.raises(NotAllowed, match=r"only the cluster admin.*user\.bob"):
            attempt()
    seen = footprint.StoreFootprint(admin).footprint().of("bob")
    assert seen.junk == len(LEASE_JUNK) + len(JOB_JUNK)
    with pytest.raises(UsageError, match=r"'nobody' is not a registered user.*auth footprint"):
        footprint.StoreFootprint(admin).delete_junk("nobody")


def test_parse_quota_text_is_tolerant():
    assert quotas.parse_quota_text(b"count=12,bytes=3456") == {"count": 12, "bytes": 3456}
    limits = footprint.QuotaUse.of(b"count=3,bytes=40", QUOTAS.leases.limits_data())
    assert (limits.znode_limit, limits.byte_limit) == (QUOTAS.leases.count,
                                                       QUOTAS.leases.data_bytes)
    assert footprint.QuotaUse.of(None, b"count=-1,bytes=-1") == footprint.QuotaUse()
    assert quotas.parse_quota_text(b"\xff=;count=x,bytes=7=") == {"bytes": 7}


@pytest.fixture
def inventory(zk_server, tmp_path: Path) -> Path:
    """An inventory of the test's own root, bob registered; its admin and bob's files in
    the inventory's credentials directory."""
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": zk_server.hosts,
                 "hypertf_zk_root": f"/footprint-{tmp_path.name}",
                 "hypertf_zk_credentials": str(tmp_path / "credentials"),
                 "hypertf_venv": sys.prefix, "hypertf_workdir": str(tmp_path / "work")},
        "children": {"gpu_nodes": {"hosts": {"n1": {"ansible_connection": "local"}}}},
    }}))
    store.secure_cluster(load_inventory(path).cluster, [], ["bob"])
    return path


def hypertf(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            identity: str, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setenv(credentials.IDENTITY_ENV, identity)
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_shows_the_table_and_deletes_bobs_junk(inventory, monkeypatch, capsys):
    cluster = load_inventory(inventory).cluster
    client = store.connect(cluster, identity="user.bob")
    try:
        layout = Layout(cluster.zk_root)
        bobs = Store(client, layout)
        key = new_task_key("bob")
        bobs.queue.enqueue(key, Request((TaskSlot("worker", 0, 0),), ("n1",)), {})
        admin = store.connect(cluster, identity="admin")
        try:
            make_junk(bobs, admin)
        finally:
            store.close(admin)
        code, out, err = hypertf(monkeypatch, capsys, "admin", "auth", "footprint",
                                 "-i", str(inventory))
        assert code == 0, err
        header, *rows, total = out.splitlines()
        assert header.split()[:2] == ["USER", "LEASES"] and "JUNK" in header
        bob_row = next(row.split() for row in rows if row.split()[0] == "bob")
        quotas = UserQuotas.of(cluster.user_queue_limit, cluster.job_records_max)
        # the folder, the lease and the junk: znodes/limit
        assert bob_row[1] == f"{1 + 1 + len(LEASE_JUNK)}/{quotas.leases.count:,}"
        assert bob_row[3] == f"{1 + 1 + len(JOB_JUNK) + len(TREE)}/{quotas.jobs.count:,}"
        assert bob_row[-2] == str(len(LEASE_JUNK) + len(JOB_JUNK))  # JUNK
        assert rows[0].split()[0] == "bob"  # the largest first: 250-character names
        assert total.startswith(f"total: {len(rows)} users")

        code, out, err = hypertf(monkeypatch, capsys, "admin", "auth", "footprint",
                                 "-i", str(inventory), "--json", "--delete-junk", "bob")
        assert code == 0, err
        shown = json.loads(out)
        assert shown["deleted"]["names"] == len(LEASE_JUNK) + len(JOB_JUNK)
        bob_shown = next(u for u in shown["users"] if u["user"] == "bob")
        assert bob_shown["junk"] == 0 and bob_shown["jobs"]["names"] == 1
        assert client.get_children(layout.user_jobs("bob")) == [key]
        assert client.get_children(layout.user_leases("bob")) == [key]

        code, out, err = hypertf(monkeypatch, capsys, "user.bob", "auth", "footprint",
                                 "-i", str(inventory), "--delete-junk", "bob")
        assert code == 7 and not out
        assert err.startswith("hypertf: error: only the cluster admin") and "user.bob" in err
        assert "Traceback" not in err and len(err.splitlines()) == 1

        code, out, err = hypertf(monkeypatch, capsys, "admin", "auth", "footprint",
                                 "-i", str(inventory), "--delete-junk", "nobody")
        assert code == 2 and not out and "Traceback" not in err
        assert "'nobody' is not a registered user" in err and "hypertf auth footprint" in err
    finally:
        store.close(client)
