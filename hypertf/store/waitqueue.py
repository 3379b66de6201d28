"""The queue in ZooKeeper: jobs that wait for GPUs, and their admission by the keeper.

A waiting job is an ordinary job whose record says ``queued``: its launcher creates the
lease (ephemeral, tied to its session) and the record (with the request and the priority)
in one transaction, then watches only its own record (and, once it has waited a while, the
queue's view).

**Who admits.** The matrix keeper (the agent holding ``keeper/lease``; see hypertf.node.agent)
runs ``Admitter.admit`` after each sync: ``admission.admission_pass`` decides every waiting
job, and all the jobs admitted in a pass are committed in ONE transaction: the matrix
(version-checked), and per job a check that its lease still lives and its record written
``allocated`` with placements and ports (version-checked against a cancel). A keeper that
dies mid-admission commits everything or nothing; the next keeper starts the pass again.

**Pitfalls, on purpose.**
- *Herd effect*: waiters never compete for a lock and never read the matrix or the records
  of 1000 hosts: each waits on its own record (admission, refusal, cancel, lost) and, only
  after VIEW_AFTER_S, one small view (``keeper/queue``, position and reason), rewritten
  only when it changes: a view that every submitter watched from the start was re-read by
  all of them at every pass (25 -> 9 ZooKeeper requests per job at 32 submitters).
- *A waiter's session lost*: its lease goes with it, the admitting transaction checks the
  lease, so a job whose launcher is gone is never admitted (and is marked ``lost``).
- *Sequence overflow*: no sequential znode is used; FIFO order is the record's creation
  zxid, ZooKeeper's 64-bit transaction id.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, cast

from kazoo.exceptions import BadVersionError, NoAuthError, NodeExistsError, NoNodeError
from kazoo.protocol.states import WatchedEvent
from kazoo.retry import ForceRetryError

from hypertf.core import jobtransitions as transitions
from hypertf.core.admission import (
    HELD,
    PRIORITY,
    RESOURCES,
    USER_LIMIT,
    Decision,
    Waiting,
    admission_pass,
    clamped,
    fits_cluster,
)
from hypertf.core.errors import Cancelled, InsufficientResources, NotAllowed, StoreError, UsageError
from hypertf.core.grants import grant_from_json, grant_to_json, held_of_grant
from hypertf.core.jobrecord import JobRecord, JobState, Owner, RefusedKind
from hypertf.core.limits import UserLimits
from hypertf.core.matrix import Held, Matrix
from hypertf.core.placement import Grant, Request, cannot_place, compact_hosts
from hypertf.core.requestcheck import (
    DEFAULT_PORT_RANGE,
    MAX_RECORD_BYTES,
    InvalidRequest,
    PortBounds,
    waiting_from_record,
)
from hypertf.store import RecordCache, Store, decode, encode, owner_of, until_committed
from hypertf.store.allocation import (
    TRANSACTION_BYTES,
    MatrixDamaged,
    MatrixVersion,
    Synced,
    SyncMemo,
    check_registered,
    matrix_writes,
    owner_info,
    read_matrix,
    sync,
)
from hypertf.store.jobs import mark_lost, read_job
from hypertf.store.leasecache import LeaseCache
from hypertf.store.zkclient import get_many, pipelined

log = logging.getLogger(__name__)
QUEUED = JobState.QUEUED
INVALID = "Invalid"  # refused before the pass: invalid, past a limit, never fits
FULL_READ_S = 10.0  # every waiting record read again at least this often (a lost watch)
REPAIR_AFTER_S = 2.0  # a matrix that reads damaged this long is rewritten by the keeper
LIMITS_READ_S = 5.0  # the admin's limits read again at least this often
VIEW_AFTER_S = 0.25  # a job admitted sooner never reads the queue's view
LEASE_CHECK_S = 2.0  # a waiter checks its lease this often (no keeper: nobody marks it)


# -- the request as the record keeps it --------------------------------------------------
def request_to_json(request: Request, priority: int,
                    exclude_ports: Mapping[str, set[int]] | None = None,
                    wait: bool = True) -> dict[str, Any]:
    """Compact: 1000 hosts share one port range, so only the differing ones are listed."""
    ranges = Counter(tuple(r) for r in request.port_ranges.values())  # not list.count:
    common = ranges.most_common(1)[0][0] if ranges else DEFAULT_PORT_RANGE  # quadratic
    return {"priority": priority, "hosts": compact_hosts(request.hosts), "policy": request.policy,
            "slots": [[s.role, s.index, s.gpus] for s in request.slots],
            "port_range": list(common),
            "port_ranges": {h: list(r) for h, r in request.port_ranges.items()
                            if tuple(r) != tuple(common)},
            "exclude_ports": {h: sorted(p) for h, p in (exclude_ports or {}).items() if p},
            "held": False, "no_wait": not wait}


def enqueue(store: Store, task_key: str, request: Request, record: Mapping[str, Any],
            priority: int = 0, exclude_ports: Mapping[str, set[int]] | None = None,
            wait: bool = True) -> None:
    """The lease and the ``queued`` record, in one transaction, in the owner's folders (the
    only places a user may write). ``wait`` False (--no-wait): the keeper admits the job in
    its next pass or refuses it."""
    if not request.slots:
        raise UsageError("a job needs at least one task")
    owner = cast(Owner, {**owner_info(), "user": owner_of(task_key)})
    job = transitions.queued(task_key, owner,
                             request_to_json(request, priority, exclude_ports, wait),
                             request.policy, record, time.time())
    tx = store.client.transaction()
    tx.create(store.layout.lease(task_key), encode(owner), acl=store.acls.lease(),
              ephemeral=True)
    tx.create(store.layout.job(task_key), encode(job), acl=store.acls.job())
    errors = [r for r in tx.commit() if isinstance(r, Exception)]
    if errors:
        check_registered(store, owner_of(task_key))  # the likely cause, named
        raise StoreError(f"ZooKeeper refused to queue job {task_key}: {errors}")


def submit(store: Store, request: Request, task_key: str,
           record: Mapping[str, Any] | None = None, *, priority: int = 0,
           exclude_ports: Mapping[str, set[int]] | None = None, wait: bool = True,
           say: Callable[[str], None] | None = None,
           lost_session: threading.Event | None = None) -> Grant:
    """The one way to take GPUs: queue the request, and return the grant once the keeper
    admitted it. With ``wait`` False, InsufficientResources when the keeper refuses it (it
    could not start at once); the lease is dropped then, and on any error."""
    enqueue(store, task_key, request, record or {}, priority, exclude_ports, wait)
    try:
        return wait_for_admission(store, task_key, say or (lambda _line: None),
                                  lost_session or threading.Event())
    except BaseException:
        with contextlib.suppress(Exception):
            store.client.delete(store.layout.lease(task_key))
        raise


def read_grant(store: Store, task_key: str) -> Grant | None:
    """The keeper's grant of ``task_key`` (None: it granted nothing). The one thing a
    launcher starts tasks on: only the keeper's identity writes ``grants/``."""
    try:
        data, _ = store.client.get(store.layout.grant(task_key))
    except NoNodeError:
        return None
    try:
        return grant_from_json(data, task_key)
    except ValueError as err:
        raise StoreError(f"{err}: the job does not start; ask the cluster admin") from None


