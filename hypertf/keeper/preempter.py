"""The keeper's preemption (docs/queue.md, "Preemption"): notices written, deadlines kept,
preempted attempts requeued at their old place. Off unless the admin's ``hypertf_preempt``.

Who preempts whom is the pure ``hypertf.core.preemption.victims_for``; this module is what
the keeper does around it, in its pass (hypertf.keeper.admitter):

- **Decide** (``choose``, pure): for the first few jobs the admission pass left waiting for
  GPUs (at most MAX_CALLS decisions a pass, a shape once, none for a job whose victims still
  hold their GPUs), on the hosts no blocked job ahead of it reserves: the freed GPUs then go
  to it, since every job behind it is kept off the hosts it reserves (the admission pass's
  rule against starvation) and no job ahead of it can use them.
- **Notify** (``Preempter.after_pass``): one notice per victim at ``preempts/<victim>``
  (hypertf.core.preemptnotice), created keeper-only in one transaction: the victim's
  launcher stops its tasks by the deadline and requeues the job (``resumes``).
- **Enforce**: once a deadline passed and the victim's grant still lives (a launcher that
  ignored the notice or never saw it), the sync drains its cells (``forced``): its hosts'
  agents stop what is left and report it, and only then are the cells freed, as for any
  ended job. A victim whose lease went without a release ends ``preempted``, not ``lost``.
- **Requeue** (``claim_orders``, pure): a waiting attempt gets the notice's ``order`` (its
  job's old place) only if the notice exists, the victim's grant is gone, the attempt is
  its owner's and no other attempt claimed it first (admitted ones, then by czxid). A record
  naming ``resumes`` alone gets nothing: the notice is the keeper's, the field its owner's.
- **Remember** with the admission's grant (``GrantTerms``, keeper-only): the tier and order
  it was admitted at, how often its job was preempted, whom it displaced (no cycles).
- **Forget**: a notice is deleted once its victim's grant is gone and its next attempt
  admitted, or a day after it was written.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from kazoo.exceptions import BadVersionError, NoAuthError, NodeExistsError, NoNodeError

from hypertf.config.settings import ClusterSettings
from hypertf.core import jobtransitions as transitions
from hypertf.core.admission import BLOCKED, PREEMPTING, REQUEUED, Decision, Waiting
from hypertf.core.errors import StoreError
from hypertf.core.grants import GrantTerms
from hypertf.core.limits import UserLimits
from hypertf.core.matrix import Held, Matrix, job_of
from hypertf.core.preemption import Preemption, Reason, Running, Standing, victims_for
from hypertf.core.preemptnotice import Notice
from hypertf.store import Store, decode, encode
from hypertf.store.zkclient import get_many

log = logging.getLogger(__name__)
NOTICE_TTL_S = 86400.0  # a notice nobody resumed is deleted after a day
MAX_CALLS = 3  # victims_for decisions per pass (~7 ms each at 25,000 hosts)
MAX_LOOKED_AT = 32  # blocked jobs looked at per pass, in queue order
BUDGET_S = 0.05  # no further decision in a pass once they took this long
RETRY_S = 2.0  # a job that found no victims is decided again after this (or a new term)


@dataclass(frozen=True)
class PreemptSettings:
    """The admin's: ``hypertf_preempt``, ``hypertf_preempt_grace_s``,
    ``hypertf_preempt_min_runtime_s``."""

    on: bool = False
    grace_s: float = 120.0
    min_runtime_s: float = 600.0


def preempt_settings(cluster: ClusterSettings) -> PreemptSettings:
    """The inventory's three settings, as the keeper goes by them."""
    return PreemptSettings(cluster.preempt, cluster.preempt_grace_s,
                           cluster.preempt_min_runtime_s)


def _user(task_key: str) -> str:
    return task_key.partition(".")[2]


