"""The Monitor's rules as a table: each row is a job shape, what its nodes report at which
second, and the decision. The behaviours come from docs/tensorflow.md (what
TensorFlow does when launched as separate processes) and are named in each row."""

from __future__ import annotations

import pytest

from hypertf.core.monitor import Decision, Event, Limits, Monitor, TaskState, Verdict
from hypertf.core.scheduler import Placement
from hypertf.core.spec import slots_for

LIMITS = Limits(start_timeout=60.0, timeout=None, idle_timeout=300.0, idle_fail=False,
                host_silence=20.0)


def tasks_for(ps: int = 0, workers: int = 2, chief: bool = False) -> dict[str, TaskState]:
    """Task i on host h<i>, port 20000+i."""
    slots = slots_for(ps, workers, chief, 0, 0)
    return {slot.name: TaskState(Placement(slot.role, slot.index, f"h{i}", ()), 20000 + i)
            for i, slot in enumerate(slots)}


def host_of(tasks: dict[str, TaskState], name: str) -> str:
    return tasks[name].placement.host


def file_of(name: str) -> str:
    role, index = name.split(":")
    return f"{role}{index}"


def listening(*names: str, at: float = 1.0) -> list[tuple[float, str, dict]]:
    return [(at, "listening", {"task": n}) for n in names]


def run(tasks: dict[str, TaskState], script: list[tuple[float, str, dict]],
        limits: Limits = LIMITS, until: float | None = None) -> tuple[Decision, Monitor]:
    """Feed the script (time, kind, fields; ``task`` as 'worker:0'); with ``until``, every
    host's watcher also beats once a second up to then (as ``tasknode watch`` does), except
    a host after a ``silence`` row. Stop at the first final decision."""
    monitor = Monitor(tasks, limits, now=0.0, logs_hint="runs/KEY/",
                      idle_causes="a task waiting for a peer")
    hosts = sorted({t.placement.host for t in tasks.values()})
    feed = [*script]
    if until is not None:
        feed += [(float(t), "beat", {"host": h}) for t in range(int(until) + 1) for h in hosts]
    feed.sort(key=lambda item: item[0])
    decision = Decision()
    said: list[str] = []
    silent: set[str] = set()
    for at, kind, fields in feed:
        fields = dict(fields)
        name = fields.pop("task", "")
        host = fields.pop("host", None) or (host_of(tasks, name) if name else "")
        if kind == "silence":
            silent.add(host)
            continue
        if kind == "beat" and host in silent:
            continue
        event = Event(kind, host, task=file_of(name) if name else "", **fields)
        decision = monitor.feed(event, at)
        said += decision.say
        if decision.final:
            break
    return Decision(decision.verdict, decision.message, tuple(said)), monitor


MIRRORED = dict(workers=2)
PS_CHIEF = dict(ps=1, workers=2, chief=True)
LEGACY = dict(ps=1, workers=2)
ALL_MIRRORED = listening("worker:0", "worker:1")
ALL_PS = listening("chief:0", "worker:0", "worker:1", "ps:0")


def exit_(name: str, at: float, code: int = 0, killed: bool = False):
    return (at, "exit", {"task": name, "code": code, "killed": killed})


def log(name: str, at: float, line: str):
    return (at, "log", {"task": name, "line": line})


