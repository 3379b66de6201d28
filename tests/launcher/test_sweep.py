"""Sweeps on the lab: trials are queued jobs; a grid with 2 at once and its results table;
a failed trial re-run alone by resume; a trial without metrics; a random search that expands
the same twice; a sweep cancelled mid-way leaves nothing running or held."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import wait_for
from tests.launcher.helpers import FAKE, all_free, hypertf, processes_of


def sweep_state(cwd: Path, sweep_id: str) -> dict:
    return json.loads((cwd / "runs" / "sweeps" / sweep_id / "sweep.json").read_text())


def sweep_id_of(out: str) -> str:
    found = re.search(r"sweep (sweep-\S+):", out)
    assert found, out
    return found.group(1)


# Two trials preflight the same hosts at once: this test found their shared write probe
# (tasknode, 6724ba1), which failed one trial 1 time in 6.
def test_a_grid_runs_two_at_once_and_ranks_the_trials_by_their_metric(lab, tmp_path):
    done = hypertf("sweep", "-i", lab.inventory, "--script", FAKE, "--worker", "2",
                   "--grid", "lr=0.1,0.2", "--grid", "batch_size=32,64", "--max-concurrent", "2",
                   "--metric", "score", "--", "--work_s", "1", "--write_metrics",
                   cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    sweep_id = sweep_id_of(done.stdout)
    state = sweep_state(tmp_path, sweep_id)
    assert [t["params"] for t in state["trials"]] == [
        {"lr": 0.1, "batch_size": 32}, {"lr": 0.1, "batch_size": 64},
        {"lr": 0.2, "batch_size": 32}, {"lr": 0.2, "batch_size": 64}]
    assert all(t["state"] == "succeeded" and t["tries"] == 1 for t in state["trials"])
    spans = [(t["started"], t["ended"]) for t in state["trials"]]  # a trial ends when reaped
    at_once = max(sum(start <= moment < end for start, end in spans) for moment, _ in spans)
    assert at_once == 2, spans  # max_concurrent, and the queue let both run
    folder = tmp_path / "runs" / "sweeps" / sweep_id
    table = json.loads((folder / "results.json").read_text())
    assert table["trials"][0]["params"] == {"lr": 0.2, "batch_size": 64}
    scores = [t["metric"] for t in table["trials"]]
    assert scores == sorted(scores, reverse=True) and scores[0] == 0.264
    assert table["best"]["index"] == 3
    rows = list(csv.DictReader((folder / "results.csv").open()))
    assert [r["lr"] for r in rows] == ["0.2", "0.2", "0.1", "0.1"]
    assert "best: trial 3" in done.stdout
    status = hypertf("sweep", "status", sweep_id, cwd=tmp_path)
    assert status.returncode == 0 and "4 succeeded" in status.stdout, status.stdout
    listing = hypertf("sweep", "list", cwd=tmp_path)
    assert sweep_id in listing.stdout and "4 succeeded" in listing.stdout
    assert all_free(lab.inventory)


def test_resume_reruns_only_the_failed_trial_and_no_metrics_is_not_a_crash(lab, tmp_path):
    fixed = tmp_path / "fixed"
    done = hypertf("sweep", "-i", lab.inventory, "--script", FAKE, "--worker", "1",
                   "--grid", "lr=0.1,0.2", "--grid", "metrics=yes,no", "--metric", "score",
                   "--", "--work_s", "0.5", "--write_metrics", "--fail_lr", "0.2",
                   "--fail_unless", str(fixed), cwd=tmp_path, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    sweep_id = sweep_id_of(done.stdout)
    before = {t["index"]: t for t in sweep_state(tmp_path, sweep_id)["trials"]}
    assert [before[i]["state"] for i in range(4)] == [
        "succeeded", "succeeded", "failed", "failed"]
    assert before[0]["metric"] == 0.1 and before[1]["metric"] is None  # no metrics written
    fixed.touch()
    again = hypertf("sweep", "resume", sweep_id, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "re-running 2 failed" in again.stdout
    after = {t["index"]: t for t in sweep_state(tmp_path, sweep_id)["trials"]}
    assert all(t["state"] == "succeeded" for t in after.values())
    assert [after[i]["tries"] for i in range(4)] == [1, 1, 2, 2]
    assert [after[i]["task_key"] for i in (0, 1)] == [before[i]["task_key"] for i in (0, 1)]
    assert all(after[i]["task_key"] != before[i]["task_key"] for i in (2, 3))
    table = json.loads((tmp_path / "runs" / "sweeps" / sweep_id / "results.json").read_text())
    assert [t["metric"] for t in table["trials"]] == [0.2, 0.1, None, None]


def test_a_random_search_from_a_spec_expands_the_same_trials_twice(tmp_path):
    spec = tmp_path / "sweep.yml"
    spec.write_text(f"script: {FAKE}\ntrain: {{worker: 1}}\nseed: 7\nnum_samples: 3\n"
                    f"random: {{lr: {{loguniform: [0.0001, 0.1]}}, batch_size: "
                    f"{{choice: [16, 32, 64]}}}}\n")
    code = ("import sys, json; from hypertf.sweep.spec import load_spec, expand; "
            "print(json.dumps([t.params for t in expand(load_spec(sys.argv[1]))]))")
    runs = [subprocess.run([sys.executable, "-c", code, str(spec)], capture_output=True,
                           text=True, check=True, env={"PYTHONHASHSEED": str(seed)}).stdout
            for seed in (1, 2)]
    assert runs[0] == runs[1] and len(json.loads(runs[0])) == 3


def test_a_sweep_cancelled_mid_way_leaves_nothing_running_or_held(lab, tmp_path):
    never = tmp_path / "never"
    secret = f"sweep-secret-{time.time_ns()}"
    done = hypertf("sweep", "-i", lab.inventory, "--detach", "--script", FAKE, "--worker", "2",
                   "--grid", "lr=0.1,0.2,0.3,0.4", "--max-concurrent", "2",
                   "--env", f"SWEEP_TOKEN={secret}", "--",
                   "--until_file", str(never), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    sweep_id = done.stdout.split()[-1]
    try:
        wait_for(lambda: sum(t["state"] == "running" and (
            tmp_path / "runs" / "sweeps" / sweep_id / f"trial-{t['index']}.log").read_text()
            .count("tasks listening") for t in sweep_state(tmp_path, sweep_id)["trials"]) == 2,
            90, "two trials running")
        keys = [t["task_key"] for t in sweep_state(tmp_path, sweep_id)["trials"][:2]]
        # the --env value reached the tasks through the detached driver and each trial's
        # launcher (their stdin), and no file or command line of the sweep holds it
        environments = " ".join(" ".join(lines) for lines in
                                processes_of(lab.inventory, keys[0]).values())
        assert f"SWEEP_TOKEN={secret}" in environments
        folder = tmp_path / "runs" / "sweeps" / sweep_id
        assert not [p.name for p in folder.iterdir() if p.is_file() and secret in
                    p.read_text(errors="replace")]
        driver_pid = sweep_state(tmp_path, sweep_id)["driver_pid"]
        assert secret not in Path(f"/proc/{driver_pid}/cmdline").read_text(errors="replace")
        cancel = hypertf("sweep", "cancel", "-i", lab.inventory, sweep_id, cwd=tmp_path)
        assert cancel.returncode == 0 and "2 waiting or running trials ended" in cancel.stdout
        wait_for(lambda: sweep_state(tmp_path, sweep_id)["driver_pid"] is None, 90,
                 "the sweep's driver to finish")
        states = [t["state"] for t in sweep_state(tmp_path, sweep_id)["trials"]]
        assert states == ["cancelled"] * 4, states
        for key in keys:
            wait_for(lambda k=key: processes_of(lab.inventory, k) == {}, 60, f"{key} stopped")
        wait_for(lambda: all_free(lab.inventory), 60, "every GPU free")
    finally:
        never.touch()
        time.sleep(0.5)
