"""The keeper's record cache, kept by watches on a real ZooKeeper (hypertf.keeper.recordcache).

A keeper's pass at 25,000 hosts must not read 37 MB of records again: once the cache
follows the hosts, a pass reads nothing, a keep-alive (a new heartbeat alone) is not a
change, a change of content or a record that comes or goes is, and one agent's unreadable
record counts as that host down without stopping the keeper for the others.
"""

from __future__ import annotations

import socket
import time
from dataclasses import replace

from hypertf import store
from hypertf.core.placement import PortRanges, Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.keeper import sync
from hypertf.keeper.recordcache import RecordCache, content_of
from hypertf.keeper.role import KeeperRole
from hypertf.store import AgentRecord, Store
from tests.conftest import wait_for


def record_of(client, layout, host: str) -> AgentRecord:
    return AgentRecord.from_json(client.get(layout.resource(host))[0])


def test_content_leaves_the_heartbeat_out():
    record = AgentRecord(host="n1", mgmt_addr="10.0.0.1", data_addr="10.0.0.1", port=1, gpu=2,
                         gpu_avail_list=[0, 1], heartbeat=12.5)
    content, beat = content_of(record.to_json())
    assert beat == 12.5
    assert content == content_of(replace(record, heartbeat=99.0).to_json())[0]
    assert content != content_of(replace(record, gpu_avail_list=[0]).to_json())[0]
    assert content_of(b'{"host":"n1"}') == (b'{"host":"n1"}', None)


def test_a_followed_record_is_read_on_change_only_and_a_keepalive_is_no_change(
        secured, layout, fake_agents):
    agents = fake_agents({"n1": 2, "n2": 2, "n3": 1})
    agents.delete(layout.resource("n3"))  # registered, its agent down
    client = store.connect(secured, identity="admin")
    try:
        reads: list[list[str]] = []

        class Counted(Store):
            def raw_records_written(self, hosts):
                reads.append(sorted(hosts))
                return super().raw_records_written(hosts)

        events: list[bool] = []
        cache = RecordCache(Counted(client, layout), changed=events.append)
        cache.follow()
        hosts = ["n1", "n2", "n3"]
        assert sorted(cache.records(hosts)) == ["n1", "n2"]
        assert reads == [hosts], "the first pass reads every host once"
        assert Store(client, layout).live_hosts() == ["n1", "n2"]  # folders' children only
        assert cache.records(hosts) and reads == [hosts], "a quiet pass read ZooKeeper"
        generation = cache.generation

        def after(change, host: str, expect) -> None:
            """Make ``change``; the next passes read ``host`` only, until ``expect``."""
            reads.clear()
            change()
            wait_for(lambda: expect(cache.records(hosts)), 10, f"{host}'s change")
            assert all(read == [host] for read in reads), reads

        # a keep-alive: the heartbeat alone changes; its time is kept (``written``, by
        # ZooKeeper's clock), the parsed record is not touched: not a change of content
        beat = time.time() + 100
        old = record_of(agents, layout, "n1")
        before, parsed = cache.written["n1"], cache.records(hosts)["n1"]
        cache.touched()
        time.sleep(0.01)  # a later mtime
        after(lambda: agents.set(layout.resource("n1"), replace(old, heartbeat=beat).to_json()),
              "n1", lambda _found: cache.written["n1"] > before)
        assert cache.generation == generation and cache.records(hosts)["n1"] is parsed
        assert cache.touched() == (set(), {"n1"}), "a keep-alive, not a change"
        # a change of content, a record that goes, one that comes
        after(lambda: agents.set(layout.resource("n1"),
                                 replace(old, gpu_avail_list=[0]).to_json()),
              "n1", lambda found: found["n1"].gpu_avail_list == [0])
        assert cache.generation == generation + 1
        after(lambda: agents.delete(layout.resource("n2")), "n2",
              lambda found: "n2" not in found)
        after(lambda: agents.create(layout.resource("n3"), replace(old, host="n3").to_json(),
                                    ephemeral=True), "n3", lambda found: "n3" in found)
        assert cache.generation == generation + 3
        assert events == [False, False, True, True]  # keep-alive, change, gone, come

        # a host never asked for is read when it is
        reads.clear()
        assert sorted(cache.records(["n1", "n3", "n9"])) == ["n1", "n3"]
        assert reads == [["n9"]]

        # a reconnect loses the watch: it is set again and every host read once more
        states: list[str] = []
        client.add_listener(states.append)
        client._connection._socket.shutdown(socket.SHUT_RDWR)  # the server stays: a blip
        wait_for(lambda: client.connected and "SUSPENDED" in states, 20, "a reconnect")
        reads.clear()
        cache.records(hosts)
        assert reads == [hosts]
        cache.forget()
    finally:
        store.close(client)


def test_an_agents_unreadable_record_counts_its_host_down_and_stops_nobody(
        secured, layout, fake_agents, keeper, zk, caplog):
    """Agent n1, with its own credential, writes a record that does not parse: the keeper
    logs it once, turns n1's row unavailable and goes on admitting jobs on n2."""
    fake_agents({"n2": 2})
    store.secure_cluster(secured, ["n1", "n2"], users=["alice"])
    agent = store.connect(secured, identity="agent.n1")
    user = store.connect(secured, identity="user.alice")
    try:
        agent.create(layout.resource("n1"), b'{"format":1,"host":"n1","gpu":"many"}',
                     ephemeral=True, acl=store.acls(agent).agent_record())
        keeping = keeper()
        hosts = ("n1", "n2")
        request = Request((TaskSlot("worker", 0, 2),), hosts,
                          port_ranges=PortRanges(hosts, (20000, 20999)))
        grant = Store(user, layout).queue.submit(request, new_task_key("alice"))
        assert [p.host for p in grant.placements] == ["n2"]
        matrix, _ = Store(zk, layout).matrix.read()
        assert matrix.gpus.get("n1", []) == [] or all(
            cell != "free" for cell in matrix.gpus["n1"])
        wait_for(lambda: keeping.passes > 0, 10, "the keeper's pass counted")  # no error
        assert sum("unreadable agent record" in r.message for r in caplog.records) == 1
    finally:
        store.close(agent)
        store.close(user)


def test_a_pass_with_nothing_moved_does_not_sync_again(secured, layout, fake_agents, zk,
                                                       monkeypatch):
    """The sync is skipped while the matrix, the records' content, the hosts and the live
    grants are what the last in-line sync saw; a record's change brings it back."""
    agents = fake_agents({"n1": 2, "n2": 2})
    role = KeeperRole(Store(zk, layout), wake=lambda: None).start()
    try:
        role.keep()
        role.keep()  # in line now (the first may have written the rows)
        calls: list[int] = []
        real = sync.synced
        monkeypatch.setattr(sync, "synced",
                            lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
        role.keep()
        role.keep()
        assert calls == []
        old = record_of(agents, layout, "n1")
        agents.set(layout.resource("n1"), replace(old, gpu_avail_list=[0]).to_json())
        wait_for(lambda: role.keep() is not None and calls, 10, "a sync after the change")
        matrix, _ = Store(zk, layout).matrix.read()
        assert matrix.gpus["n1"] == [1, 0]
    finally:
        role.stop()