TABLE = [
    # -- finishers and servers ----------------------------------------------------------------
    ("mirrored: every task is a finisher; all exit 0 -> succeeded",
     MIRRORED, [*ALL_MIRRORED, exit_("worker:0", 5), exit_("worker:1", 5.5)],
     None, Verdict.SUCCEEDED, "all finishers exited 0"),
    ("mirrored: one finisher exited 0, the other still runs -> running",
     MIRRORED, [*ALL_MIRRORED, exit_("worker:0", 5)], 10, Verdict.RUNNING, ""),
    ("mirrored: a peer dies, the others fail within ~1 s -> failed, naming the first",
     MIRRORED, [*ALL_MIRRORED, log("worker:1", 4, "Traceback (most recent call last):"),
                log("worker:1", 4, "ValueError: bad shape"), exit_("worker:1", 4.1, 1),
                exit_("worker:0", 5, 1)],
     None, Verdict.FAILED, "task worker:1@h1 failed: exit 1. Cause:\n    ValueError: bad shape"),
    ("mirrored: a finisher exits 0 before its port was seen: it started, it finished",
     MIRRORED, [(1, "listening", {"task": "worker:1"}), exit_("worker:0", 2),
                exit_("worker:1", 3)], None, Verdict.SUCCEEDED, ""),
    ("parameter server: the chief is the finisher; chief exit 0 -> succeeded, servers stopped",
     PS_CHIEF, [*ALL_PS, exit_("chief:0", 6)], None, Verdict.SUCCEEDED, ""),
    ("parameter server: a dying PS worker is tolerated by the chief -> warning, running",
     PS_CHIEF, [*ALL_PS, exit_("worker:1", 4, 1)], 10, Verdict.RUNNING,
     "worker:1@h2 ended; the job goes on without it"),
    ("parameter server: the ps dies (the chief would fail ~11 s later) -> failed at once",
     PS_CHIEF, [*ALL_PS, exit_("ps:0", 4, 1)], None, Verdict.FAILED,
     "parameter server ended (exit 1)"),
    ("parameter server: the chief fails -> failed",
     PS_CHIEF, [*ALL_PS, exit_("chief:0", 6, 2)], None, Verdict.FAILED,
     "task chief:0@h0 failed: exit 2"),
    ("legacy: workers finish, ps serve; every worker exit 0 -> succeeded",
     LEGACY, [*listening("worker:0", "worker:1", "ps:0"), exit_("worker:0", 8),
              exit_("worker:1", 9)], None, Verdict.SUCCEEDED, ""),
    ("legacy: one worker done, the other running, ps serving -> running",
     LEGACY, [*listening("worker:0", "worker:1", "ps:0"), exit_("worker:0", 8)], 20,
     Verdict.RUNNING, ""),
    ("legacy: the ps ends -> failed",
     LEGACY, [*listening("worker:0", "worker:1", "ps:0"), exit_("ps:0", 8, 0)], None,
     Verdict.FAILED, "parameter server ended (exit 0)"),
    # -- signals --------------------------------------------------------------------------------
    ("a finisher killed by a signal nobody here sent (OOM killer) -> retryable",
     MIRRORED, [*ALL_MIRRORED, exit_("worker:0", 5, 137, killed=True)], None,
     Verdict.RETRYABLE, "task worker:0@h0 failed: killed"),
    ("a finisher that died of a signal its wrapper saw (exit 139, SIGSEGV) -> retryable",
     MIRRORED, [*ALL_MIRRORED, exit_("worker:0", 5, 139)], None, Verdict.RETRYABLE,
     "task worker:0@h0 failed: exit 139"),
    ("a finisher's process gone without an exit code (SIGKILLed wrapper) -> retryable",
     MIRRORED, [*ALL_MIRRORED, exit_("worker:0", 5, None, killed=True)], None,
     Verdict.RETRYABLE, "failed: killed"),
    ("the lease dropped ('hypertf kill') -> failed, not retried",
     MIRRORED, [*ALL_MIRRORED, (5, "lease-dropped", {"why": "job K was killed"})], None,
     Verdict.FAILED, "job K was killed"),
    ("the ZooKeeper session lost -> retryable",
     MIRRORED, [*ALL_MIRRORED, (5, "session-lost", {})], None, Verdict.RETRYABLE,
     "lost the ZooKeeper session"),
    # -- ports ----------------------------------------------------------------------------------
    ("a taken port fails a task 1-3 s after start, before all listen -> port clash",
     MIRRORED, [(1, "listening", {"task": "worker:0"}),
                log("worker:1", 2, "E Failed to add port to server"),
                log("worker:1", 2, "UnknownError: Could not start gRPC server"),
                exit_("worker:1", 2.5, 1)], None, Verdict.PORT_CLASH,
     "worker:1@h1 could not bind port 20001"),
    ("the same words after every task listened are the script's own failure",
     MIRRORED, [*ALL_MIRRORED, log("worker:1", 3, "OSError: Address already in use"),
                exit_("worker:1", 3.5, 1)], None, Verdict.FAILED, "failed: exit 1"),
    # -- hangs: deadlines ------------------------------------------------------------------------
    ("a mirrored worker whose peer never starts waits forever -> start-up deadline",
     MIRRORED, [(1, "listening", {"task": "worker:0"})], 70, Verdict.RETRYABLE,
     "start-up deadline: worker:1@h1 not listening on its port after 60 s"),
    ("every port listening in time: no start-up deadline",
     MIRRORED, [*listening("worker:0", "worker:1", at=59)], 70, Verdict.RUNNING,
     "all 2 tasks listening after 59.0 s"),
    ("a whole-job deadline",
     MIRRORED, [*ALL_MIRRORED], 40, Verdict.FAILED, "job timeout: still running after 30 s"),
    ("idle: every task listens, none writes for idle_timeout -> a warning, still running",
     MIRRORED, [*ALL_MIRRORED, log("worker:0", 2, "step 1")], 400, Verdict.RUNNING,
     "every task listens and none has written a line for 300 s: a task waiting for a peer"),
    ("idle with idle_fail -> failed",
     MIRRORED, [*ALL_MIRRORED], 400, Verdict.FAILED, "idle: every task listens"),
    # -- hosts ----------------------------------------------------------------------------------
    ("a host whose watcher connection broke -> retryable, host lost",
     MIRRORED, [*ALL_MIRRORED, (5, "lost", {"host": "h1", "why": "Socket closed"})], None,
     Verdict.RETRYABLE, "lost contact with h1: Socket closed"),
    ("a host silent longer than host_silence while its tasks run -> retryable, host lost",
     MIRRORED, [*ALL_MIRRORED, (5, "silence", {"host": "h1"})], 40, Verdict.RETRYABLE,
     "host h1 stopped answering (21 s without news)"),
    ("a silent host whose tasks all ended is not lost",
     PS_CHIEF, [*ALL_PS, exit_("worker:1", 2, 0), (3, "silence", {"host": "h2"})], 40,
     Verdict.RUNNING, ""),
    ("noise and unknown tasks change nothing",
     MIRRORED, [*ALL_MIRRORED, (2, "noise", {"host": "h0", "line": "not json"}),
                (2, "exit", {"host": "h9", "task": "worker:7", "code": 1})], 10,
     Verdict.RUNNING, ""),
]
LIMITS_BY_ROW = {
    "a whole-job deadline": Limits(timeout=30.0),
    "idle with idle_fail -> failed": Limits(idle_timeout=300.0, idle_fail=True),
}


