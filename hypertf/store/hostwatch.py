"""Watches on the registered hosts and their agents' records (``HostWatch``): what wakes
the keeper when a host comes, goes or changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient

from hypertf.core.layout import Layout

__all__ = ["HostWatch"]


class HostWatch:
    """Calls ``wake`` whenever a host is registered or its agent record comes or goes: a
    watch on ``hosts`` and one on each host's folder (the record is a grandchild of
    ``hosts``, so one watch there cannot see it). ``watch_records(changed)``: also calls
    ``changed`` whenever a record's content changes (the keeper's matrix follows them)."""

    def __init__(self, client: KazooClient, layout: Layout, wake: Callable[..., Any]) -> None:
        self.client = client
        self.layout = layout
        self.wake = wake
        self.watched: set[str] = set()
        self.changed: Callable[[], Any] | None = None
        self.stopped = False
        self._records: set[str] = set()
        client.ChildrenWatch(layout.hosts, self._on_hosts)

    def stop(self) -> None:
        """End every watch at its next firing (the keeper lost its lease)."""
        self.stopped = True

    def _on_hosts(self, hosts: list[str]) -> Any:
        if self.stopped:
            return False
        for host in sorted(set(hosts) - self.watched):
            self.watched.add(host)
            self.client.ChildrenWatch(self.layout.host(host), self._on_host)
        self._watch_records()
        return self.wake()

    def _on_host(self, _children: list[str]) -> Any:
        return False if self.stopped else self.wake()

    def watch_records(self, changed: Callable[[], Any]) -> None:
        """From now on, ``changed()`` after every change of a host's record (idempotent)."""
        self.changed = changed
        self._watch_records()

    def _watch_records(self) -> None:
        if self.changed is None:
            return
        for host in sorted(self.watched - self._records):
            self._records.add(host)
            self.client.DataWatch(self.layout.resource(host), self._on_record)

    def _on_record(self, _data: bytes | None, _stat: object) -> bool:
        if self.stopped:
            return False
        if self.changed is not None:
            self.changed()
        return True  # keep watching