def set_held(store: Store, task_key: str, held: bool) -> None:
    """``hypertf hold``/``unhold``: a held job keeps its place but is not admitted (and
    reserves nothing). Only a waiting job; the record's ACL lets only its owner (and the
    admin) write it."""
    def attempt(_retries: int) -> None:
        try:
            data, stat = store.client.get(store.layout.job(task_key))
        except NoNodeError:
            raise UsageError(f"no job {task_key!r}; list them with 'hypertf queue'") from None
        record = decode(data, "job record")
        try:
            changed = transitions.held(record, held)
        except ValueError:
            raise UsageError(f"job {task_key} is not waiting in the queue "
                             f"({record.get('state')}): only a waiting job can be held"
                             ) from None
        try:
            store.client.set(store.layout.job(task_key), encode(changed), version=stat.version)
        except BadVersionError:
            raise ForceRetryError() from None
        except NoAuthError:
            raise NotAllowed(f"job {task_key} belongs to {owner_of(task_key)}: only they or "
                             f"the admin may hold it") from None

    until_committed(attempt, f"holding job {task_key}")


# -- reading the queue -------------------------------------------------------------------
@dataclass
class QueueReader:
    """Reads the waiting jobs; remembers the keys it saw were not waiting (granted, ended,
    refused), so a pass reads only the records of waiting and new jobs, in parallel.

    Every record is its owner's to write, so each is checked (``requestcheck``) before a
    pass uses it; what fails is in ``rejected`` with the reason the keeper refuses it with.
    What running jobs hold (``grants``) comes only from ``grants/``, which only the keeper
    writes: a record's own placements or state never count (a new keeper reads the grants
    once, then keeps its own admissions)."""

    store: Store
    settled: set[str] = field(default_factory=set)
    records: dict[str, tuple[dict[str, Any], int]] = field(default_factory=dict)
    grants: dict[str, Held] = field(default_factory=dict)
    rejected: dict[str, tuple[dict[str, Any] | None, int, str]] = field(default_factory=dict)
    writes: bool = True  # the keeper's reader marks lost waiters; ``hypertf queue``'s does not
    _known: dict[str, tuple[dict[str, Any] | None, int, Waiting | None, str]] = field(
        default_factory=dict)
    _dirty: set[str] = field(default_factory=set)
    _full_at: float = 0.0

    read_once: bool = False  # a first read: the running jobs' grants come from grants/

    def load_grants(self) -> None:
        """Every grant the keeper's identity wrote: what running jobs hold."""
        client, layout = self.store.client, self.store.layout
        try:
            keys = sorted(client.get_children(layout.grants))
        except NoNodeError:
            return
        answers = get_many(client, [layout.grant(key) for key in keys])
        for key, answer in zip(keys, answers, strict=True):
            if isinstance(answer, NoNodeError):
                continue
            if isinstance(answer, Exception):
                raise answer
            try:
                self.grants[key] = held_of_grant(grant_from_json(answer[0], key))
            except ValueError as err:
                log.error("grant of %s unreadable (%s): it holds nothing", key, err)

    def waiting(self, leases: set[str] | None = None) -> list[Waiting]:
        """The waiting jobs among the ``leases`` (read here when not given).

        A record is read (with a one-shot watch) when its key is new or its watch fired;
        a waiting record nobody changed is neither read nor checked again: 2,000 of one
        user's requests cost a pass nothing. Every FULL_READ_S all are read again (a watch
        set in a session that expired never fires)."""
        leases = self.store.leases() if leases is None else leases
        if not self.read_once:
            self.load_grants()
            self.read_once = True
        self.settled &= leases
        self.settled |= set(self.grants) & leases  # granted: never waiting again
        gone = set(self.records) - leases
        if self.writes:
            for key in gone:  # a waiter whose lease went without a cancel: launcher gone
                mark_lost(self.store, key)
        keys = sorted(leases - self.settled)
        self._known = {key: known for key, known in self._known.items() if key in leases}
        now = time.monotonic()
        if now >= self._full_at:
            self._full_at = now + FULL_READ_S
            fresh = keys
        else:
            fresh = [key for key in keys if key not in self._known or key in self._dirty]
        self._dirty.difference_update(fresh)
        for key, answer in self._read(fresh):
            if isinstance(answer, NoNodeError):
                self._known.pop(key, None)
                continue  # not written yet (the launcher's transaction)
            if isinstance(answer, Exception):
                raise answer
            data, stat = answer
            self._known[key] = self._check(key, data, stat.version, stat.czxid)
        self.records, self.rejected = {}, {}
        found = []
        for key in keys:
            known = self._known.get(key)
            if known is None:
                continue
            record, version, job, why = known
            if why:
                self.rejected[key] = (record, version, why)
            elif job is None:
                self.settled.add(key)  # admitted, ended, or set "allocated" by hand
                self._known.pop(key, None)
            else:
                self.records[key] = (record or {}, version)
                found.append(job)
        return found

    def _read(self, keys: list[str]) -> list[tuple[str, Any]]:
        """Each key's record and stat (or the error). The keeper's reader reads each with
        a one-shot watch (the next pass reads only what changed); a one-off reader
        (``hypertf queue``) needs no watch, so it uses multi-reads: 4,000 single reads of
        a fresh process took ~6 s on a loaded machine."""
        client, layout = self.store.client, self.store.layout
        if not self.writes:
            return list(zip(keys, get_many(client, [layout.job(key) for key in keys]),
                            strict=True))
        with pipelined(client):
            pending = [(key, client.get_async(layout.job(key), watch=self._changed))
                       for key in keys]
        answers: list[tuple[str, Any]] = []
        for key, result in pending:
            try:
                answers.append((key, result.get(timeout=30)))
            except NoNodeError as err:
                answers.append((key, err))
        return answers

    def forget(self, key: str) -> None:
        """A job decided (admitted or refused): not waiting any more."""
        self._known.pop(key, None)

    def _changed(self, event: WatchedEvent) -> None:
        if event.path:  # None: the session's own event (it expired); the next read sees all
            self._dirty.add(event.path.rpartition("/")[2])

    @staticmethod
    def _check(key: str, data: bytes, version: int, order: int,
               ) -> tuple[dict[str, Any] | None, int, Waiting | None, str]:
        """(record, version, the waiting job or None when it is not waiting, why it is
        refused or "")."""
        if len(data) > MAX_RECORD_BYTES:
            return None, version, None, (f"invalid request: its record is {len(data):,} "
                                         f"bytes (at most {MAX_RECORD_BYTES:,})")
        try:
            record = decode(data, "job record")
        except StoreError as err:
            return None, version, None, f"invalid request: {err}"
        if record.get("state") != QUEUED:
            # admitted, ended, or a record its owner set to "allocated" by hand: only the
            # keeper's grant admits, so it is never waiting again
            return record, version, None, ""
        try:
            return record, version, waiting_from_record(record, order, key), ""
        except InvalidRequest as err:
            return record, version, None, f"invalid request: {err}"


