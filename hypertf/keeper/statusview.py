"""The keeper publishes its view of the hosts for ``hypertf status`` (hypertf.core.hostview).

After each pass the keeper has every record parsed and the matrix synced; ``StatusPublisher``
turns the hosts that changed into their entries and rewrites only the shards they are in: a
shard whose shown content changed within ``WRITE_EVERY_S``, one whose agents only wrote
keep-alives at most every ``REFRESH_S``. A host of a changed shard whose record (the same
object) and row are as before is not built again.

Publishing never fails a pass: a write that ZooKeeper refuses is tried again at the next
one, and a reader without a whole view reads the records directly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from kazoo.exceptions import (
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    ZookeeperError,
)

from hypertf.core.hostview import REFRESH_S, HostView, cpu_jobs, encode_shard, host_view
from hypertf.core.matrix import Matrix, shard_of
from hypertf.core.records import AgentRecord
from hypertf.store import Store
from hypertf.store.matrixshards import MatrixVersion
from hypertf.store.zkclient import pipelined

__all__ = ["WRITE_EVERY_S", "StatusPublisher"]

# Shards are written at most this often: at 32 submitters the keeper passes ~100 times a
# second and a write per pass was a sixth of it (4.4 of 27.7 ms); what status shows is
# then at most this much (plus the next pass) behind.
WRITE_EVERY_S = 1.0

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
        self.off = ""  # why this term publishes nothing (a root it may not write)
        self._reset(0)

    def _reset(self, count: int) -> None:
        """Forget every entry: the first call, or a reshard (every host in a new shard)."""
        self.count = count  # the shards published (the matrix's)
        self.views: dict[str, HostView] = {}
        self._shards: dict[int, set[str]] = {}
        # what each host's entry was built from: its record (the cache keeps one object per
        # content) and its ports; its row is compared with the entry's
        self._inputs: dict[str, tuple[AgentRecord | None, dict[str, str] | None]] = {}
        self._versions: Mapping[int, int] = {}  # the matrix shards' versions last seen
        self._registered: frozenset[str] | None = None
        self._listed: list[str] | None = None  # the registered hosts' list last handed in
        self._written: dict[int, bytes] = {}  # what each shard's znode holds
        self._when: dict[int, float] = {}  # when each shard was last written
        self._stale: set[int] = set()  # shards whose keep-alives moved since their write
        self._dirty: set[int] = set()  # shards whose shown content changed, not yet written
        self._last = float("-inf")  # when shards were last written

    def publish(self, matrix: Matrix, version: MatrixVersion,
                records: Mapping[str, AgentRecord], written: Mapping[str, float],
                unreadable: Mapping[str, str], registered: list[str],
                touched: Iterable[str], beats: Iterable[str] = ()) -> int:
        """Rewrite the shards whose hosts changed since the last call; returns how many.
        ``touched``: the hosts whose record came, went or changed since the last call;
        ``beats``: those whose record only had a keep-alive (only ``written`` moved)."""
        if self.off:
            return 0  # said once: no request a pass on a root it may not write
        shards = version.shards
        if shards != self.count:
            self._reset(shards)
        if registered is not self._listed:  # the watch's list: a new one on a change
            self._listed = registered
            listed = frozenset(registered)
            full = listed != self._registered
            self._registered = listed
        else:
            full = False
        if full:  # the first call, or hosts (un)registered
            check = set(self._registered or ()) | matrix.gpus.keys() | matrix.ports.keys() \
                | self.views.keys()
        else:
            check = set(touched) | set(unreadable)
            for index, seen in version.versions.items():
                if self._versions.get(index) != seen:
                    check |= self._shards.get(index, set())
            for host in beats:
                view = self.views.get(host)
                if view is not None and host not in check and view.up:
                    view.written = written.get(host)
                    self._stale.add(shard_of(host, shards))
        self._versions = dict(version.versions)
        self._dirty.update(shard for host in check if (shard := self._look(
            host, matrix, records, written, unreadable)) is not None)
        now = self.clock()
        due = {s for s in range(shards) if s not in self._written}
        if now - self._last >= WRITE_EVERY_S:  # a busy keeper passes ~100 times a second
            due |= self._dirty
            stale = sorted((s for s in self._stale - due
                            if now - self._when.get(s, 0.0) >= REFRESH_S),
                           key=lambda s: self._when.get(s, 0.0))
            due.update(stale[:max(8, shards // 10)])  # keep-alives spread over passes
        if not due:
            return 0
        self._last = now
        self._dirty -= due
        return self._write(sorted(due), now)

    def _look(self, host: str, matrix: Matrix, records: Mapping[str, AgentRecord],
              written: Mapping[str, float], unreadable: Mapping[str, str]) -> int | None:
        """Build ``host``'s entry again: its shard when what it shows changed."""
        shard = shard_of(host, self.count)
        row, ports = matrix.gpus.get(host), matrix.ports.get(host)
        if host not in (self._registered or ()) and row is None and ports is None:
            if self.views.pop(host, None) is None:
                return None
            self._shards[shard].discard(host)
            return shard
        record = records.get(host)
        old = self.views.get(host)
        built = self._inputs.get(host)
        if (old is not None and built is not None and built[0] is record
                and built[1] == ports and old.row == (row or []) and host not in unreadable):
            if old.up and old.written != written.get(host):  # a keep-alive meanwhile
                old.written = written.get(host)
                self._stale.add(shard)
            return None  # its shard was rewritten by another host's change (or an admin's)
        self._inputs[host] = (record, ports)
        view = host_view(record, written.get(host) if record else None, list(row or []),
                         ports or {}, cpu_jobs(row or [], ports or {}),
                         unreadable.get(host, ""))
        self.views[host] = view
        self._shards.setdefault(shard, set()).add(host)
        if old is None or _with_written(old, None) != _with_written(view, None):
            return shard
        if old.written != view.written:
            self._stale.add(shard)
        return None

    def _write(self, due: list[int], now: float) -> int:
        """Write the ``due`` shards whose bytes changed, pipelined (one round trip for all:
        ~200 shards one after the other took over a second on a busy machine)."""
        client, pending = self.store.client, []
        with pipelined(client):
            for shard in due:
                names = sorted(self._shards.get(shard, ()))
                data = encode_shard(shard, self.count,
                                    ((name, self.views[name]) for name in names))
                self._stale.discard(shard)
                if data != self._written.get(shard):
                    pending.append((shard, data, client.set_async(
                        self.store.layout.status_view(shard), data)))
        done = 0
        for shard, data, result in pending:
            try:
                try:
                    result.get(timeout=30)
                except NoNodeError:
                    client.create(self.store.layout.status_view(shard), data,
                                  acl=self.store.acls.of("status_view"), ephemeral=True)
            except NodeExistsError:
                continue  # an older keeper's session still holds it: the next pass
            except (NoAuthError, NoNodeError) as err:  # a root this keeper may not write
                self.off = (f"cannot create {self.store.layout.status_view(shard)} "
                            f"({type(err).__name__}): 'hypertf auth init' as the admin "
                            f"brings the root's rules up to date; until then hypertf "
                            f"status reads every record")
                log.warning("the keeper publishes no status view: %s", self.off)
                return done
            except (KazooException, ZookeeperError) as err:
                log.debug("cannot publish the status view's shard %d: %s", shard, err)
                continue
            self._written[shard] = data
            self._when[shard] = now
            done += 1
        return done


def _with_written(view: HostView, written: float | None) -> HostView:
    return replace(view, written=written)

