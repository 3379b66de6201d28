"""Issue 54 items 1 and 7: a script's legacy flags and its TF2 strategy are read from the
script and from the modules beside it that it imports (tf_cnn_benchmarks.py's flags live in
benchmark_cnn.py); a ps that exits 0 by itself names --legacy-flags; --chief is suggested only
to a script that names ParameterServerStrategy or ClusterCoordinator."""

from __future__ import annotations

from pathlib import Path

import pytest

from hypertf.config.inventory import Inventory
from hypertf.core import diagnose
from hypertf.core.diagnose import (
    MAX_SCAN_FILES,
    ROLELESS,
    JobFacts,
    files_read_legacy_flags,
    scan_script,
)
from hypertf.core.monitor import Event, Limits, Monitor, TaskState, Verdict
from hypertf.core.protocol import PreflightAnswer
from hypertf.core.scheduler import Placement
from hypertf.export import ExportOptions, job_for
from hypertf.launch.launcher import Job
from hypertf.launch.preflight import Preflight
from hypertf.launch.request import TrainRequest
from hypertf.node import tasknode

ENTRY = """\
import sys
import benchmark_cnn

if __name__ == "__main__":
    benchmark_cnn.main(sys.argv)
"""
TF_APP_FLAGS = """\
import tensorflow as tf
flags = tf.app.flags
tf.app.flags.DEFINE_string("ps_hosts", "", "comma-separated ps")
flags.DEFINE_string("job_name", "", "ps or worker")
"""
ARGPARSE = """\
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--ps_hosts", default="")
"""
TF1_SERVER = """\
import json, os
import tensorflow.compat.v1 as tf
cluster = tf.train.ClusterSpec(json.loads(os.environ["TF_CONFIG"])["cluster"])
server = tf.train.Server(cluster, job_name="worker", task_index=0)
with tf.device(tf.train.replica_device_setter(cluster=cluster)):
    pass
"""
TF2_PS = """\
import tensorflow as tf
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
"""


def write(folder: Path, files: dict[str, str]) -> Path:
    """The files (relative path: text) under ``folder``; the first is the script."""
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder / next(iter(files))


# -- item 1: the scan ------------------------------------------------------------------------
@pytest.mark.parametrize("module", [TF_APP_FLAGS, ARGPARSE])
def test_flags_defined_in_an_imported_sibling_module_are_found(tmp_path, module):
    script = write(tmp_path, {"tf_cnn_benchmarks.py": ENTRY, "benchmark_cnn.py": module})
    assert not files_read_legacy_flags([script])  # the entry script alone: the defect
    scan = scan_script(script)
    assert scan.legacy_flags and not scan.ps_strategy
    assert scan.files == (script, tmp_path / "benchmark_cnn.py")


@pytest.mark.parametrize("entry, files", [
    ("from benchmark_cnn import main\n", {"benchmark_cnn.py": "import flags\n",
                                          "flags.py": TF_APP_FLAGS}),  # transitively
    ("import pkg.opts\n", {"pkg/__init__.py": "", "pkg/opts.py": ARGPARSE}),
    ("from pkg import opts\n", {"pkg/__init__.py": "", "pkg/opts.py": ARGPARSE}),
    ("from pkg import run\n", {"pkg/__init__.py": "from .opts import parse as run\n",
                               "pkg/opts.py": ARGPARSE}),  # relative, within a package
    ("def main():\n    import later\n", {"later.py": ARGPARSE}),  # imported in a function
])
def test_imports_are_followed_to_modules_and_packages_of_the_scripts_directory(
        tmp_path, entry, files):
    assert scan_script(write(tmp_path, {"train.py": entry, **files})).legacy_flags


def test_only_the_scripts_own_directory_is_read_and_nothing_is_run(tmp_path):
    (tmp_path / "argparse_flags.py").write_text(ARGPARSE)  # above the script's directory
    script = write(tmp_path / "code", {
        "train.py": "import os, json\nfrom .. import argparse_flags\nimport side_effect\n",
        "side_effect.py": f"open({str(tmp_path / 'ran')!r}, 'w').close()\n",
        "unused.py": ARGPARSE,  # beside it, but never imported
    })
    scan = scan_script(script)
    assert not scan.legacy_flags and not (tmp_path / "ran").exists()
    assert scan.files == (script, script.with_name("side_effect.py"))


def test_the_scan_is_bounded_in_files_and_bytes(tmp_path, monkeypatch):
    chain = {f"m{i}.py": f"import m{i + 1}\n" for i in range(MAX_SCAN_FILES + 5)}
    chain[f"m{MAX_SCAN_FILES + 5}.py"] = ARGPARSE
    script = write(tmp_path, chain)
    scan = scan_script(script)
    assert len(scan.files) == MAX_SCAN_FILES and not scan.legacy_flags
    short = write(tmp_path / "short", {"a.py": "import b\n", "b.py": ARGPARSE})
    assert scan_script(short).legacy_flags
    monkeypatch.setattr(diagnose, "MAX_SCAN_BYTES", len("import b\n"))
    assert scan_script(short).files == (short,)