# -- pure: who runs, who resumes, whom to preempt -----------------------------------------
def running_jobs(grants: Mapping[str, Held], granted: Mapping[str, float],
                 terms: Mapping[str, GrantTerms], limits: UserLimits,
                 exclude: Collection[str], now: float) -> list[Running]:
    """The running jobs as preemption sees them, from the keeper's grants alone: the tier
    they were admitted at (capped by the admin's limits now; a grant without terms, from an
    older keeper, counts at its owner's maximum: the hardest to preempt), started when
    granted by the keeper's clock, preemptible unless the admin exempts their user.
    ``exclude``: victims already notified."""
    tiers: dict[str, int] = {}
    exempt: dict[str, bool] = {}
    found = []
    for key, held in grants.items():
        if not held.gpus or key in exclude:
            continue
        user = _user(key)
        if user not in exempt:
            exempt[user] = not limits.preemptible(user)
            tiers[user] = limits.of(user).max_priority
        kept = terms.get(key)
        tier = min(kept.priority, tiers[user]) if kept else tiers[user]
        found.append(Running(key, tier, granted.get(key, now), held.gpus, not exempt[user],
                             kept.preemptions if kept else 0,
                             kept.displaced if kept else frozenset()))
    return found


def claim_orders(waiting: Sequence[Waiting], notices: Mapping[str, Notice],
                 claimed: Collection[str], running: Collection[str],
                 ) -> tuple[list[Waiting], dict[str, str]]:
    """The waiting jobs, each resuming attempt that may have its notice's place with that
    ``order``, and the claims made (waiting key -> the preempted attempt). An attempt gets
    the place only when the notice exists, the preempted attempt's grant is gone (not in
    ``running``), both are one user's, and neither an admitted attempt (``claimed``) nor an
    earlier record (the smaller czxid) claimed it first."""
    asking = sorted((w for w in waiting if w.resumes), key=lambda w: (w.order, w.task_key))
    if not asking or not notices:
        return list(waiting), {}
    taken = set(claimed)
    claims: dict[str, str] = {}
    for job in asking:
        victim = job.resumes
        if victim in taken or victim not in notices or victim in running \
                or victim == job.task_key or _user(victim) != job.user:
            continue
        taken.add(victim)
        claims[job.task_key] = victim
    if not claims:
        return list(waiting), {}
    return [replace(w, order=notices[claims[w.task_key]].order) if w.task_key in claims
            else w for w in waiting], claims


def _smallest(job: Waiting) -> int:
    return min((slot.gpus for slot in job.request.slots if slot.gpus > 0), default=0)


def choose(decisions: Sequence[Decision], jobs: Mapping[str, Waiting],
           running: Sequence[Running], matrix: Matrix, live: Iterable[str], now: float,
           min_runtime: float, standing: Callable[[], Standing | None] | None = None,
           busy: Collection[str] = (), skip: Collection[str] = (),
           failed: list[str] | None = None, max_calls: int = MAX_CALLS,
           max_looked: int = MAX_LOOKED_AT, budget_s: float = BUDGET_S) -> list[Preemption]:
    """The preemptions this pass makes, for the jobs ``decisions`` left waiting for GPUs,
    in queue order. Each job is decided on the live hosts that no blocked job ahead of it
    reserves (the admission pass's rule: the GPUs it frees can then only be its own); a job
    in ``busy`` (its victims still hold their GPUs) preempts no more, one in ``skip`` (it
    found no victims a moment ago) and its shape are not tried again, a shape tried once is
    not tried again, and no decision starts once ``budget_s`` is spent. ``standing`` (fair
    share on; None: tiers alone) is asked once, before the first decision. The jobs that
    found nothing are added to ``failed``. Pure but for the clock of the budget."""
    began = time.perf_counter()
    alive = set(live)
    reserved: set[str] = set()
    hosts_of: dict[tuple[int, int], set[str]] = {}  # waiting jobs share one hosts tuple
    tried: set[tuple[object, ...]] = set()
    pool = list(running)
    made: list[Preemption] = []
    fair: list[Standing | None] = []
    calls = looked = 0
    for decision in decisions:
        if decision.admitted or decision.refused or decision.reason not in BLOCKED:
            continue
        job = jobs.get(decision.task_key)
        if job is None or job.no_wait or job.request.gpus <= 0:
            continue
        looked += 1
        if looked > max_looked or calls >= max_calls:
            break
        shape = (id(job.request.hosts), job.request.slots, job.request.policy, job.priority,
                 job.user if standing is not None else "")
        if job.task_key in skip:
            tried.add(shape)
        elif job.task_key not in busy and shape not in tried:
            if calls and time.perf_counter() - began > budget_s:
                break
            tried.add(shape)
            calls += 1
            if not fair:
                fair.append(standing() if standing is not None else None)
            found = victims_for(job, pool, matrix, alive - reserved if reserved else alive,
                                now, min_runtime, fair[0])
            if found is not None and found.victims:
                made.append(found)
                chosen = set(found.victims)
                pool = [r for r in pool if r.task_key not in chosen]
            elif failed is not None:
                failed.append(job.task_key)
        smallest = _smallest(job)
        usable = hosts_of.get((id(job.request.hosts), smallest))
        if usable is None:
            usable = hosts_of[(id(job.request.hosts), smallest)] = {
                host for host in job.request.hosts
                if host in alive and len(matrix.gpus.get(host, ())) >= smallest}
        reserved |= usable  # it waits for these: nobody behind it gets them
        if len(reserved) >= len(alive):
            break
    return made


