"""The authenticated store against a real ZooKeeper: strangers can do nothing, a user ends
only their own jobs, an agent can neither take GPUs nor end a job, and every credential
mistake is one line naming the file (exit 3)."""

from __future__ import annotations

import contextlib
import inspect
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NotEmptyError
from kazoo.security import OPEN_ACL_UNSAFE, make_acl

from hypertf import store
from hypertf.config.inventory import Inventory, load_inventory
from hypertf.core.errors import InsufficientResources
from hypertf.core.matrix import FREE, MatrixIndex
from hypertf.core.placement import Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.keeper.thread import KeeperThread
from hypertf.store import AgentRecord, Layout, Store, acltable, bootstrap, credentials
from tests.conftest import wait_for


@pytest.fixture
def cluster(zk_server, tmp_path) -> Iterator[tuple[Path, Inventory, Layout]]:
    """A secured root with one registered user (this login), a second user bob, and a job
    of this user holding a GPU on n1 (whose record the admin publishes)."""
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": zk_server.hosts,
                 "hypertf_zk_root": f"/auth-{tmp_path.name}",
                 "hypertf_zk_credentials": str(tmp_path / "credentials"),
                 "hypertf_venv": sys.prefix, "hypertf_workdir": str(tmp_path / "work")},
        "children": {"gpu_nodes": {"hosts": {"n1": {"ansible_connection": "local"},
                                             "n2": {"ansible_connection": "local",
                                                    "ansible_host": "127.0.0.2"}}}},
    }}))
    inventory = load_inventory(path)
    store.secure_cluster(inventory.cluster, list(inventory.nodes), ["bob"])
    yield path, inventory, Layout(inventory.cluster.zk_root)


