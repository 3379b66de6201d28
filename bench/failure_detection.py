"""Failure detection: from a crash, or a SIGKILLed launcher, to nothing running and GPUs back.

On a 3-host lab (6 s ZooKeeper session timeout, agents every 1 s), a parameter-server shaped
job of tests/scripts/fake_tf.py (``--chief --worker 2 --ps 1``: the chief is the finisher,
the workers and the ps serve until stopped) is run through ``hypertf train``:

* crash: the chief exits 3 after 4 s (``--fail_on chief:0``); from the moment its
  processes are gone to every other task's processes gone, to the job's GPUs and ports
  gone from the matrix, and to the launcher's exit (code 1 expected);
* SIGKILL: the launcher is killed once every task listens; from the kill to the job's
  lease gone (session expiry), to its cells draining (the first sync after that), to every
  task's processes gone (the agents reap the run), and to its GPUs and ports free (each
  host's agent confirms its own host's draining cells once it has seen the tasks dead);
* kill: ``hypertf kill KEY`` from another process while the launcher runs; the same times.

A GPU is free only when its node has seen the job's tasks dead: every run checks that the
job's last process was gone before its last cell was freed ("order ok"), and fails if not.

Each case also runs with ``--ignore_term`` (tasks ignore SIGTERM, as MultiWorkerMirrored
workers do), where stopping waits for the grace period (5 s) before SIGKILL. Observed from
this machine every few ms: the job's processes in /proc (the lab's hosts share this kernel;
each task's environment carries HYPERTF_TASK_KEY and HYPERTF_TASK), and the matrix and the
lease from a separate ZooKeeper session. After each run: no process of the job on any host
(checked over SSH too), no cell held. ``--quick``: one crash (after 1.5 s) and one SIGKILL,
tasks honouring SIGTERM.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import common

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.store import Layout

SESSION_TIMEOUT = 6.0  # the lab inventory's hypertf_zk_session_timeout (hypertf.ops.lab.up)
GRACE = 5.0  # hypertf train's default --grace, and the agents' reaping grace


def start_job(kids: common.Children, lab, cwd: Path, extra: list[str]) -> tuple:
    proc = kids.popen([common.PYTHON, "-m", "hypertf.cli", "train", "-i", lab.inventory,
                       "--script", common.FAKE_TF, "--chief", "--worker", "2", "--ps", "1",
                       "--", *extra], cwd=cwd, stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    parsed = None
    for line in proc.stdout:
        output.append(line)
        parsed = parsed or common.parse_started(line.rstrip("\n"))
        if parsed:
            break
    if not parsed:
        proc.wait(timeout=30)
        raise RuntimeError("hypertf train did not start its tasks:\n" + "".join(output[-20:]))
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    proc.reader = reader  # joined before the output is judged: its last lines come after exit
    key, tasks = parsed
    addresses = {h.name: h.address for h in lab.hosts}
    endpoints = {name: (addresses[host], port) for name, (host, port) in tasks.items()}
    common.wait_listening(list(endpoints.values()), 60, "every task to listen")
    return proc, key, endpoints, output


def observe(client, root: str, key: str, tasks: set[str], proc, timeout: float,
            ) -> dict[str, float]:
    """Poll until every condition held once; returns the first time each held."""
    layout = Layout(root)
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = time.monotonic()
        if "stopped" not in seen:
            live = common.job_tasks(key)
            if not any(live.get(name) for name in tasks):
                seen["stopped"] = now
        if "released" not in seen and common.job_cells(client, root, key) == 0:
            seen["released"] = now
            if "stopped" not in seen and common.job_tasks(key):
                live = {n: p for n, p in common.job_tasks(key).items() if p and n in tasks}
                if live:
                    raise RuntimeError(f"GPUs of {key} freed while its tasks live: {live}")
        if "draining" not in seen and common.job_cells(client, root, key, draining_only=True):
            seen["draining"] = now
        if "lease gone" not in seen and client.exists(layout.lease(key)) is None:
            seen["lease gone"] = now
        if "launcher exit" not in seen and proc.poll() is not None:
            seen["launcher exit"] = now
        if {"stopped", "released", "lease gone", "launcher exit"} <= set(seen):
            return seen
        time.sleep(0.002)
    raise TimeoutError(f"after {timeout:.0f} s only {sorted(seen)} happened")


def crash(kids, lab, client, root: str, cwd: Path, ignore_term: bool, work_s: float = 4.0,
          ) -> dict[str, float]:
    extra = ["--work_s", str(work_s), "--fail_on", "chief:0",
             *(["--ignore_term"] if ignore_term else [])]
    proc, key, endpoints, output = start_job(kids, lab, cwd, extra)
    crashed = common.wait_until(lambda: not common.job_tasks(key).get("chief:0"), 60,
                                "the chief to crash", interval=0.002)
    seen = observe(client, root, key, set(endpoints) - {"chief:0"}, proc, 60)
    proc.wait(timeout=30)
    proc.reader.join(timeout=30)
    if proc.returncode != 1 or not any("task chief:0@" in line for line in output):
        raise RuntimeError(f"expected exit 1 naming chief:0, got {proc.returncode}:\n"
                           + "".join(output[-15:]))
    check_clean(lab, client, root, key)
    return {f"crash to {k}": v - crashed for k, v in seen.items()
            if k not in ("lease gone", "draining")}


def sigkill(kids, lab, client, root: str, cwd: Path, ignore_term: bool) -> dict[str, float]:
    extra = ["--work_s", "600", *(["--ignore_term"] if ignore_term else [])]
    proc, key, endpoints, _ = start_job(kids, lab, cwd, extra)
    killed = time.monotonic()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    seen = observe(client, root, key, set(endpoints), proc, SESSION_TIMEOUT * 3 + GRACE + 30)
    check_clean(lab, client, root, key)
    return {f"kill to {k}": v - killed for k, v in seen.items() if k != "launcher exit"}


def killed(kids, lab, client, root: str, cwd: Path, ignore_term: bool) -> dict[str, float]:
    extra = ["--work_s", "600", *(["--ignore_term"] if ignore_term else [])]
    proc, key, endpoints, _ = start_job(kids, lab, cwd, extra)
    started = time.monotonic()
    done = subprocess.run([common.PYTHON, "-m", "hypertf.cli", "kill", "-i", lab.inventory, key],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"hypertf kill failed: {done.stderr}")
    seen = observe(client, root, key, set(endpoints), proc, SESSION_TIMEOUT * 3 + GRACE + 30)
    proc.wait(timeout=30)
    check_clean(lab, client, root, key)
    return {f"kill command to {k}": v - started for k, v in seen.items()}


def check_clean(lab, client, root: str, key: str) -> None:
    def clean() -> bool:
        return not common.remote_processes(lab.inventory, key)

    common.wait_until(clean, 30, f"no process of job {key} on any host", interval=0.5)
    if common.job_cells(client, root, key):
        raise RuntimeError(f"job {key} still holds cells")


def main() -> int:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    reps = 1 if args.quick else 3
    cases = [("crash", False), ("sigkill", False)] if args.quick else [
        ("crash", False), ("crash", True), ("sigkill", False), ("sigkill", True),
        ("kill", False), ("kill", True)]
    report = common.Report("failure_detection", args)
    report.start()
    results: dict[tuple[str, bool], list[dict[str, float]]] = {}
    with common.bench_home("failure") as home, common.lab(home, 3, 2) as lab, \
            common.children() as kids:
        inventory = load_inventory(lab.inventory)
        client = store.connect(inventory.cluster)
        try:
            for rep in range(reps):
                for case, ignore_term in cases:
                    cwd = home / f"{case}-{ignore_term}-{rep}"
                    cwd.mkdir()
                    if case == "crash":  # --quick: the chief crashes after 1.5 s, not 4 s
                        result = crash(kids, lab, client, inventory.cluster.zk_root, cwd,
                                       ignore_term, 1.5 if args.quick else 4.0)
                    else:
                        run = {"sigkill": sigkill, "kill": killed}[case]
                        result = run(kids, lab, client, inventory.cluster.zk_root, cwd,
                                     ignore_term)
                    results.setdefault((case, ignore_term), []).append(result)
                    print(f"  rep {rep + 1} {case}{' ignore_term' if ignore_term else ''}: "
                          + ", ".join(f"{k} {v:.2f} s" for k, v in result.items()), flush=True)
        finally:
            store.close(client)
    print()
    medians = {}
    for (case, ignore_term), runs in results.items():
        label = f"{case}{', tasks ignore SIGTERM' if ignore_term else ''}"
        for key in runs[0]:
            value = common.median([r[key] for r in runs])
            medians[(case, ignore_term, key)] = value
            report.add(f"{label}: {key}", value, "s", samples=[r[key] for r in runs])
    report.add("ratio crash-to-released / crash-to-stopped (stop, then logs, then release)",
               common.ratio(medians[("crash", False, "crash to released")],
                            medians[("crash", False, "crash to stopped")]), "x")
    report.add(f"ratio kill-to-released / session timeout ({SESSION_TIMEOUT:.0f} s)",
               common.ratio(medians[("sigkill", False, "kill to released")], SESSION_TIMEOUT),
               "x")
    report.add("ratio kill-to-stopped / session timeout",
               common.ratio(medians[("sigkill", False, "kill to stopped")], SESSION_TIMEOUT), "x")
    if ("crash", True, "crash to stopped") in medians:
        report.add(f"ratio crash-to-stopped ignoring SIGTERM / honouring it (grace {GRACE:.0f} s)",
                   common.ratio(medians[("crash", True, "crash to stopped")],
                                medians[("crash", False, "crash to stopped")]), "x")
        report.add("ratio kill-to-stopped ignoring SIGTERM / honouring it",
                   common.ratio(medians[("sigkill", True, "kill to stopped")],
                                medians[("sigkill", False, "kill to stopped")]), "x")
    report.note(f"median of {reps} run(s); lab of 3 hosts x 2 static GPUs, session timeout "
                f"{SESSION_TIMEOUT:.0f} s, ZooKeeper tickTime 500 ms, agent interval 1 s; after "
                f"every run no process of the job was left on any host and no cell held (checked)")
    report.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
