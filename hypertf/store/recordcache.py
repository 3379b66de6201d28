"""The keeper's parsed copy of the agents' records (``RecordCache``), kept by watches.

At 25,000 hosts a pass that read every record again moved 37 MB and took ~0.4 s before any
decision, and its parse of the records whose keep-alive changed their heartbeat (~930 a
second) took more: the keeper's figures missed their goals on that alone. Once ``follow``
is called (the keeper's role does, for its term), each record is read once and then again
only when ZooKeeper says it changed (a data watch, re-armed by the read that follows it);
a pass reads nothing and parses only what changed. A record whose only change is its
heartbeat is not parsed again (its heartbeat is taken from the bytes), and does not count
as a change of content: ``generation`` moves only when a record's content comes, changes
or goes, so the keeper can tell that nothing it decides by has moved.

Who writes what is read here: each record is its host's agent's (its credential writes
that record only). A record that cannot be parsed counts as no record (that host's row
turns unavailable, as when its agent is down) and is logged once: one bad agent must not
stop the keeper for every other host.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import KazooState, WatchedEvent

from hypertf.core.errors import StoreError
from hypertf.core.records import AgentRecord
from hypertf.store.zkclient import pipelined
from hypertf.store.zkstore import Store

__all__ = ["RecordCache"]

log = logging.getLogger(__name__)

_HEARTBEAT = b'"heartbeat":'
ABSENT = None  # a host followed whose record does not exist (its agent is down)


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


class RecordCache:
    """The keeper's parsed copy of the agents' records.

    Unfollowed (``RecordCache(store)`` alone), every ``records`` call reads the hosts' records
    in multi-reads and parses those whose content changed. After ``follow(hosts)`` the
    records of those hosts are kept by data watches, and a call reads only hosts it does
    not follow yet. ``forget()`` (the keeper's term ended) drops what was followed."""

    def __init__(self, store: Store,
                 changed: Callable[[bool], object] | None = None) -> None:
        self.store = store
        # Called after a followed record's content changed (the heartbeat aside): True
        # when the record came or went.
        self.changed = changed
        self.generation = 0  # moves when a record's content comes, changes or goes
        self.seen_generation = 0  # ``generation`` as the last ``records`` call saw it
        self._lock = threading.Lock()
        self._raw: dict[str, bytes | None] = {}  # followed hosts read at least once
        self._dirty: set[str] = set()  # followed hosts whose bytes came since the last call
        self._following: set[str] = set()
        self._parsed: dict[str, tuple[bytes, AgentRecord]] = {}  # content -> record
        self._refused: dict[str, bytes] = {}  # hosts whose record did not parse (logged)
        self._pending: set[str] = set()  # followed hosts to read (again), with a watch
        self._wanted = threading.Condition(self._lock)
        self._listening = False
        self._term = 0  # answers and watches of an earlier term are ignored

    # -- kept by watches ----------------------------------------------------------------
    def follow(self, hosts: Iterable[str]) -> None:
        """Keep the records of ``hosts`` (and of those followed already) by watches; each
        new one is read at once by the cache's reader thread (25,000 reads pipelined)."""
        with self._lock:
            new = [host for host in hosts if host not in self._following]
            self._following.update(new)
            self._pending.update(new)
            if not self._listening:
                self._listening = True
                self.store.client.add_listener(self._on_state)
                threading.Thread(target=self._reader, daemon=True,
                                 name="record-reader").start()
            self._wanted.notify()

    def forget(self) -> None:
        """Stop keeping records (the keeper's term ended): watches fire once more, unused."""
        with self._lock:
            self._term += 1
            self._following.clear()
            self._pending.clear()
            self._raw.clear()
            self._dirty.clear()
            if self._listening:
                self.store.client.remove_listener(self._on_state)
                self._listening = False
            self._wanted.notify()

    def _reader(self) -> None:
        """Reads what watches asked for, in batches: kazoo wakes its connection thread once
        per request (~200 us on a busy machine) unless requests are sent pipelined, and
        25,000 agents' keep-alives fire ~930 watches a second."""
        client = self.store.client
        while True:
            with self._lock:
                while self._listening and not self._pending:
                    self._wanted.wait()
                if not self._listening:
                    return
                batch, self._pending = self._pending, set()
                term = self._term
            if not client.connected:  # requests would fail: wait for the connection
                with self._lock:
                    self._pending |= batch
                threading.Event().wait(0.5)
                continue
            with pipelined(client):
                for host in batch:
                    path = self.store.layout.resource(host)
                    result = client.get_async(path, watch=self._watcher(host, term))
                    result.rawlink(functools.partial(self._got, host, term))

    def _watcher(self, host: str, term: int) -> Callable[[WatchedEvent], None]:
        def fired(_event: WatchedEvent) -> None:
            with self._lock:
                if term == self._term and host in self._following:
                    self._pending.add(host)
                    self._wanted.notify()
        return fired

    def _got(self, host: str, term: int, done: Any) -> None:
        try:
            data: bytes | None = done.get_nowait()[0]
        except NoNodeError:  # no record: watch for its creation instead
            data = ABSENT
            exists = self.store.client.exists_async(self.store.layout.resource(host),
                                                    watch=self._watcher(host, term))
            exists.rawlink(functools.partial(self._created_meanwhile, host, term))
        except Exception as err:  # the connection dropped: read it again
            log.debug("reading the record of %s failed (%s): reading it again", host, err)
            with self._lock:
                if term == self._term and host in self._following:
                    self._raw.pop(host, None)  # unknown meanwhile: a pass reads it itself
                    self._pending.add(host)
                    self._wanted.notify()
            return
        with self._lock:
            if term != self._term or host not in self._following:
                return
            old = self._raw.get(host, ABSENT)
            self._raw[host] = data
            self._dirty.add(host)
        presence = (old is ABSENT) != (data is ABSENT)
        moved = presence or (data is not ABSENT and old is not ABSENT
                             and content_of(old)[0] != content_of(data)[0])
        if moved and self.changed is not None:
            self.changed(presence)

    def _created_meanwhile(self, host: str, term: int, known: Any) -> None:
        """The record came between the failed read and the exists: read it now (the
        exists' watch was set on a node that is there, and fires on its next change)."""
        try:
            stat = known.get_nowait()
        except Exception:
            stat = None
        if stat is not None:
            self._watcher(host, term)(None)

    def _on_state(self, state: str) -> None:
        """A lost session took every watch with it: every host is read again (with new
        watches) once the client has a new session; meanwhile a pass reads them itself."""
        if state == KazooState.LOST:
            with self._lock:
                self._raw.clear()
                self._term += 1
                self._pending |= self._following
                self._wanted.notify()

    # -- what a pass reads ----------------------------------------------------------------
    def records(self, hosts: Iterable[str]) -> dict[str, AgentRecord]:
        """The records of ``hosts`` that exist (as ``Store.records(only=hosts)``); a record
        that does not parse is left out (logged once)."""
        hosts = list(hosts)
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            fresh = {host: self._raw[host] for host in dirty if host in self._raw}
            unknown = [host for host in hosts if host not in self._raw]
            followed = bool(self._following)
        if not followed:  # nothing kept: read them all (one multi-read per 256 hosts)
            return self._read_all(hosts)
        for host, data in fresh.items():
            self._keep(host, data)
        if unknown:
            read, missing = self.store.raw_records(unknown), set(unknown)
            found = {host: record for host in hosts
                     if (record := self._record(host, read, missing)) is not None}
        else:  # the usual pass: every host known, a dictionary's work (25,000: ~3 ms)
            parsed = self._parsed
            found = {host: known[1] for host in hosts if (known := parsed.get(host))}
        self.seen_generation = self.generation
        return found

    def _read_all(self, hosts: list[str]) -> dict[str, AgentRecord]:
        raw = self.store.raw_records(hosts)
        for host in set(self._parsed) - set(raw):
            self._keep(host, ABSENT)
        for host, data in raw.items():
            self._keep(host, data)
        self.seen_generation = self.generation
        return {host: self._parsed[host][1] for host in raw if host in self._parsed}

    def _record(self, host: str, read: dict[str, bytes],
                unknown: set[str]) -> AgentRecord | None:
        if host in read:  # not followed, or not read yet: read for this call
            self._keep(host, read[host])
        elif host in unknown:  # ... and it has no record
            self._keep(host, ABSENT)
        known = self._parsed.get(host)
        return None if known is None else known[1]

    def _keep(self, host: str, data: bytes | None) -> None:
        """Parse ``data`` when its content changed (a heartbeat alone: only the heartbeat
        is taken); None removes the host's record."""
        known = self._parsed.get(host)
        if data is ABSENT:
            if known is not None:
                del self._parsed[host]
                self.generation += 1
            self._refused.pop(host, None)
            return
        content, beat = content_of(data)
        if known is not None and known[0] == content:
            if beat is not None and beat != known[1].heartbeat:
                self._parsed[host] = (content, replace(known[1], heartbeat=beat))
            return
        try:
            record = AgentRecord.from_json(data)
        except StoreError as err:
            if self._refused.get(host) != data:
                log.error("%s: host %s counts as down until its agent writes a readable "
                          "record", err, host)
                self._refused[host] = data
            if known is not None:
                del self._parsed[host]
                self.generation += 1
            return
        self._refused.pop(host, None)
        self._parsed[host] = (content, record)
        self.generation += 1
