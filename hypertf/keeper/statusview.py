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
from hypertf.store.allocation import MatrixVersion

__all__ = ["StatusPublisher"]

log = logging.getLogger(__name__)


class StatusPublisher:
    """The keeper's ``keeper/status.<shard>`` znodes, for one term of the lease.

    A pass looks only at what may have moved: the hosts whose records the record cache read
    (``touched``: created, changed, gone or a keep-alive) and the hosts of the matrix
    shards whose version changed; every host again when the registered hosts change or
    the matrix is resharded. So a pass at 25,000 hosts with nothing new costs a comparison
    of ~200 shard versions, not a walk over 25,000 rows (a read of the matrix hands out
    fresh row lists, so rows cannot be told unchanged by identity)."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._reset(0)

    def _reset(self, count: int) -> None:
        """Forget every entry: the first call, or a reshard (every host in a new shard)."""
        self.count = count  # the shards published (the matrix's)
        self.views: dict[str, HostView] = {}
        self._shards: dict[int, set[str]] = {}
        self._versions: Mapping[int, int] = {}  # the matrix shards' versions last seen
        self._registered: frozenset[str] | None = None
        self._written: dict[int, bytes] = {}  # what each shard's znode holds
        self._when: dict[int, float] = {}  # when each shard was last written
        self._stale: set[int] = set()  # shards whose keep-alives moved since their write

    def publish(self, matrix: Matrix, version: MatrixVersion,
                records: Mapping[str, AgentRecord], written: Mapping[str, float],
                unreadable: Mapping[str, str], registered: Iterable[str],
                touched: Iterable[str]) -> int:
        """Rewrite the shards whose hosts changed since the last call; returns how many.
        ``touched``: the hosts whose record was read since the last call."""
        shards = version.shards
        if shards != self.count:
            self._reset(shards)
        listed = frozenset(registered)
        if listed != self._registered:  # the first call, or hosts (un)registered
            self._registered = listed
            check = set(listed) | matrix.gpus.keys() | matrix.ports.keys() | self.views.keys()
        else:
            check = set(touched) | set(unreadable)
            for index, seen in version.versions.items():
                if self._versions.get(index) != seen:
                    check |= self._shards.get(index, set())
        self._versions = dict(version.versions)
        changed: set[int] = set()
        for host in check:
            shard = shard_of(host, shards)
            row, ports = matrix.gpus.get(host), matrix.ports.get(host)
            if host not in listed and row is None and ports is None:
                if self.views.pop(host, None) is not None:
                    self._shards[shard].discard(host)
                    changed.add(shard)
                continue
            record = records.get(host)
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
