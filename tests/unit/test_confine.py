"""Each job's cgroups on a node (hypertf.node.confine), on this machine's real cgroup
hierarchies: what a node can enforce and why not, the device rules the agent writes from
its row (v1 devices and the v2 BPF program), a stop that leaves nothing, and the thief: a
process of another account can neither join a job's cgroup nor widen its rules."""

from __future__ import annotations

import errno
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hypertf.config.inventory import load_inventory
from hypertf.core.protocol import StartRequest
from hypertf.node import confine, tasknode
from hypertf.node.agent import Prober
from hypertf.node.probes import StaticGpuSource
from tests.unit.test_agent_probe import prober

MOUNTS = confine.mounts()
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not any(MOUNTS),
                                reason="needs root and a cgroup hierarchy")


@pytest.fixture
def root() -> str:
    """A cgroup root of this test's own, removed with everything in it afterwards."""
    name = f"hypertf-test-{secrets.token_hex(3)}"
    yield name
    for mount in MOUNTS:
        top = Path(mount) / name if mount else None
        if top is not None and top.is_dir():
            for folder, _, _ in sorted(os.walk(top), key=lambda walked: -len(walked[0])):
                confine.kill([Path(folder)])
                os.rmdir(folder)


@pytest.fixture
def nodes(tmp_path: Path) -> list[Path]:
    paths = []
    for minor in range(3):
        path = tmp_path / f"nvidia{minor}"
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(195, minor))
        paths.append(path)
    return paths


