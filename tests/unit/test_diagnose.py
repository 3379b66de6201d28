"""Reading a script's source and a task's log: legacy flags and the cause of a death."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hypertf.core.diagnose import (
    MAX_ERROR_CHARS,
    JobFacts,
    cause_lines,
    hints,
    reads_legacy_flags,
    unknown_legacy_flag,
)
from hypertf.core.monitor import Event, Limits, Monitor, TaskState
from hypertf.core.scheduler import Placement
from hypertf.node import tasknode

# Real logs: each made by running the few lines that raise it with TensorFlow 2.21 and
# Keras 3.15 (tensorflow-cpu, no tensorboard); only the script's path and the venv's were
# renamed (/home/ana/train.py, /opt/hypertf/venv).
LOGS = Path(__file__).with_name("logs")


def log_of(name: str) -> list[str]:
    return (LOGS / f"{name}.log").read_text().splitlines()

READS = [
    'parser.add_argument("--ps_hosts", default="")',
    "flags.DEFINE_string('job_name', None, 'ps or worker')",
    "tf.compat.v1.app.flags.DEFINE_integer('task_index', 0, '')",
    'if arg.startswith("--worker_hosts="):',
    'flags.DEFINE_string(name="ps_hosts", default="", help="")',
]
DOES_NOT = [
    "# the legacy ps_hosts flag is not used here",
    'config = json.loads(os.environ["TF_CONFIG"]); index = config["task"]["index"]',
    "resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()",
    'parser.add_argument("--task_indexes")',
    "it dies with FATAL Flags parsing error: Unknown command line flag 'ps_hosts'",
]


@pytest.mark.parametrize("source", READS)
def test_a_quoted_legacy_flag_means_the_script_reads_it(source):
    assert reads_legacy_flags(source)


@pytest.mark.parametrize("source", DOES_NOT)
def test_prose_tf_config_and_other_flags_do_not_count(source):
    assert not reads_legacy_flags(source)


@pytest.mark.parametrize("line, flag", [
    ("FATAL Flags parsing error: Unknown command line flag 'ps_hosts'", "ps_hosts"),
    ("train.py: error: unrecognized arguments: --ps_hosts=a:1 --worker_hosts=b:2", "ps_hosts"),
    ("error: unrecognized arguments: --steps=3 --job_name=worker", "job_name"),
    ("FATAL Flags parsing error: Unknown command line flag 'batch'", None),
    ("all fine", None),
])
def test_the_refused_legacy_flag_is_found_in_the_log(line, flag):
    assert unknown_legacy_flag(["x", line]) == flag


def test_the_cause_is_the_script_frame_and_the_whole_error_shortened_in_the_middle():
    log = ["Epoch 1/3", "Traceback (most recent call last):",
           '  File "/w/train.py", line 40, in <module>', "    model.fit(x, y)",
           '  File "/venv/lib/python3.11/site-packages/keras/engine.py", line 9, in fit',
           "    raise ValueError(msg)",
           "ValueError: Input 0 of layer dense is incompatible: expected shape=(None, 64)",
           *[f"  [[{i} {i} {i}]]" for i in range(50)], "", "W0000 after the dump"]
    frame, error = cause_lines(log)
    assert frame == 'File "/w/train.py", line 40, in <module>: model.fit(x, y)'
    assert len(error) <= MAX_ERROR_CHARS
    assert error.startswith("ValueError: Input 0 of layer dense is incompatible: expected "
                            "shape=(None, 64) [[0 0 0]]")
    assert " ... " in error and error.endswith("[[49 49 49]]")
    assert cause_lines(["E1122 grpc error", "FATAL: cannot bind"]) == ["E1122 grpc error",
                                                                      "FATAL: cannot bind"]
    assert cause_lines(["just output"]) == []


@pytest.mark.parametrize("name, frame, error", [
    # keras_tensor.py raised it; the script's line 3 is where to look
    ("keras_tensor", 'File "/home/ana/train.py", line 3, in <module>: x = tf.nn.relu(inputs)',
     "ValueError: A KerasTensor cannot be used as input to a TensorFlow function."),
    ("per_replica", 'File "/home/ana/train.py", line 7, in <module>: model.fit(',
     "ValueError: Attempt to convert a value (PerReplica:{ 0: <tf.Tensor: shape=(16, 4)"),
    ("model_checkpoint", 'File "/home/ana/train.py", line 2, in <module>: cb = keras.',
     "ValueError: When using `save_weights_only=True` in `ModelCheckpoint`, the filepath "
     "provided must end in `.weights.h5` (Keras weights format). Received: "
     "filepath=/home/ana/ckpt"),
])
def test_a_real_keras_traceback_names_the_scripts_line_and_the_whole_error(name, frame, error):
    got_frame, got_error = cause_lines(log_of(name))
    assert got_frame.startswith(frame)
    assert got_error.startswith(error) and len(got_error) <= MAX_ERROR_CHARS
    if name == "per_replica":  # the end of the message says what it could not convert
        assert got_error.endswith("PerReplica'>) to a Tensor.")


KERAS3 = {"per_replica": "model.fit under a distribution strategy",
          "reset_states": "reset_state()",
          "keras_tensor": "a TensorFlow op on a Keras input",
          "model_checkpoint": "ModelCheckpoint's file name",
          "ps_fit": "model.fit under ParameterServerStrategy"}


@pytest.mark.parametrize("name", sorted(KERAS3))
def test_keras_3_errors_of_keras_2_scripts_name_the_legacy_keras_fix(name):
    (unknown,) = hints(log_of(name))
    assert KERAS3[name] in unknown
    assert "--env TF_USE_LEGACY_KERAS=1" in unknown
    assert "tf-keras must be on the nodes (hypertf_python_packages_no_deps: " \
        "[tf-keras==<TensorFlow's version>]" in unknown
    (there,) = hints(log_of(name), JobFacts(tf_keras=True))
    assert "--env TF_USE_LEGACY_KERAS=1; tf-keras is on the nodes" in there
    (missing,) = hints(log_of(name), JobFacts(tf_keras=False))
    assert "tf-keras is not on the nodes: add hypertf_python_packages_no_deps" in missing
    (set_already,) = hints(log_of(name), JobFacts(legacy_keras=True, tf_keras=True))
    assert "although TF_USE_LEGACY_KERAS=1 is set" in set_already
    assert "'import tf_keras as keras'" in set_already


@pytest.mark.parametrize("lines, words", [
    (log_of("tensorboard"), "add tensorboard to hypertf_python_packages"),
    (log_of("no_module"), "add tensorboard to hypertf_python_packages"),
    (["Traceback (most recent call last):", '  File "/w/train.py", line 1, in <module>',
      "    import pandas", "ModuleNotFoundError: No module named 'pandas'"],
     "module 'pandas' is not on the nodes: add its package to hypertf_python_packages"),
])
def test_a_missing_module_names_hypertf_python_packages(lines, words):
    assert any(words in hint for hint in hints(lines))


def test_other_errors_get_no_hint():
    assert hints(["ValueError: Input 0 of layer dense is incompatible"]) == []


def test_the_failure_message_carries_the_hint_and_the_scripts_frame():
    state = TaskState(Placement("worker", 0, "h1", ()), 20000)
    monitor = Monitor({"worker:0": state}, Limits(), 0.0, facts=JobFacts(tf_keras=False))
    for line in log_of("per_replica"):
        monitor.feed(Event("log", "h1", "worker0", line), 1.0)
    message = monitor.feed(Event("exit", "h1", "worker0", code=1), 2.0).message
    assert 'Cause:\n    File "/home/ana/train.py", line 7, in <module>: model.fit(' in message
    assert "hint: a Keras 2 script under Keras 3" in message
    assert "tf-keras is not on the nodes" in message


def test_preflight_says_whether_tf_keras_is_in_the_venv(tmp_path):
    """The node's answer the hint relies on (this venv is a node's venv in the lab)."""
    report = tasknode.preflight(str(tmp_path), "")
    assert report["tf_keras"] is (importlib.util.find_spec("tf_keras") is not None)


def test_a_silent_job_without_idle_fail_is_said_again_with_the_time():
    """Without --idle-fail nothing ends a silent job: the warning comes back every
    idle_timeout, with how long it has been, instead of one line and then silence."""
    tasks = {"worker:0": TaskState(Placement("worker", 0, "h1", ()), 20000)}
    monitor = Monitor(tasks, Limits(idle_timeout=10.0, host_silence=1e9), 0.0,
                      idle_causes="a script that only serves")
    monitor.feed(Event("listening", "h1", "worker0"), 1.0)
    said = [line for now in range(2, 45) for line in monitor.feed(Event("tick"), now).say]
    warnings = [line for line in said if "warning" in line]
    assert len(warnings) == 4, said
    assert "none has written a line for 10 s: a script that only serves" in warnings[0]
    assert "still no line from any task after 21 s" in warnings[1]
    assert "after 31 s" in warnings[2] and "after 41 s" in warnings[3]
    monitor.feed(Event("log", "h1", "worker0", line="step 1"), 45)  # a new silence
    said = [line for now in range(46, 57) for line in monitor.feed(Event("tick"), now).say]
    assert len(said) == 1 and "none has written a line for 10 s" in said[0]


def task(exit_code, stop_result=None):
    state = TaskState(Placement("worker", 0, "h1", ()), 20000, exit_code=exit_code)
    state.stop_result = stop_result
    return state


def ended(exit_code, stop_result=None):
    state = task(exit_code, stop_result)
    state.ended = 5.0
    return state


@pytest.mark.parametrize("state, lost, end", [
    (task(0), False, "exit 0"),
    (task(3), False, "exit 3"),
    (task(143, "stopped"), False, "stopped by HyperTF (SIGTERM)"),
    (task(None, "stopped"), False, "stopped by HyperTF (SIGTERM)"),
    (task(None, "killed"), False, "stopped by HyperTF (SIGKILL after the grace)"),
    (task(None, "survived SIGKILL"), False, "survived SIGKILL (its GPUs stay draining)"),
    (task(139), False, "died of signal 11 (SIGSEGV)"),
    (task(143), False, "died of signal 15 (SIGTERM)"),
    (task(None), True, "lost with its host"),
    (task(None), False, "end not seen (its host's watcher did not report it)"),
    (ended(None), False, "killed with its wrapper (no exit code: a SIGKILL not sent by "
                         "HyperTF)"),
    (ended(1, "not running"), False, "exit 1"),
])
def test_every_task_end_is_named(state, lost, end):
    assert state.end(lost) == end


# -- issue 39: items 4, 5 and 6 (real logs, TensorFlow 2.21 / Keras 3.15) --------------------
def test_a_missing_submodule_is_named_whole_not_by_its_namespace():
    """'google' is protobuf's namespace and is installed; google.cloud is what is missing."""
    (hint,) = hints(log_of("google_cloud"))
    assert "module 'google.cloud' is not on the nodes" in hint


def test_keras_layers_experimental_names_the_legacy_keras_fix():
    """Google Cloud's image-classification sample: tf.keras.layers.experimental is gone in
    Keras 3 and is back with TF_USE_LEGACY_KERAS=1 (tf-keras)."""
    (hint,) = hints(log_of("layers_experimental"))
    assert "--env TF_USE_LEGACY_KERAS=1" in hint
    assert "layers.experimental" in hint


def test_the_cause_keeps_the_end_of_an_error_across_the_blank_lines_of_a_tensor_dump():
    """numpy prints a 3-d tensor with a blank line between its slices: the message goes on."""
    _, error = cause_lines(log_of("per_replica_3d"))
    assert error.startswith("ValueError: Attempt to convert a value (PerReplica:{")
    assert error.endswith("PerReplica'>) to a Tensor."), error
    assert len(error) <= MAX_ERROR_CHARS


def test_a_blank_line_after_a_whole_message_still_ends_it():
    log = ["Traceback (most recent call last):", '  File "/w/train.py", line 1, in <module>',
           "    f(x)", "ValueError: shape (2, 3) is wrong", "", "  indented noise (after"]
    assert cause_lines(log)[-1] == "ValueError: shape (2, 3) is wrong"
