"""The commit of a keeper's pass (hypertf.keeper.admitter): every admission (its record
written ``allocated``, its lease checked, its grant created) and refusal of the pass, and
the matrix shards they changed, in ONE version-checked transaction. Apart from the pass so
the admitter reads as sync -> decide -> commit -> preempt -> publish, and the transaction's
rules (its size, its culprits, what the keeper's caches learn once it committed) sit in one
place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

from kazoo.exceptions import NoAuthError, NodeExistsError, QuotaExceededError

from hypertf.core import jobtransitions as transitions
from hypertf.core.admission import BUDGET, PRIORITY, USER_LIMIT, Decision, Waiting
from hypertf.core.grants import GrantTerms, RecordStamp, grant_to_json
from hypertf.core.layout import owner_of
from hypertf.core.limits import UserLimits
from hypertf.core.matrix import Held, Matrix
from hypertf.core.placement import cannot_place
from hypertf.core.requestcheck import waiting_from_record
from hypertf.keeper.ledger import Ledger
from hypertf.keeper.preempter import Preempter
from hypertf.keeper.reader import QueueReader
from hypertf.keeper.sync import SyncMemo
from hypertf.store import Store, encode
from hypertf.store.matrixshards import TRANSACTION_BYTES, MatrixVersion, matrix_writes
from hypertf.store.waitqueue import REASONS

log = logging.getLogger(__name__)

QUOTA_PAUSE_S = 30.0  # a job whose owner's records had no room waits this long


class Commit(Enum):
    """What committing a pass's decisions did."""

    COMMITTED = "committed"
    CONFLICT = "conflict"  # another writer won: read and decide again
    PART = "part"  # too large for one transaction: a first part committed, the rest next


