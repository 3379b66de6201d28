"""Usage as people and Prometheus read it, against a real ZooKeeper, the real keeper pass
and real ledger entries: jobs of bob and alice ran on two hosts of different GPU models
(H100 and A100 agent records) and ended, one of alice's still runs, one of bob's waits.

- ``hypertf usage`` (``--json``, ``--csv``, ``--by user|day|gpu_model``, as the admin and as
  alice) and ``hypertf queue --shares`` as command lines, all started at once;
- the dashboard's ``/api/usage`` (today's bars) and ``/metrics``
  (``hypertf_user_gpu_seconds_total``, ``hypertf_queue_waiting``), parsed by Prometheus'
  own parser, agreeing with the ledger and the grants; a second scrape reads no chunk
  while the ledger stood still."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families

from hypertf import store
from hypertf.config import environment
from hypertf.config.inventory import load_inventory
from hypertf.core.fairshare import DAY_S
from hypertf.core.placement import PortRanges, Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.core.usage import Chunk, parse_chunk_name
from hypertf.dashboard import ClusterSource, Dashboard
from hypertf.dashboard.usage import UsageReader, totals
from hypertf.keeper.ledger import Ledger
from hypertf.keeper.thread import KeeperThread
from hypertf.store import AgentRecord, GpuInfo, Layout, Store
from tests.conftest import wait_for

MODELS = {"n1": "NVIDIA H100 80GB HBM3", "n2": "NVIDIA A100-SXM4-80GB"}


def gpus(n: int) -> Request:
    hosts = tuple(MODELS)
    return Request(tuple(TaskSlot("worker", i, 1) for i in range(n)), hosts,
                   port_ranges=PortRanges(hosts, (20000, 20999)))


@pytest.fixture
def cluster(zk_server, tmp_path) -> Iterator[dict[str, Any]]:
    """An inventory of n1 (2 H100) and n2 (2 A100) on a fresh root, secured for bob and
    alice, the agents' records (from an admin session), the keeper in a thread, and a
    client for each user and the admin."""
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": zk_server.hosts,
                 "hypertf_zk_root": f"/usage-{tmp_path.name}", "hypertf_zk_session_timeout": 2},
        "children": {"gpu_nodes": {"hosts": {h: {"ansible_host": f"127.0.0.{i + 2}"}
                                             for i, h in enumerate(MODELS)}}}}}))
    settings = load_inventory(path).cluster
    store.secure_cluster(settings, list(MODELS), users=["bob", "alice"])
    clients = {name: store.connect(settings, identity=ident) for name, ident in
               (("admin", "admin"), ("bob", "user.bob"), ("alice", "user.alice"))}
    layout = Layout(settings.zk_root)
    for i, (host, model) in enumerate(MODELS.items()):
        record = AgentRecord(
            host=host, mgmt_addr=f"127.0.0.{i + 2}", data_addr=f"127.0.0.{i + 2}",
            port=20000 + i, gpu=2, gpu_avail_list=[0, 1], heartbeat=time.time(),
            gpus=[GpuInfo(g, model, f"GPU-{host}-{g}", 0.0, 0, 2 ** 34, True)
                  for g in range(2)])
        clients["admin"].create(layout.resource(host), record.to_json(), ephemeral=True)
    keeper = KeeperThread(settings).start()
    yield {"path": path, "layout": layout, **clients}
    keeper.stop()
    for client in clients.values():
        store.close(client)


def run_jobs(cluster: dict[str, Any]) -> tuple[dict[str, float], str, str]:
    """bob's two 1-GPU jobs and alice's first run about a second and end; alice's second
    runs on; bob's 4-GPU job waits (Resources). Returns each ended job's held GPU-seconds,
    alice's running key and bob's waiting key."""
    admin, layout = Store(cluster["admin"], cluster["layout"]), cluster["layout"]
    users = {u: Store(cluster[u], layout) for u in ("bob", "alice")}
    ended = [("bob", new_task_key("bob")), ("bob", new_task_key("bob")),
             ("alice", new_task_key("alice"))]
    running = new_task_key("alice")
    for user, key in [*ended, ("alice", running)]:
        (users[user]).queue.enqueue(key, gpus(1), {})
    started = {key: wait_for(lambda k=key: admin.queue.read_grant(k) and time.time(), 10,
                             f"{key}'s grant") for _, key in [*ended, ("alice", running)]}
    time.sleep(1.0)
    held = {}
    for user, key in ended:
        (users[user]).matrix.release(key)
        held[key] = time.time() - started[key]
    waiting = new_task_key("bob")
    (users["bob"]).queue.enqueue(waiting, gpus(4), {})
    wait_for(lambda: all(not admin.client.exists(layout.grant(k)) for _, k in ended), 10,
             "the ended grants counted")
    wait_for(lambda: any(e["task_key"] == waiting for e in admin.queue.read_view()), 10,
             "bob's 4-GPU job in the keeper's view")
    return held, running, waiting


def hypertf(path: Path, identity: str, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "hypertf.cli", *argv, "-i", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, environment.ZK_IDENTITY.name: identity})


def ledger_attempts(zk: KazooClient, layout: Layout) -> dict[str, Any]:
    names = [n for n in zk.get_children(layout.usage) if parse_chunk_name(n)]
    return {a.task_key: a for n in names
            for a in Chunk.from_json(zk.get(layout.usage_chunk(n))[0], n).attempts}


def test_usage_and_queue_shares_as_command_lines(cluster) -> None:
    held, _running, _waiting = run_jobs(cluster)
    path = cluster["path"]
    attempts = ledger_attempts(cluster["admin"], cluster["layout"])
    bob_s = sum(s for k, s in held.items() if k.endswith(".bob"))
    for key, seconds in held.items():  # the ledger's own figure: GPUs x held time
        assert attempts[key].gpu_seconds(0) == pytest.approx(seconds, rel=0.05, abs=0.3)
    runs = {"user": hypertf(path, "admin", "usage", "--json"),
            "csv": hypertf(path, "admin", "usage", "--csv"),
            "day": hypertf(path, "admin", "usage", "--by", "day", "--json"),
            "model": hypertf(path, "admin", "usage", "--by", "gpu_model", "--csv"),
            "alice": hypertf(path, "user.alice", "usage", "--by", "user", "--json"),
            "text": hypertf(path, "admin", "usage"),
            "shares": hypertf(path, "admin", "queue", "--shares"),
            "shares_json": hypertf(path, "admin", "queue", "--shares", "--json")}
    out = {}
    for name, process in runs.items():
        stdout, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, (name, stderr)
        out[name] = stdout
    by_user = {r["user"]: r for r in json.loads(out["user"])["rows"]}
    assert by_user["bob"]["gpu_seconds"] == pytest.approx(bob_s, rel=0.05, abs=0.5)
    assert by_user["alice"]["gpu_seconds"] >= held[next(k for k in held if "alice" in k)]
    lines = list(csv.reader(io.StringIO(out["csv"])))
    assert lines[0] == ["user", "gpu_hours", "gpu_seconds"]
    assert [row[0] for row in lines[1:]] == ["alice", "bob", "(all users)"]
    assert float(lines[2][2]) == pytest.approx(bob_s, rel=0.05, abs=0.5)
    day = json.loads(out["day"])
    assert [r["day"] for r in day["rows"]] == [time.strftime("%Y-%m-%d", time.gmtime())]
    models = {row[0]: float(row[2]) for row in csv.reader(io.StringIO(out["model"]))
              if row[0] != "gpu_model"}
    assert set(models) <= {*MODELS.values(), "(all users)"} and len(models) >= 2
    # each CSV cell is rounded to 0.1 s: the parts' sum may differ from the total by that
    assert sum(v for m, v in models.items() if m != "(all users)") == pytest.approx(
        models["(all users)"], rel=0.01, abs=0.05 * len(models) + 1e-9)
    mine = json.loads(out["alice"])
    assert mine["viewer"] == "alice" and [r["user"] for r in mine["rows"]] == ["alice"]
    assert mine["total"]["gpu_seconds"] >= bob_s
    assert "bob" in out["text"] and "GPU-HOURS" in out["text"]
    assert out["shares"].startswith("fair share: F = 2^(-U/S)")
    shares = {r["user"]: r for r in json.loads(out["shares_json"])}
    assert shares["alice"]["held_gpus"] == 1 and shares["bob"]["waiting"] == 1
    assert shares["bob"]["usage_gpu_seconds"] == pytest.approx(bob_s, rel=0.1, abs=0.5)
    assert 0 < shares["bob"]["factor"] <= 1


def test_the_dashboards_usage_chart_and_metrics(cluster) -> None:
    held, running, _waiting = run_jobs(cluster)
    admin = Store(cluster["admin"], cluster["layout"])
    inventory = load_inventory(cluster["path"])
    bob_s = sum(s for k, s in held.items() if k.endswith(".bob"))
    with Dashboard(ClusterSource(inventory, admin, viewer=""), port=0) as server:
        server.start()
        with urllib.request.urlopen(server.url + "api/usage", timeout=10) as answer:
            chart = json.load(answer)
        t0 = time.time()
        with urllib.request.urlopen(server.url + "metrics", timeout=10) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = answer.read().decode()
        scraped = time.time()
        source = server.source
        server.shutdown()
    today = {s["user"]: s["gpu_hours"][-1] for s in chart["series"]}
    assert len(chart["days"]) == 30 and chart["viewer"] == "admin"
    assert today["bob"] * 3600 == pytest.approx(bob_s, rel=0.05, abs=0.5)
    assert today["alice"] * 3600 > held[next(k for k in held if "alice" in k)]  # + running
    families = {f.name: f for f in text_string_to_metric_families(text)}
    counter: dict[tuple[str, str], float] = {}
    for sample in families["hypertf_user_gpu_seconds"].samples:
        if sample.name == "hypertf_user_gpu_seconds_total":
            counter[(sample.labels["user"], sample.labels["gpu_model"])] = sample.value
    assert {m for _, m in counter} <= set(MODELS.values())
    assert sum(v for (u, _), v in counter.items() if u == "bob") == pytest.approx(
        bob_s, rel=0.05, abs=0.5)
    attempts = ledger_attempts(cluster["admin"], cluster["layout"])
    alice_ended = sum(a.gpu_seconds(0) for k, a in attempts.items() if k.endswith(".alice"))
    grant_start = json.loads(cluster["admin"].get(cluster["layout"].grant(running))[0])[
        "granted"]
    alice = sum(v for (u, _), v in counter.items() if u == "alice")
    assert alice_ended + (t0 - grant_start) - 0.2 <= alice <= alice_ended + (
        scraped - grant_start) + 0.2  # ended attempts and the running one up to now
    gauge = {(s.labels["user"], s.labels["reason"]): s.value
             for s in families["hypertf_queue_waiting"].samples}
    assert gauge == {("bob", "Resources"): 1}
    # the ledger stood still: a scrape reads no chunk (only the summary's stat)
    reads = []
    real = source.ledger.store.client.get_children
    source.ledger.store.client.get_children = lambda path, *a, **k: (  # type: ignore
        reads.append(path) or real(path, *a, **k))
    try:
        source.metrics()
    finally:
        source.ledger.store.client.get_children = real  # type: ignore[method-assign]
    assert cluster["layout"].usage not in reads
    mine = ClusterSource(inventory, admin, viewer="alice").usage()
    assert [s["user"] for s in mine["series"]] == ["alice", "(others)"]

    # alice's running job ends: the counter now comes from the ledger alone, not lower
    Store(cluster["alice"], cluster["layout"]).matrix.release(running)
    wait_for(lambda: not cluster["admin"].exists(cluster["layout"].grant(running)), 10,
             "alice's last attempt counted")
    ended = ledger_attempts(cluster["admin"], cluster["layout"])
    by_user = per_user(source)
    assert by_user["alice"] == pytest.approx(
        sum(a.gpu_seconds(0) for k, a in ended.items() if k.endswith(".alice")), abs=0.3)
    # a day compacted by a keeper 40 days on (its chunks folded into one): the same totals
    before = totals(source.ledger.ended())
    later = Ledger(admin, 7 * DAY_S, clock=lambda: time.time() + 40 * DAY_S)
    later.load({}, {})
    assert later.maintain(force=True) == 1
    assert totals(source.ledger.ended()) == pytest.approx(before)


def test_the_ledger_is_read_again_only_where_it_changed(zk, layout) -> None:
    """Chunks written by hand as the keeper writes them (the summary with each): an old
    day's two chunks compacted into one, a new attempt in the newest day's chunk and a new
    day are all seen; a chunk changed without the summary (never the keeper's way) is not
    read again."""
    acl = store.acls(zk).of("usage_chunk")

    def chunk(day: str, index: int, user: str, gpu_s: float) -> bytes:
        return Chunk(day, index).added([(day, user, "A100", gpu_s)]).to_json()

    def touch_summary() -> None:
        zk.set(layout.usage, zk.get(layout.usage)[0])

    for name, user, gpu_s in (("2026-09-01.0", "bob", 10.0), ("2026-09-01.1", "alice", 20.0),
                              ("2026-09-02.0", "bob", 1.0), ("2026-11-26.0", "bob", 100.0),
                              ("2026-11-27.0", "alice", 5.0)):
        day, _, index = name.partition(".")
        zk.create(layout.usage_chunk(name), chunk(day, int(index), user, gpu_s), acl=acl)
    touch_summary()
    reader = UsageReader(Store(zk, layout))
    assert totals(reader.ended()) == {("bob", "A100"): 111.0, ("alice", "A100"): 25.0}
    compacted = Chunk("2026-09-01").added([("2026-09-01", "bob", "A100", 10.0),
                                           ("2026-09-01", "alice", "A100", 20.0)])
    tx = zk.transaction()
    tx.set_data(layout.usage_chunk("2026-09-01.0"), compacted.to_json())
    tx.delete(layout.usage_chunk("2026-09-01.1"))
    tx.set_data(layout.usage_chunk("2026-11-27.0"), chunk("2026-11-27", 0, "alice", 7.0))
    tx.create(layout.usage_chunk("2026-11-28.0"), chunk("2026-11-28", 0, "carol", 3.0),
              acl=acl)
    tx.set_data(layout.usage, zk.get(layout.usage)[0])
    assert not [r for r in tx.commit() if isinstance(r, Exception)]
    assert totals(reader.ended()) == {("bob", "A100"): 111.0, ("alice", "A100"): 27.0,
                                      ("carol", "A100"): 3.0}
    zk.set(layout.usage_chunk("2026-09-02.0"), chunk("2026-09-02", 0, "bob", 999.0))
    assert totals(reader.ended())[("bob", "A100")] == 111.0  # the summary stood still


def per_user(source: ClusterSource) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(source.metrics().decode()):
        for sample in family.samples:
            if sample.name == "hypertf_user_gpu_seconds_total":
                user = sample.labels["user"]
                found[user] = found.get(user, 0.0) + sample.value
    return found
