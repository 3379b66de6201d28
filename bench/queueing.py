"""The queue: admission at the size of a real cluster, and how soon a waiting job starts.

Part 1, a ZooKeeper of our own (loopback): 1000 hosts x 8 GPUs (resource znodes and a
matrix with every GPU held by running jobs), 200 waiting jobs queued as launchers queue
them (lease + record, each asking for 8 workers over all 1000 hosts), then:

* the pure admission pass (hypertf.core.admission) over 200 waiters and 1000 hosts;
* the keeper's whole pass (``Admitter.admit``: leases, 200 records in parallel, the
  matrix, the live hosts, the pass, the view) with nothing to admit;
* the same when one running job ends and frees 8 GPUs (it admits and commits);
* ``hypertf queue`` (collect + render) with 200 waiting jobs;
* beside them, the baseline the queue replaces: one refused ``--no-wait`` request (what a
  shell loop of ``hypertf train --no-wait`` does per try, minus process start-up), and 200
  such retries (the 200 waiters each trying once).

Part 2, the lab (3 hosts x 4 GPUs, fake tasks; ``--quick``: 2 x 2 and a part 1 of 20
hosts and 5 waiters): a job holds all 12 GPUs; a second one
(4 GPUs) waits. The holder finishes; measured from the moment its tasks are told to end
(they stop, the launcher releases) to the waiter's tasks started, for the queue and for
the baseline: a shell loop ``until hypertf train --no-wait ...; do sleep 1; done`` (a
generous 1 s retry interval).
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import common
from scale import host_name, record  # the same 8-GPU agent records as bench/scale.py

from hypertf import store
from hypertf.config.settings import ClusterSettings
from hypertf.core.admission import admission_pass
from hypertf.core.errors import InsufficientResources
from hypertf.core.matrix import Matrix
from hypertf.core.placement import Request, new_task_key
from hypertf.core.scheduler import TaskSlot
from hypertf.keeper import queueview
from hypertf.keeper.admitter import Admitter
from hypertf.keeper.reader import QueueReader
from hypertf.keeper.thread import KeeperThread
from hypertf.store import Layout, Store, credentials

GPUS = 8


def timed(action, repeat: int = 3) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.monotonic()
        action()
        samples.append(time.monotonic() - t0)
    return common.median(samples)


def part_one(zk_hosts: str, hosts: int, waiters: int, report: common.Report) -> None:
    root = f"/queue-{hosts}"
    layout = Layout(root)
    cluster = ClusterSettings("gpu_nodes", zk_hosts, root, 10.0, "/nonexistent", 5.0)
    store.secure_cluster(cluster, [])
    admin = store.connect(cluster, identity="admin")  # stands in for the agents
    client = store.connect(cluster)
    zk = Store(client, layout)
    names = tuple(host_name(i) for i in range(hosts))
    try:
        common.register_hosts(admin, root, names)
        pending = [admin.create_async(layout.resource(h), record(i).to_json(), ephemeral=True)
                   for i, h in enumerate(names)]
        for result in pending:
            result.get(timeout=60)
        running = [new_task_key(credentials.login_user()) for _ in range(hosts)]
        busy = Matrix(gpus={h: [running[i]] * GPUS for i, h in enumerate(names)})
        Store(admin, layout).matrix.overwrite(busy)
        request = Request(slots=tuple(TaskSlot("worker", i, 1) for i in range(8)), hosts=names,
                          port_ranges={h: (20000, 20999) for h in names})
        for n in range(waiters):
            zk.queue.enqueue(new_task_key(credentials.login_user()), request,
                             {"script": "train.py"},
                             priority=n % 3)
        admitter = Admitter(Store(admin, layout))  # as the keeper agent would
        waiting = QueueReader(zk).waiting()
        matrix, _ = zk.matrix.read()
        live = zk.live_hosts()
        report.add(f"pure admission pass: {waiters} waiting x {hosts} hosts",
                   1000 * timed(lambda: admission_pass(matrix, live, waiting)), "ms")
        report.add("keeper pass, nothing to admit (reads + pass + view)",
                   1000 * timed(admitter.admit), "ms")
        report.add(f"one waiting record ({hosts} hosts named)",
                   len(client.get(layout.job(waiting[0].task_key))[0]), "bytes")
        freed = busy.copy()
        freed.gpus[names[0]] = [1] * GPUS
        Store(admin, layout).matrix.overwrite(freed)
        t0 = time.monotonic()
        decisions = admitter.admit()
        report.add("keeper pass that admits (8 GPUs freed: reads + pass + commit + view)",
                   1000 * (time.monotonic() - t0), "ms")
        report.add("  jobs admitted by that pass", sum(d.admitted for d in decisions))
        report.add(f"hypertf queue: collect + render ({waiters} waiting)",
                   1000 * timed(lambda: queueview.render(queueview.collect(zk))), "ms")
        Store(admin, layout).matrix.overwrite(busy)  # all busy again: every retry is refused

        keeper = KeeperThread(cluster).start()  # a --no-wait request is refused by its pass

        def retry() -> None:
            with contextlib.suppress(InsufficientResources):
                zk.queue.submit(request, new_task_key(credentials.login_user()), wait=False)

        try:
            one = timed(retry)
        finally:
            keeper.stop()
        report.add("baseline: one refused --no-wait request (a retry, no process start)",
                   1000 * one, "ms")
        report.add(f"baseline: {waiters} waiters retrying once each (sequential)",
                   1000 * one * waiters, "ms")
    finally:
        store.close(client)
        store.close(admin)


def _stamp_lines(process: subprocess.Popen[str], marks: dict[str, float],
                 needles: dict[str, str]) -> threading.Thread:
    """Record when each needle first shows in the process's output."""
    def read() -> None:
        for line in process.stdout:
            for name, needle in needles.items():
                if needle in line and name not in marks:
                    marks[name] = time.monotonic()
                    marks[f"{name} wall"] = time.time()  # beside the records' times

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def one_start(lab, cwd: Path, children: common.Children, baseline: bool, gpus: int,
              waiting: int) -> tuple[float, float, float]:
    """Seconds from the holder's end (its tasks told to finish) to the waiter's tasks
    started (the holder's stop and release are inside both figures alike), from the
    holder's release to the waiter's GPUs granted (both as the job records say), and from
    the holder's release (its record) to the waiter's tasks started (its output line)."""
    finish = cwd / f"finish-{time.monotonic_ns()}"
    cli = [sys.executable, "-m", "hypertf.cli", "train", "-i", lab.inventory]
    holder = children.popen([*cli, "--script", common.FAKE_TF, "--worker", str(gpus), "--",
                             "--until_file", str(finish)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    held: dict[str, float] = {}
    holder_reader = _stamp_lines(holder, held, {"listening": "tasks listening"})
    common.wait_until(lambda: "listening" in held, 60, "the holder's tasks listening")
    base = [*cli, "--script", common.FAKE_TF, "--worker", str(waiting)]
    script_args = ["--", "--work_s", "0.2"]
    waiter_cmd = [*base, *script_args]
    if baseline:
        loop = shlex.join([*base, "--no-wait", *script_args])
        waiter = children.popen(["bash", "-c", f"until {loop}; do sleep 1; done"], cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    else:
        waiter = children.popen(waiter_cmd, cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    seen: dict[str, float] = {}
    waiter_reader = _stamp_lines(waiter, seen, {"started": f": started {waiting} tasks",
                                                "queued": "waits in the queue"})
    if not baseline:
        common.wait_until(lambda: "queued" in seen, 60, "the waiter queued")
    else:
        time.sleep(2.5)  # a few refused tries first
    finish.touch()
    ended = time.monotonic()  # the holder's tasks end at their next 0.1 s poll
    holder.wait(timeout=120)
    waiter.wait(timeout=120)
    holder_reader.join(5)
    waiter_reader.join(5)
    records = json.loads(subprocess.run([*cli[:3], "jobs", "-i", lab.inventory, "--json",
                                         "--last", "4"], capture_output=True, text=True,
                                        check=True).stdout)
    holder_record = next(r for r in records if len(r.get("placements", [])) == gpus)
    waiter_record = next(r for r in records if len(r.get("placements", [])) == waiting)
    granted = waiter_record.get("admitted", waiter_record["created"])
    return (seen["started"] - ended, granted - holder_record["released"],
            seen["started wall"] - holder_record["released"])


def part_two(home: Path, rounds: int, hosts: int, per_host: int, report: common.Report,
             ) -> None:
    """A job holds every GPU of the lab; the waiter asks for one host's worth."""
    with common.lab(home, hosts, per_host) as lab, common.children() as children:
        cwd = home / "runs"
        cwd.mkdir()
        queue = [one_start(lab, cwd, children, False, hosts * per_host, per_host)
                 for _ in range(rounds)]
        loop = [one_start(lab, cwd, children, True, hosts * per_host, per_host)
                for _ in range(rounds)]
    for label, index in (("release of the GPUs -> granted to the waiting job", 1),
                         ("holder released -> waiting job's tasks started (target <= 1.0 s)",
                          2),
                         ("holder's tasks end -> waiting job's tasks started", 0)):
        queue_s, loop_s = [q[index] for q in queue], [b[index] for b in loop]
        report.add(f"queue: {label} (median)", common.median(queue_s), "s", samples=queue_s)
        report.add(f"baseline retry loop (sleep 1): {label} (median)", common.median(loop_s),
                   "s", samples=loop_s)
        report.add("  ratio baseline / queue", common.ratio(common.median(loop_s),
                                                            common.median(queue_s)), "x")


def main() -> int:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    report = common.Report("queueing", args)
    report.start()
    hosts, waiters, rounds = (20, 5, 1) if args.quick else (1000, 200, 3)
    lab_hosts, lab_gpus = (2, 2) if args.quick else (3, 4)
    with common.bench_home("queueing") as home:
        with common.zookeeper(home, heap="512m") as zk:
            print(f"# part 1: {hosts} hosts x {GPUS} GPUs, {waiters} waiting jobs", flush=True)
            part_one(zk.hosts, hosts, waiters, report)
        print(f"# part 2: the lab, {lab_hosts} hosts x {lab_gpus} GPUs", flush=True)
        part_two(home, rounds, lab_hosts, lab_gpus, report)
    report.note("part 1: ZooKeeper on loopback, 512 MB heap, medians of 3; part 2: times "
                "from output lines read as they come (the launcher's own start-up included)")
    report.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
