"""The keeper publishes its view of the hosts for ``hypertf status`` (hypertf.core.hostview).

After each pass the keeper has every record parsed and the matrix synced; ``StatusPublisher``
turns the hosts that changed into their entries and rewrites only the shards they are in: a
shard whose shown content changed at once, one whose agents only wrote keep-alives at most
every ``REFRESH_S``. A pass with nothing new costs a walk over the matrix's rows by identity
(a row the sync did not touch is the same list) and nothing else.

Publishing never fails a pass: a write that ZooKeeper refuses is tried again at the next
one, and a reader without a whole view reads the records directly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError, ZookeeperError

from hypertf.core.hostview import REFRESH_S, HostView, encode_shard, host_view
from hypertf.core.matrix import Cell, Matrix, job_of, shard_of
from hypertf.core.records import AgentRecord
from hypertf.store import Store

__all__ = ["StatusPublisher"]

log = logging.getLogger(__name__)


class StatusPublisher:
    """The keeper's ``keeper/status.<shard>`` znodes, for one term of the lease."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._reset(0)

    def _reset(self, count: int) -> None:
        """Forget every entry: the first call, or a reshard (every host in a new shard)."""
        self.count = count  # the shards published (the matrix's)
        self.views: dict[str, HostView] = {}
        self._rows: dict[str, tuple[list[Cell] | None, dict[str, str] | None]] = {}
        self._records: dict[str, AgentRecord | None] = {}
        self._shards: dict[int, set[str]] = {}
        self._written: dict[int, bytes] = {}  # what each shard's znode holds
        self._when: dict[int, float] = {}  # when each shard was last written
        self._stale: set[int] = set()  # shards whose keep-alives moved since their write

    def publish(self, matrix: Matrix, shards: int, records: Mapping[str, AgentRecord],
                written: Mapping[str, float], unreadable: Mapping[str, str],
                registered: Iterable[str]) -> int:
        """Rewrite the shards whose hosts changed since the last call; returns how many."""
        if shards != self.count:
            self._reset(shards)
        hosts = set(registered) | matrix.gpus.keys() | matrix.ports.keys()
        changed: set[int] = set()
        for host in hosts | self.views.keys():
            shard = shard_of(host, shards)
            if host not in hosts:
                del self.views[host]
                self._shards[shard].discard(host)
                changed.add(shard)
                continue
            record = records.get(host)
            row, ports = matrix.gpus.get(host), matrix.ports.get(host)
            seen = self._rows.get(host)
            if (seen is not None and seen[0] is row and seen[1] is ports
                    and self._records.get(host) is record
                    and host not in unreadable):
                view = self.views[host]
                if record is not None and view.written != written.get(host):
                    self.views[host] = _with_written(view, written.get(host))
                    self._stale.add(shard)
                continue
            self._rows[host], self._records[host] = (row, ports), record
            view = host_view(record, written.get(host) if record else None, list(row or []),
                             ports or {}, _cpu_jobs(row or [], ports or {}),
                             unreadable.get(host, ""))
            old = self.views.get(host)
            self.views[host] = view
            self._shards.setdefault(shard, set()).add(host)
            if old is None or _with_written(old, None) != _with_written(view, None):
                changed.add(shard)
            elif old.written != view.written:
                self._stale.add(shard)
        now = self.clock()
        due = changed | {s for s in self._stale if now - self._when.get(s, 0.0) >= REFRESH_S}
        due |= {s for s in range(shards) if s not in self._written}
        return sum(self._write(shard, now) for shard in sorted(due))

    def _write(self, shard: int, now: float) -> bool:
        names = sorted(self._shards.get(shard, ()))
        data = encode_shard(shard, self.count, ((name, self.views[name]) for name in names))
        if data == self._written.get(shard):
            self._stale.discard(shard)
            return False
        path = self.store.layout.status_view(shard)
        try:
            try:
                self.store.client.set(path, data)
            except NoNodeError:
                self.store.client.create(path, data, acl=self.store.acls.of("status_view"),
                                         ephemeral=True)
        except NodeExistsError:
            return False  # an older keeper's session still holds it: the next pass
        except (KazooException, ZookeeperError) as err:
            log.debug("cannot publish the status view's shard %d: %s", shard, err)
            return False
        self._written[shard] = data
        self._when[shard] = now
        self._stale.discard(shard)
        return True


def _with_written(view: HostView, written: float | None) -> HostView:
    return replace(view, written=written)


def _cpu_jobs(row: list[Cell], ports: Mapping[str, str]) -> list[str]:
    """Jobs with ports here but no GPU of this host: parameter servers, offload hosts."""
    if not ports:
        return []
    return sorted({key for cell in ports.values() if (key := job_of(str(cell)))}
                  - {key for cell in row if (key := job_of(cell))})