def test_an_unparsable_module_is_searched_but_its_imports_not_followed(tmp_path):
    script = write(tmp_path, {"train.py": "import opts\n",
                              "opts.py": "print 'py2'\n" + ARGPARSE + "import more\n",
                              "more.py": TF2_PS})
    scan = scan_script(script)
    assert scan.legacy_flags and not scan.ps_strategy


@pytest.mark.parametrize("source, named", [
    (TF2_PS, True),
    ("from tensorflow.distribute.experimental import ParameterServerStrategy\n", True),
    ("coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)\n", True),
    (TF1_SERVER, False),
    ('"""Unlike ParameterServerStrategy, this uses tf.train.Server."""\n# ClusterCoordinator\n',
     False),  # prose and comments name nothing
])
def test_a_tf2_ps_script_is_one_whose_code_names_the_strategy(tmp_path, source, named):
    assert scan_script(write(tmp_path, {"train.py": source})).ps_strategy is named
    via_module = write(tmp_path / "m", {"train.py": "import model\n", "model.py": source})
    assert scan_script(via_module).ps_strategy is named


def test_the_nodes_preflight_reads_the_imported_modules_too(tmp_path):
    write(tmp_path, {"train.py": ENTRY, "benchmark_cnn.py": TF_APP_FLAGS})
    write(tmp_path, {"ps.py": "import model\n", "model.py": TF2_PS})
    found = {script: PreflightAnswer.parse(tasknode.preflight(str(tmp_path), script))
             for script in ("train.py", "ps.py", "")}
    assert (found["train.py"].legacy_flags, found["train.py"].ps_strategy) == (True, False)
    assert (found["ps.py"].legacy_flags, found["ps.py"].ps_strategy) == (False, True)
    assert found[""].ps_strategy is None  # --sync: no script to read there


def test_an_old_nodes_answer_without_the_field_is_unknown():
    old = {"python": "/v/bin/python", "problems": [], "legacy_flags": True, "protocol": 2}
    assert PreflightAnswer.parse(old).ps_strategy is None
    new = PreflightAnswer("/v/bin/python", (), "h1", ps_strategy=False)
    assert PreflightAnswer.parse(new.wire()) == new


def test_export_reads_the_imported_modules(tmp_path):
    script = write(tmp_path, {"train.py": ENTRY, "benchmark_cnn.py": ARGPARSE})
    job = job_for(TrainRequest(script=str(script), workers=2, ps=1),
                  ExportOptions("docker", image="r/i:1"))
    assert job.legacy_flags and all("--job_name=" in " ".join(t.argv) for t in job.tasks)


# -- item 1: a ps that exits 0 by itself --------------------------------------------------------
def ps_job_monitor(facts: JobFacts | None = None) -> tuple[Monitor, dict[str, TaskState]]:
    tasks = {name: TaskState(Placement(role, 0 if name != "worker:1" else 1, f"h{i}", ()),
                             20000 + i)
             for i, (name, role) in enumerate([("worker:0", "worker"), ("worker:1", "worker"),
                                               ("ps:0", "ps")])}
    return Monitor(tasks, Limits(), 0.0, logs_hint="runs/KEY/", facts=facts), tasks


@pytest.mark.parametrize("facts, words", [
    (JobFacts(legacy_flags=False), "HyperTF passed no legacy flags: if the script (or a "
     "module it imports) reads --ps_hosts/--worker_hosts/--job_name/--task_index, run it "
     "with --legacy-flags"),
    (None, "and HyperTF did not pass them, run it with --legacy-flags"),
])
def test_a_ps_that_exits_0_by_itself_says_the_tasks_ran_without_roles(facts, words):
    monitor, _ = ps_job_monitor(facts)
    for at, task in enumerate(["ps0", "worker0"]):
        monitor.feed(Event("log", f"h{2 if task == 'ps0' else 0}", task=task,
                           line="no cluster: training alone"), float(at))
    decision = monitor.feed(Event("exit", "h2", task="ps0", code=0), 3.0)
    assert decision.verdict is Verdict.FAILED
    first, hint = decision.message.splitlines()[:2]
    assert first == f"task ps:0@h2 failed: parameter server ended (exit 0): {ROLELESS}."
    assert hint.startswith("  hint: a ps never exits by itself; ") and hint.endswith(words)


def test_a_ps_that_fails_or_got_its_flags_gets_no_legacy_flags_hint():
    monitor, _ = ps_job_monitor(JobFacts(legacy_flags=False))
    failed = monitor.feed(Event("exit", "h2", task="ps0", code=1), 3.0).message
    assert ROLELESS not in failed and "--legacy-flags" not in failed
    monitor, _ = ps_job_monitor(JobFacts(legacy_flags=True))
    served = monitor.feed(Event("exit", "h2", task="ps0", code=0), 3.0).message
    assert "--legacy-flags" not in served and "join() it" in served


# -- item 7: --chief only for a TF2 parameter-server script ------------------------------------


def announced(inventory: Inventory, script: str) -> str:
    """What the job says of its flags and shape before it starts (2 workers, 1 ps)."""
    said: list[str] = []
    job = Job(inventory, TrainRequest(script=script, workers=2, ps=1), said.append)
    job.announce_flags()
    return "\n".join(said)


