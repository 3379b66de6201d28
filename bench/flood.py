"""One user's flood of waiting requests against another user's admission (issue 37, item 3).

A ZooKeeper of our own (loopback), 10 hosts x 8 GPUs (agent records published by the admin,
as bench/queueing.py does), the keeper's pass in a thread (``KeeperThread``, the real
``Admitter``). alice submits a 1-GPU job and releases it, 15 times: submit -> granted on an
idle queue. Then mallory holds host 0's 8 GPUs and queues N requests for it (2,000; 200
with ``--quick``), each a lease and a record as a launcher writes them, 100 to a
transaction. Once the keeper has seen them all: alice's submit -> granted again, and one
keeper pass (sync + read + screen + admission + view) with the flood waiting.

Goal: alice's p50 with the flood at most 1.2x the idle one. With the keeper-only grants of
issue 37, requests past ``hypertf_user_queue_limit`` (200) are refused, and the keeper reads
a waiting record again only when it changed; the code before read and placed every waiting
record at every pass. For another checkout, copy this file into its bench/ and run it there
(bench/common.py puts its own repository first on the path).
"""

from __future__ import annotations

import inspect
import time

import common

from hypertf import store
from hypertf.config.settings import ClusterSettings
from hypertf.core.placement import PortRanges, Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.keeper.admitter import Admitter
from hypertf.keeper.thread import KeeperThread
from hypertf.store import Layout, Store, encode
from hypertf.store.waitqueue import request_to_json

GPUS, HOSTS = 8, 10


def main() -> int:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    flood_size = 200 if args.quick else 2000
    samples = 5 if args.quick else 15
    report = common.Report("flood", args)
    report.start()
    with common.bench_home("flood") as home, common.zookeeper(home) as server:
        from scale import host_name, record

        root = "/flood"
        layout = Layout(root)
        cluster = ClusterSettings("gpu_nodes", server.hosts, root, 10.0, "/nonexistent", 5.0)
        store.secure_cluster(cluster, [], users=["alice", "mallory"])
        admin = store.connect(cluster, identity="admin")
        alice = store.connect(cluster, identity="user.alice")
        mallory = store.connect(cluster, identity="user.mallory")
        names = tuple(host_name(i) for i in range(HOSTS))
        common.register_hosts(admin, root, names)
        for i, host in enumerate(names):
            admin.create(layout.resource(host), record(i).to_json(), ephemeral=True)
        options = inspect.signature(KeeperThread).parameters
        extra = {"user_queue_limit": 200} if "user_queue_limit" in options else {}
        keeper = KeeperThread(cluster, **extra).start()
        try:
            def request(host: str, tasks: int = 1) -> Request:
                return Request(tuple(TaskSlot("worker", i, 1) for i in range(tasks)), (host,),
                               port_ranges=PortRanges((host,), (20000, 20999)))

            alice_store = Store(alice, layout)  # one session, as a launcher's

            def admission_s() -> float:
                started = time.monotonic()
                grant = alice_store.queue.submit(request(names[1]), new_task_key("alice"))
                took = time.monotonic() - started
                alice_store.matrix.release(grant.task_key, stopped_on=[names[1]])
                return took

            idle = [admission_s() for _ in range(samples)]
            blocker = Store(mallory, layout).queue.submit(request(names[0], GPUS),
                                                          new_task_key("mallory"))
            stamp = new_task_key("mallory").partition(".")[0]
            flood = [f"{stamp}-{i:05d}.mallory" for i in range(flood_size)]
            acls = store.acls(mallory)
            started = time.monotonic()
            for first in range(0, flood_size, 100):
                tx = mallory.transaction()
                for key in flood[first:first + 100]:
                    tx.create(layout.lease(key), b"{}", acl=acls.lease(), ephemeral=True)
                    tx.create(layout.job(key), encode({
                        "task_key": key, "state": "queued", "created": time.time(),
                        "queue": request_to_json(request(names[0]), 5)}), acl=acls.job())
                tx.commit()
            passes = keeper.passes
            common.wait_until(lambda: keeper.passes >= passes + 3, 120,
                              "the keeper's passes over the flood")
            report.add(f"flood of {flood_size} requests written and seen by 3 keeper passes",
                       time.monotonic() - started, "s")
            flooded = [admission_s() for _ in range(samples)]
            refused = sum(1 for key in flood[-50:]
                          if (Store(admin, layout).jobs.read(key) or {}).get("state")
                          == "refused")
            keeper.stop()
            admitter = Admitter(Store(admin, layout), **extra)
            admitter.keep()
            pass_s = common.median([_timed(admitter.keep) for _ in range(5)])
            p50_idle, p50_flood = common.median(idle), common.median(flooded)
            report.add("submit -> granted, idle queue (p50)", 1000 * p50_idle, "ms")
            report.add(f"submit -> granted, {flood_size} of another user's requests (p50)",
                       1000 * p50_flood, "ms")
            report.add("ratio flooded / idle (goal <= 1.2)", common.ratio(p50_flood, p50_idle))
            report.add("keeper pass with the flood waiting (p50 of 5)", 1000 * pass_s, "ms")
            report.add("of the flood's last 50 requests, refused", refused)
            Store(mallory, layout).matrix.release(blocker.task_key)
        finally:
            keeper.stop()
            for client in (admin, alice, mallory):
                store.close(client)
    report.finish()
    return 0


def _timed(action: object) -> float:
    started = time.monotonic()
    action()  # type: ignore[operator]
    return time.monotonic() - started


if __name__ == "__main__":
    raise SystemExit(main())
