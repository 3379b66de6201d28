"""Issue 39 (round 4), the command line's share: --chief and --gpus-per-chief (item 9), one
reserved environment refused by name (item 10), ``invoke --help train | head -1`` (item 11).

Real parsers and a real shell pipeline; no ZooKeeper, no network.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tasks
from hypertf.cli import main as cli
from hypertf.config.settings import RESERVED_ENV, check_env
from hypertf.core.errors import UsageError
from hypertf.launch.request import TRAIN_OPTIONS, TrainRequest
from hypertf.node import tasknode
from tests.unit.test_options import invoke_parse

REPO = Path(__file__).resolve().parents[2]
INVOKE = REPO / ".venv" / "bin" / "invoke"


# -- item 9: a chief for mirrored jobs too, and its own GPU count ----------------------------
def test_the_chief_help_says_it_also_serves_mirrored_jobs() -> None:
    (chief,) = [o for o in TRAIN_OPTIONS if o.name == "chief"]
    assert "ParameterServerStrategy" in chief.help and "mirrored" in chief.help


@pytest.mark.parametrize("argv, worker_gpus, chief_gpus", [
    (["--chief"], 1, 1),  # by default as many as a worker: today's behaviour
    (["--chief", "--gpus-per-worker", "2"], 2, 2),
    (["--chief", "--gpus-per-chief", "0"], 1, 0),  # a coordinator that needs no GPU
    (["--chief", "--gpus-per-chief", "4", "--gpus-per-worker", "2"], 2, 4),
])
def test_gpus_per_chief_gives_the_chief_its_own_count(argv: list[str], worker_gpus: int,
                                                       chief_gpus: int) -> None:
    request = cli.train_request(cli.parse_train(["--script", "t.py", "--worker", "2", *argv]))
    slots = {slot.name: slot.gpus for slot in request.slots(cpu_only=False)}
    assert slots == {"chief:0": chief_gpus, "worker:0": worker_gpus, "worker:1": worker_gpus}
    assert {slot.gpus for slot in request.slots(cpu_only=True)} == {0}


def test_invoke_train_reads_gpus_per_chief_too() -> None:
    parsed = invoke_parse(["train", "--script", "t.py", "--chief", "--gpus-per-chief", "3"])
    assert parsed[0].args["gpus_per_chief"].value == 3


def test_a_negative_gpus_per_chief_is_refused_by_name() -> None:
    with pytest.raises(UsageError, match="GPU counts"):
        TrainRequest(script="t.py", chief=True, gpus_per_chief=-1).validate()


def test_gpus_per_chief_without_a_chief_is_refused() -> None:
    """It would be ignored silently: say so instead."""
    with pytest.raises(UsageError, match=r"--gpus-per-chief.*--chief"):
        TrainRequest(script="t.py", gpus_per_chief=2).validate()


# -- item 10: one reserved environment -----------------------------------------------------
# What the launcher sets for every task (launch/taskstart.py's StartPlan.task_requests,
# spec.gpu_env).
SET_BY_HYPERTF = ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HYPERTF_GPUS",
                  "HYPERTF_TASK_KEY", "HYPERTF_TASK", "HYPERTF_ATTEMPT",
                  "HYPERTF_CHECKPOINT_DIR", "HYPERTF_TENSORBOARD_DIR", "HYPERTF_METRICS_FILE",
                  "HYPERTF_START_AFTER")


@pytest.mark.parametrize("name", SET_BY_HYPERTF)
def test_every_variable_hypertf_sets_is_refused_by_name_in_env(name: str) -> None:
    with pytest.raises(UsageError, match=f"{name} is set by HyperTF"):
        TrainRequest(script="t.py", env=(f"{name}=/mine",)).validate()


def test_the_tensorboard_dir_is_reserved() -> None:
    """A user's --env HYPERTF_TENSORBOARD_DIR=... was silently overwritten."""
    with pytest.raises(ValueError, match="HYPERTF_TENSORBOARD_DIR is set by HyperTF"):
        check_env("HYPERTF_TENSORBOARD_DIR", "/x", "--env")


