"""What confinement costs a task's start and a job's stop on a node (issue 50: <= 20 ms more
per task), side by side in one run on this machine's real cgroups.

The node side only, where confinement adds work: ``tasknode start`` (it reads the agent's
cgroups.json and waits for the job's cgroups, which the agent made from its row before, as
on a grant), each task's wrapper joining them (bash ``echo``s before its command), and
``tasknode stop`` (every process of the cgroups TERMed and waited for). Each rep starts a
run of N tasks (``true``) and waits until every wrapper wrote its exit code, then stops the
run: confined and unconfined reps alternate, so load changes fall on both alike. No lab:
SSH, the launcher and the keeper are the same either way (bench/launch_fanout.py has them).
"""

from __future__ import annotations

import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

import common

from hypertf.core.protocol import StartRequest
from hypertf.core.rundir import RunDir
from hypertf.node import confine, runcontrol, tasknode


def one_run(workdir: Path, tasks: int, cgroups: confine.JobCgroups | None,
            ) -> tuple[float, float]:
    """Seconds from 'start' to every task ended, and of the stop after."""
    key = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}.bench"
    if cgroups is not None:
        cgroups.sync({key: frozenset({0})}, {0: 0, 1: 1})  # the agent, on the grant
    run = RunDir.of(str(workdir), key, local=True)
    request = StartRequest.parse({
        "run_dir": str(run.local), "venv": sys.prefix, "script": "",
        "tasks": [{"name": f"worker{i}", "port": 1, "cwd": str(run.local / f"worker{i}"),
                   "env": {"HYPERTF_TASK_KEY": key}, "argv": ["true"]}
                  for i in range(tasks)]})
    began = time.perf_counter()
    answer = tasknode.start_tasks(request)
    assert answer.started, answer
    exits = [Path(run.exit(f"worker{i}")) for i in range(tasks)]
    while not all(path.exists() for path in exits):
        time.sleep(0.0005)
    started = time.perf_counter() - began
    began = time.perf_counter()
    runcontrol.stop(run, grace=5.0)
    stopped = time.perf_counter() - began
    for pid in answer.started.values():
        common.procs.reap(pid)
    if cgroups is not None:
        log = run.log("worker0")
        assert "not confined" not in Path(log).read_text(), Path(log).read_text()
        cgroups.sync({}, {0: 0, 1: 1})
    return started, stopped


def main() -> int:
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    reps, tasks = (5, 4) if args.quick else (30, 8)
    report = common.Report("confine", args)
    report.start()
    root = f"hypertf-bench-{secrets.token_hex(3)}"
    state = confine.detect(f"{root}/bench/node", "auto")
    report.note(f"this machine confines as: {state.label} (filter {state.filter or 'none'})")
    home = Path(tempfile.mkdtemp(prefix="hypertf-bench-confine-"))
    confined, plain = home / "confined", home / "plain"
    confined.mkdir()
    plain.mkdir()
    confine.write_state(confined, state)
    cgroups = confine.JobCgroups(state)
    times: dict[str, list[tuple[float, float]]] = {"confined": [], "plain": []}
    try:
        if state.mode is confine.Mode.NONE:
            report.note("no confinement here: nothing to compare")
        else:
            for _ in range(reps):
                times["plain"].append(one_run(plain, tasks, None))
                times["confined"].append(one_run(confined, tasks, cgroups))
    finally:
        cgroups.sync({}, {})
        cgroups.close()
        shutil.rmtree(home, ignore_errors=True)
    if times["plain"]:
        start = {k: common.median([s for s, _ in v]) for k, v in times.items()}
        stop = {k: common.median([s for _, s in v]) for k, v in times.items()}
        per_task = 1000 * (start["confined"] - start["plain"]) / tasks
        report.add(f"start of {tasks} tasks to all ended, unconfined (median of {reps})",
                   1000 * start["plain"], "ms")
        report.add(f"start of {tasks} tasks to all ended, confined", 1000 * start["confined"],
                   "ms")
        report.add("confinement's cost per task start", per_task, "ms", goal=("<=", 20.0))
        report.add("ratio start confined / unconfined",
                   common.ratio(start["confined"], start["plain"]))
        report.add("stop of the run, unconfined", 1000 * stop["plain"], "ms")
        report.add("stop of the run, confined (its cgroups read and found empty)",
                   1000 * stop["confined"], "ms")
        report.add("ratio stop confined / unconfined", common.ratio(stop["confined"],
                                                                    stop["plain"]))
    report.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