@dataclass
class Screen:
    """Refusals decided before a pass, from the admin's limits and the cluster's size: a
    request past its owner's GPU limit, one no cluster state could ever fit (it would
    reserve hosts for nothing), and a user's waiting jobs past ``queue_limit`` (oldest
    first kept). Whether a request can ever fit is decided once per record version, and
    once per shape: 1,000 waiting jobs that ask the same of 25,000 hosts cost one scan of
    them (a new ``hypertf queue`` process scanned them once per job: ~20 s)."""

    user_gpu_limit: int = 0
    queue_limit: int = 0
    port_bounds: PortBounds | None = None  # the inventory's port ranges (the agent's keeper)
    _fits: dict[tuple[str, int, int], bool] = field(default_factory=dict)
    _ports: dict[tuple[str, int], str] = field(default_factory=dict)  # why, per version
    _shapes: dict[tuple[object, ...], bool] = field(default_factory=dict)
    _sizes: tuple[tuple[str, ...], tuple[int, ...]] = ((), ())  # the rows the shapes saw

    def __call__(self, waiting: list[Waiting], versions: Mapping[str, int], matrix: Matrix,
                 limits: UserLimits) -> tuple[list[Waiting], dict[str, str]]:
        kept, refused = [], {}
        per_user: Counter[str] = Counter()
        rows = len(matrix.gpus)
        sizes = (tuple(matrix.gpus), tuple(map(len, matrix.gpus.values())))
        if sizes != self._sizes:  # a host's GPUs came or went: judge every shape again
            self._shapes.clear()
            self._sizes = sizes
        for job in sorted(waiting, key=lambda w: (w.order, w.task_key)):
            cap = limits.gpu_limit(job.user, self.user_gpu_limit)
            why = ""
            if cap and job.request.gpus > cap:
                why = (f"it asks for {job.request.gpus} GPUs, more than the {cap} {job.user} "
                       f"may hold at once (hypertf_user_gpu_limit, or the admin's 'hypertf "
                       f"auth limits'): ask for fewer GPUs")
            elif ports := self._ports_outside(job, versions.get(job.task_key, 0)):
                why = f"invalid request: {ports}"
            elif not self._ever_fits(job, versions.get(job.task_key, 0), matrix, rows):
                why = (f"{job.request.describe()}: more than the cluster's hosts can ever "
                       f"hold; ask for fewer tasks or GPUs")
            elif self.queue_limit and per_user[job.user] >= self.queue_limit:
                why = (f"{job.user} has {self.queue_limit} jobs waiting already "
                       f"(hypertf_user_queue_limit): submit it again when some have started, "
                       f"or cancel some ('hypertf queue')")
            if why:
                refused[job.task_key] = why
                continue
            per_user[job.user] += 1
            kept.append(job)
        return kept, refused

    def _ports_outside(self, job: Waiting, version: int) -> str:
        """Why the job's port ranges reach past the inventory's (once per record version)."""
        if self.port_bounds is None:
            return ""
        known = self._ports.get((job.task_key, version))
        if known is None:
            if len(self._ports) > 100_000:
                self._ports.clear()
            known = self._ports[(job.task_key, version)] = self.port_bounds.outside(
                job.request.port_ranges)
        return known

    def _ever_fits(self, job: Waiting, version: int, matrix: Matrix, rows: int) -> bool:
        known = self._fits.get((job.task_key, version, rows))
        if known is None:
            request = job.request
            shape = (request.hosts, request.slots, request.policy, rows)
            known = self._shapes.get(shape)
            if known is None:
                known = _could_ever_fit(request, matrix)
                if len(self._shapes) > 10_000:
                    self._shapes.clear()
                self._shapes[shape] = known
            if len(self._fits) > 100_000:
                self._fits.clear()
            self._fits[(job.task_key, version, rows)] = known
        return known


