"""`hypertf train` on the 3-host lab: real sshd, real ZooKeeper, real processes."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from hypertf import store
from tests.conftest import wait_for
from tests.launcher.helpers import (
    EXAMPLES,
    FAKE,
    all_free,
    finish_file,
    hypertf,
    processes_of,
    start_hypertf,
    summaries,
    task_key,
    until_line,
)

FAKE_PS_STRATEGY = str(Path(FAKE).with_name("fake_ps_strategy.py"))


def placements(summary: dict) -> list[tuple[str, str, list[int]]]:
    return [(t["task"], t["host"], t["gpus"]) for t in summary["tasks"]]


@pytest.mark.tf
@pytest.mark.parametrize(
    ("script", "shape", "expected"),
    [
        ("ps_strategy.py", ["--chief", "--worker", "2", "--ps", "1"],
         [("chief:0", "h1", [0]), ("worker:0", "h2", [0]), ("worker:1", "h3", [0]),
          ("ps:0", "h1", [])]),
        ("mirrored_strategy.py", ["--worker", "2"],
         [("worker:0", "h1", [0]), ("worker:1", "h2", [0])]),
        ("legacy_tf1.py", ["--worker", "2", "--ps", "1"],
         [("worker:0", "h1", [0]), ("worker:1", "h2", [0]), ("ps:0", "h1", [])]),
        # absl: strict flags; runs under the default options (no legacy flag is passed)
        ("absl_flags.py", ["--worker", "2"],
         [("worker:0", "h1", [0]), ("worker:1", "h2", [0])]),
        # Keras 2 model.fit (tf-keras, installed without its dependencies by ./dev.sh)
        ("keras_fit.py", ["--worker", "2", "--env", "TF_USE_LEGACY_KERAS=1"],
         [("worker:0", "h1", [0]), ("worker:1", "h2", [0])]),
    ],
)
def test_examples_train_to_accuracy_and_leave_nothing(lab, tmp_path, script, shape, expected):
    done = hypertf("train", "-i", lab.inventory, "--script", str(EXAMPLES / script), *shape,
                   cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (summary,) = summaries(tmp_path)
    assert summary["result"] == "succeeded"
    assert placements(summary) == expected
    accuracy = [float(m) for m in re.findall(r"test_accuracy=([0-9.]+)", done.stdout)]
    assert accuracy and min(accuracy) >= 0.85, done.stdout[-2000:]
    assert (tmp_path / "runs" / summary["task_key"] / "worker0.log").is_file()
    assert processes_of(lab.inventory, summary["task_key"]) == {}
    assert all_free(lab.inventory)


def test_two_jobs_at_once_get_disjoint_gpus_and_ports(lab, tmp_path):
    """Both jobs run until both are listening, so their grants overlap in time."""
    finish = finish_file(tmp_path)
    jobs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        jobs.append(start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker",
                                  "3", "--ps", "1", "--", "--until_file", str(finish),
                                  cwd=tmp_path / name))
    for job in jobs:
        until_line(job, "tasks listening")
    finish.touch()
    for job in jobs:
        out, _ = job.communicate(timeout=120)
        assert job.returncode == 0, out
    (first,), (second,) = summaries(tmp_path / "a"), summaries(tmp_path / "b")
    gpus = [(t["host"], g) for s in (first, second) for t in s["tasks"] for g in t["gpus"]]
    ports = [(t["host"], t["port"]) for s in (first, second) for t in s["tasks"]]
    assert len(gpus) == 6 and len(set(gpus)) == 6
    assert len(set(ports)) == len(ports)
    assert all_free(lab.inventory)


def test_failing_worker_stops_the_whole_job_fast(lab, tmp_path):
    started = time.monotonic()
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "3", "--ps",
                   "1", "--", "--work_s", "20", "--fail_on", "worker:1", "--fail_s", "1",
                   cwd=tmp_path)
    elapsed = time.monotonic() - started
    assert done.returncode == 1
    assert "task worker:1@h2 failed: exit 3" in done.stderr
    assert "worker:1 failing on purpose" in done.stderr  # last lines of its log
    assert "Traceback" not in done.stderr
    assert elapsed < 60  # fails fast: not after the other workers' 20 s of work
    (summary,) = summaries(tmp_path)
    assert summary["result"] == "failed"
    assert processes_of(lab.inventory, summary["task_key"]) == {}
    assert all_free(lab.inventory)


def test_task_that_never_listens_hits_the_startup_deadline(lab, tmp_path):
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2",
                   "--start-timeout", "4", "--", "--work_s", "600", "--never_listen_on",
                   "worker:1", cwd=tmp_path)
    assert done.returncode == 1
    assert "start-up deadline: worker:1@h2 not listening on its port after 4 s" in done.stderr
    (summary,) = summaries(tmp_path)
    assert processes_of(lab.inventory, summary["task_key"]) == {}
    assert all_free(lab.inventory)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_signals_to_the_launcher_leave_nothing_behind(lab, tmp_path, sig):
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2",
                        "--ps", "1", "--", "--work_s", "600", "--ignore_term", cwd=tmp_path)
    key = task_key(until_line(job, "tasks listening"))
    assert set(processes_of(lab.inventory, key)) == {"h1", "h2"}
    job.send_signal(sig)
    out, _ = job.communicate(timeout=60)
    if sig == signal.SIGKILL:
        # No launcher to clean up: the lease expires (4 s) and the agents stop the tasks.
        wait_for(lambda: processes_of(lab.inventory, key) == {}, 90, "agents to reap the job")
        wait_for(lambda: all_free(lab.inventory), 90, "the GPUs to return")
    else:
        assert job.returncode == 130, out
        assert f"interrupted by {sig.name}" in out
        assert processes_of(lab.inventory, key) == {}
        assert all_free(lab.inventory)


def test_hyperparameters_arrive_verbatim_and_run_nothing(lab, tmp_path):
    canary = Path("/tmp") / f"hypertf-canary-{time.time_ns()}"
    hostile = ["--msg", "two words", "--quote", "it's \"quoted\"", "--sub", f"$(touch {canary})",
               "--tick", f"`touch {canary}`", "--semi", f"x; touch {canary}", "--glob", "*",
               "--nl", "a\nb"]
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "1", "--",
                   "--work_s", "0", *hostile, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (summary,) = summaries(tmp_path)
    log = (tmp_path / "runs" / summary["task_key"] / "worker0.log").read_text()
    argv = json.loads(log.split("argv=", 1)[1].splitlines()[0])
    # fake_tf.py names no legacy flag: by default none is passed
    assert argv == ["--work_s", "0", *hostile]
    assert "legacy flags (--ps_hosts, --worker_hosts, --job_name, --task_index) not passed: " \
        "the script does not read them" in done.stdout
    assert not canary.exists()


def test_legacy_flags_forced_on_a_strict_script_name_the_fix(lab, tmp_path):
    """--legacy-flags on a script whose argparse refuses unknown flags (absl does the same):
    the failure names the refused flag and --no-legacy-flags; by default the same script
    runs (the flags are not passed)."""
    strict = tmp_path / "strict.py"
    strict.write_text("import argparse\n"
                      "parser = argparse.ArgumentParser()\n"
                      "parser.add_argument('--steps', type=int, default=1)\n"
                      "print('steps', parser.parse_args().steps)\n")
    forced = hypertf("train", "-i", lab.inventory, "--script", str(strict), "--worker", "1",
                     "--legacy-flags", "--", "--steps", "2", cwd=tmp_path)
    assert forced.returncode == 1
    assert "the script does not accept --ps_hosts" in forced.stdout + forced.stderr
    assert "run it with --no-legacy-flags" in forced.stdout + forced.stderr
    assert "error: unrecognized arguments: --ps_hosts=" in forced.stdout + forced.stderr
    plain = hypertf("train", "-i", lab.inventory, "--script", str(strict), "--worker", "1",
                    "--", "--steps", "2", cwd=tmp_path)
    assert plain.returncode == 0, plain.stdout + plain.stderr



@pytest.mark.tf
def test_legacy_flags_forced_on_the_absl_example_name_the_fix(lab, tmp_path):
    """absl's own error, through the launcher: FATAL ... Unknown command line flag."""
    forced = hypertf("train", "-i", lab.inventory, "--script", str(EXAMPLES / "absl_flags.py"),
                     "--worker", "1", "--legacy-flags", cwd=tmp_path, timeout=300)
    out = forced.stdout + forced.stderr
    assert forced.returncode == 1, out
    assert "Unknown command line flag 'ps_hosts'" in out
    assert "the script does not accept --ps_hosts" in out and "--no-legacy-flags" in out
    assert all_free(lab.inventory)


