"""Preemption against a real ZooKeeper and the real keeper pass (the fake agents' hosts: two
of 2 GPUs), the victim's launcher played by the test as the real one acts (hypertf.launch:
watch the notice, release 'preempted', enqueue the next attempt with ``resumes``): the
notice, the preemptor admitted on the freed GPUs, the victim requeued at its old place; the
minimum runtime, the same tier left alone, the admin's exemption; the deadline draining a
victim that ignores its notice, and a victim whose launcher died ending 'preempted'. Then
the thieves, each with its own valid credential: a user's and an agent's."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.config.settings import ClusterSettings
from hypertf.core.errors import StoreError
from hypertf.core.grants import terms_of_grant
from hypertf.core.placement import PortRanges, Request, new_task_key
from hypertf.core.preemptnotice import Notice
from hypertf.core.scheduler import TaskSlot
from hypertf.keeper import queueview
from hypertf.node.hostreport import HostReport
from hypertf.node.metrics import AgentCollector
from hypertf.store import AgentRecord, Layout, Store
from hypertf.store.bootstrap import set_user_limits
from tests.conftest import wait_for

HOSTS = {"n1": 2, "n2": 2}
GRACE = 30.0


@pytest.fixture
def users(secured: ClusterSettings, fake_agents) -> Iterator[dict[str, KazooClient]]:
    """bob, alice and carol with a client each, agent n1's client, and the admin client
    that publishes the fake agents' records (``records``)."""
    store.secure_cluster(secured, list(HOSTS), users=["bob", "alice", "carol"])
    clients = {"records": fake_agents(HOSTS)}
    clients |= {name: store.connect(secured, identity=f"user.{name}")
                for name in ("bob", "alice", "carol")}
    clients["agent"] = store.connect(secured, identity="agent.n1")
    yield clients
    for name, client in clients.items():
        if name != "records":
            store.close(client)


def preempting(secured: ClusterSettings, grace: float = GRACE, min_runtime: float = 0.0,
               half_life: float = 0.0) -> ClusterSettings:
    return dataclasses.replace(secured, preempt=True, preempt_grace_s=grace,
                               preempt_min_runtime_s=min_runtime, fairshare_half_life=half_life)


def gpus(n: int) -> Request:
    hosts = tuple(HOSTS)
    return Request(tuple(TaskSlot("worker", i, 1) for i in range(n)), hosts,
                   port_ranges=PortRanges(hosts, (20000, 20999)))


def notice_of(zk: KazooClient, layout: Layout, victim: str) -> Notice | None:
    found = zk.exists(layout.preempt(victim))
    return Notice.from_json(zk.get(layout.preempt(victim))[0], victim) if found else None


def view(zk: KazooClient, layout: Layout) -> dict:
    found = zk.exists(layout.queue_view)
    return json.loads(zk.get(layout.queue_view)[0]) if found else {}


def reason_of(zk: KazooClient, layout: Layout, key: str) -> str | None:
    return next((e["reason"] for e in view(zk, layout).get("waiting", [])
                 if e["task_key"] == key), None)


def run_all(zk: KazooClient, layout: Layout, client: KazooClient, user: str, n: int = 4,
            extra: dict | None = None, priority: int = 0) -> str:
    """A job of ``user`` holding ``n`` GPUs, admitted."""
    key = new_task_key(user)
    Store(client, layout).queue.enqueue(key, gpus(n), extra or {}, priority=priority)
    wait_for(lambda: Store(zk, layout).queue.read_grant(key), 10, f"{user}'s job admitted")
    return key