def _could_ever_fit(request: Request, matrix: Matrix) -> bool:
    """Whether ``request`` fits the matrix's hosts were every GPU free: by the counts, and
    exactly (a schedule) where the hosts are few enough for that to be cheap."""
    sizes = [len(matrix.gpus.get(h, ())) for h in request.hosts]
    biggest = max((slot.gpus for slot in request.slots), default=0)
    known = request.gpus <= sum(sizes) and biggest <= max(sizes, default=0)
    if known and len(request.hosts) <= 512:
        known = fits_cluster(request, matrix, [h for h in request.hosts if h in matrix.gpus])
    return known


def read_limits(store: Store, watch: Callable[..., Any] | None = None) -> UserLimits:
    """The admin's per-user ceilings (defaults when the root has none yet); ``watch``:
    called once when they are set, created or deleted."""
    try:
        data, _ = store.client.get(store.layout.limits, watch=watch)
    except NoNodeError:
        if watch is not None and store.client.exists(store.layout.limits, watch=watch):
            return read_limits(store, watch)  # created in between: read it
        return UserLimits()
    try:
        return UserLimits.from_json(data)
    except (StoreError, TypeError, ValueError, AttributeError):
        return UserLimits()  # damaged: the defaults, never a user's wish


# -- admitting ---------------------------------------------------------------------------
class Commit(Enum):
    """What committing a pass's decisions did."""

    COMMITTED = "committed"
    CONFLICT = "conflict"  # another writer won: read and decide again
    PART = "part"  # too large for one transaction: a first part committed, the rest next


