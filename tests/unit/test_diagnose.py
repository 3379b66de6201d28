"""Reading a script's source and a task's log: legacy flags and the cause of a death."""

from __future__ import annotations

import pytest

from hypertf.diagnose import cause_lines, reads_legacy_flags, unknown_legacy_flag
from hypertf.monitor import TaskState
from hypertf.scheduler import Placement

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


def test_the_cause_is_the_last_traceback_frame_and_error_not_the_tensor_dump():
    log = ["Epoch 1/3", "Traceback (most recent call last):",
           '  File "/w/train.py", line 40, in <module>', "    model.fit(x, y)",
           '  File "/venv/keras/engine.py", line 9, in fit', "    raise ValueError(msg)",
           "ValueError: Input 0 of layer dense is incompatible: expected shape=(None, 64)",
           *[f"  [[{i} {i} {i}]]" for i in range(50)]]
    assert cause_lines(log) == ['File "/venv/keras/engine.py", line 9, in fit',
                                "ValueError: Input 0 of layer dense is incompatible: "
                                "expected shape=(None, 64)"]
    assert cause_lines(["E1122 grpc error", "FATAL: cannot bind"]) == ["E1122 grpc error",
                                                                      "FATAL: cannot bind"]
    assert cause_lines(["just output"]) == []


def task(exit_code, stop_result=None):
    state = TaskState(Placement("worker", 0, "h1", ()), 20000, exit_code=exit_code)
    state.stop_result = stop_result
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
    (task(None), False, "killed (no exit code recorded)"),
])
def test_every_task_end_is_named(state, lost, end):
    assert state.end(lost) == end
