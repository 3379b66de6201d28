"""The rendezvous mode (``--rendezvous tf|coordinator|none``): decided from the modules the
script imports and said at start, kept in a detached launcher's and a sweep's saved request,
given to Volcano's pods from their stable hostnames, and followed by the Monitor's idle
warning, start-up deadline and end. Real parts (the Monitor, the Job's start-up
announcement, the export renderers); no ZooKeeper."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hypertf.config.inventory import Inventory
from hypertf.core.errors import UsageError
from hypertf.core.monitor import (
    Decision,
    Event,
    EventKind,
    Limits,
    Monitor,
    TaskState,
    Verdict,
)
from hypertf.core.rendezvous import RENDEZVOUS_ENV, Readiness
from hypertf.core.scheduler import Placement
from hypertf.export import ExportOptions, NodeSetup, export
from hypertf.launch.launcher import Job
from hypertf.launch.request import TrainRequest
from hypertf.sweep import driver as sweeps
from hypertf.sweep.spec import SweepSpec, expand, parse_grid_option

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


# -- the idle warning, the start-up deadline and "done" follow the mode ----------------------
class Run:
    """A Monitor of ``count`` workers (worker:i on h<i>, port 20000+i), fed at chosen
    seconds; what it said, and its first final decision."""

    def __init__(self, count: int, limits: Limits) -> None:
        tasks = {f"worker:{i}": TaskState(Placement("worker", i, f"h{i}", ()), 20000 + i)
                 for i in range(count)}
        self.monitor = Monitor(tasks, limits, now=0.0, logs_hint="runs/KEY/",
                               idle_causes="a task waiting for a peer")
        self.said: list[str] = []
        self.decision = Decision()

    def feed(self, at: float, kind: str, task: str = "", **fields: Any) -> Decision:
        host = file = ""
        if task:
            host = self.monitor.tasks[task].placement.host
            file = self.monitor.tasks[task].file_name
        decision = self.monitor.feed(Event(EventKind(kind), host, task=file, **fields), at)
        self.said += decision.say
        if decision.final and not self.decision.final:
            self.decision = decision
        return decision

    def ticks(self, start: int, until: int) -> None:
        for second in range(start, until + 1):
            if not self.decision.final:
                self.feed(float(second), "tick")


def test_a_coordinator_jobs_idle_warning_and_end_follow_its_mode() -> None:
    """Coordinator mode: the idle clock starts once rank 0 listens and does not claim that
    every task listens; a non-coordinator's exit 0 does not end the job, every task's
    does; rank 0 listened, so no 'never opened its port' note."""
    run = Run(2, Limits(start_timeout=5.0, idle_timeout=10.0, host_silence=1e9,
                        readiness=Readiness.COORDINATOR))
    run.feed(1.0, "listening", "worker:0")
    run.ticks(1, 12)
    warnings = [line for line in run.said if "warning:" in line]
    assert len(warnings) == 1, run.said
    assert "no task has written a line for 10 s" in warnings[0], warnings
    assert "every task listens" not in warnings[0], warnings
    assert not run.decision.final, run.decision.message
    assert run.feed(13.0, "exit", "worker:1", code=0).verdict is Verdict.RUNNING
    done = run.feed(14.0, "exit", "worker:0", code=0)
    assert done.verdict is Verdict.SUCCEEDED
    assert not any("note:" in line for line in run.said), run.said


def test_a_job_said_to_need_no_port_has_no_deadline_and_is_judged_by_its_exits() -> None:
    """--rendezvous none: no task ever listens; no start-up deadline at 5 s, the idle
    clock runs from the start, the job ends when every task exited 0, with no note that
    its tasks never formed a cluster (the user said so)."""
    run = Run(2, Limits(start_timeout=5.0, idle_timeout=10.0, host_silence=1e9,
                        readiness=Readiness.NONE))
    run.feed(0.5, "log", "worker:0", line="epoch 1")
    run.feed(0.5, "log", "worker:1", line="epoch 1")
    run.ticks(1, 12)
    assert not run.decision.final, run.decision.message
    assert not any("start-up deadline" in line for line in run.said), run.said
    assert any("no task has written a line for 10 s" in line for line in run.said), run.said
    run.feed(20.0, "exit", "worker:0", code=0)
    assert run.feed(21.0, "exit", "worker:1", code=0).verdict is Verdict.SUCCEEDED
    assert not any("note:" in line for line in run.said), run.said


def test_a_chief_is_the_coordinator_named_alone_at_the_deadline() -> None:
    """With a chief, rank 0 is the chief: the coordinator deadline names it alone, with
    what its initialize() should have done, and not the workers that never listened."""
    tasks = {name: TaskState(Placement(role, index, f"h{n}", ()), 20000 + n)
             for n, (name, role, index) in enumerate([("worker:0", "worker", 0),
                                                       ("chief:0", "chief", 0),
                                                       ("worker:1", "worker", 1)])}
    monitor = Monitor(tasks, Limits(start_timeout=5.0, idle_timeout=None, host_silence=1e9,
                                    readiness=Readiness.COORDINATOR), now=0.0)
    decision = Decision()
    for second in range(7):
        decision = monitor.feed(Event(EventKind.TICK), float(second))
        if decision.final:
            break
    assert decision.verdict is Verdict.RETRYABLE
    first = decision.message.splitlines()[0]
    assert first == "start-up deadline: chief:0@h1 not listening on its port after 5 s", first
    assert "rank 0 is the coordinator" in decision.message
    assert decision.hosts == {"h1"}


# -- the mode decided and said at start -------------------------------------------------------


def started(inventory: Inventory, request: TrainRequest) -> tuple[Readiness, list[str]]:
    """The mode a job decides before it starts, and its lines that name it."""
    said: list[str] = []
    job = Job(inventory, request, said.append)
    job.announce_flags()
    return job.readiness, [line for line in said if "rendezvous" in line]


def test_the_mode_comes_from_a_module_the_script_imports_and_is_said_with_why(
        tmp_path: Path, inventory: Inventory) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import model\nmodel.fit()\n")
    (code / "model.py").write_text("import jax\n\ndef fit():\n    pass\n")
    mode, lines = started(inventory, TrainRequest(script=str(code / "train.py"), workers=2))
    assert mode is Readiness.COORDINATOR
    assert lines == ["hypertf: rendezvous: coordinator (only rank 0's port must open before "
                     "the start-up deadline): the script imports jax; --rendezvous "
                     "tf|coordinator|none chooses"], lines


def test_keras_on_jax_by_env_the_option_and_tensorflow(tmp_path: Path,
                                                       inventory: Inventory) -> None:
    keras = tmp_path / "keras_fit.py"
    keras.write_text("import keras\n")
    on_jax = TrainRequest(script=str(keras), workers=2, env=("KERAS_BACKEND=jax",))
    mode, lines = started(inventory, on_jax)
    assert mode is Readiness.COORDINATOR
    assert "the job's --env sets KERAS_BACKEND=jax" in lines[0], lines
    mode, lines = started(inventory, TrainRequest(script=str(keras), workers=2))
    assert mode is Readiness.TF  # Keras on TensorFlow: as before, and said in one line
    assert lines == ["hypertf: rendezvous: tf (every task's port must open before the start-up "
                     "deadline): the script imports no jax, torch or keras on jax; --rendezvous "
                     "tf|coordinator|none chooses"], lines
    mode, lines = started(inventory, TrainRequest(script=str(keras), workers=2,
                                                  rendezvous="none"))
    assert mode is Readiness.NONE
    assert lines[0].startswith("hypertf: rendezvous: none (no port must open"), lines
    with pytest.raises(UsageError, match="--rendezvous must be one of tf, coordinator, none"):
        TrainRequest(script=str(keras), rendezvous="jax").validate()


def test_train_help_offers_the_rendezvous_option() -> None:
    done = subprocess.run([sys.executable, "-m", "hypertf.cli", "train", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "--rendezvous MODE" in text and "coordinator (rank 0's" in text, done.stdout


# -- the same for detached jobs, sweeps and exports -------------------------------------------
def test_the_mode_survives_a_detached_launchers_and_a_sweeps_saved_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    request = TrainRequest(script="t.py", workers=2, rendezvous="coordinator")
    assert TrainRequest.from_json(json.loads(json.dumps(request.to_json()))) == request
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv.yml").write_text("")
    trials = expand(SweepSpec(script="t.py", train={}, grid=parse_grid_option(["lr=0.1"])))
    sweep = sweeps.create("inv.yml", request, trials, None, "max", 1, None)
    trial = sweeps.Driver(sweep, {}).trial_request(sweep.trials[0])
    assert trial.rendezvous == "coordinator" and trial.args == ("--lr", "0.1")


SETUP = NodeSetup(task_env=(), python_packages=(), python_packages_no_deps=(),
                  tensorflow="tensorflow-cpu==2.19.1")


def test_volcano_pods_get_the_rendezvous_from_their_stable_hostnames() -> None:
    """Volcano's pods (one task each, the index from its annotation): the ranks from the
    index, the coordinator worker 0's stable name and the port TF_CONFIG names."""
    from hypertf.export import volcano

    text, _notes = export(TrainRequest(script=str(EXAMPLES / "jax_distributed.py"),
                                       workers=3),
                          ExportOptions("volcano", image="r/i:1", name="v"), SETUP)
    vj = list(yaml.safe_load_all(text))[-1]
    (task,) = vj["spec"]["tasks"]
    (container,) = task["template"]["spec"]["containers"]
    hosts = [f"v-worker-{i}.v" for i in range(3)]
    for index in range(3):
        fields = {volcano.TASK_INDEX: str(index), volcano.RETRY_COUNT: "0"}
        env: dict[str, str] = {}
        for item in container["env"]:  # as the kubelet expands them, in order
            if "valueFrom" in item:
                env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
            else:
                value = item["value"]
                for name, known in env.items():
                    value = value.replace(f"$({name})", known)
                env[item["name"]] = value
        assert set(RENDEZVOUS_ENV) <= set(env), sorted(set(RENDEZVOUS_ENV) - set(env))
        assert env["RANK"] == env["JAX_PROCESS_ID"] == env["NODE_RANK"] == str(index)
        assert env["KERAS_DISTRIBUTION_PROCESS_ID"] == str(index)
        assert env["WORLD_SIZE"] == env["JAX_NUM_PROCESSES"] == "3"
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "1")
        coordinator = env["JAX_COORDINATOR_ADDRESS"]
        assert coordinator.split(":")[0] == hosts[0], coordinator
        assert f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" == coordinator
        assert [a.split(":")[0] for a in env["KERAS_DISTRIBUTION_JOB_ADDRESSES"].split(",")] \
            == hosts