def hypertf(*argv: str, identity: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop(credentials.IDENTITY_ENV, None)
    if identity:
        env[credentials.IDENTITY_ENV] = identity
    return subprocess.run([sys.executable, "-m", "hypertf.cli", *argv], capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.fixture
def keeper(cluster) -> Iterator[KeeperThread]:
    """n1's record (2 GPUs, published by the admin) and the keeper's pass in a thread."""
    _, inventory, layout = cluster
    admin = store.connect(inventory.cluster, identity="admin")
    record = AgentRecord(host="n1", mgmt_addr="127.0.0.1", data_addr="127.0.0.1", port=1,
                         gpu=2, gpu_avail_list=[0, 1], heartbeat=time.time())
    admin.create(layout.resource("n1"), record.to_json(),
                 acl=store.acls(admin).agent_record(), ephemeral=True)
    thread = KeeperThread(inventory.cluster).start()
    yield thread
    thread.stop()
    store.close(admin)


@pytest.fixture
def launcher(cluster, keeper) -> Iterator[Store]:
    """This login user's launcher session."""
    _, inventory, layout = cluster
    client = store.connect(inventory.cluster)
    yield Store(client, layout)
    store.close(client)


@pytest.fixture
def job(launcher) -> str:
    """A running job of this login user holding GPU 0 of n1 (its launcher's session holds
    the lease)."""
    key = new_task_key(credentials.login_user())
    launcher.queue.submit(Request((TaskSlot("worker", 0, 1),), ("n1",)), key)
    return key


def every_path(layout: Layout, key: str) -> dict[str, str]:
    """One path of each rule of acltable.RULES (so of every path Layout names:
    tests/unit/test_acl_table.py), by its name: the job ``key``'s, host n1's, shard 0."""
    arguments = {"host": "n1", "index": 0, "user": store.owner_of(key), "task_key": key}
    paths = {}
    for name in acltable.RULES:
        member = getattr(layout, name)
        if callable(member):
            member = member(*(arguments[p] for p in inspect.signature(member).parameters))
        paths[name] = member
    return paths


def made(inventory: Inventory, layout: Layout, key: str) -> dict[str, str]:
    """``every_path``, each there: the admin makes, with its rule's ACL, what no fixture
    made (the keeper's lease: no keeper-host agent runs here; the queue's view, unless the
    keeper thread published it first)."""
    admin = store.connect(inventory.cluster, identity="admin")
    try:
        paths = every_path(layout, key)
        for name, path in paths.items():
            with contextlib.suppress(NodeExistsError):
                admin.create(path, b"", acl=store.acls(admin).of(name))
        return paths
    finally:
        store.close(admin)


@pytest.mark.parametrize("who", ["anonymous", "wrong secret"])
def test_a_client_without_the_credentials_can_read_change_create_and_delete_nothing(
        cluster, job, zk_server, who):
    _, inventory, layout = cluster
    auth_data = [] if who == "anonymous" else [("digest", f"user.{credentials.login_user()}:guess"),
                                               ("digest", "member:guess")]
    paths = made(inventory, layout, job).values()
    stranger = KazooClient(hosts=zk_server.hosts, auth_data=auth_data)
    stranger.start(timeout=10)
    try:
        for path in paths:
            for attempt in (lambda p: stranger.get(p), lambda p: stranger.set(p, b"{}"),
                            lambda p: stranger.create(f"{p}/x", b"", acl=OPEN_ACL_UNSAFE),
                            lambda p: stranger.delete(p),
                            lambda p: stranger.set_acls(p, OPEN_ACL_UNSAFE)):
                # the root's parent is ZooKeeper's own "/": it refuses to delete a root that
                # has children, which nobody without credentials can remove
                refusal = (NoAuthError, NotEmptyError) if path == layout.root else NoAuthError
                with pytest.raises(refusal):
                    attempt(path)
        # forging a host (its folder, then a record of 64 GPUs) is refused too
        with pytest.raises(NoAuthError):
            stranger.create(layout.host("n9"), b"")
    finally:
        stranger.stop()
        stranger.close()
    admin = store.connect(inventory.cluster, identity="admin")
    try:
        assert admin.exists(layout.lease(job)) is not None  # the job lives on
    finally:
        store.close(admin)


def test_another_user_cannot_end_a_job_and_the_admin_can(cluster, job):
    path, inventory, layout = cluster
    refused = hypertf("kill", "-i", str(path), job, identity="user.bob")
    assert refused.returncode == 7, refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    owner = credentials.login_user()
    assert f"belongs to {owner}: only {owner} or the cluster admin" in refused.stderr
    # ZooKeeper itself refuses, whatever the client: bob's own kazoo session
    bob = store.connect(inventory.cluster, identity="user.bob")
    try:
        for attempt in (lambda: bob.delete(layout.lease(job)),
                        lambda: bob.set(layout.job(job), b"{}"),
                        lambda: bob.delete(layout.job(job)),
                        lambda: bob.create(f"{layout.user_leases(owner)}/x.{owner}", b""),
                        lambda: bob.create(f"{layout.root}/x", b""),  # nothing at the root
                        lambda: bob.create(layout.user_leases("mallory"), b""),  # no new user
                        lambda: bob.set(layout.resource("n1"), b"{}")):
            with pytest.raises(NoAuthError):
                attempt()
        assert bob.exists(layout.lease(job)) is not None
        # bob can run his own jobs: his parents exist and are his
        Store(bob, layout).queue.submit(Request((TaskSlot("worker", 0, 1),), ("n1",)),
                                        new_task_key("bob"))
    finally:
        store.close(bob)
    killed = hypertf("kill", "-i", str(path), job, identity="admin")
    assert killed.returncode == 0, killed.stderr
    jobs = hypertf("jobs", "-i", str(path), "--json")
    record = next(j for j in yaml.safe_load(jobs.stdout) if j["task_key"] == job)
    assert record["state"] == "killed" and record["killed_by"]["identity"] == "admin"


def test_an_agent_can_neither_take_gpus_nor_end_a_job_nor_touch_another_host(cluster, job):
    """Agent n2's own credential: no lease, no job, no other host's record (not even a new
    one: a host's folder is the admin's, and only its own agent may create in it), and none
    of what the keeper alone decides: the matrix, grants, job records, the keeper's lease."""
    _, inventory, layout = cluster
    agent = store.connect(inventory.cluster, identity="agent.n2")
    try:
        acls = store.acls(agent)
        user = store.owner_of(job)
        for attempt in (
                lambda: agent.create(layout.lease(f"x.{user}"), b"", acl=acls.lease()),
                lambda: agent.create(layout.job(f"x.{user}"), b"", acl=acls.job()),
                lambda: agent.delete(layout.lease(job)),
                lambda: agent.set(layout.resource("n1"), b"{}"),
                lambda: agent.delete(layout.resource("n1")),
                lambda: agent.create(layout.resource("n1"), b"{}", ephemeral=True),
                lambda: agent.create(layout.host("h9"), b""),  # a forged host
                lambda: agent.create(f"{layout.host('n1')}/other", b"{}", ephemeral=True),
                lambda: agent.delete(layout.host("n2")),
                lambda: agent.create(layout.user_leases("mallory"), b""),
                lambda: agent.create(f"{layout.root}/x", b""),
                lambda: agent.set(layout.keeper, b"n2"),
                lambda: agent.create(layout.keeper_lease, b"n2", acl=acls.keeper_lease(),
                                     ephemeral=True),
                lambda: agent.set(layout.matrix, b"{}"),
                lambda: agent.set(layout.matrix_shard(0), b"garbage"),
                lambda: agent.set(layout.job(job), b"{}"),
                lambda: agent.delete(layout.job(job)),
                lambda: agent.create(layout.grant(f"x.{user}"), b"{}", acl=acls.grant()),
                lambda: agent.set(layout.limits, b"{}")):
            with pytest.raises(NoAuthError):
                attempt()
        # what it needs: its own record and reading everything
        agent.create(layout.resource("n2"), b"{}", acl=acls.agent_record(), ephemeral=True)
        agent.set(layout.resource("n2"), b"{}")
        assert agent.get(layout.job(job))[0]
    finally:
        store.close(agent)
    keeper = store.connect(inventory.cluster, identity="agent.n1", also=("keeper",))
    try:  # a keeper host's agent: it may take the keeper's lease
        keeper.create(layout.keeper_lease, b"n1", acl=store.acls(keeper).keeper_lease(),
                      ephemeral=True)
    finally:
        store.close(keeper)
    user_client = store.connect(inventory.cluster)  # a user may not keep the matrix
    try:
        with pytest.raises(NoAuthError):
            user_client.create(layout.keeper_lease, b"me",
                               acl=store.acls(user_client).keeper_lease(), ephemeral=True)
    finally:
        store.close(user_client)


def test_credentials_are_private_files_in_a_private_directory(cluster):
    _, inventory, _ = cluster
    directory = store.credentials_dir(inventory.cluster)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    names = sorted(p.name for p in directory.iterdir())
    assert names == sorted(["admin.yml", "agent.n1.yml", "agent.n2.yml", "keeper.yml",
                            f"user.{credentials.login_user()}.yml", "user.bob.yml"])
    for path in directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # a user's file holds no group secret of the agents and no admin secret
    bob = yaml.safe_load((directory / "user.bob.yml").read_text())
    assert "agents_secret" not in bob
    assert bob["secret"] not in (directory / "admin.yml").read_text()
    # the keeper's secret is in keeper.yml alone (copied only to the keeper hosts)
    keeper = yaml.safe_load((directory / "keeper.yml").read_text())
    assert all(keeper["secret"] not in (directory / name).read_text()
               for name in names if name != "keeper.yml")


def test_credential_mistakes_are_one_line_naming_the_file_and_exit_3(cluster):
    path, inventory, _ = cluster
    directory = store.credentials_dir(inventory.cluster)
    mine = directory / f"user.{credentials.login_user()}.yml"
    original = mine.read_text()

    def status_error() -> str:
        done = hypertf("status", "-i", str(path))
        assert done.returncode == 3, (done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        return done.stderr

    mine.chmod(0o644)
    assert f"{mine} is open to other users (mode 0644): chmod 600 {mine}" in status_error()
    mine.chmod(0o600)
    mine.write_text(original.replace("secret: ", "secret: stale", 1))
    assert f"ZooKeeper refused the credential {mine}" in status_error()
    mine.unlink()
    assert f"no ZooKeeper credential {mine}" in status_error()
    assert "no ZooKeeper credential" in hypertf("status", "-i", str(path),
                                                identity="user.nobody").stderr


def test_a_root_made_without_credentials_is_refused_until_the_admin_resets_it(
        zk_server, tmp_path):
    root = f"/open-{tmp_path.name}"
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": zk_server.hosts, "hypertf_zk_root": root,
                 "hypertf_zk_credentials": str(tmp_path / "credentials")},
        "children": {"gpu_nodes": {"hosts": {"n1": {"ansible_connection": "local"}}}},
    }}))
    old = KazooClient(hosts=zk_server.hosts)  # what HyperTF before credentials made
    old.start(timeout=10)
    try:
        old.ensure_path(f"{root}/jobs")
        old.create(f"{root}/matrix", b"{}")
    finally:
        old.stop()
        old.close()
    refused = hypertf("auth", "init", "-i", str(path))
    assert refused.returncode == 3
    assert f"ZooKeeper root {root}" in refused.stderr and "--reset" in refused.stderr
    # credentials were made, but the old root is still refused to every command
    status = hypertf("status", "-i", str(path))
    assert status.returncode == 3 and "made without credentials" in status.stderr
    assert "hypertf auth init --reset" in status.stderr
    reset = hypertf("auth", "init", "--reset", "-i", str(path))
    assert reset.returncode == 0, reset.stderr
    assert hypertf("status", "-i", str(path)).returncode == 0
    anonymous = KazooClient(hosts=zk_server.hosts)
    anonymous.start(timeout=10)
    try:
        with pytest.raises(NoAuthError):
            anonymous.set(f"{root}/matrix", b"{}")
    finally:
        anonymous.stop()
        anonymous.close()


