"""Preemption under faults (issue 52), on a lab of 2 hosts x 1 GPU with preemption on: bob's
priority-0 job (fake tasks that ignore SIGTERM, so the whole grace runs) holds every GPU and
alice's priority-5 job preempts it. Injected during the grace:

- ZooKeeper stopped and started again (data kept);
- the keeper's agent SIGKILLed (another keeper takes over once its session expires) and
  started again.

Holds in both: no double-booking (sampled every 50 ms: no GPU runs tasks of two jobs, and no
live task's GPU is held by another job in the matrix); alice's job runs and succeeds; bob's
attempt ends ``preempted``, its job waits again and its next attempt is granted at its old
place (its grant's terms name the notice's order), then succeeds; nothing is left running or
held.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypertf import store
from hypertf.config import environment
from hypertf.config.inventory import load_inventory
from hypertf.core.grants import terms_of_grant
from hypertf.core.matrix import job_of
from hypertf.core.preemptnotice import Notice
from hypertf.ops import agentctl, labcluster
from hypertf.ops import lab as lab_module
from hypertf.store import Layout, Store, decode
from tests.conftest import on_host, wait_for
from tests.launcher import helpers
from tests.launcher.helpers import FAKE, all_free, processes_of, strict_env, task_key, until_line

GRACE_S = 8  # long enough for a ZooKeeper restart inside it, short for the suite
# The keeper's agent killed: its session (6 s on the lab) expires before its restarted agent
# registers and a keeper takes over; the grace outlasts that, so the victim's next attempt
# finds both hosts live (see test_keeper_killed_between_the_notice_and_the_requeue).
FAILOVER_GRACE_S = 12


@pytest.fixture
def preempt_lab(state_home: Path, request: pytest.FixtureRequest) -> Iterator[lab_module.Lab]:
    """Its own lab: the keeper reads hypertf_preempt at its agent's start (the grace:
    GRACE_S, or the test's parameter)."""
    grace = getattr(request, "param", GRACE_S)
    lab = lab_module.up(hosts=2, gpus=1, base=state_home / "labs", settings={
        "hypertf_preempt": True, "hypertf_preempt_grace_s": grace,
        "hypertf_preempt_min_runtime_s": 0})
    try:
        labcluster.add_users(lab, ["alice", "bob"], max_priority={"alice": 5})
        yield lab
    finally:
        helpers.stop_started()  # before the lab goes: they release what they hold
        lab_module.down(lab)


def train_as(user: str, lab: lab_module.Lab, cwd: Path, *argv: str) -> subprocess.Popen[str]:
    cwd.mkdir()
    job = subprocess.Popen([sys.executable, "-m", "hypertf.cli", "train", "-i", lab.inventory,
                            "--script", FAKE, *argv], cwd=cwd, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True,
                           env={**strict_env(), environment.ZK_IDENTITY.name: f"user.{user}"})
    helpers.STARTED.append(job)
    return job


