"""End-to-end overhead: the same small TensorFlow job through hypertf and started by hand.

The job is examples/mirrored_strategy.py with 2 workers (MultiWorkerMirroredStrategy on
scikit-learn's digits, 200 steps, CPU). Three ways, interleaved, each repeated:

* by hand: two plain local processes with the TF_CONFIG, legacy flags and environment that
  hypertf would give them (127.0.0.1 and free ports); wall time from the first start to
  the last exit;
* ``hypertf train`` on a one-node local inventory (``ansible_connection: local``, this
  machine's own agent and a ZooKeeper of our own): no SSH, all of HyperTF's bookkeeping;
* ``hypertf train`` on a 2-host lab (network namespaces, sshd): one worker per host.

Wall time is from just before the command starts to its exit (hypertf: allocation, start,
log streaming, stop, log collection, release, summary). ``--ps-strategy`` adds
examples/ps_strategy.py (chief, 2 workers, 1 ps); by hand, the servers are stopped with
SIGTERM as soon as the chief exits, which is the best a person at a terminal can do.
``--tf1`` adds tests/scripts/tf1_default_wait.py (TF1 between-graph, 2 workers and 1 ps,
TF's default 30 s recovery wait): by hand the ps, worker 0 and worker 1 start at once, in
that order; a worker that loses the race to worker 0's initialisation sleeps 30 s.

``--stand-in`` (and ``--quick``, which also runs once without the warm-up) runs
tests/scripts/fake_tf.py for 1 s instead of TensorFlow: the same three ways and the same
bookkeeping, without TensorFlow's start-up (most of a real run), in seconds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import common
import yaml

from hypertf import store
from hypertf.core import spec as specs
from hypertf.core.scheduler import Placement
from hypertf.launch.attempt import QUIET_ENV
from hypertf.ops.zkserver import free_port

JOBS = {
    "mirrored": ("mirrored_strategy.py", ["--worker", "2"], [("worker", 0), ("worker", 1)]),
    "ps": ("ps_strategy.py", ["--chief", "--worker", "2", "--ps", "1"],
           [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]),
    "tf1": (str(common.REPO / "tests" / "scripts" / "tf1_default_wait.py"),
            ["--worker", "2", "--ps", "1"], [("ps", 0), ("worker", 0), ("worker", 1)]),
}
ACCURACY = re.compile(r"test_accuracy=([0-9.]+)")
STAND_IN = ["--work_s", "1"]  # fake_tf.py's arguments: work 1 s, then end


def command(job: str, stand_in: bool) -> tuple[str, list[str]]:
    """The job's script and its own arguments: the example, or the stand-in task."""
    return (common.FAKE_TF, STAND_IN) if stand_in else (str(common.EXAMPLES / JOBS[job][0]), [])


def local_inventory(home: Path, zk_hosts: str) -> str:
    data = yaml.safe_load((common.REPO / "inventory" / "local.yml").read_text())
    data["all"]["vars"].update(
        hypertf_zookeeper_hosts=zk_hosts, hypertf_zk_root="/bench-e2e",
        hypertf_venv=sys.prefix, hypertf_workdir=str(home / "work"),
        hypertf_agent_interval=1, hypertf_zk_session_timeout=4,
    )
    path = home / "local.yml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def agent_ctl(action: str, inventory: str) -> None:
    subprocess.run([common.PYTHON, "-m", "hypertf.cli", "agent-ctl", action, "-i", inventory,
                    "--host", "localhost"], check=True, capture_output=True, timeout=60)


def wait_agent(inventory: str) -> None:
    from hypertf import store

    inv = common.inventory_of(str(inventory))
    client = store.connect(inv.cluster)
    try:
        layout = store.Layout(inv.cluster.zk_root)
        common.wait_until(lambda: "localhost" in store.Store(client, layout).records(), 30,
                          "the local agent to register", interval=0.1)
    finally:
        store.close(client)