@pytest.mark.parametrize("source", [TF1_SERVER, ENTRY])
def test_a_tf1_script_gets_no_word_of_chief(tmp_path, inventory, source):
    write(tmp_path, {"train.py": source, "benchmark_cnn.py": "x = 1\n"})
    out = announced(inventory, str(tmp_path / "train.py"))
    assert "chief" not in out.replace("and no chief", ""), out
    assert "ps and no chief: the job ends when every worker has exited 0" in out


def test_a_parameter_server_strategy_script_is_warned_to_use_chief(tmp_path, inventory):
    write(tmp_path, {"train.py": "import model\n", "model.py": TF2_PS})
    out = announced(inventory, str(tmp_path / "train.py"))
    assert "a TF2 ParameterServerStrategy script needs --chief" in out
    assert ("hypertf: warning: ps tasks and no --chief, but the script names "
            "ParameterServerStrategy or ClusterCoordinator (TF2)") in out
    assert "run it with --chief" in out


def test_a_script_only_on_the_nodes_is_judged_by_their_preflight(tmp_path, inventory):
    """Not a file here: the nodes' answer decides; no answer (old nodes) keeps today's
    warning for a script that reads no legacy flags."""
    remote = "/srv/only-on-the-nodes/train.py"
    assert "warning: ps tasks, no --chief, and the script reads no legacy flags" in \
        announced(inventory, remote)
    for said, warned in ((False, False), (True, True)):
        job = Job(inventory, TrainRequest(script=remote, workers=2, ps=1), lambda _: None)
        job.preflight.ps_strategy = {"h1": said}
        assert (job.hang_warning(False, job.script_ps_strategy()) is not None) is warned
        assert ("--chief" in (job.request.idle_causes(False, job.script_ps_strategy()))) \
            is warned


def test_preflight_answers_combine_to_unknown_when_a_node_did_not_say(tmp_path, inventory):
    preflight = Job(inventory, TrainRequest(script="t.py", workers=1), print).preflight
    assert isinstance(preflight, Preflight) and preflight.script_ps_strategy is None
    preflight.ps_strategy = {"h1": False, "h2": None}
    assert preflight.script_ps_strategy is None
    preflight.ps_strategy = {"h1": False, "h2": False}
    assert preflight.script_ps_strategy is False
    preflight.ps_strategy = {"h1": None, "h2": True}
    assert preflight.script_ps_strategy is True


@pytest.mark.parametrize("order", [["ps0", "worker0", "worker1"], ["worker0", "worker1", "ps0"],
                                   ["worker0", "ps0", "worker1"]])
def test_every_order_of_roleless_exits_fails_naming_legacy_flags(order):
    """Every task of a ps job exits 0 without its role (no flags passed, none listened): the
    ps's exit coming first or the workers' both fail the job, say the tasks ran without their
    roles and name --legacy-flags (before the fix, workers first: SUCCEEDED, a generic note)."""
    monitor, _ = ps_job_monitor(JobFacts(legacy_flags=False))
    host = {"worker0": "h0", "worker1": "h1", "ps0": "h2"}
    for at, task in enumerate(order):
        monitor.feed(Event("log", host[task], task=task, line="no cluster: training alone"),
                     float(at))
    decision = None
    for at, task in enumerate(order, start=10):
        decision = monitor.feed(Event("exit", host[task], task=task, code=0), float(at))
        if decision.final:
            break
    assert decision is not None and decision.verdict is Verdict.FAILED, decision
    assert ROLELESS in decision.message, decision.message
    assert ("HyperTF passed no legacy flags: if the script (or a module it imports) reads "
            "--ps_hosts/--worker_hosts/--job_name/--task_index, run it with --legacy-flags"
            ) in decision.message, decision.message
    assert not any("may not be distributed" in line for line in decision.say), decision.say


def test_workers_first_roleless_end_names_the_workers():
    monitor, _ = ps_job_monitor(JobFacts(legacy_flags=False))
    monitor.feed(Event("exit", "h0", task="worker0", code=0), 1.0)
    decision = monitor.feed(Event("exit", "h1", task="worker1", code=0), 2.0)
    first, hint = decision.message.splitlines()[:2]
    assert first == (f"worker:0@h0, worker:1@h1 exited 0, but no task ever opened its port: "
                     f"{ROLELESS}.")
    assert hint.startswith("  hint: a ps serves on its port, and none opened one; HyperTF passed "
                           "no legacy flags"), hint
    assert decision.message.endswith("full logs: runs/KEY/")


def test_a_ps_job_whose_ps_listened_succeeds_when_its_workers_exit_0():
    monitor, _ = ps_job_monitor(JobFacts(legacy_flags=True))
    monitor.feed(Event("listening", "h2", task="ps0"), 0.5)
    monitor.feed(Event("exit", "h0", task="worker0", code=0), 1.0)
    decision = monitor.feed(Event("exit", "h1", task="worker1", code=0), 2.0)
    assert decision.verdict is Verdict.SUCCEEDED, decision
    assert not any("opened its port" in line for line in decision.say), decision.say
