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
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import BadVersionError, NoAuthError, NodeExistsError, NoNodeError
from kazoo.protocol.states import WatchedEvent
from kazoo.retry import ForceRetryError

from hypertf.core.admission import (
    HELD,
    PRIORITY,
    RESOURCES,
    USER_LIMIT,
    Decision,
    Waiting,
    admission_pass,
    clamped,
)
from hypertf.core.errors import Cancelled, InsufficientResources, NotAllowed, StoreError, UsageError
from hypertf.core.jobrecord import (
    JobRecord,
    JobState,
    held_of,
    placements_json,
    placements_of,
    ports_of,
)
from hypertf.core.limits import Limits
from hypertf.core.matrix import Held, Matrix
from hypertf.core.placement import (
    Grant,
    PortRanges,
    Request,
    cannot_place,
    compact_hosts,
    expand_hosts,
)
from hypertf.core.scheduler import TaskSlot
from hypertf.store import RecordCache, Store, decode, encode, owner_of, until_committed
from hypertf.store.allocation import (
    TRANSACTION_BYTES,
    MatrixVersion,
    check_registered,
    matrix_writes,
    owner_info,
    read_matrix,
    sync,
)
from hypertf.store.jobs import mark_lost, read_job
from hypertf.store.zkclient import get_many

QUEUED = JobState.QUEUED
DEFAULT_PORT_RANGE = (20000, 20999)
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


def waiting_from_record(record: Mapping[str, Any], order: int) -> Waiting:
    queue = record["queue"]
    hosts = expand_hosts(tuple(queue["hosts"]))
    low, high = queue.get("port_range", DEFAULT_PORT_RANGE)
    ranges = PortRanges(hosts, (int(low), int(high)), {
        h: (int(r[0]), int(r[1])) for h, r in queue.get("port_ranges", {}).items()})
    request = Request(slots=tuple(TaskSlot(r, i, g) for r, i, g in queue["slots"]),
                      hosts=hosts, policy=queue.get("policy", "round_robin"),
                      port_ranges=ranges)
    return Waiting(record["task_key"], request, priority=int(queue.get("priority", 0)),
                   order=order, held=bool(queue.get("held")),
                   exclude_ports={h: frozenset(p) for h, p in
                                  queue.get("exclude_ports", {}).items()},
                   no_wait=bool(queue.get("no_wait")))


def enqueue(store: Store, task_key: str, request: Request, record: Mapping[str, Any],
            priority: int = 0, exclude_ports: Mapping[str, set[int]] | None = None,
            wait: bool = True) -> None:
    """The lease and the ``queued`` record, in one transaction, in the owner's folders (the
    only places a user may write). ``wait`` False (--no-wait): the keeper admits the job in
    its next pass or refuses it."""
    if not request.slots:
        raise UsageError("a job needs at least one task")
    owner = {**owner_info(), "user": owner_of(task_key)}
    job = {"task_key": task_key, "state": QUEUED, "created": time.time(), "owner": owner,
           "policy": request.policy, "placements": [],
           "queue": request_to_json(request, priority, exclude_ports, wait), **record}
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
        admitted = wait_for_admission(store, task_key, say or (lambda _line: None),
                                      lost_session or threading.Event())
    except BaseException:
        with contextlib.suppress(Exception):
            store.client.delete(store.layout.lease(task_key))
        raise
    return grant_of(admitted)


def grant_of(record: Mapping[str, Any]) -> Grant:
    """The placements and ports an admitted job record holds."""
    return Grant(str(record["task_key"]), placements_of(record), ports_of(record))


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
        if record.get("state") != QUEUED or "queue" not in record:
            raise UsageError(f"job {task_key} is not waiting in the queue "
                             f"({record.get('state')}): only a waiting job can be held")
        record["queue"]["held"] = held
        try:
            store.client.set(store.layout.job(task_key), encode(record), version=stat.version)
        except BadVersionError:
            raise ForceRetryError() from None
        except NoAuthError:
            raise NotAllowed(f"job {task_key} belongs to {owner_of(task_key)}: only they or "
                             f"the admin may hold it") from None

    until_committed(attempt, f"holding job {task_key}")


