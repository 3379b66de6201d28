"""Every user is themselves on the nodes (issue 62), tried as the thief: on a per-user lab
(each HyperTF user a Unix account of its own, same uid on every host), bob holds only his
own ZooKeeper credential, his own SSH key and his own account, and alice's job runs on the
host he logs in to with a secret from her environment. Everything he tries on that host is
refused by the kernel or by tasknode, and her job ends as it would have."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypertf.config.inventory import load_inventory
from hypertf.core.rundir import RunDir
from hypertf.launch.login import as_job_owner
from hypertf.launch.remote import Session
from hypertf.ops import lab as lab_module
from hypertf.ops import labcluster
from hypertf.store import credentials
from tests.conftest import wait_for
from tests.launcher.helpers import FAKE, all_free, strict_env

pytestmark = pytest.mark.lab

# What bob runs on the node as his own account: each attempt's outcome, as JSON.
THIEF = r"""
import ctypes, json, os, signal, sys
target = json.loads(sys.argv[1])
out = {}
def attempt(name, action):
    try:
        action()
        out[name] = "ALLOWED"
    except OSError as err:
        out[name] = err.strerror or str(err)
def read(path):
    return lambda: open(path, "rb").read()
pid = target["pid"]
out["uid"] = os.getuid()
attempt("environ", read(f"/proc/{pid}/environ"))
attempt("cmdline", read(f"/proc/{pid}/cmdline"))
def listed():
    if str(pid) not in os.listdir("/proc"):
        raise OSError(0, "not listed")
attempt("list_proc", listed)
attempt("run_dir", lambda: os.listdir(target["run"]))
attempt("log", read(target["log"]))
attempt("checkpoints", lambda: os.listdir(target["checkpoint"]))
attempt("write_run_dir", lambda: open(os.path.join(target["run"], "x"), "w"))
attempt("kill", lambda: os.kill(pid, signal.SIGKILL))
attempt("killpg", lambda: os.killpg(pid, signal.SIGTERM))
libc = ctypes.CDLL(None, use_errno=True)
def ptrace():
    if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
attempt("ptrace", ptrace)
for procs in target["cgroup_procs"]:
    attempt("cgroup:" + procs, lambda: open(procs, "w").write(f"{os.getpid()}\n"))
for path in target["credentials"]:
    attempt("credential:" + path, read(path))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def users_lab(state_home: Path) -> Iterator[lab_module.Lab]:
    """Two hosts, two GPUs each, accounts for alice and bob (and this test's own user)."""
    try:
        lab = lab_module.up(hosts=2, gpus=2, per_user=True)
    except lab_module.LabError as err:
        pytest.skip(f"no per-user lab here: {err}")
    try:
        labcluster.add_users(lab, ["alice", "bob"])
        yield lab
    finally:
        lab_module.down(lab)