def test_a_higher_tier_preempts_and_the_victim_resumes_at_its_old_place(
        users, zk, layout, secured, keeper) -> None:
    """bob's priority-0 job holds every GPU; alice's priority-5 job preempts it: the notice
    (deadline = at + grace, 'priority', bob's order, count 1), alice 'Preempting'; bob's
    launcher releases 'preempted' and requeues with resumes: alice is admitted on the freed
    GPUs (carol's job, waiting since before, does not take them), bob's next attempt waits
    'Requeued' ahead of carol (his old place), is admitted when alice ends, and inherits
    the count; the notice is then deleted. bob's record claiming exemptions is not read."""
    keeper(preempting(secured))
    bob = run_all(zk, layout, users["bob"], "bob",
                  extra={"no_preempt": True, "no_preempt_ok": True, "preemptible": False})
    order = zk.exists(layout.job(bob)).czxid
    carol = new_task_key("carol")
    Store(users["carol"], layout).queue.enqueue(carol, gpus(1), {})
    alice = new_task_key("alice")
    Store(users["alice"], layout).queue.enqueue(alice, gpus(4), {}, priority=5)
    notice = wait_for(lambda: notice_of(zk, layout, bob), 10, "the notice to bob")
    assert isinstance(notice, Notice)
    assert (notice.by, notice.reason, notice.order, notice.count) == (alice, "priority",
                                                                      order, 1)
    assert notice.deadline == pytest.approx(notice.at + GRACE) and \
        abs(notice.at - time.time()) < 10
    wait_for(lambda: reason_of(zk, layout, alice) == "Preempting", 10, "alice Preempting")
    assert view(zk, layout)["preemptions_total"] == {"priority": 1, "fairshare": 0}
    assert [row["reason"] for row in queueview.collect(Store(zk, layout))
            if row["task_key"] == alice] == ["Preempting"]
    # bob's launcher: the tasks stopped, the attempt released 'preempted', the next queued
    Store(users["bob"], layout).matrix.release(bob, state="preempted")
    bob2 = new_task_key("bob")
    Store(users["bob"], layout).queue.enqueue(bob2, gpus(4), {}, resumes=bob)
    wait_for(lambda: Store(zk, layout).queue.read_grant(alice), 10, "alice admitted")
    assert Store(zk, layout).queue.read_grant(carol) is None  # the freed GPUs were alice's
    entries = wait_for(lambda: [(e["task_key"], e["reason"]) for e in
                                view(zk, layout).get("waiting", [])] == [
        (bob2, "Requeued"), (carol, "Resources")] and True, 10, "bob's attempt Requeued")
    assert entries
    Store(users["alice"], layout).matrix.release(alice)
    wait_for(lambda: Store(zk, layout).queue.read_grant(bob2), 10, "bob's next attempt admitted")
    assert Store(zk, layout).queue.read_grant(carol) is None  # bob was ahead of her
    terms = terms_of_grant(zk.get(layout.grant(bob2))[0])
    assert terms is not None and (terms.order, terms.preemptions, terms.resumes) == (
        order, 1, bob)
    wait_for(lambda: not zk.exists(layout.preempt(bob)), 10, "the served notice deleted")
    record = json.loads(zk.get(layout.job(bob))[0])
    assert record["state"] == "preempted"


def test_the_minimum_runtime_holds(users, zk, layout, secured, keeper) -> None:
    """With a minimum runtime of 2 s, bob's job is preempted no sooner than 2 s after it
    was granted (the keeper's clock); meanwhile alice waits for Resources."""
    keeper(preempting(secured, min_runtime=2.0))
    bob = run_all(zk, layout, users["bob"], "bob")
    granted = json.loads(zk.get(layout.grant(bob))[0])["granted"]
    alice = new_task_key("alice")
    Store(users["alice"], layout).queue.enqueue(alice, gpus(2), {}, priority=5)
    wait_for(lambda: reason_of(zk, layout, alice) == "Resources", 10, "alice waiting")
    notice = wait_for(lambda: notice_of(zk, layout, bob), 10, "the notice after 2 s")
    assert isinstance(notice, Notice) and notice.at >= granted + 2.0


def test_the_same_tier_and_an_exempt_user_are_not_preempted(
        users, zk, layout, secured, keeper) -> None:
    """Fair share off: alice's priority-0 job waits behind bob's priority-0 job; carol's
    priority-5 job does not preempt it either once the admin gave bob --no-preempt-ok."""
    set_user_limits(zk, secured.zk_root, "bob", None, None, no_preempt_ok=True)
    keeper(preempting(secured))
    bob = run_all(zk, layout, users["bob"], "bob")
    alice, carol = new_task_key("alice"), new_task_key("carol")
    Store(users["alice"], layout).queue.enqueue(alice, gpus(1), {})
    Store(users["carol"], layout).queue.enqueue(carol, gpus(1), {}, priority=5)
    wait_for(lambda: reason_of(zk, layout, alice) and reason_of(zk, layout, carol), 10,
             "both waiting")
    time.sleep(1.0)  # passes every 0.2 s
    assert not zk.exists(layout.preempt(bob))
    assert reason_of(zk, layout, carol) == "Resources"
    set_user_limits(zk, secured.zk_root, "bob", None, None, no_preempt_ok=False)
    notice = wait_for(lambda: notice_of(zk, layout, bob), 15, "preemptible again")
    assert isinstance(notice, Notice) and notice.by == carol


