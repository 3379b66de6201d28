"""Fault injection: each case says what is injected and what must hold afterwards.

After every case: no process of the job on any host, no GPU or port held by a dead job, and
the launcher's exit code and message say what happened.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time

import pytest

from hypertf.config.inventory import load_inventory
from hypertf.ops import lab as lab_module
from hypertf.ops import labcluster
from tests.conftest import on_host, wait_for
from tests.launcher.helpers import (
    FAKE,
    all_free,
    finish_file,
    hypertf,
    processes_of,
    start_hypertf,
    status,
    stop_started,
    summaries,
    task_key,
    until_line,
)


def assert_clean(inventory: str, key: str, timeout: float = 90) -> None:
    wait_for(lambda: processes_of(inventory, key) == {}, timeout, f"every process of {key} gone")
    wait_for(lambda: all_free(inventory), timeout, "every GPU and port free")


def restarted(server) -> None:
    """Start a lab ZooKeeper that a test stopped, if it is still down."""
    if server.mode() is None:
        server.start(heap="192m", tick_ms=500)


def test_agent_killed_mid_job(lab, tmp_path):
    """Inject: SIGKILL the agent of a host running a task. Holds: the job still succeeds, its
    GPUs stay held until it releases them, the row is unavailable while the agent is down."""
    finish = finish_file(tmp_path)
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2", "--",
                        "--until_file", str(finish), cwd=tmp_path)
    key = task_key(until_line(job, "tasks listening"))
    try:
        on_host(lab.inventory, "h2", "kill -KILL $(cat /srv/hypertf/agent.pid)")
        wait_for(lambda: host_entry(lab.inventory, "h2")["agent"] == "down", 90,
                 "h2's agent to count as down")
        states = [g["state"] for g in host_entry(lab.inventory, "h2")["gpus"]]
        assert states == ["busy", "unavailable", "unavailable", "unavailable"]
        finish.touch()
        out, _ = job.communicate(timeout=120)
        assert job.returncode == 0, out
    finally:
        labcluster.start_lab_agents(lab, wait_s=60)
    assert_clean(lab.inventory, key)


def host_entry(inventory: str, name: str) -> dict:
    return next(h for h in status(inventory)["hosts"] if h["name"] == name)


def test_zookeeper_restarted_mid_job(lab, tmp_path):
    """Inject: stop ZooKeeper for about a second and start it again (data kept). Holds: the
    sessions survive, the job succeeds and releases, the agents keep their records."""
    finish = finish_file(tmp_path)
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2",
                        "--ps", "1", "--", "--until_file", str(finish), cwd=tmp_path)
    key = task_key(until_line(job, "tasks listening"))
    server = lab.zk_server()
    try:
        server.stop()
        time.sleep(1)  # the outage itself, not a wait for an event
    finally:
        restarted(server)
    finish.touch()
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 0, out
    assert_clean(lab.inventory, key)
    assert all(h["agent"] == "up" for h in status(lab.inventory)["hosts"])


def test_zookeeper_outage_longer_than_the_session_spares_the_job(lab, tmp_path):
    """Inject: ZooKeeper down for 2.5x the 4 s session timeout mid-job (data kept). Holds:
    ZooKeeper does not expire sessions while it is down, so the job goes on, succeeds and
    releases; the agents keep their records."""
    finish = finish_file(tmp_path)
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2", "--",
                        "--until_file", str(finish), cwd=tmp_path)
    key = task_key(until_line(job, "tasks listening"))
    server = lab.zk_server()
    try:
        server.stop()
        time.sleep(10)  # the outage itself: 2.5 session timeouts
    finally:
        restarted(server)
    finish.touch()
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 0, out
    assert_clean(lab.inventory, key)
    wait_for(lambda: all(h["agent"] == "up" for h in status(lab.inventory)["hosts"]), 60,
             "every agent up")


def test_zookeeper_loses_its_data_mid_job(lab, tmp_path):
    """Inject: ZooKeeper restarted with an empty data dir mid-job (every lease is gone).
    Holds: the agents re-register and stop the tasks of the lease-less job; the launcher
    exits 1 naming a stopped task; nothing stays running or held."""
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2", "--",
                        "--work_s", "600", cwd=tmp_path)
    key = task_key(until_line(job, "tasks listening"))
    server = lab.zk_server()
    try:
        server.stop()
        shutil.rmtree(server.directory / "data")
    finally:
        restarted(server)
        labcluster.secure_lab_root(lab)  # the admin secures the new, empty root
    out, _ = job.communicate(timeout=180)
    assert job.returncode == 1, out
    assert re.search(r"task worker:\d@h\d failed: killed", out), out
    wait_for(lambda: all(h["agent"] == "up" for h in status(lab.inventory)["hosts"]), 60,
             "agents to re-register")
    assert_clean(lab.inventory, key)


def test_one_ensemble_member_killed_mid_job(state_home, tmp_path):
    """Inject: SIGKILL one member of a 3-node ZooKeeper ensemble mid-job. Holds: the cluster
    keeps serving, the job succeeds and releases, every agent keeps its record."""
    lab = lab_module.up(hosts=2, gpus=2, zookeeper_members=3)
    try:
        finish = finish_file(tmp_path)
        job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2",
                            "--", "--until_file", str(finish), cwd=tmp_path)
        key = task_key(until_line(job, "tasks listening"))
        victim = lab.zk_servers()[0]
        victim_pid = victim.pid()
        assert victim_pid
        subprocess.run(["kill", "-KILL", str(victim_pid)], check=True)
        finish.touch()
        out, _ = job.communicate(timeout=120)
        assert job.returncode == 0, out
        report = status(lab.inventory)
        assert [h["agent"] for h in report["hosts"]] == ["up", "up"]
        modes = sorted(s["mode"] for s in report["zookeeper"]["servers"])
        assert modes.count("down") == 1 and "leader" in modes
        assert_clean(lab.inventory, key)
    finally:
        stop_started()
        lab_module.down(lab)


def test_host_cut_off_mid_job(lab, tmp_path):
    """Inject: take h2's link down mid-job. Holds: the launcher notices within its host
    timeout, stops the tasks it can reach, exits 1 naming h2, releases every GPU; once h2 is
    back, its agent stops the orphaned task (the lease is gone)."""
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "3", "--",
                        "--work_s", "600", cwd=tmp_path)
    key = task_key(until_line(job, "tasks listening"))
    lab.cut("h2")
    try:
        started = time.monotonic()
        out, _ = job.communicate(timeout=90)
        detected = time.monotonic() - started
        assert job.returncode == 1, out
        assert "host h2 stopped answering" in out or "lost contact with h2" in out
        assert detected < 60  # the host timeout, not the job's 600 s of work
        assert processes_of_reachable(lab, key) == {}
    finally:
        lab.restore("h2")
    assert_clean(lab.inventory, key)


def processes_of_reachable(lab, key: str) -> dict[str, list[str]]:
    from hypertf.launch.remote import Cluster

    inv = load_inventory(lab.inventory)
    nodes = [n for n in inv.nodes.values() if n.name != "h2"]
    with Cluster(nodes, inv.cluster) as cluster:
        results = cluster.each(lambda s: s.run("ps eww -eo pid,stat,args", timeout=20))
    marker = f"HYPERTF_TASK_KEY={key}"
    found = {h: [line for line in r.stdout.splitlines() if marker in line]
             for h, r in results.items()}
    return {h: lines for h, lines in found.items() if lines}


@pytest.mark.parametrize("mode", ["--no-wait", "waiting"])
def test_two_launchers_race_for_the_last_gpu(lab, tmp_path, mode):
    """Inject: 11 of 12 GPUs held, two launchers ask for the last one at once. Holds: exactly
    one gets it; the other exits 4 saying what is free (--no-wait), or waits in the queue and
    runs after the winner; nothing is double-booked."""
    (tmp_path / "big").mkdir()
    big = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "11", "--",
                        "--work_s", "600", cwd=tmp_path / "big")
    big_key = task_key(until_line(big, "tasks listening"))
    racers = []
    options = ["--no-wait"] if mode == "--no-wait" else []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        racers.append(start_hypertf("train", "-i", lab.inventory, *options, "--script", FAKE,
                                    "--worker", "1", "--", "--work_s", "2",
                                    cwd=tmp_path / name))
    outputs = [r.communicate(timeout=90)[0] for r in racers]
    codes = [r.returncode for r in racers]
    if mode == "--no-wait":
        assert sorted(codes) == [0, 4], outputs
        loser = outputs[codes.index(4)]
        assert "cannot place worker:0 (1 GPU on one host)" in loser
    else:
        assert codes == [0, 0], outputs
        [waited] = [out for out in outputs if "waits in the queue" in out]
        assert "admitted after" in waited  # once the winner had released the GPU
    big.send_signal(signal.SIGINT)
    big.communicate(timeout=60)
    assert big.returncode == 130
    assert_clean(lab.inventory, big_key)


def test_sigint_during_start(lab, tmp_path):
    """Inject: Ctrl-C right after the tasks were started, before any listens. Holds: exit 130,
    nothing left running, everything released."""
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2",
                        "--ps", "1", "--", "--work_s", "600", "--never_listen_on", "worker:0",
                        cwd=tmp_path)
    key = task_key(until_line(job, ": started "))
    job.send_signal(signal.SIGINT)
    out, _ = job.communicate(timeout=60)
    assert job.returncode == 130, out
    assert "interrupted by SIGINT" in out
    assert_clean(lab.inventory, key)
    (summary,) = summaries(tmp_path)
    assert summary["result"] == "interrupted"


@pytest.mark.parametrize("how", ["ps crashes", "mirrored worker ignores SIGTERM"])
def test_servers_that_die_or_resist(lab, tmp_path, how):
    """Inject: a ps that exits (fatal), or a job whose tasks ignore SIGTERM when stopped.
    Holds: the ps exit fails the job naming ps:0; a TERM-ignoring task is KILLed after the
    grace period; nothing survives."""
    if how == "ps crashes":
        args = ["--worker", "2", "--ps", "1", "--", "--work_s", "600", "--fail_on", "ps:0",
                "--fail_s", "1"]
    else:
        args = ["--worker", "2", "--timeout", "4", "--grace", "1", "--", "--work_s", "600",
                "--ignore_term"]
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, *args, cwd=tmp_path)
    out, _ = job.communicate(timeout=90)
    assert job.returncode == 1, out
    if how == "ps crashes":
        assert "task ps:0@h1 failed: parameter server ended (exit 3)" in out
    else:
        assert "job timeout: still running after 4 s" in out
    (summary,) = summaries(tmp_path)
    assert_clean(lab.inventory, summary["task_key"])


def test_eight_launchers_at_once_on_an_idle_lab_all_succeed(lab, tmp_path):
    """Inject: 8 launchers of 1 GPU each started together on the idle 3x4 lab. Each plans
    h1 first (round robin on an idle lab); the losers of the race must plan again over every
    live host, not be refused while GPUs are free. All 8 hold their GPU at the same time."""
    finish = finish_file(tmp_path)
    jobs = []
    for i in range(8):
        (tmp_path / str(i)).mkdir()
        jobs.append(start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker",
                                  "1", "--", "--until_file", str(finish), cwd=tmp_path / str(i)))
    keys = []
    for job in jobs:
        lines = until_line(job, "tasks listening")
        assert "tasks listening" in lines[-1], "".join(lines)
        keys.append(task_key(lines))
    held = [(h["name"], g["index"]) for h in status(lab.inventory)["hosts"] for g in h["gpus"]
            if g["state"] == "busy"]
    assert len(held) == 8
    finish.touch()
    for job in jobs:
        out, _ = job.communicate(timeout=120)
        assert job.returncode == 0, out
    for key in keys:
        assert_clean(lab.inventory, key)


@pytest.mark.parametrize("how", ["launcher SIGKILLed", "hypertf kill"])
def test_gpus_of_a_term_ignoring_job_come_back_only_after_its_tasks_die(lab, tmp_path, how):
    """Inject: a job on every GPU whose tasks ignore SIGTERM ends without its launcher's own
    stop (launcher SIGKILLed, or killed from another terminal); at once a second job wants
    every GPU. Holds: the GPUs drain (shown by status) until the agents have seen the old
    tasks dead; no task of the new job ever starts beside a live task of the old one."""
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    old_dir.mkdir()
    new_dir.mkdir()
    old = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "12",
                        "--", "--work_s", "600", "--ignore_term", cwd=old_dir)
    key = task_key(until_line(old, "tasks listening"))
    if how == "launcher SIGKILLed":
        old.send_signal(signal.SIGKILL)
        old.communicate()
    else:
        killed = hypertf("kill", "-i", lab.inventory, key, cwd=tmp_path)
        assert killed.returncode == 0, killed.stderr
    if how == "launcher SIGKILLed":  # once its session expires (a kill may drain very fast)
        wait_for(lambda: any(g["state"] == "draining" for h in status(lab.inventory)["hosts"]
                             for g in h["gpus"]), 60, "the old job's GPUs draining")
    # The new job waits in the queue while the GPUs drain, then runs.
    new = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "12", "--",
                  "--work_s", "0", "--report_foreign", cwd=new_dir, timeout=180)
    assert new.returncode == 0, new.stdout + new.stderr
    (summary,) = [s for s in summaries(new_dir) if s["result"] == "succeeded"]
    logs = [p.read_text() for p in (new_dir / "runs" / summary["task_key"]).glob("worker*.log")]
    assert len(logs) == 12
    assert all("foreign task processes: 0" in log for log in logs), logs
    assert_clean(lab.inventory, key)
    jobs = {j["task_key"]: j for j in json.loads(hypertf("jobs", "-i", lab.inventory, "--json",
                                                         cwd=tmp_path).stdout)}
    assert jobs[key]["state"] == ("lost" if how == "launcher SIGKILLed" else "killed")
