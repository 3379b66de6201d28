"""Sweeps: how busy the GPUs stay while trials remain, against retry loops.

A lab of 2 hosts x 4 GPUs (8 GPUs, fake tasks that work for a fixed time). 16 trials of 2
GPUs each (2 workers x 1 GPU):

* ``hypertf sweep --grid lr=<16 values> --max-concurrent 8``: trials wait in the queue and
  are admitted as GPUs free;
* the baseline, what users write today: 16 shell retry loops at once,
  ``until hypertf train --no-wait ...; do sleep 1; done`` (a generous 1 s interval).

Busy share = GPU-seconds held by the trials (granted -> released, from their job records)
/ (8 GPUs x the time from the first grant to the last release). Wall time is from the
command's start to its end. ``--quick``: 4 trials of 0.5 s on 2 hosts x 2 GPUs.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import common

HOSTS = 2


def busy_share(inventory: str, cwd: Path, keys_after: float, gpus: int) -> tuple[float, int]:
    records = json.loads(subprocess.run(
        [sys.executable, "-m", "hypertf.cli", "jobs", "-i", inventory, "--json", "--last", "200"],
        cwd=cwd, capture_output=True, text=True, check=True).stdout)
    spans = [(r.get("admitted", r["created"]), r["released"]) for r in records
             if r.get("created", 0) >= keys_after and r.get("released")
             and len(r.get("placements", [])) == 2 and r.get("state") == "succeeded"]
    held = sum(2 * (end - start) for start, end in spans)
    window = max(end for _, end in spans) - min(start for start, _ in spans)
    return held / (gpus * window), len(spans)


def failed_logs(cwd: Path) -> str:
    """The ends of the logs of the trials that did not succeed (the succeeded ones' would
    push them out of a test's view of the output's tail)."""
    results = sorted(cwd.glob("runs/sweeps/*/results.json"))
    trials = json.loads(results[-1].read_text())["trials"] if results else []
    bad = [t for t in trials if t.get("state") != "succeeded"]
    logs = [next(iter(sorted(cwd.glob(f"runs/sweeps/*/trial-{t.get('index')}.log"))), None)
            for t in bad]
    return "".join(f"--- {log.name}\n{log.read_text(errors='replace')[-2500:]}\n"
                   for log in logs if log is not None)


def run_sweep(lab, cwd: Path, work_s: float, trials: int, gpus: int,
              ) -> tuple[float, float, int]:
    values = ",".join(f"0.{i:02d}" for i in range(1, trials + 1))
    started = time.time()
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "hypertf.cli", "sweep", "-i", lab.inventory, "--script",
         common.FAKE_TF, "--worker", "2", "--grid", f"lr={values}", "--max-concurrent", "8",
         "--", "--work_s", str(work_s)], cwd=cwd, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"the sweep failed (exit {done.returncode}):\n{done.stderr[-1000:]}\n"
                         f"{done.stdout[-1000:]}\n{failed_logs(cwd)}")
    share, count = busy_share(lab.inventory, cwd, started, gpus)
    return share, wall, count


def run_loops(lab, cwd: Path, work_s: float, trials: int, gpus: int,
              ) -> tuple[float, float, int]:
    started = time.time()
    t0 = time.monotonic()
    loops = []
    for i in range(1, trials + 1):
        train = shlex.join([sys.executable, "-m", "hypertf.cli", "train", "-i", lab.inventory,
                            "--no-wait", "--script", common.FAKE_TF, "--worker", "2", "--",
                            "--work_s", str(work_s), "--lr", f"0.{i:02d}"])
        loops.append(subprocess.Popen(["bash", "-c", f"until {train}; do sleep 1; done"],
                                      cwd=cwd, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    for loop in loops:
        loop.wait(timeout=900)
    wall = time.monotonic() - t0
    share, count = busy_share(lab.inventory, cwd, started, gpus)
    return share, wall, count


def main() -> int:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    work_s, trials, per_host = (0.5, 4, 2) if args.quick else (5.0, 16, 4)
    gpus = HOSTS * per_host
    report = common.Report("sweep", args)
    report.start()
    with common.bench_home("sweep") as home, common.lab(home, HOSTS, per_host) as lab:
        cwd = home / "runs-here"
        cwd.mkdir()
        sweep_share, sweep_wall, sweep_n = run_sweep(lab, cwd, work_s, trials, gpus)
        loop_share, loop_wall, loop_n = run_loops(lab, cwd, work_s, trials, gpus)
    report.add(f"sweep: GPU-time busy while trials remain ({sweep_n} trials x 2 GPUs, "
               f"{work_s:g} s of work each)", 100 * sweep_share, "%")
    report.add("retry loops: the same", 100 * loop_share, "%", trials=loop_n)
    report.add("sweep: wall time", sweep_wall, "s")
    report.add("retry loops: wall time", loop_wall, "s")
    report.add("  ratio loops / sweep (wall)", common.ratio(loop_wall, sweep_wall), "x")
    report.note("busy = granted -> released per trial, from the job records; a trial's own "
                "start-up (SSH, preflight, process start) counts as busy, as it holds the GPUs")
    report.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
