"""The keeper's pass: sync the matrix, decide every waiting job, and commit all of a pass's
admissions (each with its grant) and refusals in ONE transaction: the matrix
(version-checked), and per job a check that its lease still lives and its record written
``allocated`` with placements and ports (version-checked against a cancel;
hypertf.keeper.commit). A keeper that dies mid-admission commits everything or nothing;
the next keeper starts the pass again.
The view it publishes (``keeper/queue``: position and reason) is what waiters read after
a while (hypertf.store.waitqueue.JobQueue.wait_for_admission). Each pass orders a priority tier by
fair share from the keeper's usage ledger (hypertf.keeper.ledger), which also ends an
attempt in the transaction that deletes its grant. With ``hypertf_preempt`` on, a committed
pass then preempts for the jobs it left waiting for GPUs (hypertf.keeper.preempter); its
notices are kept, and preempted attempts requeued at their old place, whether on or off.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError
from kazoo.retry import ForceRetryError

from hypertf.core import errors
from hypertf.core.admission import Decision, Waiting, admission_pass, clamped
from hypertf.core.fairshare import DAY_S, DEFAULT_HALF_LIFE_DAYS, Fairshare
from hypertf.core.limits import UserLimits
from hypertf.core.matrix import Held, Matrix
from hypertf.core.preemption import Standing
from hypertf.core.records import plain_text
from hypertf.core.requestcheck import PortBounds
from hypertf.keeper.commit import Commit, Committer
from hypertf.keeper.leasecache import LeaseCache
from hypertf.keeper.ledger import Ledger
from hypertf.keeper.preempter import Preempter, PreemptSettings
from hypertf.keeper.reader import QueueReader, read_limits
from hypertf.keeper.recordcache import RecordCache
from hypertf.keeper.screen import INVALID, Screen
from hypertf.keeper.sync import Synced, SyncMemo, sync
from hypertf.store import AgentRecord, Store, encode, until_committed
from hypertf.store.matrixshards import MatrixDamaged, MatrixVersion, ShardCache

log = logging.getLogger(__name__)
REPAIR_AFTER_S = 2.0  # a matrix that reads damaged this long is rewritten by the keeper
LIMITS_READ_S = 5.0  # the admin's limits read again at least this often


class AdminLimits:
    """The admin's limits, read again after they changed (a watch) and at least every
    LIMITS_READ_S (a watch set in an expired session never fires)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._limits: UserLimits | None = None  # the admin's, until the watch on them fires
        self._read = 0.0

    def __call__(self) -> UserLimits:
        limits = self._limits
        if limits is None or time.monotonic() - self._read > LIMITS_READ_S:
            self._read = time.monotonic()
            limits = self._limits = read_limits(self.store, watch=self._changed)
        return limits

    def _changed(self, _event: object) -> None:
        self._limits = None