class Committer:
    """Commits a pass's settled decisions, handed the keeper's parts it writes through or
    keeps in step: the reader (records, grants), the ledger (an attempt opened), the
    preempter (the grant's terms) and the sync's memo. It alone keeps the records the keeper
    may not write, as its commits find them (``writable``: the admitter asks)."""

    def __init__(self, store: Store, reader: QueueReader, ledger: Ledger, preempter: Preempter,
                 memo: SyncMemo, clock: Callable[[], float], user_gpu_limit: int = 0) -> None:
        self.store = store
        self.reader = reader
        self.ledger = ledger
        self.preempter = preempter
        self.memo = memo
        self._unwritable: set[str] = set()  # records whose ACL shuts the keeper out
        self._over_quota: dict[str, float] = {}  # record -> until when it is left out
        self.clock = clock
        self.user_gpu_limit = user_gpu_limit

    def writable(self, key: str) -> bool:
        """False for a job whose record shut the keeper out at a commit (its owner's ACL):
        left out of every later pass, never retried; and for QUOTA_PAUSE_S after its
        owner's records folder had no room for the keeper's write in it (its quota): that
        job waits, the others' admissions go on."""
        if key in self._unwritable:
            return False
        until = self._over_quota.get(key)
        if until is None:
            return True
        if self.clock() < until:
            return False
        del self._over_quota[key]
        return True

    def _record_of(self, key: str) -> tuple[dict[str, Any] | None, int]:
        if key in self.reader.records:
            return self.reader.records[key]
        record, version, _ = self.reader.rejected[key]
        return record, version

    def commit(self, matrix: Matrix, version: MatrixVersion, settled: list[Decision],
               live: list[str], limits: UserLimits, refusals: Mapping[str, str],
               jobs: Mapping[str, Waiting]) -> Commit:
        """COMMITTED, CONFLICT, or PART (the pass's decisions would make a request
        past TRANSACTION_BYTES: the first half, or less, was committed; the rest is
        decided again by the next try). A record the keeper may not write (its owner
        shut the keeper out with its ACL) is left out of later passes, not retried."""
        taken = matrix
        tx = self.store.client.transaction()
        ops: list[str | None] = []  # the job each operation is for (None: the matrix)
        now = self.clock()
        size = 0
        terms: dict[str, GrantTerms] = {}
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
            job = jobs.get(key)
            if job is not None:
                terms[key] = self.preempter.terms_for(job)
            tx.create(self.store.layout.grant(key),
                      grant_to_json(key, decision.placements, decision.ports, now,
                                    terms.get(key),
                                    RecordStamp.of(data, record_version + 1, now)
                                    if record_version >= 0 else None),
                      acl=self.store.acls.grant())
            ops += [key, key, key]
            size += 2 * len(data)
        # The shards the admissions changed, each version-checked; a refusal names what is
        # free everywhere, so then every shard is checked too.
        shards, written = matrix_writes(tx, self.store.layout, matrix, taken, version,
                                        check_rest=any(d.refused for d in settled))
        size += shards
        if size > TRANSACTION_BYTES and len(settled) > 1:
            first = self.commit(matrix, version, settled[:len(settled) // 2], live, limits,
                                refusals, jobs)
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
                self._unwritable.add(culprit_key)
            elif culprit_key is not None and isinstance(error, QuotaExceededError):
                log.warning("the records of %s's jobs are at their quota "
                            "(hypertf_user_records_mb): %s waits %.0f s before it is "
                            "tried again", owner_of(culprit_key), culprit_key,
                            QUOTA_PAUSE_S)
                self._over_quota[culprit_key] = self.clock() + QUOTA_PAUSE_S
            elif culprit_key is not None and isinstance(error, NodeExistsError):
                log.error("%s already has a grant: it is not admitted again", culprit_key)
                self.reader.settled.add(culprit_key)
            return Commit.CONFLICT  # a cancel, a lost waiter or another writer: decide again
        if any(isinstance(r, Exception) for r in results):
            return Commit.CONFLICT
        self.memo.admitted(version, written, [d.task_key for d in settled if d.admitted])
        for decision in settled:
            self.reader.settled.add(decision.task_key)
            self.reader.records.pop(decision.task_key, None)  # no longer waiting
            self.reader.rejected.pop(decision.task_key, None)
            self.reader.forget(decision.task_key)
            if decision.admitted:
                held = Held.of(decision.placements, decision.ports)
                self.reader.grants[decision.task_key] = held
                self.reader.granted[decision.task_key] = now
                self.ledger.opened(decision.task_key, now, held)
                if decision.task_key in terms:
                    self.reader.terms[decision.task_key] = terms[decision.task_key]
                    self.preempter.admitted(decision.task_key, terms[decision.task_key])
        return Commit.COMMITTED

    def refusal(self, decision: Decision, record: Mapping[str, Any], matrix: Matrix,
                live: list[str], limits: UserLimits) -> str:
        """Why a --no-wait job cannot start now, naming what is free or the limit."""
        job = waiting_from_record(record, 0, decision.task_key)
        if decision.reason == BUDGET:
            used = self.ledger.month_used(job.user, self.clock()) / 3600
            return (f"{job.user} used {used:,.1f} GPU-hours this month, their budget of "
                    f"{limits.of(job.user).gpu_hours_per_month:,g} (the admin's 'hypertf auth "
                    f"limits --gpu-hours-per-month'); running jobs go on, new ones wait "
                    f"without --no-wait")
        if decision.reason == USER_LIMIT:
            held = matrix.held_per_user().get(job.user, 0)
            cap = limits.gpu_limit(job.user, self.user_gpu_limit)
            return (f"{job.user} holds {held} GPUs; this job's {job.request.gpus} more would "
                    f"pass the limit of {cap} (hypertf_user_gpu_limit, or the admin's "
                    f"'hypertf auth limits')")
        why = cannot_place(job.request, matrix, live)
        return why or (f"the GPUs it needs are promised to jobs ahead of it in the queue "
                       f"({REASONS[PRIORITY]}); run it without --no-wait to wait in line")