def agents_report(client: KazooClient, layout: Layout, drained: list[str]) -> None:
    """The fake agents report ``drained`` dead on their hosts (what a real one does once
    it stopped the job's tasks there)."""
    for i, (host, n) in enumerate(HOSTS.items()):
        record = AgentRecord(host=host, mgmt_addr=f"127.0.0.{i + 2}",
                             data_addr=f"127.0.0.{i + 2}", port=20000 + i, gpu=n,
                             gpu_avail_list=list(range(n)), heartbeat=time.time(),
                             drained=drained)
        client.set(layout.resource(host), record.to_json())


def host_reports(tmp_path: Path) -> dict[str, HostReport]:
    """The agents' own reporting code (hypertf.node.hostreport) for n1 and n2, their run
    directories under ``tmp_path`` (nothing of bob runs there: a drain finds him dead)."""
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": "127.0.0.1:2181", "hypertf_gpu_source": "none",
                 "hypertf_workdir": str(tmp_path / "work"), "hypertf_venv": sys.prefix},
        "children": {"gpu_nodes": {"hosts": {h: {"ansible_connection": "local"}
                                             for h in HOSTS}}}}}))
    inventory = load_inventory(path)
    return {h: HostReport(inventory.node(h), Layout("/unused"), AgentCollector(h),
                          lambda *_: None) for h in HOSTS}


def test_the_deadline_drains_a_victim_that_ignores_its_notice(
        users, zk, layout, secured, keeper, tmp_path) -> None:
    """Grace 1 s; bob's launcher never reacts: at the deadline his cells turn draining
    (not restored though his grant and lease live); the agents (their own code and
    credentials) stop his tasks only then, and report them; only then is alice admitted."""
    keeper(preempting(secured, grace=1.0))
    reports = host_reports(tmp_path)
    agents = {h: store.connect(secured, identity=f"agent.{h}") for h in HOSTS}
    bob = run_all(zk, layout, users["bob"], "bob")
    alice = new_task_key("alice")
    Store(users["alice"], layout).queue.enqueue(alice, gpus(2), {}, priority=5)
    notice = wait_for(lambda: notice_of(zk, layout, bob), 10, "the notice")
    assert isinstance(notice, Notice)
    if time.time() < notice.deadline - 0.3:  # within the grace his live job is his
        reports["n1"].confirm_drained(Store(agents["n1"], layout))
        assert reports["n1"].drained == set()

    def drained() -> bool:
        matrix, _ = Store(zk, layout).matrix.read()
        return all(cell == f"draining:{bob}" for row in matrix.gpus.values() for cell in row)

    wait_for(drained, 10, "bob's cells draining at the deadline")
    assert time.time() >= notice.deadline
    time.sleep(0.6)  # passes: the live grant is not restored, alice not admitted on faith
    assert drained() and Store(zk, layout).queue.read_grant(alice) is None
    assert zk.exists(layout.lease(bob)) and zk.exists(layout.grant(bob))
    for host, report in reports.items():
        report.confirm_drained(Store(agents[host], layout))
        assert report.drained == {bob}, host
        store.close(agents[host])
    agents_report(users["records"], layout, [bob])  # what each agent's record then says
    wait_for(lambda: Store(zk, layout).queue.read_grant(alice), 10, "alice admitted")
    Store(users["bob"], layout).matrix.release(bob, state="preempted")
    wait_for(lambda: not zk.exists(layout.grant(bob)), 10, "bob's grant gone")
    assert Store(zk, layout).queue.read_grant(alice) is not None


def test_a_victim_whose_launcher_died_ends_preempted_not_lost(
        users, zk, layout, secured, keeper) -> None:
    """bob's launcher's session ends after the notice, without a release: his record ends
    'preempted' (by alice), and alice is admitted once his cells are drained."""
    keeper(preempting(secured))
    launcher = store.connect(secured, identity="user.bob")
    bob = run_all(zk, layout, launcher, "bob")
    alice = new_task_key("alice")
    Store(users["alice"], layout).queue.enqueue(alice, gpus(4), {}, priority=5)
    wait_for(lambda: notice_of(zk, layout, bob), 10, "the notice")
    store.close(launcher)
    record = wait_for(lambda: (r := json.loads(zk.get(layout.job(bob))[0]))["state"]
                      != "allocated" and r, 15, "bob's record ended")
    assert record["state"] == "preempted" and record["preempted_by"] == alice  # type: ignore[index]
    agents_report(users["records"], layout, [bob])
    wait_for(lambda: Store(zk, layout).queue.read_grant(alice), 10, "alice admitted")