def test_the_settings_and_the_launcher_read_the_same_list() -> None:
    from hypertf.core import taskenv

    assert RESERVED_ENV is taskenv.RESERVED_ENV


def test_a_variable_hypertf_sets_outside_the_list_is_a_bug() -> None:
    """The launcher's values go through taskenv.ours: a new name must join the list, else
    a user's --env of it would be overwritten without a word."""
    from hypertf.core import taskenv

    assert taskenv.ours({"TF_CONFIG": "{}", "HYPERTF_TASK": "worker:0"}) == {
        "TF_CONFIG": "{}", "HYPERTF_TASK": "worker:0"}
    with pytest.raises(AssertionError, match="HYPERTF_NEW"):
        taskenv.ours({"HYPERTF_NEW": "1"})


# -- item 11: a reader that leaves the help ------------------------------------------------
@pytest.mark.skipif(not INVOKE.exists(), reason="needs the venv's invoke")
def test_invoke_help_into_head_prints_no_traceback() -> None:
    """Invoke prints the help itself, after loading tasks.py: its BrokenPipeError went
    through as a traceback (exit 1) when ``head`` left first."""
    assert tasks.ns.task_names  # the collection the command loads
    for _ in range(3):  # the race is lost almost always; three tries make it certain
        done = subprocess.run(["bash", "-c", f"{INVOKE} --help train | head -1; "
                                             f"exit ${{PIPESTATUS[0]}}"],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.stdout.startswith("Usage: inv")
        assert done.stderr == "", done.stderr
        assert done.returncode in (0, cli.SIGPIPE_EXIT)


# -- item 17: one offload channel name -----------------------------------------------------
def test_the_offload_channel_name_is_spelled_in_one_module_only() -> None:
    """The launcher, the channel and the node's cleanup spelled it apart; a drift leaks
    /dev/shm segments."""
    spelled = sorted(str(path.relative_to(REPO)) for path in (REPO / "hypertf").rglob("*.py")
                     if "hypertf-offload" in path.read_text())
    assert spelled == ["hypertf/core/offloadname.py"]


def test_what_the_node_removes_is_what_the_launcher_named(tmp_path: Path) -> None:
    """tasknode stop's cleanup, on a /dev/shm of its own, takes every name of the job's
    channels (shared memory and semaphores, each generation) and nothing of another job."""
    from hypertf.core.offloadname import channel_name
    from hypertf.node import tasknode

    key, other = "20261122-085000-a1b2c3.alice", "20261122-085000-ffffff.bob"
    mine = [channel_name(key, "worker0")[1:] + suffix for suffix in ("", "-d1")]
    mine += ["sem." + channel_name(key, "ps0")[1:] + suffix for suffix in ("-req", "-done")]
    theirs = [channel_name(other, "worker0")[1:], "sem." + channel_name(other, "worker0")[1:]]
    for name in mine + theirs:
        (tmp_path / name).write_text("")
    tasknode.unlink_offload_channels(key, shm=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(theirs)


# -- item 18: tasknode stop waits with psutil.wait_procs ---------------------------------------
def test_stop_waits_for_the_groups_with_psutils_wait_procs(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            ) -> None:
    """Real tasks, one ending on TERM and one ignoring it: both are waited for by
    psutil.wait_procs (counted here, then called through), not by a hand-written poll."""
    import psutil

    from tests.unit.test_tasknode import SLEEPER, STUBBORN, Node

    waits: list[int] = []
    real = psutil.wait_procs

    def counted(procs, timeout=None, callback=None):  # type: ignore[no-untyped-def]
        waits.append(len(procs))
        return real(procs, timeout=timeout, callback=callback)

    monkeypatch.setattr(psutil, "wait_procs", counted)
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "activate").write_text("")
    node = Node(tmp_path, tmp_path / "venv")
    try:
        run = node.run_dir()
        pids = tmp_path / "stubborn.pids"
        node.python_task(run, "ps0", SLEEPER)
        node.python_task(run, "worker0", STUBBORN, str(pids))
        wait_for_file = time.monotonic() + 10
        while not pids.exists() and time.monotonic() < wait_for_file:
            time.sleep(0.05)
        assert tasknode.stop(run, grace=0.5) == {"ps0": "stopped", "worker0": "killed"}
        assert waits and max(waits) >= 2
        assert not tasknode.run_alive(run)
    finally:
        node.cleanup()


# -- item 2: a node environment without bin/activate ---------------------------------------
def _run_task(tmp_path: Path, venv: Path, argv: list[str]) -> tuple[int, str]:
    """One task through the real task.sh, as ``tasknode start`` runs it: exit code, log."""
    from hypertf.core.rundir import RunDir

    run = RunDir.of(tmp_path / "work", "job", local=True)
    run.local.mkdir(parents=True)
    done = subprocess.run(tasknode.wrapper_argv(run, "worker0", str(venv), str(tmp_path), argv),
                          capture_output=True, text=True, timeout=30)
    log = Path(run.log("worker0"))
    assert Path(run.exit("worker0")).read_text().strip() == str(done.returncode)
    return done.returncode, log.read_text() if log.exists() else ""


def _bare_env(tmp_path: Path, python: bool) -> Path:
    """A hand-made (or conda) environment: bin/python, no bin/activate."""
    venv = tmp_path / "env"
    (venv / "bin").mkdir(parents=True)
    if python:
        (venv / "bin" / "python").symlink_to(sys.executable)
    return venv


def test_a_task_runs_in_an_environment_without_activate(tmp_path: Path) -> None:
    """It ended 'exit 127' with no output: now bin/ comes first on PATH, as activate does."""
    venv = _bare_env(tmp_path, python=True)
    code, log = _run_task(tmp_path, venv, [
        "bash", "-c", 'echo "python is $(command -v python); env $VIRTUAL_ENV"'])
    assert code == 0, log
    assert f"python is {venv}/bin/python; env {venv}" in log


def test_a_task_without_any_environment_says_why_in_its_log(tmp_path: Path) -> None:
    venv = _bare_env(tmp_path, python=False)
    code, log = _run_task(tmp_path, venv, ["python", "-c", "print(1)"])
    assert code == 127
    assert f"hypertf: no Python environment at {venv} (neither bin/activate nor bin/python)" \
        in log


def test_an_activate_that_fails_is_named_in_the_log(tmp_path: Path) -> None:
    venv = _bare_env(tmp_path, python=True)
    (venv / "bin" / "activate").write_text("return 3\n")
    code, log = _run_task(tmp_path, venv, ["python", "-c", "print(1)"])
    assert code == 127
    assert f"hypertf: sourcing {venv}/bin/activate failed (exit 3)" in log


def test_preflight_checks_what_task_sh_needs_of_the_environment(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    bare = _bare_env(tmp_path, python=True)
    assert tasknode.preflight(str(tmp_path / "work"), "", str(bare))["problems"] == []
    nothing = tmp_path / "nothing"
    (problem,) = tasknode.preflight(str(tmp_path / "work"), "", str(nothing))["problems"]
    assert problem.startswith(f"no Python environment at {nothing}")
    assert "hypertf_venv" in problem
    assert tasknode.preflight(str(tmp_path / "work"), "")["problems"] == []  # this venv


# -- item 3: TF1 between-graph start order, and an idle warning that says what is --------------
def _placements(*names: str) -> list:
    from hypertf.core.scheduler import Placement

    return [Placement(n.split(":")[0], int(n.split(":")[1]), "h1", ()) for n in names]


def test_a_node_starts_the_ps_then_worker_0_then_the_others() -> None:
    from hypertf.core import spec

    placed = _placements("worker:0", "worker:1", "worker:2", "ps:0", "ps:1")  # slot order
    ordered = sorted(placed, key=spec.start_rank)
    assert [p.name for p in ordered] == ["ps:0", "ps:1", "worker:0", "worker:1", "worker:2"]
    chief = sorted(_placements("chief:0", "worker:0", "ps:0"), key=spec.start_rank)
    assert [p.name for p in chief] == ["ps:0", "chief:0", "worker:0"]


def test_only_the_other_tf1_workers_wait_for_worker_0() -> None:
    from hypertf.core import spec

    addresses = {"worker:0": "10.0.0.1:2000", "worker:1": "10.0.0.2:2001",
                 "ps:0": "10.0.0.3:2002", "chief:0": "10.0.0.4:2003"}
    legacy = _placements("worker:0", "worker:1", "ps:0")
    assert spec.start_after(legacy, addresses) == {"worker:1": "10.0.0.1:2000"}
    assert spec.start_after(_placements("chief:0", "worker:0", "worker:1", "ps:0"),
                            addresses) == {}  # TF2 parameter server
    assert spec.start_after(_placements("worker:0", "worker:1"), addresses) == {}  # mirrored


def test_task_sh_starts_a_task_after_its_address_listens(tmp_path: Path) -> None:
    """The real wrapper: the command runs only once the port accepts a connection."""
    import socket

    from hypertf.core.rundir import RunDir

    venv = _bare_env(tmp_path, python=True)
    run = RunDir.of(tmp_path / "work", "job", local=True)
    run.local.mkdir(parents=True)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stamp = tmp_path / "started"
    wrapper = subprocess.Popen(
        tasknode.wrapper_argv(run, "worker1", str(venv), str(tmp_path),
                              ["bash", "-c", f"date +%s.%N > {stamp}"]),
        env={**os.environ, "HYPERTF_START_AFTER": f"127.0.0.1:{port}"})
    try:
        time.sleep(1.0)
        assert not stamp.exists(), "started before worker 0 listened"
        listened = time.time()
        listener.listen()
        assert wrapper.wait(timeout=10) == 0
        assert listened <= float(stamp.read_text()) < listened + 2
    finally:
        listener.close()
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()


def test_the_idle_warning_of_a_tf1_worker_left_waiting_says_what_is_and_the_fixes() -> None:
    """legacy_mnist: worker 0 trained and exited 0; worker 1 logged 'Waiting for model to
    be ready' and nothing more. The warning said 'every task listens' and advised --chief
    (a TF2 fix) although the script reads the legacy flags."""
    from hypertf.core.monitor import Event, Limits, Monitor, TaskState
    from hypertf.launch.request import TrainRequest

    tasks = {p.name: TaskState(p, 20000 + i)
             for i, p in enumerate(_placements("worker:0", "worker:1", "ps:0"))}
    causes = TrainRequest(script="t.py", workers=2, ps=1).idle_causes(legacy_flags=True)
    assert "--chief" not in causes
    monitor = Monitor(tasks, Limits(idle_timeout=300.0), 0.0, idle_causes=causes)
    for name in ("worker0", "worker1", "ps0"):
        monitor.feed(Event("listening", "h1", name), 1.0)
    monitor.feed(Event("log", "h1", "worker1", line="Waiting for model to be ready."), 2.0)
    monitor.feed(Event("exit", "h1", "worker0", code=0), 3.0)
    said = [line for now in range(4, 310) for line in monitor.feed(Event("tick"), now).say]
    (warning,) = [line for line in said if "warning" in line]
    assert "every task listens" not in warning and "--chief" not in warning
    assert "worker:1@h1, ps:0@h1 still running" in warning
    assert "worker:0@h1 ended (exit 0)" in warning
    assert "device_filters" in warning and "wait for the other workers" in warning
