"""Which tasks must listen, and what the start-up deadline says of those that do not (issue
54, round 5, defects 5, 6 and 13): the Monitor driven by node events and a fake clock."""

from __future__ import annotations

from hypertf.core.monitor import (
    Decision,
    Event,
    Limits,
    Monitor,
    TaskState,
    Verdict,
    must_listen,
    shown_tail,
)
from hypertf.core.scheduler import Placement

LIMITS = Limits(start_timeout=5.0, idle_timeout=300.0, host_silence=1e9)


def workers(count: int) -> dict[str, TaskState]:
    """worker:i on host h<i>, port 20000+i."""
    return {f"worker:{i}": TaskState(Placement("worker", i, f"h{i}", ()), 20000 + i)
            for i in range(count)}


class Run:
    """A Monitor fed at chosen seconds; every event's lines and the first final decision."""

    def __init__(self, tasks: dict[str, TaskState], limits: Limits = LIMITS) -> None:
        self.monitor = Monitor(tasks, limits, now=0.0, logs_hint="runs/KEY/",
                               idle_causes="a task waiting for a peer")
        self.said: list[str] = []
        self.decision = Decision()

    def feed(self, at: float, kind: str, task: str = "", **fields: object) -> Decision:
        host, file = "", ""
        if task:
            host = self.monitor.tasks[task].placement.host
            file = self.monitor.tasks[task].file_name
        decision = self.monitor.feed(Event(kind, host, task=file, **fields), at)  # type: ignore[arg-type]
        self.said += decision.say
        if decision.final and not self.decision.final:
            self.decision = decision
        return decision

    def ticks(self, until: float) -> None:
        for second in range(int(until) + 1):
            if not self.decision.final:
                self.feed(float(second), "tick")


def test_a_single_task_has_no_peer_so_no_listening_deadline():
    """Defect 5: one worker training without a strategy, printing an epoch every 2 s for
    90 s under a 5 s start-up deadline, never opens its port: it runs to its end."""
    run = Run(workers(1))
    for epoch in range(45):
        run.feed(2.0 * epoch + 0.5, "log", "worker:0", line=f"epoch {epoch + 1}/45")
        run.feed(2.0 * epoch + 1.0, "tick")
    assert not run.decision.final, run.decision.message
    done = run.feed(91.0, "exit", "worker:0", code=0)
    assert done.verdict is Verdict.SUCCEEDED
    assert not any("note:" in line for line in run.said)  # one task: a cluster of one


def test_must_listen_is_every_task_of_two_or_more_and_none_of_one():
    one = [t.placement for t in workers(1).values()]
    two = [t.placement for t in workers(2).values()]
    assert must_listen(one) == frozenset()
    assert must_listen(two) == {"worker:0", "worker:1"}


def test_a_single_task_that_listens_is_announced_without_a_count():
    """Not 'all 1 tasks'; the words scripts and tests wait for ('tasks listening') stay."""
    run = Run(workers(1))
    run.feed(1.5, "listening", "worker:0")
    assert "hypertf: all tasks listening after 1.5 s" in run.said


def test_a_single_silent_task_gets_the_idle_warning_without_claiming_it_listens():
    run = Run(workers(1), Limits(start_timeout=5.0, idle_timeout=10.0, host_silence=1e9))
    run.ticks(12)
    assert any("no task has written a line for 10 s" in line for line in run.said), run.said


def test_tasks_that_write_but_never_listen_are_named_as_not_distributed():
    """Defect 5, 2 workers: both train alone, printing; at the deadline each is named with
    its lines and its port, and the advice is the script, not a longer deadline."""
    run = Run(workers(2))
    for i in range(10):
        run.feed(0.5 * i, "log", "worker:0", line=f"step {i}")
        run.feed(0.5 * i, "log", "worker:1", line=f"step {i}")
    run.ticks(6)
    message = run.decision.message
    assert run.decision.verdict is Verdict.RETRYABLE
    assert "start-up deadline: worker:0@h0, worker:1@h1 not listening on their port after 5 s" \
        in message
    assert ("worker:0@h0 has written 10 lines but never opened port 20000: the script may not "
            "be distributed") in message
    assert "worker:1@h1 has written 10 lines but never opened port 20001" in message
    assert "tf.distribute strategy" in message
    assert "raise --start-timeout" not in message


def test_a_multi_task_job_in_which_no_task_listened_ends_with_a_note():
    """Defect 5: a short 2-worker run without a strategy 'succeeded' silently."""
    run = Run(workers(2))
    run.feed(1.0, "log", "worker:0", line="accuracy 0.9")
    run.feed(1.0, "log", "worker:1", line="accuracy 0.9")
    run.feed(2.0, "exit", "worker:0", code=0)
    done = run.feed(2.5, "exit", "worker:1", code=0)
    assert done.verdict is Verdict.SUCCEEDED
    notes = [line for line in run.said if "note:" in line]
    assert len(notes) == 1 and "no task of this job ever opened its port" in notes[0]
    assert "2 tasks ran as separate copies of the script, not as one cluster" in notes[0]


