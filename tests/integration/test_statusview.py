"""``hypertf status`` past 64 hosts reads the keeper's view (hypertf.core.hostview) and shows
what reading every record shows; without a whole view it reads the records; only the keeper
can write the view."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import yaml
from kazoo.exceptions import NoAuthError
from rich.console import Console

from hypertf import store
from hypertf.cli import statustable
from hypertf.config.inventory import load_inventory
from hypertf.core.hostview import REFRESH_S
from hypertf.core.placement import Request, new_task_key
from hypertf.core.records import AgentRecord, GpuInfo
from hypertf.core.scheduler import TaskSlot
from hypertf.keeper.statusview import StatusPublisher
from hypertf.keeper.sync import sync
from hypertf.store import Store, credentials, status
from tests.conftest import wait_for

HOSTS = 70  # past statustable.COMPACT_FROM_HOSTS: the compact view, from the keeper's


@pytest.fixture
def big(secured, layout, fake_agents, tmp_path):
    names = [f"n{i:02d}" for i in range(HOSTS)]
    agents = fake_agents({name: 2 for name in names})
    odd = AgentRecord(host="n01", mgmt_addr="127.0.0.3", data_addr="127.0.0.3", port=20001,
                      gpu=2, gpu_avail_list=[0], gpu_source="static", confine="cgroup",
                      gpus=[GpuInfo(0, "A100", "GPU-a", 0.0, 0, 80, available=True),
                            GpuInfo(1, "A100", "GPU-b", 0.0, 0, 80, available=False,
                                    reason="ECC errors")],
                      heartbeat=time.time())
    agents.set(layout.resource("n01"), odd.to_json())
    agents.set(layout.resource("n02"), b"not json")  # a hostile agent's record
    agents.delete(layout.resource("n03"))  # registered, its agent down
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": secured.zookeeper_hosts,
                 "hypertf_zk_root": secured.zk_root},
        "children": {"gpu_nodes": {"hosts": {
            name: {"ansible_host": f"127.0.0.{i + 2}"} for i, name in enumerate(names)}}}}}))
    return path, agents, odd


def shown(report: dict) -> dict:
    """What the compact status shows of a report (the heartbeat's age apart)."""
    return {"hosts": [{k: v for k, v in h.items() if k != "heartbeat_age_s"}
                      for h in report["hosts"]],
            "jobs": report["jobs"], "trespasses": report["trespasses"]}


def test_status_from_the_keepers_view_shows_what_the_records_show(big, secured, layout,
                                                                  keeper):
    path, agents, odd = big
    inventory = load_inventory(path)
    client = store.connect(secured)
    thread = keeper()
    try:
        view = wait_for(lambda: status.collect_view(client, inventory), 20, "the view")
        direct = status.collect(client, inventory, gpu_details=False)
        assert shown(view) == shown(direct)
        by_name = {h["name"]: h for h in view["hosts"]}
        assert by_name["n01"]["gpus"][1]["reason"] == "ECC errors"
        assert by_name["n01"]["confine"] == "cgroup"
        assert "unreadable agent record" in by_name["n02"]["unreadable"]
        assert by_name["n02"]["agent"] == "down"
        assert by_name["n03"]["agent"] == "down"
        assert all(h["heartbeat_age_s"] <= REFRESH_S + 5 for h in view["hosts"]
                   if h["agent"] == "up")

        # A record that changes shows at the keeper's next passes (its shard alone).
        agents.set(layout.resource("n01"), replace(odd, gpus=[
            odd.gpus[0], replace(odd.gpus[1], reason="fell off the bus")]).to_json())
        wait_for(lambda: [h["gpus"][1].get("reason") for h in status.collect_view(
            client, inventory)["hosts"] if h["name"] == "n01"] == ["fell off the bus"], 10,
                 "the new reason in the view")

        # A job admitted now shows in the view at the keeper's next passes.
        user = Store(client, layout)
        key = new_task_key(credentials.login_user())
        user.queue.submit(Request((TaskSlot("worker", 0, 2),), ("n10",)), key)

        def n10() -> list[dict]:
            view = status.collect_view(client, inventory) or {"hosts": []}
            return next((h["gpus"] for h in view["hosts"] if h["name"] == "n10"), [])

        wait_for(lambda: (gpus := n10()) and all(g["task_key"] == key for g in gpus), 10,
                 "the grant in the view")
        assert [g["state"] for g in n10()] == ["busy", "busy"]
        view = status.collect_view(client, inventory)
        assert shown(view) == shown(status.collect(client, inventory, gpu_details=False))
        out = io.StringIO()
        statustable.render(view, Console(file=out, width=200))
        assert "from the keeper's view" in out.getvalue()
        user.matrix.release(key)

        # The keeper gone, its view goes with its session: status reads the records.
        thread.stop()
        wait_for(lambda: status.collect_view(client, inventory) is None, 10, "the view gone")
    finally:
        store.close(client)


def test_the_command_uses_the_view_past_64_hosts_and_direct_on_request(big, keeper):
    path, *_ = big
    keeper()
    inventory = load_inventory(path)
    client = store.connect(load_inventory(path).cluster)
    try:
        wait_for(lambda: status.collect_view(client, inventory), 20, "the view")
    finally:
        store.close(client)

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "hypertf.cli", "status", "-i", str(path),
                               *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "from the keeper's view" in run()
    assert "from the keeper's view" not in run("--direct")
    assert '"view"' not in run("--json")


@pytest.mark.parametrize("identity", ["user", "agent"])
def test_only_the_keeper_writes_the_view(big, secured, layout, keeper, identity):
    """A user's or an agent's own valid credential can neither change nor plant a shard."""
    path, *_ = big
    keeper()
    inventory = load_inventory(path)
    admin = store.connect(secured, identity="admin")
    thief = store.connect(secured, identity=None if identity == "user" else "agent.n05")
    try:
        wait_for(lambda: status.collect_view(admin, inventory), 20, "the view")
        with pytest.raises(NoAuthError):
            thief.set(layout.status_view(0), b'{"format":1}')
        shards = len(admin.get_children(layout.keeper))
        with pytest.raises(NoAuthError):
            thief.create(layout.status_view(shards + 5), b"{}", ephemeral=True)
        assert status.collect_view(admin, inventory) is not None
    finally:
        store.close(thief)
        store.close(admin)


def test_a_keeper_that_may_not_write_the_view_says_so_once_and_stops_trying(
        secured, layout, fake_agents):
    """A root whose rules this keeper's credential does not meet (here: a user's, standing in
    for a root secured by an older HyperTF): one warning, then no request a pass; the
    command reads every record."""
    fake_agents({"n1": 1, "n2": 1})
    admin = store.connect(secured, identity="admin")
    user = store.connect(secured)
    try:
        synced = sync(Store(admin, layout))
        publisher = StatusPublisher(Store(user, layout))
        args = (synced.matrix, synced.version, synced.records, {}, {}, ["n1", "n2"], set())
        assert publisher.publish(*args) == 0
        assert "NoAuthError" in publisher.off and "hypertf auth init" in publisher.off
        sent = user.last_zxid
        assert publisher.publish(*args) == 0 and user.last_zxid == sent
        assert not [n for n in admin.get_children(layout.keeper) if n.startswith("status.")]
    finally:
        store.close(user)
        store.close(admin)
