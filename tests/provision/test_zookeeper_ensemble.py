"""A 3-member ZooKeeper ensemble deployed by the role on lab hosts keeps serving, and the
agents keep their records, when one member dies; the next setup run brings it back."""

from __future__ import annotations

import time

import pytest
from kazoo.exceptions import NoNodeError

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.ops import provision
from hypertf.store import fourletter
from tests.conftest import on_host, wait_for

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]
MEMBERS = ("h1", "h2", "h3")
PIDFILE = "/srv/zookeeper/run/zookeeper.pid"


def test_ensemble_survives_a_dead_member(make_lab, lab_inventory, ansible_dirs, monkeypatch):
    for key, value in ansible_dirs.items():
        monkeypatch.setenv(key, value)
    lab = make_lab(hosts=3)
    path = lab_inventory(lab.dir, zookeeper=MEMBERS, tensorflow="")
    out: list[str] = []
    provision.setup(path, say=out.append)
    inventory = load_inventory(path)

    def modes() -> dict[str, str | None]:
        return {h: fourletter.mode(lab.host(h).address, 2181) for h in MEMBERS}

    assert sorted(map(str, modes().values())) == ["follower", "follower", "leader"], "\n".join(out)
    assert inventory.cluster.zookeeper_hosts.count(",") == 2

    client = store.connect(inventory.cluster, identity="admin")  # writes a probe at the root
    try:
        layout = store.Layout(inventory.cluster.zk_root)
        before = {h: client.exists(layout.resource(h)) for h in inventory.nodes}
        assert all(before.values()), before

        # The supervisor restarts a ZooKeeper that dies on its own.
        follower = next(h for h, m in modes().items() if m == "follower")
        java = on_host(inventory, follower, f"ps -o pid= --ppid $(cat {PIDFILE})").split()
        on_host(inventory, follower, f"kill -KILL {java[0]}")
        wait_for(lambda: modes()[follower] == "follower", 60, f"{follower} restarted")

        # Kill the leader's whole member (supervisor and server), as if its host lost it.
        leader = next(h for h, m in modes().items() if m == "leader")
        on_host(inventory, leader, f"kill -KILL -- -$(cat {PIDFILE})")
        wait_for(lambda: modes()[leader] is None, 10, f"{leader} down")
        wait_for(lambda: sorted(str(m) for h, m in modes().items() if h != leader)
                 == ["follower", "leader"], 60, "a new leader among the two left")

        # Still serving: writes succeed; the agents keep their records and sessions.
        probe = f"{layout.root}/probe-ensemble"
        client.create(probe, b"1", ephemeral=True)
        client.set(probe, b"2")
        for _ in range(2):  # now, and again after longer than a session timeout
            after = {h: client.exists(layout.resource(h)) for h in inventory.nodes}
            for host, stat in after.items():
                assert stat is not None, f"{host}'s record is gone"
                assert stat.czxid == before[host].czxid, f"{host}'s record was recreated"
                assert stat.ephemeralOwner == before[host].ephemeralOwner
            time.sleep(inventory.cluster.zk_session_timeout * 1.5)
        client.delete(probe)
    except NoNodeError as err:
        raise AssertionError(f"a record vanished: {err}") from None
    finally:
        store.close(client)

    # The next run starts the dead member again and changes nothing else.
    out.clear()
    run = provision.setup(path, say=out.append)
    changed = {h.name for h in run.hosts.values() if h.changed}
    assert changed == {leader}, "\n".join(out)
    wait_for(lambda: sorted(map(str, modes().values())) == ["follower", "follower", "leader"], 60,
             "three members serving again")