# -- admitting ---------------------------------------------------------------------------
@dataclass
class Admitter:
    """The keeper's pass: sync the matrix, decide every waiting job, commit admissions
    (each with its grant) and refusals in one transaction, publish the view. The
    ``Committer`` is handed the parts it writes through (the reader, the ledger, the
    preempter, the sync's memo: objects with methods of their own, no bare collection);
    which records shut the keeper out is the committer's to know and this pass's to ask."""

    store: Store
    user_gpu_limit: int = 0
    user_queue_limit: int = 0
    host_gpus_max: int = 0  # a host's record claiming more GPUs counts it down (0: none)
    port_bounds: PortBounds | None = None  # the inventory's port ranges (None: unchecked)
    half_life_s: float = DEFAULT_HALF_LIFE_DAYS * DAY_S  # fair share's (0: off)
    clock: Callable[[], float] = time.time  # the keeper's clock (the ledger's times)
    preempt: PreemptSettings = field(default_factory=PreemptSettings)  # the admin's (off)
    reader: QueueReader = field(init=False)
    ledger: Ledger = field(init=False)
    preempter: Preempter = field(init=False)
    cache: RecordCache = field(init=False)
    leases: LeaseCache = field(init=False)
    screen: Screen = field(init=False)
    committer: Committer = field(init=False)
    limits: AdminLimits = field(init=False)
    published: bytes | None = None
    _synced_live: list[str] | None = None
    _read_waiting: list[Waiting] | None = None
    _read_matrix: tuple[Matrix, MatrixVersion] | None = None
    _last_good: Matrix | None = None  # the last matrix read whole: fills a damaged shard
    last_synced: Synced | None = None  # the last pass's sync (the status view's hosts)
    _damaged_at: float | None = None  # when the matrix first read damaged (monotonic)
    _memo: SyncMemo = field(default_factory=SyncMemo)  # what the last in-line sync went by
    # The registered hosts as the keeper role's watch keeps them (None: listed each pass).
    hosts: Callable[[], list[str]] | None = None

    def __post_init__(self) -> None:
        self.reader = QueueReader(self.store)
        self.cache = RecordCache(self.store, gpus_max=self.host_gpus_max)
        self.shards = ShardCache()  # the matrix between passes (enabled by the role's watch)
        self.leases = LeaseCache(self.store)
        self.screen = Screen(self.user_gpu_limit, self.user_queue_limit, self.port_bounds)
        self.ledger = Ledger(self.store, self.half_life_s, self.clock)
        self.preempter = Preempter(self.store, self.preempt, self.clock)
        self.committer = Committer(self.store, self.reader, self.ledger, self.preempter,
                                   self._memo, self.clock, self.user_gpu_limit)
        self.limits = AdminLimits(self.store)

    def keep(self) -> list[Decision]:
        """Sync (free ended jobs, repair running ones), then admit. Once the reader knows
        the running jobs' grants, the sync goes first and the queue is read with the
        leases it read (one listing of every user's leases per pass, not two)."""
        if not self.reader.read_once:  # fresh grants before the repair (a new keeper)
            waiting = self.reader.waiting(self.leases.leases())
            self.preempter.load(self.reader.terms)
            done = self._sync()
        else:
            self.preempter.load(self.reader.terms)  # once a term (again after a failure)
            known = self.leases.known()
            if known is not None:  # new records' reads share the sync's round trip
                self.reader.prefetch(known)
            done = self._sync()
            waiting = self.reader.waiting(done.leases)
        self._last_good, self.last_synced = done.matrix, done
        self._load_ledger()
        self.drop_ended_grants(done.leases, done.records, done.ended)
        # The admission's first try reads none of these again (its commit checks the
        # matrix's versions, so a stale read only costs a second try).
        self._synced_live, self._read_waiting = sorted(done.records), waiting
        self._read_matrix = (done.matrix, done.version)
        return self.admit()

    def _sync(self) -> Synced:
        """The sync; a damaged matrix is rewritten only once it has read damaged for
        REPAIR_AFTER_S (an admin's migration or reshard passes through states that read
        damaged for a moment: the keeper must not race it)."""
        due = self._damaged_at is not None and \
            time.monotonic() - self._damaged_at >= REPAIR_AFTER_S
        grants: Mapping[str, Held] = self.reader.grants
        forced = self.preempter.forced(grants, self.clock()) if self.preempter.notices \
            else set()
        if forced:  # past their notice's deadline: drained, never restored
            grants = {key: held for key, held in grants.items() if key not in forced}
        try:
            done = sync(self.store, grants, self.cache, self._last_good,
                        repair=due, memo=self._memo,
                        registered_hosts=self.hosts, live_leases=self.leases.leases,
                        drain=forced, mark=self.preempter.mark_gone, shards=self.shards)
        except MatrixDamaged:
            if self._damaged_at is None:
                self._damaged_at = time.monotonic()
            raise
        self._damaged_at = None
        return done

    def _load_ledger(self) -> None:
        """The ledger's first read, once the reader knows the running grants."""
        if not self.ledger.loaded and self.reader.read_once:
            self.ledger.load(self.reader.grants, self.reader.granted)

    def drop_ended_grants(self, leases: set[str],
                          records: Mapping[str, AgentRecord] | None = None,
                          ended_jobs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """A grant lives while its job's lease does: the sync has drained or freed the
        cells of a job whose lease is gone, so its grant goes too, in the transaction that
        ends its attempt in the usage ledger (``records``: the agents', for GPU models;
        ``ended_jobs``: the ended jobs' records the sync read, for words). Launchers wait
        for the grant's deletion (``Store.matrix.wait_settled``): never deferred."""
        ended = [key for key in self.reader.grants if key not in leases]
        if not ended:
            return
        if self.ledger.loaded:
            for key in self.ledger.close(ended, self.reader.grants, records or {},
                                         ended_jobs or {}):
                self._forget_grant(key)
            return
        if len(ended) > 1:  # one transaction for all (one request, one log entry)
            tx = self.store.client.transaction()
            for key in ended:
                tx.delete(self.store.layout.grant(key))
            if not any(isinstance(r, Exception) for r in tx.commit()):
                for key in ended:
                    self._forget_grant(key)
                return
        pending = [(key, self.store.client.delete_async(self.store.layout.grant(key)))
                   for key in ended]  # one of them gone already: each on its own
        for key, result in pending:
            with contextlib.suppress(NoNodeError):
                result.get(timeout=30)
            self._forget_grant(key)

    def _forget_grant(self, key: str) -> None:
        self.reader.grants.pop(key, None)
        self.reader.granted.pop(key, None)
        self.reader.terms.pop(key, None)

    def live_hosts(self) -> list[str]:
        """Registered hosts with an agent record: those the sync just read (once), else
        from the keeper's records."""
        live, self._synced_live = self._synced_live, None
        return live if live is not None else sorted(self.cache.records(self.store.hosts()))

    def admit(self) -> list[Decision]:
        """One pass; returns the decisions (admitted and refused ones committed)."""
        def attempt(_retries: int) -> list[Decision]:
            seen, self._read_matrix = self._read_matrix, None
            matrix, version = seen or self.store.matrix.read(cache=self.shards)
            waiting, self._read_waiting = self._read_waiting, None
            if waiting is None:
                waiting = self.reader.waiting()
            waiting = [w for w in waiting if self.committer.writable(w.task_key)]
            live = self.live_hosts()
            limits = self.limits()
            versions = {key: v for key, (_, v) in self.reader.records.items()}
            waiting, screened = self.screen(waiting, versions, matrix, limits)
            waiting = self.preempter.requeue(waiting, self.reader.grants)
            refusals = {**{key: why for key, (_, _, why) in self.reader.rejected.items()
                           if self.committer.writable(key)}, **screened}
            self._load_ledger()
            now = self.clock()
            users = {w.user for w in waiting}
            fair = self.ledger.fairshare(users, limits, now) if self.half_life_s > 0 \
                else None
            decisions = admission_pass(matrix, live, waiting, self.user_gpu_limit, limits,
                                       fair, self.ledger.over_budget(users, limits, now))
            settled = [d for d in decisions if d.admitted or d.refused]
            settled += [Decision(key, 0, INVALID, refused=True) for key in sorted(refusals)]
            jobs = {w.task_key: w for w in clamped(waiting, limits)}
            if settled:
                outcome = self.committer.commit(matrix, version, settled, live, limits,
                                                 refusals, jobs)
                if outcome is not Commit.COMMITTED:  # a conflict, or a first part of a large pass
                    raise ForceRetryError()  # committed: read and decide again
            self._preempt(decisions, jobs, matrix, live, limits, fair, now)
            self.publish(decisions, jobs, self.preempter.reasons(decisions))
            return decisions

        return until_committed(attempt, "admitting waiting jobs")

    def _preempt(self, decisions: list[Decision], jobs: Mapping[str, Waiting], matrix: Matrix,
                 live: list[str], limits: UserLimits, fair: Fairshare | None,
                 now: float) -> None:
        """After a committed pass (hypertf.keeper.preempter): preempt for the jobs left
        waiting for GPUs, on the matrix as this pass's admissions left it."""
        if not self.preempt.on and not self.preempter.notices:
            self.preempter.busy = set()
            return  # off: nothing to decide, nothing to keep
        after = matrix
        for decision in decisions:
            if decision.admitted:
                held = Held.of(decision.placements, decision.ports)
                after = after.take(decision.task_key, held.gpus, held.ports)

        def standing() -> Standing:
            """Each user's factor among those running or waiting, their usage from the
            ledger and the GPUs held once this pass's admissions are counted."""
            users = {key.partition(".")[2] for key in self.reader.grants} | \
                {job.user for job in jobs.values()}
            share = self.ledger.fairshare(users, limits, now)
            share.held = after.held_per_user()
            return Standing(share.factors(users))

        fair_on = fair is not None and fair.on
        self.preempter.after_pass(decisions, jobs, self.reader.grants, self.reader.granted,
                                  self.reader.terms, after, live, limits,
                                  standing if fair_on else None, now)

    def publish(self, decisions: list[Decision], waiting: Mapping[str, Waiting],
                reasons: Mapping[str, str] | None = None) -> None:
        """``keeper/queue``: an ephemeral of the keeper's session, rewritten on change;
        ``reasons`` over the pass's (the preemption's ``Preempting``, ``Requeued``)."""
        data = encode_view(view_of(decisions, waiting, reasons, self.preempter.counts,
                                   self.reader.records))
        if data == self.published:
            return
        path = self.store.layout.queue_view
        try:
            self.store.client.set(path, data)
        except NoNodeError:
            try:
                self.store.client.create(path, data, acl=self.store.acls.keeper_lease(),
                                         ephemeral=True)
            except NodeExistsError:
                return  # an older keeper's session still holds it: next pass
            except (NoNodeError, NoAuthError):
                pass  # a root secured before the keeper existed: waiters poll, no view
        self.published = data


SCRIPT_SHOWN = 200  # a waiting job's script in the view: what ``hypertf queue`` prints
VIEW_BYTES_MAX = 512 * 1024  # past it the view keeps the first entries and says how many


def view_of(decisions: list[Decision], waiting: Mapping[str, Waiting],
            reasons: Mapping[str, str] | None = None,
            preemptions: Mapping[str, int] | None = None,
            records: Mapping[str, tuple[Mapping[str, Any], int]] | None = None,
            ) -> dict[str, Any]:
    """What waiters and ``hypertf queue`` show: every job still waiting, in order (with
    ``records``, the waiting jobs' records the keeper read: each one's shape, script and
    creation, so the command reads this view alone); and ``preemptions_total`` (per
    reason, this keeper's term: hypertf_preemptions_total)."""
    entries: list[dict[str, Any]] = []
    shown = reasons or {}
    for d in decisions:
        if d.admitted or d.refused:
            continue
        job = waiting[d.task_key]
        entry = {"task_key": d.task_key, "position": len(entries) + 1,
                 "reason": shown.get(d.task_key, d.reason), "priority": job.priority,
                 "gpus": job.request.gpus}
        record = records.get(d.task_key) if records is not None else None
        if record is not None:
            created, script = record[0].get("created"), record[0].get("script", "")
            entry.update(shape=job.request.describe(),
                         script=plain_text(script, SCRIPT_SHOWN),
                         created=created if type(created) in (int, float) else None)
        entries.append(entry)
    view: dict[str, Any] = {"waiting": entries}
    if preemptions is not None:
        view["preemptions_total"] = dict(preemptions)
    return view


def encode_view(view: dict[str, Any]) -> bytes:
    """The view's bytes, within VIEW_BYTES_MAX: a queue too long for one znode keeps its
    first entries (``truncated``: how many there are), so the pass never fails on it."""
    entries: list[Any] = view["waiting"]
    keep, extra = len(entries), dict[str, int]()
    while True:
        try:
            data = encode({**view, "waiting": entries[:keep], **extra})
        except errors.StoreError:  # past ZooKeeper's bound
            data = b""
        if (data and len(data) <= VIEW_BYTES_MAX) or keep == 0:
            return data or encode({"waiting": [], "truncated": len(entries)})
        keep, extra = keep // 2, {"truncated": len(entries)}
