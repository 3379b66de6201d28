"""An attempt's one input: the events the other threads put on its queue (each node's
watcher: listening, log lines, exits, a run's end; kazoo's watch on the lease: its end),
and what the attempt keeps of them beside its Monitor's rules.

Only the attempt's thread reads the queue and changes what is kept here, so nothing needs
a lock: the other threads only ``put``.
"""

from __future__ import annotations

import queue
import time
from collections import deque
from collections.abc import Iterable, Mapping

from hypertf.core.monitor import Event, EventKind, TaskState
from hypertf.core.protocol import RunEnd, StopResult

__all__ = ["ENDED_WAIT_S", "KILLED_WAIT_S", "LATE_EXIT_WAIT_S", "Inbox"]

LATE_EXIT_WAIT_S = 5.0  # after the stop: how long the watchers may take to report the ends
ENDED_WAIT_S = 0.5  # before the stop: how long a finished host's watcher may take to end it
KILLED_WAIT_S = 1.0  # a task killed by a signal: how long a lease drop may take to arrive


class Inbox:
    """The attempt's event queue; how each node ended its run (``ended``), the hosts whose
    watcher still runs (``watched``, until closed or lost), whether the lease was dropped."""

    def __init__(self) -> None:
        self.events: queue.Queue[Event] = queue.Queue()
        self._pending: deque[Event] = deque()  # taken from the queue early, handled next
        self.lease_dropped = False
        self.watched: set[str] = set()
        # per host: what the stop answered (logs, metrics, offload counts), or the watcher's
        # 'done' when the node ended the run itself ("stopped": what a stop would have said)
        self.ended: dict[str, RunEnd] = {}

    def next(self, timeout: float) -> Event | None:
        """The next event (one taken early first), or None after ``timeout``."""
        if self._pending:
            return self._pending.popleft()
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def absorb(self, event: Event, exits: Mapping[str, TaskState] | None = None) -> None:
        """What the attempt keeps of any event: how a node ended its run, whose watcher is
        gone, the lease's end; with ``exits`` (the attempt's tasks, once the Monitor has
        decided) the exit codes that come after the decision."""
        if event.kind is EventKind.DONE and event.ended is not None:
            self.ended[event.host] = event.ended
        elif event.kind in (EventKind.CLOSED, EventKind.LOST):
            self.watched.discard(event.host)
        elif event.kind is EventKind.LEASE_DROPPED:
            self.lease_dropped = True
        elif exits is not None and event.kind is EventKind.EXIT:
            task = next((t for t in exits.values() if t.placement.host == event.host
                         and t.file_name == event.task), None)
            if task is not None and task.ended is None:
                task.ended, task.exit_code, task.killed = (time.monotonic(), event.code,
                                                           event.killed)

    def await_lease_drop(self, wait_s: float = KILLED_WAIT_S) -> None:
        """A task killed by a signal: was it an agent stopping it after 'hypertf kill'?
        Events that come meanwhile are kept, in order, for the watch loop."""
        deadline = time.monotonic() + wait_s
        while not self.lease_dropped and (left := deadline - time.monotonic()) > 0:
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                return
            self._pending.append(event)
            if event.kind is EventKind.LEASE_DROPPED:
                self.lease_dropped = True

    def ends_of(self, finished: Iterable[str], tasks: Mapping[str, TaskState],
                wait_s: float = ENDED_WAIT_S) -> dict[str, dict[str, StopResult]]:
        """Hosts whose every task exited by itself (``finished``): their watcher ends the
        run there and says so right after the last exit. Waits briefly for that word; the
        stop results of the hosts that said it."""
        finished = set(finished)
        deadline = time.monotonic() + wait_s
        while any(h not in self.ended for h in finished) and \
                (left := deadline - time.monotonic()) > 0:
            event = self.next(timeout=left)
            if event is not None:
                self.absorb(event, exits=tasks)
        return {host: self.ended[host].stopped for host in finished if host in self.ended}

    def late_exits(self, tasks: Mapping[str, TaskState], lost_hosts: set[str],
                   wait_s: float = LATE_EXIT_WAIT_S) -> None:
        """Record the exit codes the watchers report after the Monitor decided. A job ends
        at its first failure; its peers die of it a second later (a mirrored worker's
        'Socket closed') or are stopped now, and their ends arrive after the decision.
        Without this, a task that exited 1 with its own traceback read as having no exit
        code at all. Waits until every watched host's tasks have ended, its watcher
        closed, or ``wait_s``."""
        def waiting() -> bool:
            return any(t.ended is None and t.placement.host in self.watched - lost_hosts
                       for t in tasks.values())

        deadline = time.monotonic() + wait_s
        while waiting() and time.monotonic() < deadline:
            event = self.next(timeout=0.1)
            if event is not None:
                self.absorb(event, exits=tasks)