def opens_in(dirs: list[Path], nodes: list[Path]) -> list[str]:
    """What a new process in ``dirs`` gets opening each node: ENXIO (allowed: no driver)
    or EPERM (refused)."""
    procs = ":".join(str(d / "cgroup.procs") for d in dirs)
    code = ("import errno, os, sys\nfrom hypertf.node import confine\n"
            "assert not confine.join(sys.argv[1])\n"
            "for p in sys.argv[2:]:\n"
            "    try: os.close(os.open(p, os.O_RDWR)); print('ok')\n"
            "    except OSError as e: print(errno.errorcode[e.errno])\n")
    done = subprocess.run([sys.executable, "-c", code, procs, *map(str, nodes)],
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_a_node_with_cgroups_confines_and_one_without_says_why(root, tmp_path):
    found = confine.detect(f"{root}/c/h1", "auto")
    if MOUNTS[1]:
        assert found.mode is confine.Mode.DEVICES and found.filter == "v1"
    assert found.label in ("devices+cgroup", "cgroup")
    assert confine.detect(f"{root}/c/h1", "off").label == "none: hypertf_gpu_confine: off"
    nowhere = tmp_path / "mountinfo"  # a node whose hierarchies cannot be written
    nowhere.write_text(
        "40 31 0:33 / /proc/none/unified rw - cgroup2 cgroup2 rw\n"
        "41 31 0:34 / /proc/none/devices rw - cgroup cgroup rw,devices\n")
    lost = confine.detect(f"{root}/c/h1", "required", str(nowhere))
    assert lost.mode is confine.Mode.NONE and lost.required
    assert lost.label.startswith("none: cgroup v2 (/proc/none/unified/")
    assert lost.job_dirs("k.alice") == []


@pytest.mark.parametrize("hierarchy", ["v1", "bpf"])
def test_the_job_opens_only_its_gpus_as_the_row_grants_them(root, tmp_path, nodes, hierarchy):
    unified, devices = MOUNTS
    info = tmp_path / "mountinfo"  # the node as if it had only this hierarchy
    if hierarchy == "v1" and devices:
        info.write_text(f"41 31 0:34 / {devices} rw - cgroup cgroup rw,devices\n")
    elif hierarchy == "bpf" and unified:
        info.write_text(f"40 31 0:33 / {unified} rw - cgroup2 cgroup2 rw\n")
    else:
        pytest.skip(f"no {hierarchy} hierarchy here")
    state = confine.detect(f"{root}/c/h1", "auto", str(info))
    if state.filter != hierarchy:
        pytest.skip(f"no {hierarchy} device filter here: {state.why}")
    cgroups = confine.JobCgroups(state)
    minors = {0: 0, 1: 1, 2: 2}
    cgroups.sync({"k1.alice": frozenset({0}), "k2.bob": frozenset()}, minors)
    assert opens_in(state.job_dirs("k1.alice"), nodes) == ["ENXIO", "EPERM", "EPERM"]
    assert opens_in(state.job_dirs("k2.bob"), nodes) == ["EPERM"] * 3  # CPU tasks only
    cgroups.sync({"k1.alice": frozenset({1, 2})}, minors)  # its next attempt's grant
    assert opens_in(state.job_dirs("k1.alice"), nodes) == ["EPERM", "ENXIO", "ENXIO"]
    assert not any(d.exists() for d in state.job_dirs("k2.bob"))  # gone from the row: removed


def test_a_stop_leaves_nothing_of_the_job_and_a_job_without_cells_is_ended(root):
    state = confine.detect(f"{root}/c/h1", "auto")
    cgroups = confine.JobCgroups(state)
    cgroups.sync({"k1.alice": frozenset()}, {})
    dirs = state.job_dirs("k1.alice")
    procs = ":".join(str(d / "cgroup.procs") for d in dirs)
    daemon = ("import subprocess, sys\nfrom hypertf.node import confine\n"
              "assert not confine.join(sys.argv[1])\n"
              "subprocess.Popen(['sleep', '600'], start_new_session=True)\n")
    subprocess.run([sys.executable, "-c", daemon, procs], check=True)
    assert confine.populated(dirs)
    assert confine.stop(dirs, grace=2.0)
    assert not confine.populated(dirs)
    subprocess.run([sys.executable, "-c", daemon, procs], check=True)
    cgroups.sync({}, {})  # its cells are gone: nothing of it may run, its cgroups go
    assert not any(d.exists() for d in dirs)


def test_another_account_can_neither_join_a_jobs_cgroup_nor_widen_its_rules(root):
    try:
        thief = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no 'nobody' account to be the thief")
    state = confine.detect(f"{root}/c/h1", "auto")
    confine.JobCgroups(state).sync({"k1.alice": frozenset({0})}, {0: 0, 1: 1})
    targets = [str(d / "cgroup.procs") for d in state.job_dirs("k1.alice")]
    if state.filter == "v1":
        targets.append(str(Path(state.devices) / "k1.alice" / "devices.allow"))
    targets += [str(Path(d) / "cgroup.kill") for d in (state.unified,) if d]
    code = ("import os, sys\nos.setuid(int(sys.argv[1]))\n"
            "for path in sys.argv[2:]:\n"
            "    try:\n        open(path, 'w').write(str(os.getpid()) if path.endswith('procs')"
            " else 'c 195:1 rwm')\n        print('wrote', path)\n"
            "    except OSError as err:\n        print(err.errno)\n")
    done = subprocess.run([sys.executable, "-c", code, str(thief), *targets],
                          capture_output=True, text=True, check=True)
    assert done.stdout.split() == [str(errno.EACCES)] * len(targets), done.stdout


def test_a_required_node_that_cannot_confine_offers_no_gpu(tmp_path):
    gpus = tmp_path / "gpus.json"
    gpus.write_text("[{}, {}]")
    probe = prober(tmp_path, gpus)
    probe.cgroups = confine.NodeCgroups(why="cgroup v2 (read-only)", required=True)
    record = probe.probe()
    assert record.gpu_avail_list == [] and record.confine == "none: cgroup v2 (read-only)"
    assert all("hypertf_gpu_confine is required" in g.reason for g in record.gpus)
    assert isinstance(probe, Prober) and isinstance(probe.source, StaticGpuSource)


def test_a_start_on_a_required_node_without_the_jobs_cgroups_starts_nothing(tmp_path, root,
                                                                            monkeypatch):
    state = confine.detect(f"{root}/c/h1", "required")
    confine.write_state(tmp_path, state)  # the agent's file; it never made the job's cgroups
    monkeypatch.setattr(confine, "WAIT_S", 0.2)
    run = tmp_path / "runs" / "k9.alice"
    answer = tasknode.start_tasks(StartRequest.parse({
        "run_dir": str(run), "venv": sys.prefix, "script": "",
        "tasks": [{"name": "worker0", "argv": ["true"], "cwd": str(run / "worker0"),
                   "env": {}, "port": 1}]}))
    assert answer.problems and "hypertf_gpu_confine is required" in answer.problems[0]
    assert not answer.started


@pytest.fixture
def public() -> Path:
    """A folder every account may enter (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="hypertf-confine-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_task_of_an_account_that_cannot_join_waits_for_the_agent_to_move_it(root, public):
    """Not root (on cgroup v2 no other account may move a process between cgroups): the
    wrapper waits, the agent proves it and moves it in, and only then the command runs."""
    try:
        account = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' account")
    from hypertf.core.layout import Layout
    from hypertf.core.rundir import RunDir
    from hypertf.node.hostreport import HostReport
    from hypertf.node.metrics import AgentCollector

    gpus = public / "gpus.json"
    gpus.write_text("[{}]")
    node = prober(public, gpus).node
    state = confine.detect(f"{root}/c/h1", "required")
    report = HostReport(node, Layout("/p"), AgentCollector(node.name), lambda *_: None,
                        cgroups=confine.JobCgroups(state))
    key = "k5.nobody"
    report.cgroups.sync({key: frozenset({0})}, {0: 0})
    run = RunDir.of(node.settings.workdir, key, local=True)
    for folder in (Path(node.settings.workdir), run.local.parent):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)
    run.local.mkdir()
    os.chown(run.local, account.pw_uid, account.pw_gid)
    env, notice = confine.join_env(state, key)
    assert not notice
    task = subprocess.Popen(
        tasknode.wrapper_argv(run, "worker0", sys.prefix, "/", ["cat", "/proc/self/cgroup"]),
        env={**os.environ, **env, "HYPERTF_TASK_KEY": key}, user=account.pw_uid,
        group=account.pw_gid, start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while task.poll() is None and time.monotonic() < deadline:
            report.adopt()  # the agent's probe
            time.sleep(0.05)
        assert task.wait(timeout=10) == 0, Path(run.log("worker0")).read_text()
    finally:
        if task.poll() is None:
            task.kill()
    lines = Path(run.log("worker0")).read_text().splitlines()
    assert sum(line.endswith(f"/{state.path}/{key}") for line in lines) == len(
        state.job_dirs(key)), lines


def test_an_agent_that_stops_leaves_no_empty_cgroup_behind(root, tmp_path):
    state = confine.detect(f"{root}/c/h1", "auto")
    cgroups = confine.JobCgroups(state)
    cgroups.sync({"k1.alice": frozenset({0})}, {0: 0})
    cgroups.close(tmp_path)
    assert confine.read_state(tmp_path).label == "none: the node's agent is stopped"
    for mount in MOUNTS:
        if mount:
            assert not (Path(mount) / root / "c").exists()  # its host's, its cluster's


def test_an_agent_not_serving_makes_no_cgroup(tmp_path):
    from hypertf.node.agent import NodeAgent

    gpus = tmp_path / "gpus.json"
    gpus.write_text("[{}]")
    node = prober(tmp_path, gpus).node
    agent = NodeAgent(load_inventory(tmp_path / "inventory.yml"), node.name)
    assert agent.cgroups.state.mode is confine.Mode.NONE
    assert not any((Path(m) / "hypertf" / "p").exists() for m in MOUNTS if m)
