"""Where a job's time goes: each phase of a launch, per host where it is per host.

The launcher notes phases as they happen (inventory, connect, preflight, admission, start
(with the --sync upload), listening, first log line, run, stop, release, logs); summary.json
keeps them and ``hypertf train --timings`` prints them, so a slow launch is explained, not
guessed at (the benches read the same entries). Pure: no clock but the one given, thread-safe
(hosts are handled in parallel).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timeline:
    """Phases in seconds from ``origin`` (the job's start; the inventory read before it has
    a negative start)."""

    origin: float = field(default_factory=time.monotonic)
    entries: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _marked: set[tuple[str, str | None]] = field(default_factory=set, repr=False)

    def add(self, phase: str, start: float, end: float, host: str | None = None,
            note: str = "") -> None:
        """A phase from ``start`` to ``end`` (monotonic clock); ``note`` says how (a
        preflight answer taken from the cache: "cached")."""
        entry: dict[str, Any] = {"phase": phase, "start_s": round(start - self.origin, 3),
                                 "seconds": round(max(0.0, end - start), 3)}
        if host is not None:
            entry["host"] = host
        if note:
            entry["note"] = note
        with self._lock:
            self.entries.append(entry)

    @contextmanager
    def phase(self, name: str, host: str | None = None) -> Iterator[None]:
        """Time the block as phase ``name`` (noted also when it raises)."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.add(name, start, time.monotonic(), host)

    def mark(self, name: str, host: str | None = None, once: bool = True) -> None:
        """An instant (a task listening, the first log line): the time since the job's start;
        with ``once``, only the first for this name and host counts."""
        now = time.monotonic()
        with self._lock:
            if once and (name, host) in self._marked:
                return
            self._marked.add((name, host))
        self.add(name, now, now, host)

    def to_json(self) -> list[dict[str, Any]]:
        with self._lock:
            return sorted(self.entries, key=lambda e: (e["start_s"], e["phase"]))

    def table(self) -> list[str]:
        """The timeline as lines for the terminal."""
        lines = [f"  {'phase':<16} {'host':<12} {'at s':>8} {'took s':>8}"]
        for e in self.to_json():
            took = f"{e['seconds']:8.3f}" if e["seconds"] else f"{'-':>8}"
            note = f"  ({e['note']})" if e.get("note") else ""
            lines.append(f"  {e['phase']:<16} {e.get('host', ''):<12} {e['start_s']:8.3f} {took}"
                         f"{note}")
        return lines
