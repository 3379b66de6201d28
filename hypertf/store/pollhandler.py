"""kazoo's threading handler with a ``select`` that costs one ``poll`` system call.

kazoo's connection thread waits on its socket through ``handler.select`` about five times
per request (the loop's wait, the write, the header's and the body's reads), and kazoo's
own ``selector_select`` builds, fills and closes a new epoll selector for every one of them:
~10 us of CPU each on this machine against ~1 us for a ``poll`` object, which has no
descriptor limit either (the reason kazoo left ``select.select``). Every HyperTF client
(launchers, agents, the keeper) pays it on every request; at 32 submitters it was about a
quarter of the submitters' CPU per admission cycle (docs/benchmarks.md, issue 55).

The handler is kazoo's public extension point (``KazooClient(handler=...)``); the answer
keeps ``selector_select``'s meaning: a descriptor with an error or a hang-up is reported
ready, so kazoo's read or write meets the error, and a bad descriptor raises as there.
"""

from __future__ import annotations

import math
import select
import threading
from collections.abc import Sequence
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import fileobj_to_fd

__all__ = ["PollHandler"]

_READ = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL
_WRITE = select.POLLOUT | select.POLLHUP | select.POLLERR | select.POLLNVAL
KEPT_POLLS = 8  # per thread: kazoo's connection thread asks about three sets


class PollHandler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo has no hints
    """SequentialThreadingHandler whose ``select`` waits with ``select.poll``: one poll
    object per set of descriptors and thread, kept (kazoo asks about the same two or three
    sets over and over), so a wait is one system call."""

    def __init__(self) -> None:
        super().__init__()
        self._polls = threading.local()  # a poll object may not be polled by two threads

    def select(self, rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any],
               timeout: float | None = None) -> tuple[list[Any], list[Any], list[Any]]:
        """``select.select``'s contract (readable, writable, and an always empty third
        list), as kazoo's ``selector_select`` keeps it."""
        if timeout is not None:
            if not isinstance(timeout, (int, float)):
                raise TypeError("timeout must be a number")
            if timeout < 0:
                raise ValueError("timeout must be non-negative")
        rfds = [fileobj_to_fd(fileobj) for fileobj in rlist]
        wfds = [fileobj_to_fd(fileobj) for fileobj in wlist]
        # poll's unit is the millisecond: rounded up, so a short wait is not a busy loop
        ready = self._poller(tuple(rfds), tuple(wfds)).poll(
            None if timeout is None else math.ceil(timeout * 1000))
        if not ready:
            return [], [], []
        events = dict(ready)
        return ([f for f, fd in zip(rlist, rfds, strict=True) if events.get(fd, 0) & _READ],
                [f for f, fd in zip(wlist, wfds, strict=True) if events.get(fd, 0) & _WRITE],
                [])

    def _poller(self, rfds: tuple[int, ...], wfds: tuple[int, ...]) -> Any:
        """This thread's poll object for these descriptors (a descriptor number reused by
        a new socket is the same question to poll)."""
        kept: dict[tuple[tuple[int, ...], tuple[int, ...]], Any] = \
            self._polls.__dict__.setdefault("kept", {})
        poller = kept.get((rfds, wfds))
        if poller is None:
            masks: dict[int, int] = {}
            for fd in rfds:
                masks[fd] = masks.get(fd, 0) | select.POLLIN | select.POLLPRI
            for fd in wfds:
                masks[fd] = masks.get(fd, 0) | select.POLLOUT
            poller = select.poll()
            for fd, mask in masks.items():
                poller.register(fd, mask)
            if len(kept) >= KEPT_POLLS:
                kept.clear()
            kept[(rfds, wfds)] = poller
        return poller
