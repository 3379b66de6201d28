"""hypertf.core.protocol: every launcher<->node message as a record, its wire form the one
nodes have always sent, and a version the launcher checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hypertf.core import protocol
from hypertf.core.errors import RemoteError
from hypertf.core.monitor import Event, EventKind
from hypertf.core.protocol import (
    PROTOCOL_VERSION,
    UNVERSIONED,
    NodeEvent,
    PreflightAnswer,
    ProtocolError,
    RunEnd,
    StartAnswer,
    StartRequest,
    StopResult,
    TaskStart,
    VersionMismatch,
)
from hypertf.node import tasknode

REPO = Path(__file__).resolve().parents[2]

END = RunEnd({"worker0": StopResult.NOT_RUNNING}, {"worker0": "bye\n"}, None, {})
EVENTS = [
    (protocol.log_line("worker0", "hello"), {"e": "log", "task": "worker0", "line": "hello"}),
    (protocol.listening("ps0"), {"e": "listening", "task": "ps0"}),
    (protocol.exited("worker0", 3, False),
     {"e": "exit", "task": "worker0", "code": 3, "killed": False}),
    (protocol.exited("worker1", None, True),
     {"e": "exit", "task": "worker1", "code": None, "killed": True}),
    (protocol.BEAT, {"e": "beat"}),
    (protocol.done(), {"e": "done"}),
    (protocol.done(END), {"e": "done", "ended": {
        "stopped": {"worker0": "not running"}, "logs": {"worker0": "bye\n"}, "metrics": None,
        "offload": {}}}),
]


@pytest.mark.parametrize(("event", "wire"), EVENTS)
def test_each_event_has_the_wire_form_nodes_always_sent_and_reads_back(
        event: NodeEvent, wire: dict) -> None:
    assert event.wire() == wire
    assert protocol.parse_event(json.loads(json.dumps(wire)), strict=True) == event


@pytest.mark.parametrize("payload", [
    {"e": "telemetry", "task": "worker0"},  # a kind of another version
    {"task": "worker0"},  # no kind
    {"e": "exit", "task": "worker0", "code": "3", "killed": False},  # a code as text
    {"e": "log", "task": 7, "line": "x"},
    {"e": "done", "ended": {"stopped": {"worker0": "vanished"}, "logs": {}}},
    "a banner line", ["e", "log"],
])
def test_an_unreadable_event_raises_when_strict_and_is_noise_otherwise(payload: object) -> None:
    with pytest.raises(ProtocolError, match="node protocol 2"):
        protocol.parse_event(payload, strict=True)
    assert protocol.parse_event(payload, strict=False) is None
    assert Event.from_node("h1", payload).kind is EventKind.NOISE
    with pytest.raises(ProtocolError):
        Event.from_node("h1", payload, strict=True)


def test_the_launchers_sink_is_strict_with_protocol_strict_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's watch (nodeclient) reads HYPERTF_PROTOCOL_STRICT: the lab tests' one
    refuses a line it cannot read, anyone else's passes it on as noise."""
    import queue

    from hypertf.config import environment
    from hypertf.launch.nodeclient import _LineSink

    monkeypatch.delenv(environment.PROTOCOL_STRICT.name, raising=False)
    events: queue.Queue[Event] = queue.Queue()
    _LineSink("h1", events).write('{"e": "telemetry"}\n')
    assert events.get_nowait().kind is EventKind.NOISE
    monkeypatch.setenv(environment.PROTOCOL_STRICT.name, "1")  # the lab tests' launchers
    with pytest.raises(ProtocolError):
        _LineSink("h1", events).write('{"e": "telemetry"}\n')


def test_the_launchers_event_carries_the_nodes_and_refuses_an_unknown_kind() -> None:
    event = Event.from_node("h1", EVENTS[-1][1], strict=True)
    assert (event.kind, event.host, event.ended) == (EventKind.DONE, "h1", END)
    assert Event("exit", "h1", task="worker0", code=3).kind is EventKind.EXIT
    with pytest.raises(ValueError, match="telemetry"):
        Event("telemetry")  # type: ignore[arg-type]