def test_a_job_whose_tasks_listened_ends_without_the_note():
    run = Run(workers(2))
    run.feed(1.0, "listening", "worker:0")
    run.feed(1.0, "listening", "worker:1")
    run.feed(2.0, "exit", "worker:0", code=0)
    assert run.feed(2.5, "exit", "worker:1", code=0).verdict is Verdict.SUCCEEDED
    assert not any("note:" in line for line in run.said)


def test_tasks_blocked_on_a_file_are_named_silent_with_the_file_among_the_causes():
    """Defect 6: two tasks wait for a file a third writes in its own directory. The
    deadline names each silent task, how long it has been silent and its last line, and
    lists a file another task writes (and --workdir) among the causes."""
    run = Run(workers(3), Limits(start_timeout=60.0, idle_timeout=300.0, host_silence=1e9))
    run.feed(1.0, "listening", "worker:0")
    run.feed(1.0, "log", "worker:1", line="waiting for vocab.txt")
    run.feed(2.0, "log", "worker:2", line="loading")
    run.feed(2.0, "log", "worker:2", line="waiting for vocab.txt")
    run.ticks(61)
    message = run.decision.message
    assert run.decision.verdict is Verdict.RETRYABLE
    assert "start-up deadline: worker:1@h1, worker:2@h2 not listening on their port after 60 s" \
        in message
    assert "worker:1@h1 has been silent for 60 s after 1 line (the last: waiting for " \
        "vocab.txt)" in message
    assert "worker:2@h2 has been silent for 59 s after 2 lines (the last: waiting" in message
    assert ("a task waiting for a file another task writes (each task has its own directory; "
            "`--workdir DIR` on shared storage shares one)") in message
    assert run.decision.hosts == {"h1", "h2"}


def test_one_task_not_listening_is_its_port_and_a_silent_one_says_so():
    run = Run(workers(2))
    run.feed(1.0, "listening", "worker:0")
    run.ticks(6)
    message = run.decision.message
    assert "start-up deadline: worker:1@h1 not listening on its port after 5 s" in message
    assert "worker:1@h1 has written nothing in 6 s" in message


TRACEBACK = ["Traceback (most recent call last):",
             '  File "/w/train.py", line 9, in <module>',
             "    main()",
             '  File "/w/train.py", line 7, in main',
             "    raise RuntimeError('vocab.txt is empty')",
             "RuntimeError: vocab.txt is empty"]


def failure_of(lines: list[str]) -> str:
    run = Run(workers(2))
    run.feed(0.5, "listening", "worker:0")
    run.feed(0.5, "listening", "worker:1")
    for line in lines:
        run.feed(1.0, "log", "worker:1", line=line)
    return run.feed(2.0, "exit", "worker:1", code=1).message


def test_the_last_lines_shown_include_the_exception_line_the_cause_quotes():
    """Defect 13: the tail left out the lines the cause had shown, so it stopped before
    the exception."""
    message = failure_of([f"step {i}" for i in range(8)] + TRACEBACK)
    cause, tail = message.split("last lines of its log:")
    assert "RuntimeError: vocab.txt is empty" in cause
    assert tail.splitlines()[1:][-2:] == ["    RuntimeError: vocab.txt is empty",
                                          "  full logs: runs/KEY/"]


def test_the_tail_reaches_back_to_an_exception_followed_by_many_lines():
    noise = [f"shutting down {i}" for i in range(30)]
    lines = [*TRACEBACK, *noise]
    shown = shown_tail(lines, ["RuntimeError: vocab.txt is empty"])
    assert shown[0] == "RuntimeError: vocab.txt is empty"
    assert shown[3] == "... (21 lines left out)" and shown[-1] == "shutting down 29"
    assert len(shown) == 11
    short = shown_tail([*TRACEBACK, *noise[:12]], ["RuntimeError: vocab.txt is empty"])
    assert short[0] == "RuntimeError: vocab.txt is empty" and len(short) == 13


def test_a_coordinator_job_says_its_coordinator_listening_not_every_task():
    """Issue 53: in coordinator mode the other tasks open no port. The line names rank 0 as
    soon as it listens, no deadline waits for the others, and no 'all 2 tasks listening'
    comes when they exit 0."""
    from hypertf.core.rendezvous import Readiness

    run = Run(workers(2), Limits(start_timeout=5.0, idle_timeout=300.0, host_silence=1e9,
                                 readiness=Readiness.COORDINATOR))
    run.feed(1.0, "listening", "worker:0")
    run.feed(1.2, "tick")
    assert [line for line in run.said if "listening" in line] == [
        "hypertf: coordinator worker:0@h0 listening after 1.0 s"]
    run.ticks(30)  # worker:1 never opens its port: no start-up deadline for it
    assert not run.decision.final, run.decision.message
    run.feed(31.0, "exit", "worker:1", code=0)
    run.feed(31.5, "tick")
    assert not any("tasks listening" in line for line in run.said), run.said
