"""What the user hears of a job, and where its time went: one object the job and each of
its attempts are handed, so an attempt needs no job to speak (and a test reads what was
said)."""

from __future__ import annotations

from collections.abc import Callable

from hypertf.core.timeline import Timeline


class Reporter:
    """Lines for the user (``say``: print, a detached launcher's log, a test's list) and the
    job's timeline (summary.json's ``timeline``, ``--timings``)."""

    def __init__(self, say: Callable[[str], None] = print,
                 timeline: Timeline | None = None) -> None:
        self.say = say
        self.timeline = timeline or Timeline()