def test_thieves_write_no_notice_take_no_place_and_exempt_nobody(
        users, zk, layout, secured, keeper) -> None:
    """As the thief, with the thief's own valid credential: a user (carol) and an agent
    cannot create, change or delete a notice; carol's job naming bob's preempted attempt
    (another user's) in ``resumes``, and bob's naming his own key never preempted, get no early
    place; a user cannot set --no-preempt-ok for himself."""
    keeper(preempting(secured))
    bob = run_all(zk, layout, users["bob"], "bob")
    urgent = new_task_key("alice")
    Store(users["alice"], layout).queue.enqueue(urgent, gpus(4), {}, priority=5)
    wait_for(lambda: notice_of(zk, layout, bob), 10, "the notice to bob")
    original = zk.get(layout.preempt(bob))[0]
    forged = Notice(urgent, bob, time.time(), time.time() + 1, "priority").to_json()
    for who in ("carol", "bob", "agent"):
        thief = users[who]
        acl = store.acls(thief).of("preempt")
        for write in (lambda t=thief, a=acl: t.create(layout.preempt(urgent), forged, acl=a),
                      lambda t=thief: t.set(layout.preempt(bob), forged),
                      lambda t=thief: t.delete(layout.preempt(bob))):
            with pytest.raises(NoAuthError):
                write()
        with pytest.raises(StoreError, match="only the cluster admin"):
            set_user_limits(thief, secured.zk_root, who if who != "agent" else "bob", None,
                            None, no_preempt_ok=True)
    assert zk.get(layout.preempt(bob))[0] == original
    # carol's early job, then the thieves' requests naming attempts that are not theirs
    # or not preempted: they stay behind carol's, at their own places
    first = new_task_key("carol")
    Store(users["carol"], layout).queue.enqueue(first, gpus(4), {})
    stolen, unpreempted = new_task_key("carol"), new_task_key("bob")
    Store(users["carol"], layout).queue.enqueue(stolen, gpus(4), {}, resumes=bob)
    # his own, never preempted
    Store(users["bob"], layout).queue.enqueue(unpreempted, gpus(4), {},
                                              resumes=new_task_key("bob"))
    wait_for(lambda: len(view(zk, layout).get("waiting", [])) == 4, 10, "all waiting")
    Store(users["bob"], layout).matrix.release(bob, state="preempted")
    wait_for(lambda: Store(zk, layout).queue.read_grant(urgent), 10, "alice admitted")
    waiting = wait_for(lambda: [(e["task_key"], e["reason"]) for e in
                                view(zk, layout)["waiting"]] == [
        (first, "Resources"), (stolen, "Resources"), (unpreempted, "Resources")]
                       and True, 10, "the thieves at their own places")
    assert waiting


def test_a_new_keeper_keeps_the_notices_places_and_counts(users, zk, layout, secured,
                                                          keeper) -> None:
    """The keeper that preempted bob stops before his job is requeued: the next one reads
    the notice and the grants' terms, so alice still gets the GPUs, bob's next attempt its
    old place ('Requeued') and count, and the served notice is deleted."""
    first = keeper(preempting(secured))
    bob = run_all(zk, layout, users["bob"], "bob")
    order = zk.exists(layout.job(bob)).czxid
    alice = new_task_key("alice")
    Store(users["alice"], layout).queue.enqueue(alice, gpus(4), {}, priority=5)
    wait_for(lambda: notice_of(zk, layout, bob), 10, "the notice")
    first.stop()
    keeper(preempting(secured))
    wait_for(lambda: reason_of(zk, layout, alice) == "Preempting", 10, "alice Preempting")
    Store(users["bob"], layout).matrix.release(bob, state="preempted")
    bob2 = new_task_key("bob")
    Store(users["bob"], layout).queue.enqueue(bob2, gpus(4), {}, resumes=bob)
    wait_for(lambda: Store(zk, layout).queue.read_grant(alice), 10, "alice admitted")
    wait_for(lambda: reason_of(zk, layout, bob2) == "Requeued", 10, "bob's attempt Requeued")
    Store(users["alice"], layout).matrix.release(alice)
    wait_for(lambda: Store(zk, layout).queue.read_grant(bob2), 10, "bob's next attempt admitted")
    terms = terms_of_grant(zk.get(layout.grant(bob2))[0])
    assert terms is not None and (terms.order, terms.preemptions) == (order, 1)
    wait_for(lambda: not zk.exists(layout.preempt(bob)), 10, "the served notice deleted")