def test_hyperparameters_follow_directly_without_double_dash(lab, tmp_path):
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "1",
                   "--work_s", "0", "--batch_size", "100", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (summary,) = summaries(tmp_path)
    log = (tmp_path / "runs" / summary["task_key"] / "worker0.log").read_text()
    assert log.split("argv=", 1)[1].splitlines()[0].endswith('"--batch_size", "100"]')
    # Pinned by UUID (the static source's stable ones), in PCI bus order for index users.
    [task] = summary["tasks"]
    uuids = ",".join(f"GPU-static-{task['host']}-{gpu}" for gpu in task["gpus"])
    assert f"cuda={uuids!r} fail_fast=use_caller" in log
    assert f"gpu_order=PCI_BUS_ID gpus={','.join(map(str, task['gpus']))!r}" in log


def test_kill_from_another_terminal_and_list_jobs(lab, tmp_path):
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2", "--",
                        "--work_s", "600", cwd=tmp_path)
    key = task_key(until_line(job, "tasks listening"))
    listing = hypertf("jobs", "-i", lab.inventory, cwd=tmp_path)
    assert listing.stdout.startswith("TASK KEY"), listing.stdout  # then one row per job
    assert re.search(rf"{key} +running +\S+@\S+ +[\d-]+ [\d:]+ +- +[\d:]+ +"
                     rf"{re.escape(FAKE)} +worker:0@h1, worker:1@h2",
                     listing.stdout), listing.stdout
    killed = hypertf("kill", "-i", lab.inventory, key, cwd=tmp_path)
    assert killed.returncode == 0 and "lease dropped" in killed.stdout
    out, _ = job.communicate(timeout=60)
    assert job.returncode == 8, out  # killed: not a failure of the job (README, exit codes)
    assert f"job {key} was killed: its lease was dropped" in out
    wait_for(lambda: processes_of(lab.inventory, key) == {}, 90, "the killed job's processes")
    # its GPUs are freed once each host's agent has reported the processes dead (its record)
    # and the keeper has read the report: a moment after they are gone
    wait_for(lambda: all_free(lab.inventory), 30, "the killed job's GPUs freed")
    again = hypertf("kill", "-i", lab.inventory, key, cwd=tmp_path)
    assert "was neither running nor waiting (killed)" in again.stdout
    unknown = hypertf("kill", "-i", lab.inventory, "nope", cwd=tmp_path)
    assert unknown.returncode == 2 and "'nope' is not a task key" in unknown.stderr
    missing = f"20200101-000000-abcdef.{store.owner_of(key)}"
    unknown = hypertf("kill", "-i", lab.inventory, missing, cwd=tmp_path)
    assert unknown.returncode == 2 and f"no job {missing!r}" in unknown.stderr