# -- reading the queue -------------------------------------------------------------------
@dataclass
class QueueReader:
    """Reads the waiting jobs; remembers the keys it saw were not waiting (running jobs),
    so a pass reads only the records of waiting and new jobs, in parallel. What running
    jobs were granted is kept (``grants``): the keeper restores it if the matrix loses it."""

    store: Store
    settled: set[str] = field(default_factory=set)
    records: dict[str, tuple[dict[str, Any], int]] = field(default_factory=dict)
    grants: dict[str, Held] = field(default_factory=dict)

    read_once: bool = False  # a first read: the running jobs' grants come from their records

    def waiting(self, leases: set[str] | None = None) -> list[Waiting]:
        """The waiting jobs among the ``leases`` (read here when not given)."""
        leases = self.store.leases() if leases is None else leases
        self.read_once = True
        self.settled &= leases
        self.grants = {key: held for key, held in self.grants.items() if key in leases}
        gone = set(self.records) - leases
        for key in gone:  # a waiter whose lease went without a cancel: its launcher is gone
            mark_lost(self.store, key)
        keys = sorted(leases - self.settled)
        answers = get_many(self.store.client, [self.store.layout.job(key) for key in keys])
        self.records = {}
        found = []
        for key, answer in zip(keys, answers, strict=True):
            if isinstance(answer, NoNodeError):
                continue  # not written yet (the launcher's transaction)
            if isinstance(answer, Exception):
                raise answer
            data, stat = answer
            try:
                record = decode(data, "job record")
            except StoreError:
                continue  # unreadable
            if record.get("state") != QUEUED or "queue" not in record:
                self.settled.add(key)
                if record.get("placements") and key not in self.grants:
                    with contextlib.suppress(KeyError, TypeError, ValueError):
                        self.grants[key] = held_of(record)  # a new keeper
                continue
            try:
                job = waiting_from_record(record, stat.czxid)
            except (KeyError, TypeError, ValueError):
                continue  # its owner wrote a request no keeper can read: it waits unread
            self.records[key] = (record, stat.version)
            found.append(job)
        return found


def read_limits(store: Store, watch: Callable[..., Any] | None = None) -> Limits:
    """The admin's per-user ceilings (defaults when the root has none yet); ``watch``:
    called once when they are set, created or deleted."""
    try:
        data, _ = store.client.get(store.layout.limits, watch=watch)
    except NoNodeError:
        if watch is not None and store.client.exists(store.layout.limits, watch=watch):
            return read_limits(store, watch)  # created in between: read it
        return Limits()
    try:
        return Limits.from_json(data)
    except (StoreError, TypeError, ValueError, AttributeError):
        return Limits()  # damaged: the defaults, never a user's wish


