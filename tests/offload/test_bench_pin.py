"""bench/offload.py --pin (issue 42 item 5): the task on C CPUs, each processor on CPUs of
its own; the plan for the goal's machine, hydra's pinned command line, and the --quick run
on this machine (which says it cannot show a speed-up with fewer than 8 CPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypertf.offload.world import mpiexec_argv

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from offload import pin_plan  # noqa: E402


def test_the_goal_machine_gets_two_task_cpus_and_three_processors_of_four():
    task, sets = pin_plan(list(range(16)), None, None)
    assert task == [0, 1]
    assert sets == [[2, 3, 4, 5], [6, 7, 8, 9], [10, 11, 12, 13]]
    assert pin_plan([0, 1], None, None) == ([0], [[1]])


def test_each_rank_runs_under_taskset_with_as_many_blas_threads_as_cpus():
    argv = " ".join(mpiexec_argv("/c", 2, "/py", pin=["0,1", "2,3,4,5", "6,7,8,9"]))
    agent, first, second = argv.split(" : ")
    assert "-env OMP_NUM_THREADS 2 -env OPENBLAS_NUM_THREADS 2 taskset -c 0,1 /py -m " \
           "hypertf.offload.agent" in agent
    assert first.endswith("-n 1 -env OMP_NUM_THREADS 4 -env OPENBLAS_NUM_THREADS 4 taskset "
                          "-c 2,3,4,5 /py -m hypertf.offload.processor")
    assert "taskset -c 6,7,8,9 /py -m hypertf.offload.processor" in second


def test_the_quick_pinned_run_ends_well_here():
    done = subprocess.run([sys.executable, str(BENCH / "offload.py"), "--pin", "--quick"],
                          capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("HYPERTF_BENCH")})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "speed-up local/offloaded n=1024" in done.stdout
    assert "measured/model n=1024" in done.stdout and "ratio hop/memcpy" in done.stdout
    if len(os.sched_getaffinity(0)) < 8:
        assert "cannot show a speed-up" in done.stdout
