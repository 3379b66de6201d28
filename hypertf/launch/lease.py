"""What an attempt writes to and hears from ZooKeeper: its record's 'starting', its
lease's end (``hypertf kill`` or ``cancel``, or the session lost), and its release.

``JobLease`` is what ``Attempt`` is handed; ``StoreLease`` is the real one. The lease's
end is heard on kazoo's thread and becomes a ``lease-dropped`` (or ``session-lost``) event
on the attempt's queue: the attempt learns it the way it learns everything else.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from kazoo.client import KazooState
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from hypertf.core.errors import StoreError
from hypertf.core.jobrecord import JobState
from hypertf.core.monitor import Event, EventKind
from hypertf.core.records import plain_text
from hypertf.store import Store

__all__ = ["JobLease", "StoreLease"]


class JobLease(Protocol):
    """An attempt's side of its job record and lease."""

    def starting(self, task_key: str) -> None:
        """The record says the tasks are starting."""
        ...

    def watch(self, task_key: str, events: queue.Queue[Event]) -> Callable[[], None]:
        """From now on, the lease's end puts a ``lease-dropped`` event on ``events`` (the
        session's loss a ``session-lost``); the function returned ends the watch (the
        attempt's own release drops the lease)."""
        ...

    def ended_by(self, task_key: str) -> str:
        """Who dropped the lease and with which command, as the record says ("hypertf
        cancel by user.bob from ws1"); "hypertf kill or cancel" when it does not say."""
        ...

    def release(self, task_key: str, result: JobState, summary: Mapping[str, Any],
                stopped_on: Sequence[str] | None,
                meanwhile: Callable[[], object] | None = None) -> None:
        """The GPUs back (those on ``stopped_on``; None: every host, nothing ran), the
        record ended with ``result`` and ``summary``; a store out of reach is said, not
        raised: the lease ends with the session anyway. ``meanwhile`` (the logs) runs
        once the record and lease are written, while the keeper frees the GPUs, or after
        a failure to write them: always once."""
        ...


class StoreLease:
    """The real lease: the job's records in ZooKeeper."""

    def __init__(self, store: Store, say: Callable[[str], None],
                 connect_wait_s: float = 15.0) -> None:
        self.store = store
        self.say = say
        self.connect_wait_s = connect_wait_s

    def starting(self, task_key: str) -> None:
        self.store.jobs.update(task_key, state=JobState.STARTING)

    def watch(self, task_key: str, events: queue.Queue[Event]) -> Callable[[], None]:
        over = threading.Event()
        client = self.store.client

        def on_lease(data: bytes | None, _stat: object) -> bool:
            if data is None and not over.is_set():
                events.put(Event(EventKind.LEASE_DROPPED))
            return data is not None and not over.is_set()  # False ends the watch

        def on_state(state: str) -> None:  # kazoo's thread: never blocks
            if state == KazooState.LOST and not over.is_set():
                events.put(Event(EventKind.SESSION_LOST))

        def on_notice(data: bytes | None, _stat: object) -> bool:
            """The keeper's preemption notice for this attempt (only it writes there)."""
            if data is not None and not over.is_set():
                events.put(Event(EventKind.PREEMPTED, why=data.decode(errors="replace")))
                return False  # one notice per attempt
            return not over.is_set()

        client.add_listener(on_state)
        client.DataWatch(self.store.layout.lease(task_key), on_lease)
        client.DataWatch(self.store.layout.preempt(task_key), on_notice)

        def end() -> None:
            over.set()
            client.remove_listener(on_state)

        return end

    def ended_by(self, task_key: str) -> str:
        try:
            record = self.store.jobs.read(task_key) or {}
        except (StoreError, KazooException, KazooTimeoutError):
            record = {}
        by = record.get("killed_by") or record.get("cancelled_by") or {}
        command = plain_text(by.get("command"), 64)  # the killer's words: plain text
        who = plain_text(by.get("identity") or by.get("user"), 64)
        return (command or "hypertf kill or cancel") + (
            f" by {who} from {plain_text(by.get('host'), 64) or '?'}" if who else "")

    def release(self, task_key: str, result: JobState, summary: Mapping[str, Any],
                stopped_on: Sequence[str] | None,
                meanwhile: Callable[[], object] | None = None) -> None:
        client = self.store.client
        ran = False

        def once() -> None:
            nonlocal ran
            if meanwhile is not None and not ran:
                ran = True
                meanwhile()

        deadline = time.monotonic() + self.connect_wait_s
        while not client.connected and time.monotonic() < deadline:
            time.sleep(0.2)  # calls on a disconnected client would queue and block
        try:
            if not client.connected:
                raise StoreError("not connected")
            self.store.matrix.release(task_key, state=result, extra={"summary": summary},
                                      stopped_on=stopped_on, meanwhile=once)
        except (StoreError, KazooException, KazooTimeoutError) as err:
            self.say(f"hypertf: warning: could not reach ZooKeeper to release job "
                     f"{task_key} ({err or type(err).__name__}); its lease ends with "
                     f"this session and the next sync returns the GPUs")
        finally:
            once()

