"""The nodes of a job as an attempt uses them: start and watch, stop, copy logs back.

``Fleet`` is what ``Attempt`` (hypertf.launch.attempt) is handed; ``SshFleet`` is the real
one, every host in parallel over the job's SSH sessions (``Cluster.each``) with one
``NodeClient`` per host. What the nodes report after a start (log lines, listening,
exits, a run ended) arrives only as events on the attempt's queue; what a call returns
comes back as its result, per host. So the attempt's state is only ever changed by the
attempt's own thread, and a test drives a whole attempt with an in-memory fleet
(tests/unit/test_attempt.py).
"""

from __future__ import annotations

import queue
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from hypertf.core.monitor import Event
from hypertf.core.protocol import RunEnd, TaskStart
from hypertf.core.rundir import RunDir
from hypertf.core.timeline import Timeline
from hypertf.launch.nodeclient import NodeClient
from hypertf.launch.remote import Cluster, GroupResult, Session


class HostStart(NamedTuple):
    """What one host starts: its tasks in ``run``, directories to make first
    (checkpoints), the ``--sync`` directory to upload, the script that must be there."""

    run: RunDir
    tasks: tuple[TaskStart, ...]
    make_dirs: tuple[str, ...] = ()
    sync_dir: str | None = None
    script: str = ""


class Fleet(Protocol):
    """The job's nodes: each call covers many hosts at once and answers per host (a value,
    or the exception that host raised: ``PortsBusy``, ``RemoteError``...)."""

    def start(self, starts: Mapping[str, HostStart],
              events: queue.Queue[Event]) -> GroupResult[dict[str, int]]:
        """Start every host's tasks and watch them: their events go to ``events``, each
        host's ending with ``closed`` or ``lost``. Per host, each task's PID."""
        ...

    def stop(self, runs: Mapping[str, RunDir], grace: float,
             preempt_deadline: float | None = None) -> GroupResult[RunEnd]:
        """TERM, then KILL after ``grace``, every task of each host's run; per host what
        the stop did, with the logs (those that fit), the metrics and the offload counts.
        ``preempt_deadline``: a preemption (the nodes write HYPERTF_PREEMPT_FILE first)."""
        ...

    def fetch_logs(self, runs: Mapping[str, RunDir], tasks: Mapping[str, Sequence[str]],
                   local: RunDir, have: Mapping[str, Mapping[str, str]]) -> None:
        """Each host's task logs into ``local``; those in ``have[host]`` without asking."""
        ...

    def fetch_metrics(self, host: str, run: RunDir, local: RunDir) -> None:
        """The reporting task's metrics file, if it wrote one, into ``local``."""
        ...


class SshFleet:
    """The real nodes: the job's SSH sessions, every host at once."""

    def __init__(self, cluster: Cluster, timeline: Timeline) -> None:
        self.cluster = cluster
        self.timeline = timeline

    def start(self, starts: Mapping[str, HostStart],
              events: queue.Queue[Event]) -> GroupResult[dict[str, int]]:
        def launch(session: Session) -> dict[str, int]:
            """Upload (--sync), start and watch in one command: one round trip per host,
            whose channel then carries the tasks' events (logs, listening, exits)."""
            host = session.node.name
            start = starts[host]
            with self.timeline.phase("start", host):
                return NodeClient(session).start_watching(
                    start.run, start.tasks, events, make_dirs=start.make_dirs,
                    sync_dir=start.sync_dir, script=start.script)

        return self.cluster.each(launch, list(starts))

    def stop(self, runs: Mapping[str, RunDir], grace: float,
             preempt_deadline: float | None = None) -> GroupResult[RunEnd]:
        return self.cluster.each(lambda s: NodeClient(s).stop_with_logs(
            runs[s.node.name], grace, preempt_deadline), list(runs))

    def fetch_logs(self, runs: Mapping[str, RunDir], tasks: Mapping[str, Sequence[str]],
                   local: RunDir, have: Mapping[str, Mapping[str, str]]) -> None:
        self.cluster.each(lambda s: NodeClient(s).fetch_logs(
            runs[s.node.name], tasks[s.node.name], local, have.get(s.node.name)), sorted(runs))

    def fetch_metrics(self, host: str, run: RunDir, local: RunDir) -> None:
        self.cluster.each(lambda s: NodeClient(s).fetch_metrics(run, local), [host])
