"""The keeper's passes on a thread of their own: ``PassThread`` runs one keeper term's passes,
woken by the keeper's watches, and ``PassCounts`` counts them for /metrics.

An agent that holds the keeper lease runs its passes on a ``PassThread`` (one per term of
the lease: hypertf.keeper.role.KeeperTerm), so a slow pass never delays that host's
heartbeat and drain reports, and a pass that raises is logged with its cause, counted
(the agent's /metrics: ``hypertf_keeper_pass_failures_total``) and tried again, without
touching the agent's loop. The keeper of a process that is no agent (benches, tests:
hypertf.keeper.thread.KeeperThread) runs its passes on one too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from hypertf.core.errors import StoreError

log = logging.getLogger(__name__)

BUG_RETRY_S = 5.0  # a pass that failed unexpectedly (a bug) is tried again this soon
ZK_RETRY_S = 1.0  # ... one that failed on ZooKeeper (a connection loss, a timeout)
END_WAIT_S = 10.0  # how long a stop waits for the pass in progress (the agent stops)


class PassCounts:
    """The keeper's passes in this process, every term's: those that went through and
    those that failed. Written by the pass threads, read by /metrics' scrapes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._passes = 0
        self._failures = 0

    def passed(self) -> None:
        with self._lock:
            self._passes += 1

    def failed(self) -> None:
        with self._lock:
            self._failures += 1

    @property
    def passes(self) -> int:
        with self._lock:
            return self._passes

    @property
    def failures(self) -> int:
        with self._lock:
            return self._failures


class PassThread:
    """One keeper term's passes (``keep``), on a thread of their own: at once when woken
    (``wake``: a watch fired, or the agent looked around), ``interval`` after the last pass
    once some host's record changed (``records_changed``), and at least every ``quiet``
    seconds. A pass that raises is logged with its cause and counted in ``counts``; a bug's
    or a connection loss's is tried again soon (``BUG_RETRY_S``, ``ZK_RETRY_S``), bad data's
    (a StoreError: the matrix outgrew its znode...) at the next wake-up. ``stop()`` ends the
    thread after the pass in progress; ``on_end`` (the role's stop) runs on it then."""

    def __init__(self, interval: float, quiet: float, counts: PassCounts | None = None,
                 name: str = "keeper") -> None:
        self.interval, self.quiet = interval, quiet
        self.counts = counts or PassCounts()
        self._wake = threading.Event()  # a pass now
        self._records = threading.Event()  # a pass at the next interval
        self._poke = threading.Event()  # one of the above, or the stop: look again
        self._stop = threading.Event()
        self._finish = False  # a stop that lets the term's first pass run first
        self._ran = False  # a pass has run (gone through or failed)
        self._last = 0.0  # when the last pass began (monotonic)
        self._retry_at: float | None = None  # after a failed pass: when to try again
        self._thread: threading.Thread | None = None
        self._name = name

    def start(self, keep: Callable[[], object],
              on_end: Callable[[], object] | None = None) -> PassThread:
        self._wake.set()  # a new term's first pass: at once
        self._thread = threading.Thread(target=self._run, args=(keep, on_end), daemon=True,
                                        name=self._name)
        self._thread.start()
        return self

    def wake(self, *_: object) -> None:
        """A pass now (a watch callback: never blocks)."""
        self._wake.set()
        self._poke.set()

    def records_changed(self) -> None:
        """Some host's record changed: a pass at the next interval."""
        self._records.set()
        self._poke.set()

    def stop(self, wait: float | None = 0.0, finish: bool = False) -> bool:
        """End the thread after the pass in progress (with ``finish``: not before the term's
        first pass has run, as ``hypertf agent --once`` runs one); wait for it up to ``wait``
        seconds (None: as long as it takes). True once it has ended."""
        self._finish = finish
        self._stop.set()
        self._poke.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and \
                (wait is None or wait > 0):
            thread.join(wait)
        return thread is None or not thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self, keep: Callable[[], object], on_end: Callable[[], object] | None) -> None:
        try:
            while self._due():
                self._pass(keep)
        finally:
            if on_end is not None:
                try:
                    on_end()
                except Exception:  # the term is over either way
                    log.exception("ending the keeper's term failed")

    def _due(self) -> bool:
        """Wait until a pass is due; False once stopped."""
        while True:
            self._poke.clear()  # cleared before the flags are read: a wake-up now is kept
            if self._stop.is_set():
                return self._finish and not self._ran
            now = time.monotonic()
            due = self._last + self.quiet
            if self._records.is_set():
                due = min(due, self._last + self.interval)
            if self._retry_at is not None:
                due = min(due, self._retry_at)
            if self._wake.is_set() or now >= due:
                return True
            self._poke.wait(due - now)

    def _pass(self, keep: Callable[[], object]) -> None:
        """One pass, its failure said with its cause and counted."""
        self._wake.clear()
        self._records.clear()
        self._last, self._retry_at, self._ran = time.monotonic(), None, True
        try:
            keep()
        except StoreError as err:  # unreadable data, e.g. the matrix outgrew its znode
            log.error("cannot sync the matrix or admit waiting jobs: %s", err)
        except (KazooException, KazooTimeoutError) as err:
            log.warning("the keeper's pass failed on ZooKeeper (%s: %s); trying again in "
                        "%.0f s", type(err).__name__, err, ZK_RETRY_S)
            self._retry_at = time.monotonic() + ZK_RETRY_S
        except Exception:  # a bug: said with its traceback, and the next pass tries again
            log.exception("the keeper's pass failed; trying again in %.0f s", BUG_RETRY_S)
            self._retry_at = time.monotonic() + BUG_RETRY_S
        else:
            self.counts.passed()
            return
        self.counts.failed()
