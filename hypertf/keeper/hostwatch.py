"""The watch on the registered hosts (``HostWatch``): what wakes the keeper when a host is
registered or removed, and hands the hosts to the keeper's record cache, whose one
recursive watch follows each host's record (its coming, changes and going)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient

from hypertf.core.layout import Layout

__all__ = ["HostWatch"]


class HostWatch:
    """Keeps ``hosts`` (the registered hosts: the keeper's pass lists 25,000 names no more)
    and calls ``wake`` whenever they change, after ``follow(hosts)`` (the record cache's,
    which follows every record by one recursive watch: no more a children watch per host's
    folder and a data watch per record, 2 synchronous round trips per host at the keeper's
    start)."""

    def __init__(self, client: KazooClient, layout: Layout, wake: Callable[..., Any],
                 follow: Callable[[list[str]], None] | None = None) -> None:
        self.client = client
        self.layout = layout
        self.wake = wake
        self.follow = follow
        self.stopped = False
        self.hosts: list[str] | None = None  # the registered hosts, sorted, as last seen
        client.ChildrenWatch(layout.hosts, self._on_hosts)

    def stop(self) -> None:
        """End the watch at its next firing (the keeper lost its lease)."""
        self.stopped = True

    def _on_hosts(self, hosts: list[str]) -> Any:
        if self.stopped:
            return False
        self.hosts = sorted(hosts)
        if self.follow is not None:
            self.follow(hosts)
        return self.wake()