# -- admitting ---------------------------------------------------------------------------
@dataclass
class Admitter:
    """The keeper's pass: sync the matrix, decide every waiting job, commit admissions and
    refusals in one transaction, publish the view."""

    store: Store
    user_gpu_limit: int = 0
    reader: QueueReader = field(init=False)
    cache: RecordCache = field(init=False)
    published: bytes | None = None
    _synced_live: list[str] | None = None
    _read_waiting: list[Waiting] | None = None
    _read_matrix: tuple[Matrix, MatrixVersion] | None = None
    _limits: Limits | None = None  # the admin's, until the watch on them fires
    _limits_read: float = 0.0

    def __post_init__(self) -> None:
        self.reader = QueueReader(self.store)
        self.cache = RecordCache(self.store)

    def keep(self) -> list[Decision]:
        """Sync (free ended jobs, repair running ones), then admit. Once the reader knows
        the running jobs' grants, the sync goes first and the queue is read with the
        leases it read (one listing of every user's leases per pass, not two)."""
        if not self.reader.read_once:  # fresh grants before the repair (a new keeper)
            waiting = self.reader.waiting()
            done = sync(self.store, self.reader.grants, self.cache)
        else:
            done = sync(self.store, self.reader.grants, self.cache)
            waiting = self.reader.waiting(done.leases)
        # The admission's first try reads none of these again (its commit checks the
        # matrix's versions, so a stale read only costs a second try).
        self._synced_live, self._read_waiting = sorted(done.records), waiting
        self._read_matrix = (done.matrix, done.version)
        return self.admit()

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
            live = self.live_hosts()
            limits = self.limits()
            decisions = admission_pass(matrix, live, waiting, self.user_gpu_limit, limits)
            settled = [d for d in decisions if d.admitted or d.refused]
            if settled:
                outcome = self._commit(matrix, version, settled, live, limits)
                if outcome != "committed":  # a conflict, or a first part of a large pass
                    raise ForceRetryError()  # committed: read and decide again
            self.publish(decisions, {w.task_key: w for w in clamped(waiting, limits)})
            return decisions

        return until_committed(attempt, "admitting waiting jobs")

    def limits(self) -> Limits:
        """The admin's limits, read again after they changed (a watch) and at least every
        LIMITS_READ_S (a watch set in an expired session never fires)."""
        limits = self._limits
        if limits is None or time.monotonic() - self._limits_read > LIMITS_READ_S:
            self._limits_read = time.monotonic()
            limits = self._limits = read_limits(self.store, watch=self._limits_changed)
        return limits

    def _limits_changed(self, _event: object) -> None:
        self._limits = None

    def _commit(self, matrix: Matrix, version: MatrixVersion, settled: list[Decision],
                live: list[str], limits: Limits) -> str:
        """"committed", "conflict", or "part" (the pass's decisions would make a request
        past TRANSACTION_BYTES: the first half, or less, was committed; the rest is
        decided again by the next try)."""
        taken = matrix
        tx = self.store.client.transaction()
        now = time.time()
        size = 0
        # Admissions first: a refusal names what is free once this pass's admissions took
        # their GPUs (two --no-wait jobs for the last GPU: the loser hears it is taken).
        for decision in sorted(settled, key=lambda d: d.refused):
            record, record_version = self.reader.records[decision.task_key]
            if decision.refused:
                data = encode({**record, "state": JobState.REFUSED, "refused": now,
                               "refused_reason": self.refusal(decision, record, taken, live,
                                                              limits)})
                tx.set_data(self.store.layout.job(decision.task_key), data,
                            version=record_version)
                size += len(data)
                continue
            held = Held.of(decision.placements, decision.ports)
            taken = taken.take(decision.task_key, held.gpus, held.ports)
            tx.check(self.store.layout.lease(decision.task_key), -1)
            data = encode({
                **record, "state": JobState.ALLOCATED, "admitted": now,
                "waited_s": round(now - float(record.get("created", now)), 3),
                "placements": placements_json(decision.placements, decision.ports)})
            tx.set_data(self.store.layout.job(decision.task_key), data, version=record_version)
            size += len(data)
        # The shards the admissions changed, each version-checked; a refusal names what is
        # free everywhere, so then every shard is checked too.
        size += matrix_writes(tx, self.store.layout, matrix, taken, version,
                              check_rest=any(d.refused for d in settled))
        if size > TRANSACTION_BYTES and len(settled) > 1:
            first = self._commit(matrix, version, settled[:len(settled) // 2], live, limits)
            return "part" if first != "conflict" else first
        errors = [r for r in tx.commit() if isinstance(r, Exception)]
        if errors:
            return "conflict"  # a cancel, a lost waiter or another writer: decide again
        for decision in settled:
            self.reader.settled.add(decision.task_key)
            self.reader.records.pop(decision.task_key, None)  # no longer waiting
            if decision.admitted:
                self.reader.grants[decision.task_key] = Held.of(decision.placements,
                                                                decision.ports)
        return "committed"

    def refusal(self, decision: Decision, record: Mapping[str, Any], matrix: Matrix,
                live: list[str], limits: Limits) -> str:
        """Why a --no-wait job cannot start now, naming what is free or the limit."""
        job = waiting_from_record(record, 0)
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
                       lost_session: threading.Event) -> JobRecord:
    """Block until the keeper admits ``task_key``; say its position and reason whenever
    they change. Returns the admitted record; raises Cancelled when the lease goes.

    Few requests, since every submitter pays them at every job: a read of its own record
    with a one-shot watch, and the same again each time the watch fires (the keeper's
    admission, a refusal, a cancel, and ``lost`` when the lease went without one are all
    written there). Only a job still waiting after VIEW_AFTER_S reads and watches the
    queue's view (its position) and checks its lease every LEASE_CHECK_S (a root without a
    keeper marks no lost job)."""
    fired: set[str] = set()
    wake = threading.Event()
    job_path, view_path = store.layout.job(task_key), store.layout.queue_view

    def changed(event: WatchedEvent) -> None:
        fired.add(event.path)
        wake.set()

    since = time.monotonic()
    lease_checked = since
    fired.add(job_path)
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
        if job_path in fired:
            fired.discard(job_path)
            record = read_job(store, task_key, watch=changed) or JobRecord()
            admitted_record = _admission_end(record, task_key, lease_gone)
            if admitted_record is not None:
                return admitted_record
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
        raise InsufficientResources(str(record.get("refused_reason")
                                        or "the keeper could not start it now"))
    if state != QUEUED or lease_gone:
        by = record.get("cancelled_by") or record.get("killed_by") or {}
        who = by.get("identity") or by.get("user")
        raise Cancelled(f"job {task_key} was cancelled while it waited"
                        + (f" (by {who} from {by.get('host', '?')})" if who else ""))
    return None