def jobs_in(matrix: Matrix) -> set[str]:
    """Every job with a GPU cell held or draining (distinct cells first, at C speed)."""
    cells = set(itertools.chain.from_iterable(matrix.gpus.values()))
    return {key for cell in cells if (key := job_of(cell))}


# -- the keeper's side ------------------------------------------------------------------
class RunningPool:
    """``running_jobs`` of the keeper's grants, each built once while the admin's limits stay
    the same (a grant's terms and start never change): at 25,000 running jobs a pass costs
    a lookup each, not a new ``Running`` each."""

    def __init__(self) -> None:
        self._pool: dict[str, Running | None] = {}  # grant -> as preemption sees it
        self._limits: UserLimits | None = None  # the limits the pool was built with

    def running(self, grants: Mapping[str, Held], granted: Mapping[str, float],
                terms: Mapping[str, GrantTerms], limits: UserLimits, now: float,
                notified: Collection[str]) -> list[Running]:
        """The running jobs of ``grants`` but those ``notified`` (victims already)."""
        if limits != self._limits:
            self._pool, self._limits = {}, limits
        pool = self._pool
        new = {key: held for key, held in grants.items() if key not in pool}
        if new:
            built = {r.task_key: r for r in running_jobs(new, granted, terms, limits, (), now)}
            pool.update({key: built.get(key) for key in new})
        if len(pool) > len(grants):
            for key in [k for k in pool if k not in grants]:
                del pool[key]
        return [job for key in grants
                if (job := pool.get(key)) is not None and key not in notified]


def order_of(store: Store, victim: str) -> int:
    """A grant without terms (an older keeper's): its record's czxid, its queue place."""
    try:
        stat = store.client.exists(store.layout.job(victim))
    except NoAuthError:
        stat = None
    return int(stat.czxid) if stat is not None else 0