@dataclass
class Admitter:
    """The keeper's pass: sync the matrix, decide every waiting job, commit admissions
    (each with its grant) and refusals in one transaction, publish the view."""

    store: Store
    user_gpu_limit: int = 0
    user_queue_limit: int = 0
    host_gpus_max: int = 0  # a host's record claiming more GPUs counts it down (0: none)
    port_bounds: PortBounds | None = None  # the inventory's port ranges (None: unchecked)
    reader: QueueReader = field(init=False)
    cache: RecordCache = field(init=False)
    leases: LeaseCache = field(init=False)
    screen: Screen = field(init=False)
    published: bytes | None = None
    unwritable: set[str] = field(default_factory=set)  # records whose ACL shuts the keeper out
    _synced_live: list[str] | None = None
    _read_waiting: list[Waiting] | None = None
    _read_matrix: tuple[Matrix, MatrixVersion] | None = None
    _last_good: Matrix | None = None  # the last matrix read whole: fills a damaged shard
    _damaged_at: float | None = None  # when the matrix first read damaged (monotonic)
    _limits: UserLimits | None = None  # the admin's, until the watch on them fires
    _limits_read: float = 0.0
    _memo: SyncMemo = field(default_factory=SyncMemo)  # what the last in-line sync went by
    # The registered hosts as the keeper role's watch keeps them (None: listed each pass).
    hosts: Callable[[], list[str]] | None = None

    def __post_init__(self) -> None:
        self.reader = QueueReader(self.store)
        self.cache = RecordCache(self.store, gpus_max=self.host_gpus_max)
        self.leases = LeaseCache(self.store)
        self.screen = Screen(self.user_gpu_limit, self.user_queue_limit, self.port_bounds)

    def keep(self) -> list[Decision]:
        """Sync (free ended jobs, repair running ones), then admit. Once the reader knows
        the running jobs' grants, the sync goes first and the queue is read with the
        leases it read (one listing of every user's leases per pass, not two)."""
        if not self.reader.read_once:  # fresh grants before the repair (a new keeper)
            waiting = self.reader.waiting(self.leases.leases())
            done = self._sync()
        else:
            done = self._sync()
            waiting = self.reader.waiting(done.leases)
        self._last_good = done.matrix
        self.drop_ended_grants(done.leases)
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
        try:
            done = sync(self.store, self.reader.grants, self.cache, self._last_good,
                        repair=due, memo=self._memo,
                        registered_hosts=self.hosts, live_leases=self.leases.leases)
        except MatrixDamaged:
            if self._damaged_at is None:
                self._damaged_at = time.monotonic()
            raise
        self._damaged_at = None
        return done

    def drop_ended_grants(self, leases: set[str]) -> None:
        """A grant lives while its job's lease does: the sync has drained or freed the
        cells of a job whose lease is gone, so its grant goes too."""
        ended = [key for key in self.reader.grants if key not in leases]
        if len(ended) > 1:  # one transaction for all (one request, one log entry)
            tx = self.store.client.transaction()
            for key in ended:
                tx.delete(self.store.layout.grant(key))
            if not any(isinstance(r, Exception) for r in tx.commit()):
                for key in ended:
                    self.reader.grants.pop(key, None)
                return
        pending = [(key, self.store.client.delete_async(self.store.layout.grant(key)))
                   for key in ended]  # one of them gone already: each on its own
        for key, result in pending:
            with contextlib.suppress(NoNodeError):
                result.get(timeout=30)
            self.reader.grants.pop(key, None)

    def live_hosts(self) -> list[str]:
        """Registered hosts with an agent record: those the sync just read (once), else
        from the keeper's records."""
        live, self._synced_live = self._synced_live, None
        return live if live is not None else sorted(self.cache.records(self.store.hosts()))

    def admit(self) -> list[Decision]:
        """One pass; returns the decisions (admitted and refused ones committed)."""
        def attempt(_retries: int) -> list[Decision]:
            seen, self._read_matrix = self._read_matrix, None
            matrix, version = seen or read_matrix(self.store)
            waiting, self._read_waiting = self._read_waiting, None
            if waiting is None:
                waiting = self.reader.waiting()
            waiting = [w for w in waiting if w.task_key not in self.unwritable]
            live = self.live_hosts()
            limits = self.limits()
            versions = {key: v for key, (_, v) in self.reader.records.items()}
            waiting, screened = self.screen(waiting, versions, matrix, limits)
            refusals = {**{key: why for key, (_, _, why) in self.reader.rejected.items()
                           if key not in self.unwritable}, **screened}
            decisions = admission_pass(matrix, live, waiting, self.user_gpu_limit, limits)
            settled = [d for d in decisions if d.admitted or d.refused]
            settled += [Decision(key, 0, INVALID, refused=True) for key in sorted(refusals)]
            if settled:
                outcome = self._commit(matrix, version, settled, live, limits, refusals)
                if outcome is not Commit.COMMITTED:  # a conflict, or a first part of a large pass
                    raise ForceRetryError()  # committed: read and decide again
            self.publish(decisions, {w.task_key: w for w in clamped(waiting, limits)})
            return decisions

        return until_committed(attempt, "admitting waiting jobs")

    def limits(self) -> UserLimits:
        """The admin's limits, read again after they changed (a watch) and at least every
        LIMITS_READ_S (a watch set in an expired session never fires)."""
        limits = self._limits
        if limits is None or time.monotonic() - self._limits_read > LIMITS_READ_S:
            self._limits_read = time.monotonic()
            limits = self._limits = read_limits(self.store, watch=self._limits_changed)
        return limits

    def _limits_changed(self, _event: object) -> None:
        self._limits = None

    def _record_of(self, key: str) -> tuple[dict[str, Any] | None, int]:
        if key in self.reader.records:
            return self.reader.records[key]
        record, version, _ = self.reader.rejected[key]
        return record, version

    def _commit(self, matrix: Matrix, version: MatrixVersion, settled: list[Decision],
                live: list[str], limits: UserLimits, refusals: Mapping[str, str]) -> Commit:
        """COMMITTED, CONFLICT, or PART (the pass's decisions would make a request
        past TRANSACTION_BYTES: the first half, or less, was committed; the rest is
        decided again by the next try). A record the keeper may not write (its owner
        shut the keeper out with its ACL) is left out of later passes, not retried."""
        taken = matrix
        tx = self.store.client.transaction()
        ops: list[str | None] = []  # the job each operation is for (None: the matrix)
        now = time.time()
        size = 0
        # Admissions first: a refusal names what is free once this pass's admissions took
        # their GPUs (two --no-wait jobs for the last GPU: the loser hears it is taken).
        for decision in sorted(settled, key=lambda d: d.refused):
            key = decision.task_key
            record, record_version = self._record_of(key)
            if decision.refused:
                why = refusals.get(key) or self.refusal(decision, record or {}, taken, live,
                                                        limits)
                invalid = key in self.reader.rejected  # its record failed the check
                data = encode(transitions.refused(None if invalid else record, key, why,
                                                  invalid=invalid, now=now))
                tx.set_data(self.store.layout.job(key), data, version=record_version)
                ops.append(key)
                size += len(data)
                continue
            held = Held.of(decision.placements, decision.ports)
            taken = taken.take(key, held.gpus, held.ports)
            tx.check(self.store.layout.lease(key), -1)
            data = encode(transitions.admitted(record, decision.placements, decision.ports,
                                               now))
            tx.set_data(self.store.layout.job(key), data, version=record_version)
            tx.create(self.store.layout.grant(key),
                      grant_to_json(key, decision.placements, decision.ports, now),
                      acl=self.store.acls.grant())
            ops += [key, key, key]
            size += 2 * len(data)
        # The shards the admissions changed, each version-checked; a refusal names what is
        # free everywhere, so then every shard is checked too.
        shards, written = matrix_writes(tx, self.store.layout, matrix, taken, version,
                                        check_rest=any(d.refused for d in settled))
        size += shards
        if size > TRANSACTION_BYTES and len(settled) > 1:
            first = self._commit(matrix, version, settled[:len(settled) // 2], live, limits,
                                 refusals)
            return Commit.PART if first is not Commit.CONFLICT else first
        results = tx.commit()
        culprit = next(((i, r) for i, r in enumerate(results) if isinstance(r, Exception)
                        and type(r).__name__ not in ("RolledBackError",
                                                     "RuntimeInconsistency")), None)
        if culprit is not None:
            i, error = culprit
            culprit_key = ops[i] if i < len(ops) else None
            if culprit_key is not None and isinstance(error, NoAuthError):
                log.warning("the record of %s does not let the keeper write it (its ACL): "
                            "it is never admitted", culprit_key)
                self.unwritable.add(culprit_key)
            elif culprit_key is not None and isinstance(error, NodeExistsError):
                log.error("%s already has a grant: it is not admitted again", culprit_key)
                self.reader.settled.add(culprit_key)
            return Commit.CONFLICT  # a cancel, a lost waiter or another writer: decide again
        if any(isinstance(r, Exception) for r in results):
            return Commit.CONFLICT
        self._memo.admitted(version, written, [d.task_key for d in settled if d.admitted])
        for decision in settled:
            self.reader.settled.add(decision.task_key)
            self.reader.records.pop(decision.task_key, None)  # no longer waiting
            self.reader.rejected.pop(decision.task_key, None)
            self.reader.forget(decision.task_key)
            if decision.admitted:
                self.reader.grants[decision.task_key] = Held.of(decision.placements,
                                                                decision.ports)
        return Commit.COMMITTED

    def refusal(self, decision: Decision, record: Mapping[str, Any], matrix: Matrix,
                live: list[str], limits: UserLimits) -> str:
        """Why a --no-wait job cannot start now, naming what is free or the limit."""
        job = waiting_from_record(record, 0, decision.task_key)
        if decision.reason == USER_LIMIT:
            held = matrix.held_per_user().get(job.user, 0)
            cap = limits.gpu_limit(job.user, self.user_gpu_limit)
            return (f"{job.user} holds {held} GPUs; this job's {job.request.gpus} more would "
                    f"pass the limit of {cap} (hypertf_user_gpu_limit, or the admin's "
                    f"'hypertf auth limits')")
        why = cannot_place(job.request, matrix, live)
        return why or (f"the GPUs it needs are promised to jobs ahead of it in the queue "
                       f"({REASONS[PRIORITY]}); run it without --no-wait to wait in line")

    def publish(self, decisions: list[Decision], waiting: Mapping[str, Waiting]) -> None:
        """``keeper/queue``: an ephemeral of the keeper's session, rewritten on change."""
        data = encode(view_of(decisions, waiting))
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


def view_of(decisions: list[Decision], waiting: Mapping[str, Waiting]) -> dict[str, Any]:
    """What waiters and ``hypertf queue`` show: every job still waiting, in order."""
    entries: list[dict[str, Any]] = []
    for d in decisions:
        if d.admitted or d.refused:
            continue
        job = waiting[d.task_key]
        entries.append({"task_key": d.task_key, "position": len(entries) + 1,
                        "reason": d.reason, "priority": job.priority,
                        "gpus": job.request.gpus})
    return {"waiting": entries}


def read_view(store: Store, watch: Callable[..., Any] | None = None) -> list[dict[str, Any]]:
    """The keeper's last view of the queue ([] when there is none)."""
    try:
        data, _ = store.client.get(store.layout.queue_view, watch=watch)
    except NoNodeError:
        return []
    return list(decode(data, "queue view").get("waiting", []))


REASONS = {
    RESOURCES: "not enough free GPUs yet",
    PRIORITY: "jobs ahead of it (higher priority, or earlier) wait for the GPUs it needs",
    USER_LIMIT: "its owner's running jobs are at hypertf_user_gpu_limit",
    HELD: "held",
}


def wait_for_admission(store: Store, task_key: str, say: Callable[[str], None],
                       lost_session: threading.Event) -> Grant:
    """Block until the keeper admits ``task_key``; say its position and reason whenever
    they change. Returns the keeper's grant (never the record's own placements: its owner
    may write those); raises Cancelled when the lease goes.

    Few requests, since every submitter pays them at every job: a one-shot watch on its
    own record (set with ``exists``: the record is as it created it), then, each time the
    watch fires, a read of the grant (the keeper's admission writes both) and, without
    one, of the record with a new watch (a refusal, a cancel, and ``lost`` when the lease
    went without one are written there). Only a job still waiting after VIEW_AFTER_S
    reads and watches the queue's view (its position) and checks its lease every
    LEASE_CHECK_S (a root without a keeper marks no lost job)."""
    fired: set[str] = set()
    wake = threading.Event()
    job_path, view_path = store.layout.job(task_key), store.layout.queue_view

    def changed(event: WatchedEvent) -> None:
        fired.add(event.path)
        wake.set()

    since = time.monotonic()
    lease_checked = since
    fired.add(job_path)
    first = True
    watching_view = False
    shown: tuple[int, int, str] | None = None
    while True:
        if lost_session.is_set():
            raise StoreError(f"lost the ZooKeeper session while job {task_key} waited: its "
                             f"place in the queue is gone and it will never start; submit "
                             f"it again")
        lease_gone = False
        if time.monotonic() - lease_checked >= LEASE_CHECK_S:
            lease_checked = time.monotonic()
            # the record too, as if its watch fired: across a ZooKeeper outage a waiter's
            # watch can be lost (test_outage waited forever without this read)
            fired.add(job_path)
            lease_gone = store.client.exists(store.layout.lease(task_key)) is None
        if first:  # the record as this waiter created it (version 0): a watch only
            first = False
            fired.discard(job_path)
            stat = store.client.exists(job_path, watch=changed)
            if stat is not None and stat.version > 0:
                fired.add(job_path)  # changed already: read it
        elif job_path in fired and not lease_gone:
            # the grant first: the keeper writes it with the record's admission, and it is
            # what a launcher starts on (one read per admitted job instead of two)
            grant = read_grant(store, task_key)
            if grant is not None:
                return grant
        if job_path in fired:
            fired.discard(job_path)
            record = read_job(store, task_key, watch=changed) or JobRecord()
            if _admission_end(record, task_key, lease_gone) is not None:
                grant = read_grant(store, task_key)
                if grant is None:
                    raise NotAllowed(f"job {task_key}'s record says it was admitted, but the "
                                     f"keeper granted it nothing (the record was written by "
                                     f"hand?): it does not start")
                return grant
        if not watching_view and time.monotonic() - since >= VIEW_AFTER_S:
            watching_view = True
            fired.add(view_path)
        if view_path in fired:
            fired.discard(view_path)
            view = read_view(store, watch=changed)
            mine = next((e for e in view if e["task_key"] == task_key), None)
            if mine is not None:
                now = (int(mine["position"]), len(view), str(mine["reason"]))
                if now != shown:
                    shown = now
                    say(f"hypertf: job {task_key} waits in the queue: position {now[0]} of "
                        f"{now[1]} ({now[2]}: {REASONS.get(now[2], now[2])})")
        wake.wait(LEASE_CHECK_S if watching_view else
                  max(0.0, VIEW_AFTER_S - (time.monotonic() - since)))
        wake.clear()


def _admission_end(record: JobRecord, task_key: str, lease_gone: bool) -> JobRecord | None:
    """The admitted record; None while it waits; raises for a refusal or a cancel."""
    state = record.get("state")
    if state == JobState.ALLOCATED:
        return record
    if state == JobState.REFUSED:
        why = str(record.get("refused_reason") or "the keeper could not start it now")
        if record.get("refused_kind") == RefusedKind.INVALID:
            raise UsageError(f"the keeper refused job {task_key}: {why}")
        raise InsufficientResources(why)
    if state != QUEUED or lease_gone:
        by = record.get("cancelled_by") or record.get("killed_by") or {}
        who = by.get("identity") or by.get("user")
        raise Cancelled(f"job {task_key} was cancelled while it waited"
                        + (f" (by {who} from {by.get('host', '?')})" if who else ""))
    return None