def as_user(user: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**strict_env(), credentials.IDENTITY_ENV: f"user.{user}"}
    return subprocess.run([sys.executable, "-m", "hypertf.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


def on_host_as(lab: lab_module.Lab, user: str, host: str, command: str,
               ) -> tuple[int, str, str]:
    """``command`` on ``host`` over SSH as ``user``'s own account with ``user``'s own key."""
    inventory = as_job_owner(load_inventory(lab.inventory), user)
    session = Session(inventory.node(host), inventory.cluster)
    try:
        result = session.run(command, timeout=60)
    finally:
        session.close()
    return result.exited, result.stdout, result.stderr


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every account may enter (pytest's are 0700): the job's finish file."""
    folder = Path(tempfile.mkdtemp(prefix="hypertf-accounts-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_thief_with_his_own_account_gets_nothing_of_a_neighbours_job(users_lab, tmp_path,
                                                                       open_dir):
    lab = users_lab
    secret = f"s3cret-{secrets.token_hex(8)}"
    finish = open_dir / "finish"
    env = {**strict_env(), credentials.IDENTITY_ENV: "user.alice", "SECRET_TOKEN": secret}
    done = subprocess.run(
        [sys.executable, "-m", "hypertf.cli", "train", "-i", lab.inventory, "--script", FAKE,
         "--worker", "1", "--detach", "--max-restarts", "1", "--env", "SECRET_TOKEN", "--",
         "--until_file", str(finish)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    key = done.stdout.split()[0]
    assert key.endswith(".alice")

    def task_host() -> str | None:
        for host in lab.hosts:
            if (lab.dir / host.name / "srv/hypertf/runs" / key / "worker0.pid").exists():
                return host.name
        return None

    wait_for(task_host, 60, "alice's task to start")
    host = task_host()
    assert host is not None
    hostdir = lab.dir / host / "srv"
    run = RunDir.of(hostdir / "hypertf", key, local=True)
    wait_for(lambda: Path(run.pid("worker0")).read_text().strip(), 30, "the task's record")
    pid = int(Path(run.pid("worker0")).read_text().split()[0])
    accounts = {u: f"{lab.account_prefix}{u}" for u in ("alice", "bob")}

    # what alice's job is on the node: her account's, private
    assert run.local.stat().st_uid == int(subprocess.check_output(
        ["id", "-u", accounts["alice"]]).strip())
    assert (run.local.stat().st_mode & 0o777) == 0o700

    cgroups = json.loads((hostdir / "hypertf/cgroups.json").read_text())
    procs = [f"{subtree}/{key}/cgroup.procs"
             for subtree in (cgroups.get("unified"), cgroups.get("devices")) if subtree]
    wait_for(lambda: all(Path(p).exists() for p in procs), 30, "the job's cgroups")
    checkpoint = [p for p in (hostdir / "hypertf/checkpoints").iterdir()]
    target = {
        "pid": pid, "run": f"/srv/hypertf/runs/{key}",
        "log": f"/srv/hypertf/runs/{key}/worker0.log",
        "checkpoint": f"/srv/hypertf/checkpoints/{checkpoint[0].name}" if checkpoint
        else f"/srv/hypertf/runs/{key}/worker0",
        "cgroup_procs": procs,
        "credentials": [f"/srv/hypertf/credentials/agent.{host}.yml",
                        "/srv/hypertf/credentials/keeper.yml",
                        str(lab.dir / "credentials" / "admin.yml"),
                        str(lab.dir / "credentials" / "keeper.yml"),
                        str(lab.user_dir("alice") / "id_ed25519")],
    }
    code, out, err = on_host_as(lab, "bob", host, f"python3 -c {shlex_quote(THIEF)} "
                                f"{shlex_quote(json.dumps(target))}")
    assert code == 0, err
    seen = json.loads(out)
    assert seen.pop("uid") != 0
    allowed = {name: outcome for name, outcome in seen.items() if "ALLOWED" in outcome}
    assert not allowed, seen
    assert secret not in out

    # tasknode start with her run directory and her job key: refused (exit 7), nothing run
    request = json.dumps({"run_dir": f"/srv/hypertf/runs/{key}", "script": "", "venv":
                          sys.prefix, "tasks": [{"name": "worker9", "port": 20999,
                                                 "cwd": "/tmp", "argv": ["true"],
                                                 "env": {"HYPERTF_TASK_KEY": key}}]})
    code, out, err = on_host_as(
        lab, "bob", host, f"echo {shlex_quote(request)} | {sys.executable} -m "
                          f"hypertf.node.tasknode start")
    assert code == 7, (code, out, err)
    assert "alice" in err and "refused" in err
    # ... and a run directory of his own under another job's name proves nothing
    forged = f"{key.rsplit('.', 1)[0]}x.alice"
    request = request.replace(key, forged)
    code, out, err = on_host_as(
        lab, "bob", host, f"echo {shlex_quote(request)} | {sys.executable} -m "
                          f"hypertf.node.tasknode start")
    assert code == 7 and "refused" in err, (code, out, err)
    assert not (hostdir / "hypertf/runs" / forged).exists()

    # bob's key does not open alice's account
    inventory = as_job_owner(load_inventory(lab.inventory), "alice")
    node = inventory.node(host)
    bob_key = str(lab.user_dir("bob") / "id_ed25519")
    import dataclasses

    session = Session(dataclasses.replace(node, key_file=bob_key), inventory.cluster)
    with pytest.raises(Exception, match="refused the key"):
        session.run("true")
    session.close()

    # her job is unharmed: the task still runs, with her secret, and ends as she asked
    assert Path(f"/proc/{pid}").exists() or (hostdir / "hypertf/runs" / key).exists()
    assert not Path(run.exit("worker0")).exists()
    finish.touch()
    wait_for(lambda: Path(run.exit("worker0")).exists(), 60, "alice's task to end")
    assert Path(run.exit("worker0")).read_text().strip() == "0"
    wait_for(lambda: all_free(lab.inventory), 60, "her GPUs back")
    jobs = as_user("alice", "jobs", "--json", "-i", lab.inventory, cwd=tmp_path)
    assert jobs.returncode == 0, jobs.stderr
    assert any(j.get("task_key") == key and j.get("state") == "succeeded"
               for j in json.loads(jobs.stdout)), jobs.stdout


def test_tasks_run_as_their_owner_and_logs_are_the_owners(users_lab, tmp_path):
    """A job of each user runs as that user's account; ``hypertf logs`` of bob's job as
    alice cannot read it on the node (its run directory is bob's, 0700)."""
    lab = users_lab
    keys = {}
    for user in ("alice", "bob"):
        done = as_user(user, "train", "-i", lab.inventory, "--script", FAKE, "--worker", "1",
                       cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        keys[user] = next(w for w in done.stdout.split()
                          if w.startswith("runs/")).split("/")[1]
    for user, key in keys.items():
        owners = {(lab.dir / h.name / "srv/hypertf/runs" / key).stat().st_uid
                  for h in lab.hosts if (lab.dir / h.name / "srv/hypertf/runs" / key).exists()}
        uid = int(subprocess.check_output(["id", "-u", f"{lab.account_prefix}{user}"]))
        assert owners == {uid}, (user, owners)
    mine = as_user("bob", "logs", "-i", lab.inventory, keys["bob"], cwd=tmp_path)
    assert mine.returncode == 0, mine.stderr
    theirs = as_user("alice", "logs", "-i", lab.inventory, keys["bob"], cwd=tmp_path)
    assert theirs.returncode != 0
    assert "is bob's, and its files are that user's alone" in theirs.stderr, theirs


def test_a_user_without_a_key_gets_one_line(users_lab, tmp_path):
    lab = users_lab
    done = as_user("carol", "train", "-i", lab.inventory, "--script", FAKE, "--worker", "1",
                   cwd=tmp_path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "no SSH key" in done.stderr or "credential" in done.stderr, done.stderr


def test_the_preflight_refuses_a_node_whose_credentials_a_task_could_read(users_lab,
                                                                          tmp_path):
    lab = users_lab
    folder = lab.dir / "h2" / "srv/hypertf/credentials"
    credential = folder / "agent.h2.yml"
    folder.chmod(0o755)
    credential.chmod(0o644)
    try:
        done = as_user("bob", "train", "-i", lab.inventory, "--script", FAKE, "--worker", "2",
                       cwd=tmp_path)
    finally:
        folder.chmod(0o700)
        credential.chmod(0o600)
    assert done.returncode != 0
    assert "agent.h2.yml" in done.stderr and "readable by the task account" in done.stderr, \
        done.stderr
    assert "Traceback" not in done.stderr
    assert all_free(lab.inventory)


def shlex_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def test_the_lab_removes_its_accounts(state_home):
    try:
        lab = lab_module.up(hosts=1, gpus=1, per_user=True, agents=False)
    except lab_module.LabError as err:
        pytest.skip(f"no per-user lab here: {err}")
    try:
        labcluster.add_users(lab, ["dora"])
        account = f"{lab.account_prefix}dora"
        assert subprocess.run(["id", account], capture_output=True).returncode == 0
        assert os.path.isdir(os.path.expanduser(f"~{account}"))
    finally:
        lab_module.down(lab)
    assert subprocess.run(["id", account], capture_output=True).returncode != 0
    assert subprocess.run(["getent", "group", lab.group], capture_output=True).returncode != 0