def test_start_request_and_answers_round_trip() -> None:
    request = StartRequest("/srv/runs/k", "/opt/venv", (
        TaskStart("worker0", 2222, "/srv/runs/k/worker0", {"A": "1"}, ("python", "t.py")),),
        ("/srv/ckpt",), "t.py", 1234)
    assert StartRequest.parse(json.loads(json.dumps(request.wire()))) == request
    assert "archive" not in request._replace(archive=None).wire()
    # an older launcher's request (no make_dirs, script or archive) still reads
    old = {"run_dir": "/r", "venv": "/v", "tasks": [
        {"name": "worker0", "port": 1, "cwd": "/", "argv": ["x"], "env": {}}]}
    assert StartRequest.parse(old).make_dirs == () and StartRequest.parse(old).script == ""
    for answer, wire in ((StartAnswer(started={"worker0": 42}), {"started": {"worker0": 42}}),
                         (StartAnswer(busy=(2222,)), {"busy": [2222]}),
                         (StartAnswer(problems=("no script",)), {"problems": ["no script"]})):
        assert answer.wire() == wire
        assert StartAnswer.parse(wire) == answer
    with pytest.raises(ProtocolError):
        StartAnswer.parse({"started": {"worker0": "42"}})


def test_the_node_reports_its_protocol_version_and_an_old_node_reads_as_unversioned(
        tmp_path: Path) -> None:
    answer = PreflightAnswer.parse(tasknode.preflight(str(tmp_path), ""))
    assert answer.protocol == PROTOCOL_VERSION and answer.problems == ()
    old = {"python": "/v/bin/python", "problems": [], "hostname": "h1", "legacy_flags": False}
    assert PreflightAnswer.parse(old).protocol == UNVERSIONED


def test_a_version_mismatch_is_one_line_naming_both_versions_and_the_fix() -> None:
    err = VersionMismatch({"h2": 3, "h1": 1, "h3": 3})
    assert isinstance(err, RemoteError) and err.exit_code == 6
    assert "\n" not in str(err)
    assert str(err).startswith("HyperTF versions differ: h1 on node protocol 1; h2, h3 on "
                               f"node protocol 3, this launcher on protocol {PROTOCOL_VERSION}")
    assert "invoke cluster.setup" in str(err)


def test_stop_results_are_read_as_results() -> None:
    assert protocol.parse_stopped({"worker0": "survived SIGKILL"}) == {
        "worker0": StopResult.SURVIVED}
    with pytest.raises(ProtocolError):
        protocol.parse_stopped({"worker0": "gone fishing"})


def modules_an_import_loads(module: str) -> set[str]:
    """The modules a fresh Python loads to import ``module`` (those it had already aside)."""
    code = ("import json, sys; before = set(sys.modules); import " + module + "; "
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=30, check=True)
    return set(json.loads(out.stdout))


def test_start_stays_within_the_verbs_import_budget() -> None:
    """'tasknode start' runs on every node of every job: importing the verb loads what its
    module's budget states (tasknode.IMPORT_BUDGET of HyperTF, the standard library's light
    modules) and nothing of tasknode.NOT_IMPORTED: no dataclasses, for one (the protocol's
    records are NamedTuples because dataclasses imports inspect, ~8 ms)."""
    loaded = modules_an_import_loads("hypertf.node.tasknode")
    ours = {name for name in loaded if name.partition(".")[0] == "hypertf"}
    assert ours - tasknode.IMPORT_BUDGET == set(), "past the budget stated in tasknode.py"
    assert loaded & tasknode.NOT_IMPORTED == set()
    assert {name for name in loaded - ours
            if name.partition(".")[0] not in sys.stdlib_module_names} == set()
    assert "dataclasses" in tasknode.NOT_IMPORTED  # the budget keeps the protocol's promise


def test_the_budget_names_what_the_verb_needs() -> None:
    """A budget naming modules the verb no longer loads would hide the next one it adds."""
    assert modules_an_import_loads("hypertf.node.tasknode") >= tasknode.IMPORT_BUDGET