def task_processes() -> list[dict[str, str]]:
    """The environment of every live task process of any job on this kernel (the lab's
    hosts are namespaces of it)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                raw = handle.read()
            if b"HYPERTF_TASK_KEY=" not in raw or b"TF_CONFIG=" not in raw:
                continue
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                if handle.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
        except OSError:
            continue
        found.append(dict(item.decode(errors="replace").partition("=")[::2]
                          for item in raw.split(b"\0") if item))
    return found


class DoubleBooking(threading.Thread):
    """Samples, every 50 ms: the matrix first, then the live tasks. A GPU with live tasks of
    two jobs, or a live task whose GPU the matrix gave to another job (the task lived when
    the matrix was read, since it lives after), is a double-booking."""

    def __init__(self, lab: lab_module.Lab) -> None:
        super().__init__(daemon=True)
        cluster = load_inventory(lab.inventory).cluster
        self.client = store.connect(cluster, identity="admin")
        self.store = Store(self.client, Layout(cluster.zk_root))
        self.hosts = {h.address: h.name for h in lab.hosts}
        self.samples = self.unread = 0
        self.found: list[str] = []
        self.seen: set[str] = set()  # the jobs whose tasks it saw: it looked at the right ones
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            try:
                matrix, _ = self.store.matrix.read()
            except Exception:  # ZooKeeper down: the tasks alone this time
                matrix, self.unread = None, self.unread + 1
            gpus: dict[tuple[str, int], set[str]] = {}
            for env in task_processes():
                config = json.loads(env["TF_CONFIG"])
                task = config["task"]
                address = config["cluster"][task["type"]][task["index"]].rsplit(":", 1)[0]
                host = self.hosts.get(address)
                if host is None:
                    continue  # another lab's (other test sessions share this kernel)
                for gpu in filter(None, env.get("HYPERTF_GPUS", "").split(",")):
                    gpus.setdefault((host, int(gpu)), set()).add(env["HYPERTF_TASK_KEY"])
                self.seen.add(env["HYPERTF_TASK_KEY"])
            for (host, gpu), keys in gpus.items():
                if len(keys) > 1:
                    self.found.append(f"{host} GPU {gpu} runs tasks of {sorted(keys)}")
                row = matrix.gpus.get(host, []) if matrix is not None else []
                owner = job_of(row[gpu]) if gpu < len(row) else None
                if owner is not None and owner not in keys:
                    self.found.append(f"{host} GPU {gpu} held by {owner} in the matrix while "
                                      f"{sorted(keys)} run there")
            self.samples += 1

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=10)
        store.close(self.client)


def the_notice(lab: lab_module.Lab, victim: str, timeout: float = 30) -> Notice:
    cluster = load_inventory(lab.inventory).cluster
    admin = store.connect(cluster, identity="admin")
    path = Layout(cluster.zk_root).preempt(victim)
    try:
        wait_for(lambda: admin.exists(path), timeout, f"the notice for {victim}", interval=0.05)
        return Notice.from_json(admin.get(path)[0], victim)
    finally:
        store.close(admin)


def preempt_with_fault(lab: lab_module.Lab, tmp_path: Path, fault, repair) -> None:
    """Bob's job preempted by alice's, ``fault(notice)`` injected once the notice is out,
    ``repair()`` after alice's tasks started; then everything the module's doc says."""
    finish = tmp_path / "bob-finish"
    bob = train_as("bob", lab, tmp_path / "bob", "--worker", "2", "--priority", "0", "--",
                   "--until_file", str(finish), "--ignore_term")
    seen = until_line(bob, "tasks listening")
    bob_key = task_key(seen)
    sampler = DoubleBooking(lab)
    sampler.start()
    try:
        alice = train_as("alice", lab, tmp_path / "alice", "--worker", "2", "--priority", "5",
                         "--", "--work_s", "1")
        notice = the_notice(lab, bob_key)
        fault(notice)
        said = until_line(alice, ": started ")
        assert ": started " in "".join(said), "".join(said)[-3000:]
        alice_key = task_key(said)
        repair()
        rest, _ = alice.communicate(timeout=60)
        assert alice.returncode == 0, "".join(said) + rest
        # bob's next attempt, granted at its old place once alice ended
        lines = seen + until_line(bob, ": started ")
        starts = [line for line in lines if ": started " in line]
        assert len(starts) == 2, "".join(lines)[-3000:]
        next_key = task_key(starts[1:])
        cluster = load_inventory(lab.inventory).cluster
        layout = Layout(cluster.zk_root)
        admin = store.connect(cluster, identity="admin")
        try:
            terms = terms_of_grant(admin.get(layout.grant(next_key))[0])
            ended = decode(admin.get(layout.job(bob_key))[0], "job record")
        finally:
            store.close(admin)
        assert terms is not None and terms.resumes == bob_key and terms.order == notice.order
        assert ended["state"] == "preempted", ended
        finish.touch()
        out, _ = bob.communicate(timeout=60)
        output = "".join(lines) + out
        assert bob.returncode == 0, output[-3000:]
        assert "requeued as attempt 2" in output, output[-3000:]
    finally:
        sampler.stop()
    assert not sampler.found, sampler.found[:5]
    assert sampler.samples > 20 and {bob_key, alice_key} <= sampler.seen, (
        sampler.samples, sampler.seen)
    for key in (bob_key, next_key):
        wait_for(lambda k=key: processes_of(lab.inventory, k) == {}, 30, f"no task of {key}")
    wait_for(lambda: all_free(lab.inventory), 30, "every GPU and port free")


@pytest.mark.timeout(120)  # ~15 s; a launcher that never starts fails it in time
def test_zookeeper_restarted_during_the_grace(preempt_lab, tmp_path):
    """Inject: ZooKeeper stopped for 1.5 s and started again (data kept) while bob's tasks,
    told to stop, ignore SIGTERM until the deadline."""
    lab = preempt_lab
    server = lab.zk_server()
    outage: list[float] = []

    def fault(notice: Notice) -> None:
        assert time.time() < notice.deadline - 3, "the notice came too late to test"
        server.stop()
        outage.append(time.time())
        time.sleep(1.5)  # the outage itself, not a wait for an event
        server.start(heap="192m", tick_ms=500)
        outage.append(time.time())
        outage.append(notice.deadline)

    def repair() -> None:
        if server.mode() is None:
            server.start(heap="192m", tick_ms=500)

    try:
        preempt_with_fault(lab, tmp_path, fault, repair)
    finally:
        repair()
    assert outage and outage[0] < outage[2], f"ZooKeeper stopped after the deadline: {outage}"


@pytest.mark.parametrize("preempt_lab", [FAILOVER_GRACE_S], indirect=True)
@pytest.mark.timeout(120)  # ~20 s
def test_keeper_killed_between_the_notice_and_the_requeue(preempt_lab, tmp_path):
    """Inject: SIGKILL the agent holding the keeper lease once the notice is out, and start
    it again at once: its host's record and the keeper lease go when the killed session
    expires, then a keeper of a new term (either host's agent) reads the notices, sees the
    victim out, admits the preemptor and requeues the victim at its old place."""
    lab = preempt_lab
    inventory = load_inventory(lab.inventory)
    layout = Layout(inventory.cluster.zk_root)
    terms: list[int] = []
    killed: list[str] = []

    def keeper_lease() -> tuple[str, int]:
        admin = store.connect(inventory.cluster, identity="admin")
        try:
            data, stat = admin.get(layout.keeper_lease)
        finally:
            store.close(admin)
        return data.decode(), stat.czxid

    def fault(notice: Notice) -> None:
        holder, term = keeper_lease()
        terms.append(term)
        host = next(h for h in inventory.nodes if h in holder)
        on_host(lab.inventory, host, "kill -KILL $(cat /srv/hypertf/agent.pid)")
        assert time.time() < notice.deadline, "the keeper died after the grace"
        killed.append(host)
        agentctl.start_agents(inventory, killed)  # it registers once the old session expires

    preempt_with_fault(lab, tmp_path, fault, lambda: None)
    assert killed and keeper_lease()[1] != terms[0], "no new keeper term"
