"""The queue in ZooKeeper, the launcher's side: a job waits for GPUs as an ordinary job
record that says ``queued``; its launcher creates the lease (ephemeral, tied to its
session) and the record (with the request and the priority) in one transaction, then
watches only its own record (and, once it has waited a while, the queue's view). The
keeper's side (reading the queue, the screen, the admission) is hypertf.keeper.

**Who admits.** The matrix keeper (hypertf.keeper.admitter) decides every waiting job in
one pass and commits a pass's admissions, each with its grant (``grants/<key>``, only the
keeper's identity writes it), in one transaction. A launcher starts its tasks on the grant
alone, never on its record's own placements.

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
from typing import Any, cast

from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError
from kazoo.protocol.states import WatchedEvent
from kazoo.retry import ForceRetryError

from hypertf.core import jobtransitions as transitions
from hypertf.core.admission import (
    BUDGET,
    FAIRSHARE,
    HELD,
    PREEMPTING,
    PRIORITY,
    REQUEUED,
    RESOURCES,
    USER_LIMIT,
)
from hypertf.core.errors import Cancelled, InsufficientResources, NotAllowed, StoreError, UsageError
from hypertf.core.grants import grant_and_stamp
from hypertf.core.jobrecord import JobRecord, JobState, Owner, RefusedKind
from hypertf.core.layout import owner_of
from hypertf.core.placement import Grant, Request, compact_hosts
from hypertf.core.records import decode, encode
from hypertf.core.requestcheck import (
    DEFAULT_PORT_RANGE,
)
from hypertf.store import quotas
from hypertf.store.allocation import StoredMatrix, owner_info
from hypertf.store.jobs import JobRecords
from hypertf.store.retry import until_committed
from hypertf.store.zkclient import answer, pipelined
from hypertf.store.zkstore import StoreReads

log = logging.getLogger(__name__)
QUEUED = JobState.QUEUED
VIEW_AFTER_S = 0.25  # a job admitted sooner never reads the queue's view
LEASE_CHECK_S = 2.0  # a waiter checks its lease this often (no keeper: nobody marks it)


# -- the request as the record keeps it --------------------------------------------------
def request_to_json(request: Request, priority: int,
                    exclude_ports: Mapping[str, set[int]] | None = None,
                    wait: bool = True, resumes: str = "") -> dict[str, Any]:
    """Compact: 1000 hosts share one port range, so only the differing ones are listed.
    ``resumes``: the preempted attempt this one continues (its place in the queue is the
    keeper's to give, from its own notice: the field alone gives nothing)."""
    ranges = Counter(tuple(r) for r in request.port_ranges.values())  # not list.count:
    common = ranges.most_common(1)[0][0] if ranges else DEFAULT_PORT_RANGE  # quadratic
    return {"priority": priority, "hosts": compact_hosts(request.hosts), "policy": request.policy,
            "slots": [[s.role, s.index, s.gpus] for s in request.slots],
            "port_range": list(common),
            "port_ranges": {h: list(r) for h, r in request.port_ranges.items()
                            if tuple(r) != tuple(common)},
            "exclude_ports": {h: sorted(p) for h, p in (exclude_ports or {}).items() if p},
            "held": False, "no_wait": not wait, **({"resumes": resumes} if resumes else {})}


class _Watched:
    """What a waiter's watches noted: the paths that changed, and a wake-up."""

    def __init__(self, *fired: str) -> None:
        self.fired = set(fired)
        self.wake = threading.Event()

    def changed(self, event: WatchedEvent) -> None:
        self.fired.add(event.path)
        self.wake.set()


WAITERS_KEPT = 1024  # per session: watches set by enqueue that no waiter took (yet)


def preemptions_of(view: Mapping[str, Any]) -> dict[str, int]:
    """A view's count of preemptions per reason in the keeper's current term
    (``preemptions_total``: hypertf_preemptions_total)."""
    found = view.get("preemptions_total", {})
    return {str(reason)[:32]: count for reason, count in found.items()
            if type(count) is int and count >= 0} if isinstance(found, dict) else {}


# What a waiting launcher prints after each reason the keeper's view gives (and the
# dashboard beside it); a reason without a text here is printed bare.
REASONS = {
    RESOURCES: "not enough free GPUs yet",
    PRIORITY: "jobs ahead of it (higher priority, or earlier) wait for the GPUs it needs",
    USER_LIMIT: "its owner's running jobs are at hypertf_user_gpu_limit",
    HELD: "held",
    FAIRSHARE: "other users' shares are ahead of yours: they used less of the cluster for "
               "their share lately, so their jobs at this priority go first ('hypertf queue "
               "--shares' shows each user's share, usage and factor)",
    BUDGET: "your GPU-hours this month reached the admin's budget: it waits until the next "
            "month or a larger budget ('hypertf auth limits --gpu-hours-per-month'); running "
            "jobs go on",
    PREEMPTING: "the keeper is preempting lower-priority jobs (or jobs of users above their "
                "share) for it",
    REQUEUED: "preempted: waiting again at its old place",
}


class JobQueue:
    """``Store.queue``: the launcher's side of the queue, for one session: what it submits,
    the grants it reads, and the watches its enqueue set for its own waiter (at most
    WAITERS_KEPT; a waiter that finds none sets its own)."""

    def __init__(self, store: StoreReads, matrix: StoredMatrix, jobs: JobRecords) -> None:
        self.store = store
        self.client, self.layout = store.client, store.layout
        self.matrix = matrix
        self.jobs = jobs
        self._waiters: dict[str, _Watched] = {}
        self._waiters_lock = threading.Lock()

    def enqueue(self, task_key: str, request: Request, record: Mapping[str, Any],
                priority: int = 0, exclude_ports: Mapping[str, set[int]] | None = None,
                wait: bool = True, resumes: str = "") -> None:
        """The lease and the ``queued`` record, in one transaction, in the owner's folders (the
        only places a user may write). ``wait`` False (--no-wait): the keeper admits the job in
        its next pass or refuses it."""
        if not request.slots:
            raise UsageError("a job needs at least one task")
        owner = cast(Owner, {**owner_info(), "user": owner_of(task_key)})
        job = transitions.queued(task_key, owner,
                                 request_to_json(request, priority, exclude_ports, wait,
                                                 resumes),
                                 request.policy, record, time.time())
        client, job_path = self.client, self.layout.job(task_key)
        data = encode(job)
        tx = client.transaction()
        tx.create(self.layout.lease(task_key), encode(owner), acl=self.store.acls.lease(),
                  ephemeral=True)
        tx.create(job_path, data, acl=self.store.acls.job())
        # The waiter's watch on its record, sent with the transaction (ZooKeeper answers a
        # session's requests in order: it sees the record created): one round trip, and
        # wait_for_admission sets none of its own (_Watched).
        watched = _Watched()  # nothing fired yet
        with pipelined(client):
            committed = tx.commit_async()
            stat_read = client.exists_async(job_path, watch=watched.changed)
        errors = [r for r in answer(client, committed, tx.commit) if isinstance(r, Exception)]
        if errors:
            self._explain_full(owner_of(task_key), len(data))
            self.store.check_registered(owner_of(task_key))  # the likely cause, named
            raise StoreError(f"ZooKeeper refused to queue job {task_key}: {errors}")
        stat = answer(client, stat_read,
                      lambda: client.exists(job_path, watch=watched.changed))
        if stat is None or stat.version > 0:
            watched.fired.add(job_path)  # changed already (or gone): the waiter reads it
        self._armed(task_key, watched)
        self.jobs.known.remember(task_key, decode(data, "job record"), 0)  # as created: version 0

    def _explain_full(self, user: str, record_bytes: int) -> None:
        """StoreError naming the folder of ``user``'s that has no room for one more job, if
        one has none (its quota: docs/zookeeper-layout.md, "Bounds")."""
        for path, what, fix in (
                (self.layout.user_leases(user), "waiting and running jobs",
                 "wait for some to end, or cancel some (hypertf kill)"),
                (self.layout.user_jobs(user), "job records",
                 "the keeper prunes the oldest finished ones; the admin may raise "
                 "hypertf_job_records_max or hypertf_user_records_mb and run hypertf auth "
                 "init")):
            use = quotas.folder_use(self.client, path)
            full = use.full(record_bytes) if use is not None else None
            if full is not None:
                raise StoreError(f"{user}'s {what} are at their quota in ZooKeeper ({full}, "
                                 f"{path}): {fix}")

    def submit(self, request: Request, task_key: str,
               record: Mapping[str, Any] | None = None, *, priority: int = 0,
               exclude_ports: Mapping[str, set[int]] | None = None, wait: bool = True,
               say: Callable[[str], None] | None = None,
               lost_session: threading.Event | None = None) -> Grant:
        """The one way to take GPUs: queue the request, and return the grant once the keeper
        admitted it. With ``wait`` False, InsufficientResources when the keeper refuses it (it
        could not start at once); the lease is dropped then, and on any error."""
        self.enqueue(task_key, request, record or {}, priority, exclude_ports, wait)
        try:
            return self.wait_for_admission(task_key, say or (lambda _line: None),
                                           lost_session or threading.Event())
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.delete(self.layout.lease(task_key))
            raise

    def _armed(self, task_key: str, watched: _Watched | None = None) -> _Watched | None:
        """Keep (with ``watched``) or take the watch ``enqueue`` set on ``task_key``'s record,
        for this client's ``wait_for_admission``."""
        with self._waiters_lock:
            kept = self._waiters
            if watched is None:
                return kept.pop(task_key, None)
            kept[task_key] = watched
            while len(kept) > WAITERS_KEPT:
                del kept[next(iter(kept))]  # its waiter, if any, sets a watch of its own
            return watched

    def read_grant(self, task_key: str, watched: bool = False) -> Grant | None:
        """The keeper's grant of ``task_key`` (None: it granted nothing). The one thing a
        launcher starts tasks on: only the keeper's identity writes ``grants/``. ``watched``:
        the read sets a watch on the grant, for this client's ``release`` to learn of its
        deletion (``StoredMatrix.watch_grant``)."""
        path = self.layout.grant(task_key)
        try:
            if watched:
                data, _ = self.client.get(path, watch=self.matrix.watch_grant(task_key))
            else:
                data, _ = self.client.get(path)
        except NoNodeError:
            if watched:
                self.matrix.forget_grant_watch(task_key)
            return None
        try:
            grant, stamp = grant_and_stamp(data, task_key)
        except ValueError as err:
            raise StoreError(f"{err}: the job does not start; ask the cluster admin") from err
        self.jobs.known.admitted(task_key, grant, stamp)  # the record the admission wrote
        return grant

    def set_held(self, task_key: str, held: bool) -> None:
        """``hypertf hold``/``unhold``: a held job keeps its place but is not admitted (and
        reserves nothing). Only a waiting job; the record's ACL lets only its owner (and the
        admin) write it."""
        def attempt(_retries: int) -> None:
            try:
                data, stat = self.client.get(self.layout.job(task_key))
            except NoNodeError:
                raise UsageError(f"no job {task_key!r}; list them with 'hypertf queue'") from None
            record = decode(data, "job record")
            try:
                changed = transitions.held(record, held)
            except ValueError as err:
                raise UsageError(f"job {task_key} is not waiting in the queue "
                                 f"({record.get('state')}): only a waiting job can be held"
                                 ) from err
            try:
                self.client.set(self.layout.job(task_key), encode(changed), version=stat.version)
            except BadVersionError as err:
                raise ForceRetryError() from err
            except NoAuthError as err:
                raise NotAllowed(f"job {task_key} belongs to {owner_of(task_key)}: only they or "
                                 f"the admin may hold it") from err

        until_committed(attempt, f"holding job {task_key}")

    def read_queue_view(self, watch: Callable[..., Any] | None = None) -> dict[str, Any]:
        """The keeper's last published view of the queue, whole ({} when there is none)."""
        try:
            data, _ = self.client.get(self.layout.queue_view, watch=watch)
        except NoNodeError:
            return {}
        return decode(data, "queue view")

    def read_view(self, watch: Callable[..., Any] | None = None) -> list[dict[str, Any]]:
        """The keeper's last view of the queue's waiting jobs ([] when there is none)."""
        return list(self.read_queue_view(watch).get("waiting", []))

    def wait_for_admission(self, task_key: str, say: Callable[[str], None],
                           lost_session: threading.Event) -> Grant:
        """Block until the keeper admits ``task_key``; say its position and reason whenever
        they change. Returns the keeper's grant (never the record's own placements: its owner
        may write those); raises Cancelled when the lease goes.

        Few requests, since every submitter pays them at every job: a one-shot watch on its
        own record (set with ``exists`` in ``enqueue``'s round trip, or here when this client
        did not enqueue it: the record is as it created it), then, each time the watch fires,
        a read of the grant (the keeper's admission writes both; the read leaves a watch on
        it for ``release``) and, without one, of the record with a new watch (a refusal, a
        cancel, and ``lost`` when the lease went without one are written there). Only a job
        still waiting after VIEW_AFTER_S reads and watches the queue's view (its position)
        and checks its lease every LEASE_CHECK_S (a root without a keeper marks no lost
        job)."""
        job_path, view_path = self.layout.job(task_key), self.layout.queue_view
        watched = self._armed(task_key)  # the watch enqueue set with its transaction
        first = watched is None
        if watched is None:
            watched = _Watched(job_path)
        fired, wake, changed = watched.fired, watched.wake, watched.changed
        since = time.monotonic()
        lease_checked = since
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
                lease_gone = self.client.exists(self.layout.lease(task_key)) is None
            if first:  # the record as this waiter created it (version 0): a watch only
                first = False
                fired.discard(job_path)
                stat = self.client.exists(job_path, watch=changed)
                if stat is not None and stat.version > 0:
                    fired.add(job_path)  # changed already: read it
            elif job_path in fired and not lease_gone:
                # the grant first: the keeper writes it with the record's admission, and it is
                # what a launcher starts on (one read per admitted job instead of two); its
                # watch tells the release when the keeper dropped it
                grant = self.read_grant(task_key, watched=True)
                if grant is not None:
                    return grant
            if job_path in fired:
                fired.discard(job_path)
                record = self.jobs.read(task_key, watch=changed) or JobRecord()
                if _admission_end(record, task_key, lease_gone) is not None:
                    grant = self.read_grant(task_key, watched=True)
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
                view = self.read_view(watch=changed)
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