@pytest.mark.parametrize("title, shape, script, until, verdict, words", TABLE,
                         ids=[row[0] for row in TABLE])
def test_monitor_table(title, shape, script, until, verdict, words):
    decision, _ = run(tasks_for(**shape), script, LIMITS_BY_ROW.get(title, LIMITS), until)
    assert decision.verdict is verdict, decision
    text = decision.message if decision.final else "\n".join(decision.say)
    assert words in text, text


def test_every_verdict_is_reached_by_the_table():
    assert {row[4] for row in TABLE} == set(Verdict)


def test_tasks_record_times_codes_and_tails_from_the_injected_clock():
    tasks = tasks_for(**MIRRORED)
    script = [*listening("worker:0", "worker:1", at=1.5),
              *(log("worker:0", 2, f"line {i}") for i in range(250)),
              exit_("worker:0", 7), exit_("worker:1", 9)]
    decision, monitor = run(tasks, script)
    first = monitor.tasks["worker:0"]
    assert (first.started, first.ended, first.exit_code) == (1.5, 7, 0)
    assert len(first.tail) == 200 and first.tail[-1] == "line 249"  # the last TAIL_LINES
    assert "[worker:0@h0] line 0" in decision.say
    assert decision.say[-1] == "hypertf: worker:1@h1 ended (exit 0)"
    assert monitor.lost_hosts == set()


def test_a_lost_host_is_remembered_for_the_stop():
    _, monitor = run(tasks_for(**MIRRORED),
                     [*ALL_MIRRORED, (5, "lost", {"host": "h1", "why": "gone"})])
    assert monitor.lost_hosts == {"h1"}


def test_a_refused_legacy_flag_is_named_with_its_fix():
    script = [log("worker:0", 1, "FATAL Flags parsing error: Unknown command line flag "
                  "'ps_hosts'"), exit_("worker:0", 1.2, 1)]
    decision, _ = run(tasks_for(workers=1), script)
    assert decision.verdict is Verdict.FAILED
    assert "the script does not accept --ps_hosts" in decision.message
    assert "--no-legacy-flags" in decision.message
    assert decision.message.endswith("full logs: runs/KEY/")


def test_event_from_a_node_line():
    event = Event.from_node("h1", {"e": "exit", "task": "worker0", "code": 3, "killed": False})
    assert event == Event("exit", "h1", task="worker0", code=3)
    assert Event.from_node("h1", {}).kind == "noise"
