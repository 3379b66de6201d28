"""Shared fixtures: one real ZooKeeper and one lab per test session, torn down even on failure.

The ZooKeeper listens on loopback only; the lab's hosts are network namespaces this session
creates itself (see hypertf.ops.lab). Each test gets its own ZooKeeper root, so tests sharing the
server never see each other's matrix.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from hypertf import store
from hypertf.config.inventory import Inventory, load_inventory
from hypertf.config.settings import ClusterSettings
from hypertf.keeper.thread import KeeperThread
from hypertf.launch.remote import Session
from hypertf.ops import lab as lab_module
from hypertf.ops.zkserver import ZooKeeperServer, free_port
from hypertf.store import AgentRecord, Layout

REPO = Path(__file__).resolve().parent.parent


def wait_for(predicate: Callable[[], object], timeout: float, what: str,
             interval: float = 0.1) -> object:
    """Poll with a deadline instead of sleeping; the failure says what did not happen."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def on_host(inventory: Inventory | str, host: str, command: str) -> str:
    """Run a shell command on an inventory host over SSH (pinned keys); its stdout."""
    inv = load_inventory(inventory) if isinstance(inventory, str) else inventory
    session = Session(inv.node(host), inv.cluster)
    try:
        result = session.run(command, timeout=30)
    finally:
        session.close()
    assert result.ok, result.stderr
    return result.stdout


@pytest.fixture(scope="session")
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private HYPERTF_HOME under the user's home (0700): sshd's StrictModes refuses keys
    below a world-writable directory, and a checkout may well live under /tmp."""
    home = Path.home() / ".hypertf" / f"test-{secrets.token_hex(3)}"
    home.mkdir(parents=True, mode=0o700)
    old = os.environ.get("HYPERTF_HOME")
    os.environ["HYPERTF_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("HYPERTF_HOME", None)
    else:
        os.environ["HYPERTF_HOME"] = old
    import shutil

    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _private_state_home(state_home: Path) -> Path:
    """Every test writes HyperTF's state (the inventory cache too) in the session's home."""
    return state_home


@pytest.fixture(scope="session")
def zk_server(state_home: Path, request: pytest.FixtureRequest) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer("127.0.0.1", free_port(), state_home / "zookeeper")
    server.start(tick_ms=500)
    yield server
    if request.session.testsfailed:
        tail = server.logfile.read_text(errors="replace").splitlines()[-30:]
        print("\n--- ZooKeeper log (last lines) ---\n" + "\n".join(tail))
    server.stop()


@pytest.fixture
def cluster_settings(zk_server: ZooKeeperServer) -> ClusterSettings:
    """Settings for a fresh ZooKeeper root, private to this test."""
    return ClusterSettings(
        gpu_group="gpu_nodes",
        zookeeper_hosts=zk_server.hosts,
        zk_root=f"/test-{secrets.token_hex(4)}",
        zk_session_timeout=2.0,
        known_hosts="/nonexistent",
        ssh_timeout=5.0,
    )


@pytest.fixture
def layout(cluster_settings: ClusterSettings) -> Layout:
    return Layout(cluster_settings.zk_root)


@pytest.fixture
def secured(cluster_settings: ClusterSettings) -> ClusterSettings:
    """The test's root, secured: credentials for the admin and this user
    (hypertf.store.credentials)."""
    store.secure_cluster(cluster_settings, [])
    return cluster_settings


@pytest.fixture
def zk(secured: ClusterSettings, layout: Layout) -> Iterator[KazooClient]:
    """The admin's client (it may do anything) on the test's secured root."""
    client = store.connect(secured, identity="admin")
    yield client
    store.close(client)


@pytest.fixture
def fake_agents(secured: ClusterSettings, layout: Layout,
                ) -> Iterator[Callable[[dict[str, int]], KazooClient]]:
    """Publish agent records (the real format) from a separate (admin) session, like agents
    would."""
    clients: list[KazooClient] = []

    def publish(gpus_per_host: dict[str, int]) -> KazooClient:
        store.secure_cluster(secured, list(gpus_per_host))  # registers the hosts
        client = store.connect(secured, identity="admin")
        clients.append(client)
        for i, (host, gpus) in enumerate(gpus_per_host.items()):
            record = AgentRecord(host=host, mgmt_addr=f"127.0.0.{i + 2}",
                                 data_addr=f"127.0.0.{i + 2}", port=20000 + i, gpu=gpus,
                                 gpu_avail_list=list(range(gpus)), heartbeat=time.time())
            client.create(layout.resource(host), record.to_json(), ephemeral=True)
        return client

    yield publish
    for client in clients:
        store.close(client)


@pytest.fixture
def keeper(secured: ClusterSettings) -> Iterator[Callable[..., KeeperThread]]:
    """Run the keeper's pass (the real Admitter) in a thread for hosts without agent
    processes: ``keeper()`` for the test's root, ``keeper(settings, user_gpu_limit=2)``."""
    started: list[KeeperThread] = []

    def start(cluster: ClusterSettings | None = None, user_gpu_limit: int = 0,
              user_queue_limit: int = 200) -> KeeperThread:
        thread = KeeperThread(cluster or secured, user_gpu_limit,
                              user_queue_limit=user_queue_limit).start()
        started.append(thread)
        return thread

    yield start
    for thread in started:
        thread.stop()


LAB_HOSTS, LAB_GPUS = 3, 4


class SharedLab:
    """The session's lab; replaced when a test broke it beyond repair."""

    def __init__(self) -> None:
        self.current: lab_module.Lab | None = None

    def get(self) -> lab_module.Lab:
        if self.current is None:
            self.current = lab_module.up(hosts=LAB_HOSTS, gpus=LAB_GPUS)
        return self.current


@pytest.fixture(scope="session")
def shared_lab(state_home: Path) -> Iterator[SharedLab]:
    """Three hosts with four static GPUs each, agents running; removed at the end."""
    shared = SharedLab()
    try:
        yield shared
    finally:
        if shared.current is not None:
            lab_module.down(shared.current)


@pytest.fixture
def lab(shared_lab: SharedLab, request: pytest.FixtureRequest) -> lab_module.Lab:
    """The shared lab, healthy: checked before each test and repaired (or rebuilt) if an
    earlier test left it damaged, so one failing test fails alone."""
    from tests.lab_health import ensure_healthy

    healthy, problems = ensure_healthy(shared_lab.get(), LAB_GPUS)
    shared_lab.current = healthy
    if problems:
        print(f"\n[lab] repaired before {request.node.name}: {'; '.join(problems)}")
    return healthy


@pytest.fixture(autouse=True)
def _no_launcher_left() -> Iterator[None]:
    """Launchers a test started and did not wait for (an assert failed first) are
    interrupted, then killed, so they release what they hold before the next test."""
    from tests.launcher.helpers import stop_started

    yield
    stop_started()