def make_certificates(directory: Path) -> tuple[Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1: (server PEM, CA PEM)."""
    def openssl(*argv: str) -> None:
        subprocess.run(["openssl", *argv], check=True, capture_output=True, cwd=directory)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-subj", "/CN=hypertf-test-ca", "-days", "1")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
            "server.csr", "-subj", "/CN=127.0.0.1")
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "san.cnf")
    pem = directory / "server.pem"
    pem.write_text((directory / "server.key").read_text() + (directory / "server.crt").read_text())
    pem.chmod(0o600)
    return pem, directory / "ca.pem"


def test_tls_to_zookeeper_when_the_inventory_names_a_ca(state_home, tmp_path):
    """hypertf_zk_tls_ca: every client talks TLS to the secure port and verifies it; a
    client without TLS gets nothing from that port."""
    from hypertf.ops.zkserver import ZooKeeperServer, free_port

    pem, ca = make_certificates(tmp_path)
    server = ZooKeeperServer("127.0.0.1", free_port(), state_home / f"tls-{tmp_path.name}",
                             secure_port=free_port(), tls_pem=str(pem), tls_ca=str(ca))
    server.start(tick_ms=500)
    try:
        path = tmp_path / "inventory.yml"
        path.write_text(yaml.safe_dump({"all": {
            "vars": {"hypertf_zookeeper_hosts": f"127.0.0.1:{server.secure_port}",
                     "hypertf_zk_tls_ca": str(ca),
                     "hypertf_zk_credentials": str(tmp_path / "credentials")},
            "children": {"gpu_nodes": {"hosts": {"n1": {"ansible_connection": "local"}}}},
        }}))
        init = hypertf("auth", "init", "-i", str(path))
        assert init.returncode == 0, init.stderr
        status = hypertf("status", "-i", str(path), "--json")
        assert status.returncode == 0, status.stderr
        plain = KazooClient(hosts=f"127.0.0.1:{server.secure_port}")
        with pytest.raises(Exception):  # noqa: B017 - kazoo's timeout type varies
            plain.start(timeout=3)
        plain.stop()
        plain.close()
    finally:
        server.stop()


def test_a_registered_user_writes_nothing_outside_his_own_folders_and_waits_his_turn(
        cluster, job, launcher):
    """Bob, with his own valid credential, can read everything but change nothing outside
    his folders: not the matrix (so not another job's GPUs), not the limits, not a record,
    not another user's job. His request for the GPUs the job holds waits in the queue and
    is admitted once the job released them."""
    _, inventory, layout = cluster
    owner = credentials.login_user()
    paths = made(inventory, layout, job)
    bob = store.connect(inventory.cluster, identity="user.bob")
    shards = Store(bob, layout).matrix.read()[1].shards
    # every path Layout names, of the job's owner (not bob) and host n1; every shard
    outside = dict.fromkeys([*paths.values(), *(layout.matrix_shard(i) for i in range(shards))])
    assert owner != "bob" and paths["user_leases"] == layout.user_leases(owner)
    try:
        for path in outside:
            assert bob.get(path) is not None  # reading is every member's right
            for write in (lambda p: bob.set(p, b"{}"),
                          lambda p: bob.create(f"{p}/x.bob", b"{}"),
                          lambda p: bob.delete(p),
                          lambda p: bob.set_acls(p, OPEN_ACL_UNSAFE)):
                with pytest.raises((NoAuthError, NotEmptyError)):
                    write(path)
        matrix, _ = Store(bob, layout).matrix.read()
        assert matrix.gpus["n1"][0] == job  # the job's GPU was never set free

        got: list[object] = []
        waiter = threading.Thread(target=lambda: got.append(Store(bob, layout).queue.submit(
            Request((TaskSlot("worker", 0, 2),), ("n1",)), new_task_key("bob"))))
        waiter.start()
        wait_for(lambda: Store(bob, layout).queue.read_view(), 10, "bob's job in the queue")
        time.sleep(0.5)
        assert not got, "bob's job was admitted onto a GPU another job holds"
        launcher.matrix.release(job)
        waiter.join(20)
        assert got and got[0].placements[0].gpus == (0, 1)
    finally:
        store.close(bob)


def in_background(call: Callable[[], object]) -> None:
    """A waiter that waits until the test ends (its session closes then: not an error)."""
    def run() -> None:
        with contextlib.suppress(Exception):
            call()

    threading.Thread(target=run, daemon=True).start()


def test_priorities_are_capped_by_the_admin_and_a_users_own_record_gains_nothing(
        cluster, job, launcher):
    """The admin gives bob a maximum priority of 0. Bob asks for 50 and later writes 1000
    into his own queued record: a later job of priority 1 still goes first."""
    path, inventory, layout = cluster
    limited = hypertf("auth", "limits", "bob", "--max-priority", "0", "--gpu-limit", "2",
                      "-i", str(path), identity="admin")
    assert limited.returncode == 0, limited.stderr
    assert "bob: priority at most 0, GPUs at most 2" in limited.stdout
    refused = hypertf("auth", "limits", "bob", "--max-priority", "99", "-i", str(path),
                      identity="user.bob")
    assert refused.returncode != 0 and "only the cluster admin" in refused.stderr

    busy = Request((TaskSlot("worker", 0, 1),), ("n1",))
    launcher.queue.submit(busy, new_task_key(owner := credentials.login_user()))  # n1 is now full
    bob = store.connect(inventory.cluster, identity="user.bob")
    try:
        bobs = new_task_key("bob")
        in_background(lambda: Store(bob, layout).queue.submit(busy, bobs, priority=50))
        wait_for(lambda: [e["task_key"] for e in launcher.queue.read_view()] == [bobs], 10,
                 "bob's job waiting")
        data, stat_ = bob.get(layout.job(bobs))
        record = yaml.safe_load(data)
        record["queue"]["priority"] = 1000
        bob.set(layout.job(bobs), store.encode(record), version=stat_.version)
        mine = new_task_key(owner)
        in_background(lambda: launcher.queue.submit(busy, mine, priority=1))
        wait_for(lambda: [e["task_key"] for e in launcher.queue.read_view()] == [mine, bobs], 10,
                 "the priority-1 job ahead of bob's 1000")
        assert launcher.queue.read_view()[1]["priority"] == 0
    finally:
        store.close(bob)


def test_the_keeper_restores_a_running_jobs_cells_whoever_wrote_the_matrix(
        cluster, job, launcher):
    """The admin's credential (the one besides the keeper's that may write the matrix) sets
    the job's GPU free: the keeper's next pass gives it back, and a --no-wait request for
    it is refused meanwhile."""
    _, inventory, layout = cluster
    agent = store.connect(inventory.cluster, identity="admin")
    try:
        forged, _ = Store(agent, layout).matrix.read()
        forged.gpus["n1"] = [FREE, FREE]
        forged.ports.pop("n1", None)
        Store(agent, layout).matrix.overwrite(forged)
        wait_for(lambda: Store(agent, layout).matrix.read()[0].gpus["n1"][0] == job,
                 10, "the job's GPU restored")
        with pytest.raises(InsufficientResources):
            launcher.queue.submit(Request((TaskSlot("worker", 0, 2),), ("n1",)),
                                  new_task_key(credentials.login_user()), wait=False)
    finally:
        store.close(agent)


def test_a_root_in_the_previous_layout_is_refused_until_auth_init_migrates_it(cluster):
    """A root secured by an older HyperTF (no limits, a matrix users may write, every
    agent's record in one folder any agent may create in): every command says which command
    migrates it; after it, the matrix is closed to users and each host has its folder."""
    path, inventory, layout = cluster
    admin = store.connect(inventory.cluster, identity="admin")
    try:
        admin.delete(layout.limits)
        admin.delete(layout.hosts, recursive=True)
        admin.create(f"{layout.root}/resources", b"", acl=store.acls(admin).root())
        admin.set_acls(layout.matrix, [*store.acls(admin).root(), make_acl(
            "digest", store.credential_of(admin).member_id, read=True, write=True)])
    finally:
        store.close(admin)
    old = hypertf("status", "-i", str(path))
    assert old.returncode == 3, old.stdout + old.stderr
    assert "in a previous layout" in old.stderr and "'hypertf auth init -i INVENTORY'" \
        in old.stderr and old.stderr.count("\n") == 1, old.stderr
    migrated = hypertf("auth", "init", "-i", str(path), identity="admin")
    assert migrated.returncode == 0, migrated.stderr
    assert hypertf("status", "-i", str(path)).returncode == 0
    admin = store.connect(inventory.cluster, identity="admin")
    try:
        assert sorted(admin.get_children(layout.hosts)) == ["n1", "n2"]
    finally:
        store.close(admin)
    user = store.connect(inventory.cluster)
    try:
        with pytest.raises(NoAuthError):
            user.set(layout.matrix, b"{}")
    finally:
        store.close(user)


def test_a_matrix_in_one_znode_is_refused_until_auth_init_shards_it(cluster, job):
    """The previous layout's matrix (every row in the parent's data, as a HyperTF before
    shards wrote it) is refused by every command in one line naming the command that
    migrates it; ``auth init`` shards it and keeps the running job's cells and ports."""
    path, inventory, layout = cluster
    admin = store.connect(inventory.cluster, identity="admin")
    try:
        before, _ = Store(admin, layout).matrix.read()
        assert before.gpus["n1"][0] == job
        acl = store.acls(admin).matrix()
        admin.delete(layout.matrix, recursive=True)
        admin.create(layout.matrix, store.encode({"gpus": before.gpus, "ports": before.ports}),
                     acl=acl)
    finally:
        store.close(admin)
    old = hypertf("status", "-i", str(path))
    assert old.returncode == 3, old.stdout + old.stderr
    assert "in a previous layout" in old.stderr and "GPU matrix in one znode" in old.stderr
    assert "'hypertf auth init -i INVENTORY'" in old.stderr and old.stderr.count("\n") == 1
    migrated = hypertf("auth", "init", "-i", str(path), identity="admin")
    assert migrated.returncode == 0, migrated.stderr
    assert hypertf("status", "-i", str(path)).returncode == 0
    admin = store.connect(inventory.cluster, identity="admin")
    try:
        index = MatrixIndex.from_json(admin.get(layout.matrix)[0])
        assert index is not None and index.shards >= 1
        assert sorted(admin.get_children(layout.matrix)) == sorted(
            str(i) for i in range(index.shards))
        after, _ = Store(admin, layout).matrix.read()
        assert after == before  # the job keeps its GPU and its port
        assert bootstrap.current_layout(admin, layout.root)
    finally:
        store.close(admin)
    user = store.connect(inventory.cluster)
    try:
        for i in range(index.shards):
            with pytest.raises(NoAuthError):
                user.set(layout.matrix_shard(i), b"{}")
    finally:
        store.close(user)