class Preempter:
    """One keeper term's preemption state: the notices (read once, then kept by its own
    writes), this pass's claims, each preemptor's displaced users until it is admitted, and
    the preemptions counted per reason (``hypertf_preemptions_total``, in the queue view)."""

    def __init__(self, store: Store, settings: PreemptSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.loaded = False
        self.writable = True  # False: the root has no preempts/ ('hypertf auth init' again)
        self.notices: dict[str, Notice] = {}  # victim -> the keeper's notice
        self.claims: dict[str, str] = {}  # waiting key -> the victim whose place it has
        self.resumed: dict[str, str] = {}  # victim -> its admitted next attempt
        self.displacing: dict[str, frozenset[str]] = {}  # preemptor -> displaced users
        self.carried: dict[str, frozenset[str]] = {}  # victim -> its own displaced users
        self.counts: dict[str, int] = {reason.value: 0 for reason in Reason}
        self.busy: set[str] = set()  # preemptors whose victims still hold GPUs
        self._failed: dict[str, float] = {}  # waiting key -> when it last found no victims
        self._pool = RunningPool()  # the grants as preemption sees them, kept across passes

    # -- reading ----------------------------------------------------------------------
    def load(self, terms: Mapping[str, GrantTerms], writes: bool = True) -> None:
        """Every notice (a new keeper's first pass; again after a surprise), and what the
        grants' terms say was resumed and displaced. ``writes`` False: ``hypertf queue``'s
        reading (an unreadable notice is skipped, not deleted)."""
        if self.loaded:
            return
        client, layout = self.store.client, self.store.layout
        try:
            names = [n for n in client.get_children(layout.preempts) if len(n) <= 129]
        except NoNodeError:
            names = []
            self.writable = False
            if self.settings.on and writes:
                log.error("ZooKeeper root %s has no preempts folder: nobody is preempted "
                          "until the admin runs 'hypertf auth init -i INVENTORY'",
                          layout.root)
        except NoAuthError:
            names, self.writable = [], False
        self.notices = {}
        for name, answer in zip(names, get_many(client, [layout.preempt(n) for n in names]),
                                strict=True):
            if isinstance(answer, Exception):
                continue
            try:
                self.notices[name] = Notice.from_json(answer[0], name)
            except ValueError as err:
                if writes:
                    log.error("%s: deleted", err)
                    self._delete([name])
        self.resumed = {t.resumes: key for key, t in terms.items() if t.resumes}
        for victim, notice in self.notices.items():
            kept = terms.get(victim)
            displaced = frozenset({_user(victim)}) | (kept.displaced if kept else frozenset())
            self.displacing[notice.by] = self.displacing.get(notice.by, frozenset()) | displaced
            if kept is not None:
                self.carried[victim] = kept.displaced
        self.loaded = True

    # -- a pass -------------------------------------------------------------------------
    def requeue(self, waiting: Sequence[Waiting], running: Collection[str]) -> list[Waiting]:
        """The waiting jobs with the places notices kept for them (``claim_orders``)."""
        waiting, self.claims = claim_orders(waiting, self.notices, self.resumed, running)
        return list(waiting)

    def terms_for(self, job: Waiting) -> GrantTerms:
        """The terms to keep with ``job``'s grant (its capped tier, its order as admitted)."""
        victim = self.claims.get(job.task_key, "")
        notice = self.notices.get(victim)
        displaced = self.displacing.get(job.task_key, frozenset())
        if victim:
            displaced |= self.carried.get(victim, frozenset())
        return GrantTerms(job.priority, job.order, notice.count if notice else 0,
                          displaced, victim)

    def admitted(self, key: str, terms: GrantTerms) -> None:
        """``key`` was admitted with ``terms`` (committed)."""
        self.displacing.pop(key, None)
        if terms.resumes:
            self.resumed[terms.resumes] = key

    def forced(self, grants: Mapping[str, Held], now: float) -> set[str]:
        """Victims past their deadline whose grant still lives: the sync drains them."""
        return {victim for victim, notice in self.notices.items()
                if notice.deadline <= now and victim in grants}

    def mark_gone(self, key: str) -> None:
        """A job found without its lease and without a release: ``preempted`` when the
        keeper had preempted it, else ``lost`` (the sync's, hypertf.store.jobs)."""
        notice = self.notices.get(key)
        if notice is None:
            self.store.jobs.mark_lost(key)
            return
        client, path = self.store.client, self.store.layout.job(key)
        try:
            data, stat = client.get(path)
            ended = transitions.preempted(decode(data, "job record"), notice.by, notice.at,
                                          self.clock())
            if ended is not None:
                client.set(path, encode(ended), version=stat.version)
        except (NoNodeError, NoAuthError, BadVersionError, StoreError) as err:
            # BadVersion: its launcher's own release came first, and its word stands
            log.info("did not record %s preempted: %s", key, type(err).__name__)

    def after_pass(self, decisions: Sequence[Decision], jobs: Mapping[str, Waiting],
                   grants: Mapping[str, Held], granted: Mapping[str, float],
                   terms: Mapping[str, GrantTerms], matrix: Matrix, live: Iterable[str],
                   limits: UserLimits, standing: Callable[[], Standing | None] | None,
                   now: float) -> list[Preemption]:
        """After a committed pass: note which preemptors still wait for their victims,
        decide and notify new preemptions (when on), forget served notices."""
        self.note_busy(grants, matrix)
        made: list[Preemption] = []
        if self.settings.on and self.writable and any(
                not d.admitted and not d.refused and d.reason in BLOCKED for d in decisions):
            running = self._pool.running(grants, granted, terms, limits, now, self.notices)
            self._failed = {k: t for k, t in self._failed.items()
                            if k in jobs and now - t < RETRY_S}
            failed: list[str] = []
            if running:
                made = choose(decisions, jobs, running, matrix, live, now,
                              self.settings.min_runtime_s, standing, self.busy,
                              self._failed, failed)
            self._failed.update(dict.fromkeys(failed, now))
            if made:
                made = self._notify(made, terms, now)
        self.cleanup(grants, now)
        return made

    def note_busy(self, grants: Mapping[str, Held], matrix: Matrix) -> None:
        """The preemptors whose victims still hold GPUs: a grant, or cells held or draining
        (the freed GPUs are theirs once the agents confirm; no more victims meanwhile)."""
        if not self.notices:
            self.busy = set()
            return
        holding = jobs_in(matrix)
        self.busy = {n.by for v, n in self.notices.items() if v in grants or v in holding}

    def _notify(self, made: list[Preemption], terms: Mapping[str, GrantTerms], now: float,
                ) -> list[Preemption]:
        """One notice per victim, all in one transaction (keeper-only ACL)."""
        client, layout = self.store.client, self.store.layout
        acl = self.store.acls.of("preempt")
        notices: list[Notice] = []
        tx = client.transaction()
        for decision in made:
            for victim in decision.victims:
                kept = terms.get(victim)
                notice = Notice(victim, decision.task_key, now, now + self.settings.grace_s,
                                decision.reasons[victim].value,
                                kept.order if kept else order_of(self.store, victim),
                                min((kept.preemptions if kept else 0) + 1, 10_000))
                tx.create(layout.preempt(victim), notice.to_json(), acl=acl)
                notices.append(notice)
        results = tx.commit()
        failed = [r for r in results if isinstance(r, Exception)
                  and type(r).__name__ not in ("RolledBackError", "RuntimeInconsistency")]
        if failed:
            if isinstance(failed[0], NodeExistsError):
                log.warning("a preemption notice existed that this keeper did not know: "
                            "reading them again")
                self.loaded = False
                self.load(terms)
            else:
                log.error("cannot write preemption notices (%s): none is made until the "
                          "admin runs 'hypertf auth init -i INVENTORY'", failed[0])
                self.writable = False
            return []
        for notice in notices:
            self.notices[notice.victim] = notice
            self.counts[notice.reason] = self.counts.get(notice.reason, 0) + 1
            kept = terms.get(notice.victim)
            self.carried[notice.victim] = kept.displaced if kept else frozenset()
            log.info("preempted %s for %s (%s): SIGKILL at %.0f", notice.victim, notice.by,
                     notice.reason, notice.deadline)
        for decision in made:
            self.displacing[decision.task_key] = \
                self.displacing.get(decision.task_key, frozenset()) | decision.displaced
            self.busy.add(decision.task_key)
        return made

    def cleanup(self, grants: Mapping[str, Held], now: float) -> None:
        """Delete the notices served (the victim's grant gone and its next attempt admitted)
        or a day old."""
        done = [victim for victim, notice in self.notices.items()
                if (victim not in grants and victim in self.resumed)
                or now - notice.at > NOTICE_TTL_S]
        if done:
            self._delete(done)
        live = {notice.by for notice in self.notices.values()}
        for key in [k for k in self.displacing if k not in live]:
            del self.displacing[key]

    def _delete(self, victims: list[str]) -> None:
        client, layout = self.store.client, self.store.layout
        tx = client.transaction()
        for victim in victims:
            tx.delete(layout.preempt(victim))
        if any(isinstance(r, Exception) for r in tx.commit()):  # one gone already: each
            for victim in victims:
                try:
                    client.delete(layout.preempt(victim))
                except NoNodeError:
                    pass
                except NoAuthError as err:
                    log.error("cannot delete the preemption notice of %s: %s", victim, err)
                    continue
        for victim in victims:
            self.notices.pop(victim, None)
            self.resumed.pop(victim, None)
            self.carried.pop(victim, None)

    def reasons(self, decisions: Sequence[Decision]) -> dict[str, str]:
        """``Preempting`` for a job whose victims still hold its GPUs, ``Requeued`` for a
        resumed attempt waiting at its old place (over Resources, Priority, Fairshare)."""
        shown: dict[str, str] = {}
        if not self.busy and not self.claims:
            return shown
        for decision in decisions:
            if decision.admitted or decision.refused or decision.reason not in BLOCKED:
                continue
            if decision.task_key in self.busy:
                shown[decision.task_key] = PREEMPTING
            elif decision.task_key in self.claims:
                shown[decision.task_key] = REQUEUED
        return shown
