"""The keeper SIGKILLed in the middle of a burst of 100 submissions: a second keeper takes
over, every job is admitted exactly once, no GPU is ever held by two jobs, and every record
ends in an end state with every GPU free."""

from __future__ import annotations

import dataclasses
import itertools
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict

from hypertf import store
from hypertf.core.matrix import FREE
from hypertf.core.placement import Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.store import Store
from tests.conftest import wait_for

JOBS, SUBMITTERS = 100, 10


def keeper_process(cluster) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "hypertf.keeper.thread", cluster.zookeeper_hosts,
                             cluster.zk_root, "10"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "keeping"
    return proc


def test_a_keeper_killed_mid_burst_admits_each_job_once_and_books_no_gpu_twice(
        zk, layout, fake_agents, cluster_settings):
    cluster = dataclasses.replace(cluster_settings, zk_session_timeout=15.0)
    fake_agents({"n1": 4, "n2": 4})  # 8 GPUs for 10 submitters: some always wait
    request = Request((TaskSlot("worker", 0, 1),), ("n1", "n2"))
    grants: list[tuple[str, str, int, float, float]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def submitter() -> None:
        client = store.connect(cluster)
        try:
            for _ in range(JOBS // SUBMITTERS):
                key = new_task_key("root")
                grant = Store(client, layout).queue.submit(request, key)
                granted = time.time()
                time.sleep(0.05)
                releasing = time.time()
                placement = grant.placements[0]
                with lock:
                    grants.append((key, placement.host, placement.gpus[0], granted, releasing))
                Store(client, layout).matrix.release(key)
        except BaseException as err:  # reported by the test, not lost in a thread
            errors.append(err)
        finally:
            store.close(client)

    first = keeper_process(cluster)
    second = None
    threads = [threading.Thread(target=submitter) for _ in range(SUBMITTERS)]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: len(grants) >= 30, 120, "30 jobs admitted by the first keeper")
        first.send_signal(signal.SIGKILL)
        first.wait()
        time.sleep(1.0)  # the burst goes on without a keeper: the submitters wait
        second = keeper_process(cluster)
        for thread in threads:
            thread.join(240)
        assert not errors, errors
        assert len(grants) == JOBS and len({g[0] for g in grants}) == JOBS
        by_gpu = defaultdict(list)
        for _, host, gpu, granted, releasing in grants:
            by_gpu[(host, gpu)].append((granted, releasing))
        for gpu, intervals in by_gpu.items():
            intervals.sort()
            for (_, end), (start, _) in itertools.pairwise(intervals):
                assert start >= end, f"{gpu} held by two jobs at once"
        states = {Store(zk, layout).jobs.read(key)["state"] for key, *_ in grants}
        assert states == {"released"}

        def all_free() -> bool:
            matrix, _ = Store(zk, layout).matrix.read()
            cells = [cell for row in matrix.gpus.values() for cell in row]
            return cells == [FREE] * 8 and not matrix.ports and not Store(zk, layout).leases()

        wait_for(all_free, 30, "every GPU free and no lease left")
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(20)
