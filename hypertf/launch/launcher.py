"""The job behind ``invoke train`` / ``hypertf train``: plan -> preflight -> one ``Attempt``
per try -> report.

``Job`` holds what every attempt shares (the ZooKeeper client, the SSH sessions, the hosts
that passed preflight); each ``Attempt`` (hypertf.launch.attempt) has its own task key and
allocates, starts, watches, stops and releases. A port clash is retried as a new attempt
on fresh ports. If the launcher is killed outright, its ZooKeeper lease expires and the
agents stop the job's tasks and free its GPUs.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kazoo.client import KazooState

from hypertf import store
from hypertf.config.inventory import Inventory
from hypertf.core.addresses import HostAddresses, data_addresses
from hypertf.core.admission import fits_cluster
from hypertf.core.errors import HyperTFError, InsufficientResources
from hypertf.core.jobrecord import JobState
from hypertf.core.monitor import Verdict
from hypertf.core.placement import Grant, Request, new_task_key
from hypertf.core.protocol import (
    PROTOCOL_VERSION,
    PreflightAnswer,
    ProtocolError,
    VersionMismatch,
)
from hypertf.core.rundir import checkpoint_dir
from hypertf.core.scheduler import Policy
from hypertf.core.spec import offload_hosts
from hypertf.core.timeline import Timeline
from hypertf.launch.attempt import (
    Attempt,
    Interrupted,
    JobFailed,
    JobKilled,
    Outcome,
    Parts,
    ended_by,
    interrupted_by_signals,
    summary_of,
    uninterruptible,
)
from hypertf.launch.fleet import SshFleet
from hypertf.launch.lease import StoreLease
from hypertf.launch.nodeclient import NodeClient
from hypertf.launch.preflightcache import PreflightCache
from hypertf.launch.remote import Cluster, GroupResult, Session
from hypertf.launch.reporter import Reporter
from hypertf.launch.request import LegacyFlags, TrainRequest
from hypertf.store import Layout, auth
from hypertf.store.allocation import plan, read_matrix
from hypertf.store.waitqueue import enqueue, read_view, wait_for_admission

__all__ = ["Interrupted", "Job", "JobFailed", "TrainRequest", "train"]

MAX_PORT_RETRIES = 3
EARLY_PREFLIGHT_HOSTS = 32  # hosts a waiting job preflights while it waits
MAX_RESTART_PAUSE_S = 30.0  # restarts wait 1, 2, 4 ... seconds, at most this


@dataclass
class Restarts:
    """--max-restarts: how many so far, and how often each host was to blame."""

    allowed: int
    on_failure: bool  # --restart-on-failure: a script's own exit counts too
    done: int = 0
    failures: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def avoid(self) -> frozenset[str]:
        """Hosts that failed two attempts: left out when the others can take the job."""
        return frozenset(host for host, count in self.failures.items() if count >= 2)

    def after(self, err: JobFailed) -> float | None:
        """The pause before the next attempt (1, 2, 4 ... s), or None: ``err`` ends the job."""
        if isinstance(err, JobKilled) or not (err.retryable or self.on_failure) \
                or self.done >= self.allowed:  # a kill or cancel is never restarted
            return None
        self.done += 1
        self.failures.update(err.hosts)
        return min(2.0 ** (self.done - 1), MAX_RESTART_PAUSE_S)


class Job:
    """One training job from plan to report; its tries are ``Attempt`` objects."""

    max_port_retries = MAX_PORT_RETRIES

    def __init__(self, inventory: Inventory, request: TrainRequest,
                 say: Callable[[str], None] = print, first_key: str | None = None,
                 parts: Parts | None = None) -> None:
        request.validate()
        self.inventory = inventory
        self.request = request
        self.say = say
        # what each attempt is handed; the real ones once connected (plan), unless given
        self.parts = parts
        self.reporter = parts.reporter if parts else Reporter(say)
        self.layout = Layout(inventory.cluster.zk_root)
        self.owner = auth.job_owner()
        self.client: Any = None
        self.store: Any = None  # store.Store once connected
        self.cluster: Cluster | None = None
        self.records: dict[str, store.AgentRecord] = {}
        self._said_refused: set[tuple[str, str]] = set()  # (host, claim) told about
        self.lost_session = threading.Event()
        self.started_at = time.time()
        self.result = JobState.FAILED  # succeeded, failed or interrupted
        self.message = ""
        self.preflighted: set[str] = set()
        self.offload_placed: set[str] = set()  # hosts lent to products: preflighted as such
        self.offload_checked: set[str] = set()
        self.connecting: set[str] = set()  # hosts whose SSH connection is being made early
        self.script_reads_flags = False
        self.tf_keras: dict[str, bool] = {}  # preflight: tf-keras in each host's venv
        self.flags_announced = False
        self.cpu_only = False
        self.attempts: list[Attempt] = []
        self.queued: set[str] = set()  # task keys that went through the queue
        self.first_key = first_key  # a detached launcher's key, chosen by its parent
        self.timeline: Timeline = self.reporter.timeline

    # -- plan ---------------------------------------------------------------------------
    def connect_soon(self, hosts: Iterable[str]) -> None:
        """Open the SSH connections to ``hosts`` in the background, and start each node's
        ``tasknode start --watch`` there, waiting for its request: the handshakes and the
        nodes' Python starts overlap ZooKeeper, the dry run and the admission instead of
        opening the start round."""
        todo = [host for host in hosts if host not in self.connecting]
        cluster = self._cluster(todo)
        for host in todo:
            self.connecting.add(host)
            session = cluster.sessions[host]
            session.open_soon(NodeClient(session).start_command())

    def likely_hosts(self) -> list[str]:
        """The hosts this job surely uses, known before ZooKeeper is asked: every GPU node
        of a small inventory that has no more nodes than the job has tasks, placed round
        robin (a GPU per server per round reaches each node). Otherwise none: the dry run
        names them later (``place``)."""
        nodes = list(self.inventory.nodes)
        tasks = len(self.request.slots(cpu_only=False)) - self.request.offload_hosts
        if self.request.policy != Policy.ROUND_ROBIN or len(nodes) > min(
                tasks, EARLY_PREFLIGHT_HOSTS):
            return []
        return nodes

    def plan(self) -> list[str]:
        """Connect, and find the candidate hosts (inventory GPU nodes with a live agent)."""
        with self.timeline.phase("connect"):
            self.client = store.connect(self.inventory.cluster, long_lived=True,
                                        on_pause=lambda msg: self.say(f"hypertf: {msg}"))
            self.store = store.Store(self.client, self.layout)
            self.client.add_listener(self._on_state)
            if self.parts is None:  # the job places its tasks itself (queue, preflight)
                self.parts = Parts(placer=self, fleet=SshFleet(self._cluster([]), self.timeline),
                                   lease=StoreLease(self.store, self.say),
                                   reporter=self.reporter)
            hosts = self.live_hosts()
        self.cpu_only = sum(self.records[h].gpu for h in hosts) == 0
        if self.cpu_only and any(slot.gpus for slot in self.request.slots(cpu_only=False)):
            self.say("hypertf: notice: no GPU on any node of this cluster: every task runs on CPU")
        return hosts

    def live_hosts(self) -> list[str]:
        """The inventory's GPU nodes whose agent is up (their records kept for the start)."""
        cluster = self.inventory.cluster
        # an agent that lost ZooKeeper's data gives up its client after outage_patience and
        # retries every 2 s, then probes: that long after 'auth init', records may yet come
        interval = max((n.settings.agent_interval for n in self.inventory.nodes.values()),
                       default=5.0)
        window = store.outage_patience(cluster) + 2.0 + interval + 5.0
        records = self.store.records_soon(self.inventory.nodes, window, self.say)
        self.records = self._vouched(records)
        hosts = [name for name in self.inventory.nodes if name in self.records]
        if not hosts:
            raise HyperTFError(
                f"no agent is running on any host of {self.inventory.path}: start them with "
                f"'invoke agent.start -i {self.inventory.path}' (status: hypertf status)"
            )
        return hosts

    def _vouched(self, records: dict[str, store.AgentRecord]
                 ) -> dict[str, store.AgentRecord]:
        """The records with each host's data address as the inventory vouches for it
        (hypertf.core.addresses): an agent's claim the inventory cannot check is replaced
        by the host's inventory address, said once per host and claim."""
        nodes = self.inventory.nodes
        chosen = data_addresses({
            host: HostAddresses(nodes[host].address, record.data_addr,
                                nodes[host].settings.data_network)
            for host, record in records.items() if host in nodes})
        vouched = dict(records)
        for host, (address, refused) in chosen.items():
            if refused and (host, records[host].data_addr) not in self._said_refused:
                self._said_refused.add((host, records[host].data_addr))
                self.say(f"hypertf: notice: {host}'s agent reports the data address "
                         f"{records[host].data_addr}, not taken ({refused}): its tasks use "
                         f"the inventory's address {address}")
            if address != records[host].data_addr:
                vouched[host] = replace(records[host], data_addr=address)
        return vouched

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self.lost_session.set()

    # -- preflight ----------------------------------------------------------------------
    def preflight(self, hosts: list[str]) -> None:
        """SSH with verified host keys, venv, script, work dir: on every host, in parallel.
        Hosts that passed are remembered (and their sessions kept) for the whole job."""
        results = self._check_hosts(hosts)
        versions = {host: err.hosts[host] for host, err in results.failed.items()
                    if isinstance(err, VersionMismatch)}
        if versions:  # one line for them all: nothing else matters until they are upgraded
            raise VersionMismatch(versions)
        results.raise_failed("preflight", "; nothing was started or allocated")

    def _check_hosts(self, hosts: list[str]) -> GroupResult[PreflightAnswer]:
        """Preflight ``hosts``; what passed is remembered, what failed is returned. A host
        whose answer is in the preflight cache (same venv, script digest, host key file;
        seconds old) is not asked again."""
        cluster = self._cluster(hosts)
        script = self._preflight_script()
        cache = self._preflight_cache()
        offload = {host for host in hosts if host in self.offload_placed}
        results: GroupResult[PreflightAnswer] = GroupResult()
        for host, cached in cache.get(self.inventory.node(h) for h in hosts
                                      if h not in offload).items():
            with contextlib.suppress(ProtocolError):
                answer = PreflightAnswer.parse(cached)
                if answer.protocol == PROTOCOL_VERSION:  # else asked again
                    now = time.monotonic()
                    self.timeline.add("preflight", now, now, host, note="cached")
                    results[host] = answer

        def check(session: Session) -> PreflightAnswer:
            with self.timeline.phase("preflight", session.node.name):
                return NodeClient(session).preflight(
                    script, timeout=self.inventory.cluster.ssh_timeout * 3,
                    offload=session.node.name in offload)

        asked = cluster.each(check, [host for host in hosts if host not in results])
        results.update(asked)
        cache.put((self.inventory.node(host), answer.wire())
                  for host, answer in asked.succeeded.items() if host not in offload)
        cache.forget(asked.failed)
        self.script_reads_flags |= any(v.legacy_flags for v in results.succeeded.values())
        self.tf_keras.update({host: v.tf_keras for host, v in results.succeeded.items()
                              if host not in offload})
        self.preflighted.update(h for h in results.succeeded if h not in offload)
        self.offload_checked.update(h for h in results.succeeded if h in offload)
        return results

    def unchecked(self, hosts: Iterable[str]) -> list[str]:
        """Those of ``hosts`` not yet preflighted for their part (a task's or an offload
        host's: checked for different things)."""
        return [host for host in hosts if host not in (
            self.offload_checked if host in self.offload_placed else self.preflighted)]

    def _preflight_script(self) -> str:
        """The script preflight looks for on a node ("" with --sync: the start brings it)."""
        return "" if self.request.sync_dir else self.script_path()

    def _preflight_cache(self) -> PreflightCache:
        return PreflightCache(self.inventory.cluster.known_hosts, self._preflight_script())

    def forget_preflight(self, hosts: Iterable[str]) -> None:
        """Hosts where a start failed: their cached preflight answers go, and this job
        preflights them again if it places tasks there again."""
        hosts = list(hosts)
        self.preflighted.difference_update(hosts)
        self.offload_checked.difference_update(hosts)
        self._preflight_cache().forget(hosts)

    def _cluster(self, hosts: list[str]) -> Cluster:
        """The job's SSH sessions, with one for each of ``hosts`` (made in the caller's
        thread: the background preflight only uses them)."""
        if self.cluster is None:
            self.cluster = Cluster([], self.inventory.cluster)
        for host in hosts:
            self.cluster.sessions.setdefault(
                host, Session(self.inventory.node(host), self.inventory.cluster))
        return self.cluster

    def preflight_while_waiting(self, hosts: list[str]) -> threading.Thread | None:
        """A job that waits preflights the hosts it may get meanwhile (at most
        EARLY_PREFLIGHT_HOSTS of them), so that once admitted it starts at once. A host
        failing here is only checked again, loudly, if the job is placed on it."""
        todo = [host for host in hosts if host not in self.preflighted][:EARLY_PREFLIGHT_HOSTS]
        if not todo:
            return None
        self._cluster(todo)
        thread = threading.Thread(target=lambda: self._check_hosts(todo), daemon=True,
                                  name="early-preflight")
        thread.start()
        return thread

    def announce_flags(self) -> bool:
        """Whether the legacy flags are passed; said once per job, with what ends it."""
        passed = self.request.passes_legacy_flags(self.script_reads_flags)
        if not self.flags_announced:
            self.say(f"hypertf: {self.request.legacy_flags_note(passed)}")
            notice = self.request.topology_notice()
            if notice:
                self.say(f"hypertf: {notice}")
            warning = self.hang_warning(passed)
            if warning:
                self.say(f"hypertf: warning: {warning}")
            self.flags_announced = True
        return passed

    def hang_warning(self, passed: bool) -> str | None:
        """ps tasks, no chief, and no legacy flags for the script: only a TF1 script that
        reads its cluster from the flags finishes in that shape (its workers are the
        finishers). A TF2 ParameterServerStrategy script's workers and ps only serve, so
        the job would wait for ever, silently: say so before it starts. A warning, not a
        refusal: a TF1 script may read TF_CONFIG itself and then runs fine."""
        if not self.request.ps or self.request.chief or passed:
            return None
        why = ("--no-legacy-flags" if self.request.legacy_flags == LegacyFlags.OFF
               else "the script reads no legacy flags (--ps_hosts ...)")
        return (f"ps tasks, no --chief, and {why}: if this is a TF2 ParameterServerStrategy "
                f"script, its workers and ps only serve and the job hangs (nothing ends it "
                f"but --timeout, --idle-fail or Ctrl-C); run it with --chief")

    def script_path(self) -> str:
        script = self.request.script
        return str(Path(script).resolve()) if Path(script).is_file() else script

    # -- allocate -----------------------------------------------------------------------
    def _allocation_request(self, hosts: list[str]) -> Request:
        return Request(slots=self.request.slots(self.cpu_only), hosts=tuple(hosts),
                       policy=self.request.policy,
                       port_ranges={h: self.inventory.node(h).settings.port_range
                                    for h in hosts})

    def needed_hosts(self, hosts: list[str]) -> list[str]:
        """The hosts the job would use now (a dry run): only those are preflighted, so a
        broken node the job does not need does not fail it."""
        placements = plan(self.store, self._allocation_request(hosts))
        self.offload_placed = set(offload_hosts(placements))
        used = {p.host for p in placements}
        return [host for host in hosts if host in used]

    def place(self, task_key: str, live: list[str], exclude: dict[str, set[int]],
              avoid: frozenset[str] = frozenset()) -> Grant:
        """Ask the keeper for GPUs: the one way to get them (on an idle cluster too). The
        job waits in the queue until admitted, or with --no-wait is admitted at once or
        refused (exit 4). When it would start now, the hosts it would use are preflighted
        before it asks. Hosts in ``avoid`` (they failed two attempts) are left out when
        the others can take the job. A request larger than the whole cluster, or than the
        owner's GPU limit, fails at once whatever --no-wait says."""
        others = [host for host in live if host not in avoid]
        if avoid and others:
            with contextlib.suppress(InsufficientResources):  # it needs them: keep them
                self.needed_hosts(others)
                live = others
        request = self._allocation_request(live)
        self._check_could_ever_run(request)
        expect_wait = bool(read_view(self.store))  # others wait: in line behind them
        if not expect_wait:
            try:
                chosen = self.needed_hosts(live)
            except InsufficientResources:
                if not self.request.wait:
                    raise  # the message names what is free where
                expect_wait = True
            else:
                self.connect_soon(chosen)
                new = self.unchecked(chosen)
                if new:
                    self.preflight(new)
        return self._wait_in_queue(task_key, request, exclude, expect_wait)

    def _check_could_ever_run(self, request: Request) -> None:
        limit = self.inventory.cluster.user_gpu_limit
        if limit and request.gpus > limit:
            raise InsufficientResources(
                f"this job asks for {request.gpus} GPUs, more than the {limit} one user may "
                f"hold at once (hypertf_user_gpu_limit): ask for fewer GPUs")
        matrix, _ = read_matrix(self.store)
        if not fits_cluster(request, matrix, list(request.hosts)):
            plan(self.store, request)  # raises today's message: what is free, per host
            raise InsufficientResources(f"{request.describe()}: more than the whole cluster "
                                        f"has; ask for fewer tasks or GPUs")

    def _wait_in_queue(self, task_key: str, request: Request, exclude: dict[str, set[int]],
                       expect_wait: bool) -> Grant:
        """Queue the job, wait for the keeper to admit it, then preflight its hosts."""
        asked = time.monotonic()
        enqueue(self.store, task_key, request, self._record(), self.request.priority, exclude,
                wait=self.request.wait)
        self.queued.add(task_key)
        queued_at = time.monotonic()
        said: list[str] = []

        def say(line: str) -> None:
            said.append(line)
            self.say(line)

        early = None
        if expect_wait and self.request.wait:
            say(f"hypertf: job {task_key} queued (priority {self.request.priority}, "
                f"{request.describe()}): it starts when the GPUs are free; 'hypertf queue' "
                f"shows the queue, 'hypertf cancel {task_key}' ends it")
            early = self.preflight_while_waiting(list(request.hosts))
        try:
            grant = wait_for_admission(self.store, task_key, say, self.lost_session)
        finally:
            self.timeline.add("admission", asked, time.monotonic())
        if said:
            self.say(f"hypertf: job {task_key} admitted after "
                     f"{time.monotonic() - queued_at:.1f} s in the queue")
        if early is not None:
            early.join(self.inventory.cluster.ssh_timeout * 3 + 5)
        self.live_hosts()  # fresh records (addresses, GPU UUIDs) after the wait
        hosts = sorted({p.host for p in grant.placements})
        gone = [host for host in hosts if host not in self.records]
        if gone:
            raise JobFailed(f"the agent of {', '.join(gone)} went away while the job waited",
                            retryable=True, hosts=frozenset(gone))
        self.offload_placed = set(offload_hosts(grant.placements))
        new = self.unchecked(hosts)
        if new:
            self.preflight(new)
        return grant

    def _record(self) -> dict[str, Any]:
        """What the job record says about the request (hypertf jobs shows it)."""
        return {"script": self.request.script, "args": list(self.request.args),
                "inventory": str(self.inventory.path), "job_id": self.job_id,
                "attempt": len(self.attempts)}

    # -- the lifecycle ------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Plan, then attempts until one succeeds, fails, or the port retries run out;
        every attempt stops and releases what it took whatever goes wrong."""
        with interrupted_by_signals():
            try:
                self.connect_soon(self.likely_hosts())
                outcome = self.run_attempts(self.plan())
                self.result, self.message = JobState.SUCCEEDED, outcome.message
            except HyperTFError as err:
                self.result, self.message = ended_by(err)
                raise
            finally:
                with uninterruptible():
                    if self.cluster:
                        self.cluster.close()
                    if self.client is not None:
                        store.close(self.client)
        return self.summary()

    def run_attempts(self, live: list[str]) -> Outcome:
        """New attempts after port clashes (up to MAX_PORT_RETRIES) and, with
        --max-restarts, after retryable failures: each after the previous one is stopped
        and released, restarts with a growing pause, leaving out hosts that failed twice."""
        assert self.parts is not None, "plan() first: it makes the parts"
        exclude: dict[str, set[int]] = {}
        port_retries = 0
        restarts = Restarts(self.request.max_restarts, self.request.restart_on_failure)
        while True:
            key = self.first_key if not self.attempts and self.first_key else \
                new_task_key(self.owner)
            attempt = Attempt(self, key, number=len(self.attempts) + 1,
                              last=port_retries == MAX_PORT_RETRIES, parts=self.parts)
            self.attempts.append(attempt)
            self.lost_session.clear()  # a new attempt has a new lease in the current session
            try:
                outcome = attempt.run(live, exclude, restarts.avoid)
            except JobFailed as err:
                pause = restarts.after(err)
                if pause is None:
                    raise
                self.say(f"hypertf: attempt {attempt.number} failed ({str(err).splitlines()[0]});"
                         f" restart {restarts.done} of {restarts.allowed} in {pause:.0f} s")
                time.sleep(pause)
                live = self.parts.placer.live_hosts()
                continue
            if outcome.verdict is not Verdict.PORT_CLASH:
                return outcome
            port_retries += 1
            self.say("hypertf: a task could not bind its port: retrying on fresh ports")
            for host, ports in outcome.busy_ports.items():
                exclude.setdefault(host, set()).update(ports)

    @property
    def job_id(self) -> str:
        """The job across its attempts: its first attempt's task key."""
        return self.attempts[0].task_key

    def checkpoint_dir(self, host: str) -> str:
        """HYPERTF_CHECKPOINT_DIR: --checkpoint-dir, else one per job in the node's work dir;
        the same path for every attempt."""
        return self.request.checkpoint_dir or checkpoint_dir(
            self.inventory.node(host).settings.workdir, self.job_id)

    @property
    def local_dir(self) -> Path:
        return self.attempts[-1].local_dir if self.attempts else Path("runs")

    def attempts_summary(self) -> list[dict[str, Any]]:
        return [{"attempt": a.number, "task_key": a.task_key, "result": a.result,
                 "message": a.message.splitlines()[0] if a.message else ""}
                for a in self.attempts]

    def summary(self) -> dict[str, Any]:
        return {**summary_of(self.attempts[-1]), "result": self.result, "message": self.message}


def train(inventory: Inventory, request: TrainRequest, say: Callable[[str], None] = print,
          first_key: str | None = None, inventory_s: float = 0.0) -> dict[str, Any]:
    """Run one job to the end; returns the summary, raises JobFailed on failure.
    ``inventory_s``: how long reading the inventory took (the timeline's first phase)."""
    job = Job(inventory, request, say, first_key)
    if inventory_s:
        job.timeline.add("inventory", job.timeline.origin - inventory_s, job.timeline.origin)
    try:
        summary = job.run()
    finally:
        if request.timings:
            key = job.job_id if job.attempts else "?"
            say(f"hypertf: timeline of job {key} (seconds from its start):")
            for line in job.timeline.table():
                say(line)
    say(f"hypertf: job {summary['task_key']} {summary['result']} in {summary['wall_s']:.1f} s")
    for task in summary["tasks"]:
        say(f"  {task['task']:<10} {task['host']:<12} {task['end']}")
    say(f"  logs and summary.json: {job.local_dir}/")
    return summary
