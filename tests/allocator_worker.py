"""A separate allocator process for the concurrency and SIGKILL tests.

usage: python allocator_worker.py ZK_HOSTS ROOT HOSTS MODE [CYCLES [SESSION_TIMEOUT]]
MODE 'cycle': take 1 GPU (through the keeper's queue), hold briefly, release, CYCLES times;
prints one JSON per grant.
MODE 'hold': take 1 GPU, print the grant, then sleep until killed.
"""

from __future__ import annotations

import json
import sys
import time

from hypertf import store
from hypertf.config.settings import ClusterSettings
from hypertf.core.placement import Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.store import Store


def main() -> None:
    zk_hosts, root, hosts, mode = sys.argv[1:5]
    cycles = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    timeout = float(sys.argv[6]) if len(sys.argv) > 6 else 2.0
    settings = ClusterSettings("gpu_nodes", zk_hosts, root, timeout, "/nonexistent", 5.0)
    client = store.connect(settings)
    layout = store.Layout(root)
    request = Request(slots=(TaskSlot("worker", 0, 1),), hosts=tuple(hosts.split(",")))
    session = Store(client, layout)  # one session: its known records and grant watches
    for _ in range(cycles):
        key = new_task_key("root")
        grant = session.queue.submit(request, key)  # waits in the queue
        start = time.time()
        placement = grant.placements[0]
        print(json.dumps({"key": key, "host": placement.host, "gpu": placement.gpus[0],
                          "start": start, "retries": grant.retries}), flush=True)
        if mode == "hold":
            time.sleep(3600)
        time.sleep(0.02)
        end = time.time()
        session.matrix.release(key)
        print(json.dumps({"key": key, "end": end}), flush=True)
    store.close(client)


if __name__ == "__main__":
    main()