def test_env_reaches_every_task_over_the_inventory_env(lab, tmp_path):
    """hypertf_task_env (inventory) and --env (command line, wins), values verbatim (spaces,
    quotes, $(...) are not run), names kept in summary.json. The same job shows its timeline
    (--timings): every phase, per host where it is per host, in order, in summary.json."""
    import yaml

    data = yaml.safe_load(Path(lab.inventory).read_text())
    data["all"]["vars"]["hypertf_task_env"] = {"HYPERTF_TEST_A": "from inventory",
                                               "HYPERTF_TEST_B": "inventory"}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    canary = Path("/tmp") / f"hypertf-env-canary-{time.time_ns()}"
    done = hypertf("train", "-i", str(inventory), "--script", FAKE, "--worker", "2",
                   "--env", "HYPERTF_TEST_B=cli wins", "--env", f"HYPERTF_TEST_C=$(touch {canary})",
                   "--timings", "--", "--work_s", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (summary,) = summaries(tmp_path)
    timeline = summary["timeline"]
    phases = [e["phase"] for e in timeline]
    for phase in ("inventory", "connect", "preflight", "admission", "start",
                  "first log line", "stop", "release", "logs"):  # "listening": these tasks
        assert phase in phases, " ".join(phases)  # exit before the port check sees them
    hosts = {p["host"] for p in summary["tasks"]}
    assert {e["host"] for e in timeline if e["phase"] == "start"} == hosts
    assert [e["start_s"] for e in timeline] == sorted(e["start_s"] for e in timeline)
    assert "timeline of job" in done.stdout and "admission" in done.stdout
    expected = {"HYPERTF_TEST_A": "from inventory", "HYPERTF_TEST_B": "cli wins",
                "HYPERTF_TEST_C": f"$(touch {canary})"}
    for name in ("worker0", "worker1"):
        log = (tmp_path / "runs" / summary["task_key"] / f"{name}.log").read_text()
        assert json.loads(log.split("test_env=", 1)[1].splitlines()[0]) == expected
    assert all(env == sorted(expected) for env in summary["env"].values())  # names only
    assert not canary.exists()
    bad = hypertf("train", "-i", str(inventory), "--script", FAKE, "--env", "TF_CONFIG={}",
                  cwd=tmp_path)
    assert bad.returncode == 2 and "TF_CONFIG is set by HyperTF" in bad.stderr


def test_ps_without_chief_says_what_ends_the_job_and_an_idle_job_is_named(lab, tmp_path):
    """ps and no chief: the start says the workers finish and TF2 PS scripts need --chief
    (this one names ParameterServerStrategy); every task listening and silent past
    --idle-timeout ends the job with --idle-fail."""
    never = tmp_path / "never"
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE_PS_STRATEGY, "--worker", "1",
                   "--ps", "1", "--idle-timeout", "3", "--idle-fail", "--", "--until_file",
                   str(never), cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "a TF2 ParameterServerStrategy script needs --chief" in out
    assert "idle: every task listens and none has written a line for 3 s" in out
    assert all_free(lab.inventory)


@pytest.mark.tf
def test_a_tf_compat_v1_flags_script_gets_the_legacy_flags_by_default(lab, tmp_path):
    """tf.compat.v1.app.flags defines the four flags: auto passes them (and nothing else)."""
    script = Path(FAKE).with_name("tf1_flags.py")
    done = hypertf("train", "-i", lab.inventory, "--script", str(script), "--worker", "2",
                   cwd=tmp_path, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "legacy flags (--ps_hosts, --worker_hosts, --job_name, --task_index) passed: " \
        "the script reads them" in out
    assert "job_name=worker task_index=0 workers=2" in out
    assert "job_name=worker task_index=1 workers=2" in out


def test_tasks_that_exit_on_their_own_after_the_first_failure_keep_their_exit_code(lab, tmp_path):
    """Both workers fail at once (exit 3): the job ends at the first exit, and the other's
    exit, reported a moment later, is still recorded (it read 'killed (no exit code
    recorded)' when the launcher stopped listening at the decision). The tasks ignore the
    stop's SIGTERM, as MultiWorkerMirroredStrategy does: the later one then always ends by
    its own exit, however fast the stop reaches it (a stop faster than the two starts'
    spread once made it 'stopped by HyperTF')."""
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2", "--",
                   "--lr", "0.5", "--fail_lr", "0.5", "--fail_s", "1", "--ignore_term",
                   cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    (summary,) = summaries(tmp_path)
    ends = {t["task"]: (t["exit_code"], t["end"]) for t in summary["tasks"]}
    assert ends == {"worker:0": (3, "exit 3"), "worker:1": (3, "exit 3")}, ends
    assert all_free(lab.inventory)


def test_ps_without_chief_for_a_script_without_legacy_flags_warns_of_the_hang(lab, tmp_path):
    """ps, no --chief, a script that names ParameterServerStrategy: it would hang; the
    start says so, and without --idle-fail the idle warning comes back with the time
    instead of the launcher waiting silently."""
    finish = finish_file(tmp_path)
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE_PS_STRATEGY, "--worker", "1",
                        "--ps", "1", "--idle-timeout", "1", "--", "--until_file", str(finish),
                        cwd=tmp_path)
    lines = until_line(job, "still no line from any task after")
    finish.touch()
    out, _ = job.communicate(timeout=120)
    out = "".join(lines) + out
    assert job.returncode == 0, out
    assert ("hypertf: warning: ps tasks and no --chief, but the script names "
            "ParameterServerStrategy or ClusterCoordinator (TF2): its workers and ps only "
            "serve and the job hangs") in out
    assert "none has written a line for 1 s" in out
    assert all_free(lab.inventory)