def by_hand(kids: common.Children, job: str, cwd: Path, stand_in: bool) -> dict:
    _, _, roles = JOBS[job]
    script, script_args = command(job, stand_in)
    placements = [Placement(role, index, "local", ()) for role, index in roles]
    addresses = {p.name: f"127.0.0.1:{free_port()}" for p in placements}
    task_specs = specs.build(placements, addresses)
    finishers = specs.finishers(placements)
    started = time.monotonic()
    running = {}
    for task_spec in sorted(task_specs,  # in the order JOBS lists the roles
                            key=lambda s: roles.index((s.placement.role, s.placement.index))):
        env = {**os.environ, **QUIET_ENV, "TF_CONFIG": task_spec.tf_config,
               "CUDA_VISIBLE_DEVICES": ""}
        name = task_spec.placement.name
        log = open(cwd / f"{name.replace(':', '')}.log", "w")  # noqa: SIM115 - child's stdout
        with log:
            running[name] = kids.popen(
                [common.PYTHON, script, *task_spec.flags, *script_args], env=env,
                cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    codes = {name: running[name].wait(timeout=600) for name in finishers}
    for name, proc in running.items():
        if name not in finishers:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    wall = time.monotonic() - started
    if any(codes.values()):
        raise RuntimeError(f"hand-started job failed: {codes}; logs in {cwd}")
    text = "".join(p.read_text() for p in cwd.glob("*.log"))
    return {"wall_s": wall, "accuracy": [float(a) for a in ACCURACY.findall(text)]}


def through_hypertf(kids: common.Children, job: str, inventory: str, cwd: Path,
                    stand_in: bool) -> dict:
    _, shape, _ = JOBS[job]
    script, script_args = command(job, stand_in)
    log = cwd / "hypertf.out"
    started = time.monotonic()
    with open(log, "w") as handle:
        proc = kids.popen([common.PYTHON, "-m", "hypertf.cli", "train", "-i", inventory,
                           "--script", script, *shape, "--", *script_args], cwd=cwd,
                          stdout=handle, stderr=subprocess.STDOUT)
        # wait4: the launcher's own CPU time (not its tasks': they are not its children)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = log.read_text()
    if proc.returncode:
        raise RuntimeError(f"hypertf train failed ({proc.returncode}):\n{out[-3000:]}")
    # the attempt that succeeded: a port taken meanwhile (another bench's task on this
    # machine) makes the launcher retry on fresh ports, under a new key with its own summary
    summaries = [json.loads(path.read_text()) for path in cwd.glob("runs/*/summary.json")]
    summary = next(s for s in summaries if s.get("result") == "succeeded")
    durations = [t["duration_s"] for t in summary["tasks"] if t["duration_s"] is not None]
    return {"wall_s": wall, "launcher_wall_s": summary["wall_s"],
            "launcher_cpu_s": usage.ru_utime + usage.ru_stime,
            "longest_task_s": max(durations) if durations else float("nan"),
            "accuracy": [float(a) for a in ACCURACY.findall(out)]}


def main() -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--ps-strategy", action="store_true",
                   help="also run examples/ps_strategy.py (chief, 2 workers, 1 ps)")
    p.add_argument("--tf1", action="store_true",
                   help="also run a TF1 between-graph script (2 workers, 1 ps, 30 s recovery)")
    p.add_argument("--reps", type=int, help="repetitions (default 3, --quick 1)")
    p.add_argument("--stand-in", action="store_true",
                   help="a 1 s stand-in task instead of TensorFlow (implied by --quick)")
    args = p.parse_args()
    reps = args.reps or (1 if args.quick else 3)
    stand_in = args.stand_in or args.quick
    jobs = ["mirrored", *(["ps"] if args.ps_strategy else []), *(["tf1"] if args.tf1 else [])]
    report = common.Report("e2e_overhead", args)
    report.start()
    results: dict[tuple[str, str], list[dict]] = {}
    with common.bench_home("e2e") as home, common.zookeeper(home) as zk, \
            common.lab(home, 2, 1) as lab, common.children() as kids:
        inventory = local_inventory(home, zk.hosts)
        inv = common.inventory_of(str(inventory))
        store.secure_cluster(inv.cluster, list(inv.nodes))  # an authenticated store, as ever
        agent_ctl("start", inventory)
        try:
            wait_agent(inventory)
            if not args.quick:
                warm = home / "warm-up"
                warm.mkdir()
                by_hand(kids, "mirrored", warm, stand_in)  # page cache, bytecode: not counted
            for rep in range(reps):
                for job in jobs:
                    methods = ["hand", "hypertf-local", "hypertf-lab"]
                    methods = methods[rep % 3:] + methods[:rep % 3]
                    for method in methods:
                        cwd = home / f"{job}-{method}-{rep}"
                        cwd.mkdir()
                        if method == "hand":
                            result = by_hand(kids, job, cwd, stand_in)
                        else:
                            inv = inventory if method == "hypertf-local" else lab.inventory
                            result = through_hypertf(kids, job, inv, cwd, stand_in)
                        results.setdefault((job, method), []).append(result)
                        print(f"  rep {rep + 1} {job} {method}: wall {result['wall_s']:.2f} s, "
                              f"accuracy {result['accuracy']}", flush=True)
        finally:
            agent_ctl("stop", inventory)

    def med(job: str, method: str, key: str = "wall_s") -> float:
        return common.median([r[key] for r in results[(job, method)]])

    print()
    for job in jobs:
        hand = med(job, "hand")
        report.add(f"{job}: by hand (plain local processes), wall", hand, "s",
                   samples=[r["wall_s"] for r in results[(job, "hand")]])
        for method, label in (("hypertf-local", "hypertf train, local inventory"),
                              ("hypertf-lab", "hypertf train, 2-host lab over SSH")):
            wall = med(job, method)
            report.add(f"{job}: {label}, wall", wall, "s",
                       samples=[r["wall_s"] for r in results[(job, method)]])
            report.add(f"{job}: ratio {method}/hand", common.ratio(wall, hand), "x")
            report.add(f"{job}: {method} overhead (wall - hand)", wall - hand, "s")
            report.add(f"{job}: {method} longest task (listening to exit)",
                       med(job, method, "longest_task_s"), "s")
            report.add(f"{job}: {method} CPU time of the launcher process",
                       med(job, method, "launcher_cpu_s"), "s")
        accuracies = [a for rs in (results[(job, m)] for m in
                                   ("hand", "hypertf-local", "hypertf-lab"))
                      for r in rs for a in r["accuracy"]]
        if accuracies:  # the stand-in reports none
            report.add(f"{job}: lowest test accuracy over all runs", min(accuracies), "")
    report.note(f"median of {reps} run(s) per method"
                + ("" if args.quick else " after one uncounted warm-up run")
                + "; the methods interleaved, their order rotated each repetition; "
                + ("a 1 s stand-in task (tests/scripts/fake_tf.py), no TensorFlow" if stand_in
                   else "CPU only (tensorflow-cpu): TensorFlow's own start-up is most of "
                        "every run"))
    report.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
