"""The keeper's parsed copy of the agents' records (``RecordCache``), kept by one watch.

At 25,000 hosts a pass that read every record again moved 37 MB and took ~0.4 s before any
decision, and its parse of the records whose keep-alive changed their heartbeat (~930 a
second) took more. A plain watch per record is no cure: kazoo spends ~300 us re-arming each
one, and 930 a second left the keeper's own requests queued behind them. Once ``follow``
is called (the keeper's role does, for its term), one persistent recursive watch on the
hosts' folder (ZooKeeper 3.6+) says which records were created, changed or deleted; a pass
reads only those (one multi-read per 256) and parses only those whose content changed. A
record whose only change is its heartbeat is not parsed again (its time is kept in
``written``, by ZooKeeper's clock) and does not count as a change: ``generation`` moves
only when a record's content comes, changes or goes, so the keeper can tell that nothing
it decides by moved.
The watch lives on the connection: after a reconnect it is set again and every record is
read once more (events in between were lost). A server without the watch is read whole at
every pass, as before.

Who writes what is read here: each record is its host's agent's (its credential writes
that record only). A record that cannot be parsed counts as no record (that host's row
turns unavailable, as when its agent is down) and is logged once: one bad agent must not
stop the keeper for every other host.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from hypertf.core.errors import StoreError
from hypertf.core.layout import RESOURCE_LEAF
from hypertf.core.records import AgentRecord
from hypertf.keeper.treefollow import CREATED, DELETED, TreeFollow
from hypertf.store.session import Store

__all__ = ["RecordCache", "content_of"]

log = logging.getLogger(__name__)

_HEARTBEAT = b'"heartbeat":'


def content_of(data: bytes) -> tuple[bytes, float | None]:
    """The record's bytes without its heartbeat's value, and that value (None when the
    record has no plain heartbeat field: then the bytes are the content)."""
    start = data.find(_HEARTBEAT)
    if start < 0:
        return data, None
    start += len(_HEARTBEAT)
    end = start
    while end < len(data) and data[end] not in b",}":
        end += 1
    try:
        beat = float(data[start:end])
    except ValueError:
        return data, None
    return data[:start] + data[end:], beat


class RecordCache(TreeFollow):
    """The keeper's parsed copy of the agents' records.

    Unfollowed (``RecordCache(store)`` alone), every ``records`` call reads the hosts' records
    in multi-reads and parses those whose content changed. After ``follow()`` a call reads
    only the records the watch said changed and hosts never read. ``forget()`` (the
    keeper's term ended) removes the watch. ``changed(presence)``, when given, is called
    from kazoo's connection thread for each event (``presence``: a record came or went);
    it must only take note."""

    def __init__(self, store: Store,
                 changed: Callable[[bool], object] | None = None, gpus_max: int = 0) -> None:
        super().__init__(store, store.layout.hosts)
        self.changed = changed
        self.gpus_max = gpus_max  # the admin's bound on a record's GPUs (0: the format's)
        self.generation = 0  # moves when a record's content comes, changes or goes
        self.seen_generation = 0  # ``generation`` as the last ``records`` call saw it
        self._stale: set[str] = set()  # hosts whose record an event named since last read
        self._read: set[str] = set()  # hosts read since the watch was set
        self._parsed: dict[str, tuple[bytes, AgentRecord]] = {}  # content -> record
        self._refused: dict[str, bytes] = {}  # hosts whose record did not parse (logged)
        # The status view's (hypertf.keeper.statusview): when ZooKeeper last saw each record
        # written (its mtime: never the agent's own clock), and why a record did not parse.
        self.written: dict[str, float] = {}
        self.unreadable: dict[str, str] = {}
        # hosts whose record came, went or changed (beyond its heartbeat) since the last
        # ``touched()``, and those whose only change was a keep-alive
        self._touched: set[str] = set()
        self._beats: set[str] = set()

    def follow(self, _hosts: Iterable[str] = ()) -> None:
        """Keep the records by the watch from the next ``records`` call on (every host
        below the hosts' folder: hosts registered later are followed too)."""
        super().follow()

    def _forgotten(self) -> None:
        self._read.clear()

    def _on_event(self, kind: int, path: str) -> None:
        host, _, leaf = path[len(self._prefix):].partition("/")
        if leaf != RESOURCE_LEAF:
            return  # a host's folder, or what an agent may not create
        with self._lock:
            self._stale.add(host)
        if self.changed is not None:
            self.changed(kind in (CREATED, DELETED))

    def _watch(self) -> bool:
        """Set the watch (the pass's thread, before its read): whether it is set."""
        if self._unsupported:
            return False
        watching = self._set_watch()
        with self._lock:
            self._stale.clear()  # a whole read follows
            self._read.clear()
        if not watching:
            log.warning("ZooKeeper has no persistent watches (3.6 or later has them): the "
                        "keeper reads every agent record at each pass")
        return watching

    def records(self, hosts: Iterable[str]) -> dict[str, AgentRecord]:
        """The records of ``hosts`` that exist (as ``Store.records(only=hosts)``); a record
        that does not parse is left out (logged once)."""
        hosts = list(hosts)
        with self._lock:
            watched = self._following and self._watching
        if self._following and not watched:
            watched = self._watch()
        with self._lock:
            stale, self._stale = self._stale, set()
        if watched:
            wanted = set(hosts)
            done = self._read
            for host in stale - wanted:  # not asked for now: read when it is
                done.discard(host)
            to_read = [host for host in hosts if host in stale or host not in done]
        else:
            to_read = hosts
        raw = self.store.raw_records_written(to_read) if to_read else {}
        written = self.written
        for host in to_read:
            data, at = raw.get(host, (None, 0.0))
            if data is None:
                written.pop(host, None)
            else:
                written[host] = at
            if self._keep(host, data):
                self._beats.add(host)
            else:
                self._touched.add(host)
        if watched:
            self._read.update(to_read)
        parsed = self._parsed
        self.seen_generation = self.generation
        return {host: known[1] for host in hosts if (known := parsed.get(host))}

    def touched(self) -> tuple[set[str], set[str]]:
        """Since the last call: the hosts whose record came, went or changed, and those
        whose record only had a keep-alive (its ``written`` moved): what the status view
        looks at again."""
        touched, self._touched = self._touched, set()
        beats, self._beats = self._beats - touched, set()
        return touched, beats

    def _keep(self, host: str, data: bytes | None) -> bool:
        """Parse ``data`` when its content changed (a heartbeat alone changes nothing kept
        here); None removes the host's record. True when only the heartbeat moved."""
        known = self._parsed.get(host)
        if data is None:
            if known is not None:
                del self._parsed[host]
                self.generation += 1
            self._refused.pop(host, None)
            self.unreadable.pop(host, None)
            return False
        content, _ = content_of(data)
        if known is not None and known[0] == content:
            # a keep-alive: nothing the keeper decides by moved, and its time is in
            # ``written`` (copying the record for its heartbeat was 11% of a busy pass)
            return True
        try:
            record = AgentRecord.from_json(data)
            if self.gpus_max and record.gpu > self.gpus_max:
                raise StoreError(
                    f"host {host}'s agent reports {record.gpu} GPUs, more than the "
                    f"{self.gpus_max} hypertf_host_gpus_max allows (raise it in the "
                    f"inventory if the host has that many)")
        except StoreError as err:
            if self._refused.get(host) != content:  # once per content, not per keep-alive
                log.error("%s: host %s counts as down until its agent writes a readable "
                          "record", err, host)
                self._refused[host] = content
                self.unreadable[host] = str(err)
            if known is not None:
                del self._parsed[host]
                self.generation += 1
            return False
        self._refused.pop(host, None)
        self.unreadable.pop(host, None)
        self._parsed[host] = (content, record)
        self.generation += 1
        return False
