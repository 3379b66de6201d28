"""The job behind ``invoke train`` / ``hypertf train``: plan -> preflight -> one ``Attempt``
per try -> report.

``Job`` holds what every attempt shares and hands each its parts: the placer (the keeper's
grant, with the hosts preflighted: hypertf.launch.placer), the fleet over the job's SSH
sessions (hypertf.launch.sessions), the lease, the reporter. Each ``Attempt``
(hypertf.launch.attempt) has its own task key and allocates, starts, watches, stops and
releases. A port clash is retried as a new attempt on fresh ports. If the launcher is
killed outright, its ZooKeeper lease expires and the agents stop the job's tasks and free
its GPUs.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kazoo.client import KazooState

from hypertf import store
from hypertf.config.inventory import Inventory
from hypertf.core.errors import HyperTFError, Interrupted
from hypertf.core.jobrecord import AttemptSummary, JobState, JobSummary
from hypertf.core.monitor import Verdict
from hypertf.core.placement import new_task_key
from hypertf.core.preemption import requeue_delay
from hypertf.core.records import AgentRecord
from hypertf.core.rendezvous import READINESS_SAID, Readiness
from hypertf.core.rundir import checkpoint_dir
from hypertf.core.timeline import Timeline
from hypertf.launch.attempt import (
    Attempt,
    JobFailed,
    JobKilled,
    Outcome,
    Parts,
    Preempted,
    ended_by,
    interrupted_by_signals,
    summary_of,
    uninterruptible,
)
from hypertf.launch.fleet import SshFleet
from hypertf.launch.lease import StoreLease
from hypertf.launch.login import shared_login
from hypertf.launch.placer import KeeperPlacer
from hypertf.launch.preflight import Preflight, script_path
from hypertf.launch.prestart import likely_hosts
from hypertf.launch.reporter import Reporter
from hypertf.launch.request import LegacyFlags, TrainRequest
from hypertf.launch.roster import Roster
from hypertf.launch.sessions import Sessions
from hypertf.store import Layout, Store, credentials

__all__ = ["Interrupted", "Job", "JobFailed", "TrainRequest", "train"]

MAX_PORT_RETRIES = 3
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
                 parts: Parts | None = None, sessions: Sessions | None = None) -> None:
        request.validate()
        self.inventory = inventory
        self.request = request
        self.say = say
        # what each attempt is handed; the real ones once connected (plan), unless given
        self.parts = parts
        self.reporter = parts.reporter if parts else Reporter(say)
        self.timeline: Timeline = self.reporter.timeline
        self.layout = Layout(inventory.cluster.zk_root)
        self.owner = credentials.job_owner()
        self.store: Store | None = None  # the job's ZooKeeper client and root, once connected
        # the SSH sessions: a cold launch's, begun before this module was imported (prestart)
        self.sessions = sessions if sessions is not None else Sessions(inventory)
        self.preflight = Preflight(inventory, request, self.sessions, self.timeline)
        self.records: dict[str, AgentRecord] = {}  # the live agents' (the roster refreshes it)
        self.lost_session = threading.Event()
        self.started_at = time.time()
        self.result = JobState.FAILED  # succeeded, failed or interrupted
        self.message = ""
        self.flags_announced = False
        # whether the script names ParameterServerStrategy (None: not known), once announced
        self.ps_strategy: bool | None = None
        self.readiness = Readiness.TF  # which ports "started" waits for (decided at start)
        self.cpu_only = False
        self.attempts: list[Attempt] = []
        self.first_key = first_key  # a detached launcher's key, chosen by its parent

    # -- plan ---------------------------------------------------------------------------
    def plan(self) -> list[str]:
        """Connect, and find the candidate hosts (inventory GPU nodes with a live agent);
        the parts each attempt is handed are made here, unless the job was given them."""
        with self.timeline.phase("connect"):
            client = store.connect(self.inventory.cluster, long_lived=True,
                                   on_pause=lambda msg: self.say(f"hypertf: {msg}"))
            self.store = connected = Store(client, self.layout)
            client.add_listener(self._on_state)
            roster = Roster(connected, self.inventory, self.say, self.records)
            hosts = roster.live_hosts()
        self.cpu_only = sum(self.records[h].gpu for h in hosts) == 0
        if self.cpu_only and any(slot.gpus for slot in self.request.slots(cpu_only=False)):
            self.say("hypertf: notice: no GPU on any node of this cluster: every task runs on CPU")
        if self.parts is None:  # the job places its tasks itself (queue, preflight)
            placer = KeeperPlacer(connected.queue, connected.matrix, roster, self.preflight,
                                  self.sessions.connect_soon, self.inventory, self.request,
                                  self.reporter, self.lost_session, self.cpu_only)
            self.parts = Parts(placer=placer, fleet=SshFleet(self.sessions.cluster, self.timeline),
                               lease=StoreLease(connected, self.say), reporter=self.reporter)
        return hosts

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self.lost_session.set()

    @property
    def tf_keras(self) -> Mapping[str, bool]:
        """Preflight's answer: tf-keras in each host's venv."""
        return self.preflight.tf_keras

    def announce_flags(self) -> bool:
        """Whether the legacy flags are passed; said once per job, with what ends it."""
        passed = self.request.passes_legacy_flags(self.preflight.script_reads_flags)
        if not self.flags_announced:
            self.ps_strategy = self.script_ps_strategy()
            self.say(f"hypertf: {self.request.legacy_flags_note(passed)}")
            notice = self.request.topology_notice(self.ps_strategy)
            if notice:
                self.say(f"hypertf: {notice}")
            warning = self.hang_warning(passed, self.ps_strategy)
            if warning:
                self.say(f"hypertf: warning: {warning}")
            for line in self.preflight.unconfined():
                self.say(f"hypertf: notice: {line}")
            shared = shared_login(self.inventory)
            if shared:
                self.say(shared)
            self.readiness, why = self.decide_readiness()
            mode_line = self.readiness_line(self.readiness, why)
            if mode_line:
                self.say(f"hypertf: {mode_line}")
            self.flags_announced = True
        return passed

    def readiness_line(self, readiness: Readiness, why: str) -> str | None:
        """The rendezvous mode, what it waits for and why, in one line (as the legacy-flags
        line says its choice): a single task has no port that must open (no peer connects
        to it, ``must_listen``), and TensorFlow's way is said only for a job of two or
        more tasks (a single task's is nothing to say)."""
        one_task = self.request.workers + self.request.ps + int(self.request.chief) < 2
        if readiness is Readiness.TF and one_task:
            return None
        waits = ("a single task: no port must open before the start-up deadline"
                 if one_task and readiness is not Readiness.NONE else READINESS_SAID[readiness])
        if not self.request.rendezvous:  # the option is named once, not after itself
            why = f"{why}; --rendezvous tf|coordinator|none chooses"
        return f"rendezvous: {readiness} ({waits}): {why}"

    def decide_readiness(self) -> tuple[Readiness, str]:
        """What "started" waits for, and why: --rendezvous, else the script's own imports
        (read here when it is a file here, else as the nodes read it), else a
        KERAS_BACKEND=jax in the job's --env, else TensorFlow's way (every task's port)."""
        if self.request.rendezvous:
            chosen = Readiness(self.request.rendezvous)
            return chosen, f"chosen by --rendezvous {chosen}"
        scan = self.preflight.local_scan
        why = scan.coordinator if scan is not None else self.preflight.script_coordinator
        if not why and self.request.env_vars().get("KERAS_BACKEND") == "jax":
            why = "the job's --env sets KERAS_BACKEND=jax"
        if why is None:  # no node read the script (old nodes)
            return Readiness.TF, "TensorFlow's way, the default (the script was not read)"
        if not why:
            return Readiness.TF, "the script imports no jax, torch or keras on jax"
        return Readiness.COORDINATOR, f"the script {why[3:]}" if why.startswith("it ") else why

    def script_ps_strategy(self) -> bool | None:
        """Does the script, or a module beside it that it imports, name
        ParameterServerStrategy or ClusterCoordinator? Read here when the script is a file
        here (--sync: in DIR), else as the nodes' preflight read it; None: not known."""
        scan = self.preflight.local_scan
        return scan.ps_strategy if scan is not None else self.preflight.script_ps_strategy

    def hang_warning(self, passed: bool, ps_strategy: bool | None = None) -> str | None:
        """ps tasks, no chief: only a TF1 script finishes in that shape (its workers are the
        finishers). A TF2 ParameterServerStrategy script's workers and ps only serve, so
        the job would wait for ever, silently: say so before it starts, when the script
        names ParameterServerStrategy (``ps_strategy``), or, not known, when it reads no
        legacy flags. A script known to name neither it nor ClusterCoordinator is TF1 (one
        that reads TF_CONFIG breaks on a chief): no word of --chief. A warning, not a
        refusal."""
        if not self.request.ps or self.request.chief or ps_strategy is False:
            return None
        if ps_strategy:
            return ("ps tasks and no --chief, but the script names ParameterServerStrategy "
                    "or ClusterCoordinator (TF2): its workers and ps only serve and the job "
                    "hangs (nothing ends it but --timeout, --idle-fail or Ctrl-C); run it "
                    "with --chief")
        if passed:
            return None
        why = ("--no-legacy-flags" if self.request.legacy_flags == LegacyFlags.OFF
               else "the script reads no legacy flags (--ps_hosts ...)")
        return (f"ps tasks, no --chief, and {why}: if this is a TF2 ParameterServerStrategy "
                f"script, its workers and ps only serve and the job hangs (nothing ends it "
                f"but --timeout, --idle-fail or Ctrl-C); run it with --chief")

    def script_path(self) -> str:
        return script_path(self.request)

    # -- the lifecycle ------------------------------------------------------------------
    def run(self) -> JobSummary:
        """Plan, then attempts until one succeeds, fails, or the port retries run out;
        every attempt stops and releases what it took whatever goes wrong."""
        with interrupted_by_signals():
            try:
                self.sessions.connect_soon(likely_hosts(self.inventory, self.request))
                outcome = self.run_attempts(self.plan())
                self.result, self.message = JobState.SUCCEEDED, outcome.message
            except HyperTFError as err:
                self.result, self.message = ended_by(err)
                raise
            finally:
                with uninterruptible():
                    self.sessions.close()
                    if self.store is not None:
                        store.close(self.store.client)
        return self.summary()

    def run_attempts(self, live: list[str]) -> Outcome:
        """New attempts after port clashes (up to MAX_PORT_RETRIES) and, with
        --max-restarts, after retryable failures: each after the previous one is stopped
        and released, restarts with a growing pause, leaving out hosts that failed twice."""
        assert self.parts is not None, "plan() first: it makes the parts"
        exclude: dict[str, set[int]] = {}
        port_retries = 0
        restarts = Restarts(self.request.max_restarts, self.request.restart_on_failure)
        resumes = ""  # the preempted attempt the next one continues
        while True:
            key = self.first_key if not self.attempts and self.first_key else \
                new_task_key(self.owner)
            attempt = Attempt(self, key, number=len(self.attempts) + 1,
                              last=port_retries == MAX_PORT_RETRIES, parts=self.parts,
                              resumes=resumes)
            self.attempts.append(attempt)
            self.lost_session.clear()  # a new attempt has a new lease in the current session
            try:
                outcome = attempt.run(live, exclude, restarts.avoid)
            except Preempted as err:  # not a failure: no restart is spent on it
                resumes = attempt.task_key
                wait = requeue_delay(err.notice.count)
                self.say(f"hypertf: attempt {attempt.number} {err}: requeued as attempt "
                         f"{attempt.number + 1}" + (f" in {wait:.0f} s" if wait else "")
                         + ", at its place in the queue")
                time.sleep(wait)
                # the hosts it had: an agent down for a moment must not end the job (the
                # keeper admits it only on live hosts, and it waits for them in the queue)
                continue
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

    def attempts_summary(self) -> list[AttemptSummary]:
        return [{"attempt": a.number, "task_key": a.task_key, "result": a.result,
                 "message": a.message.splitlines()[0] if a.message else ""}
                for a in self.attempts]

    def summary(self) -> JobSummary:
        summary = summary_of(self.attempts[-1])
        summary["result"], summary["message"] = self.result, self.message
        return summary


def train(inventory: Inventory, request: TrainRequest, say: Callable[[str], None] = print,
          first_key: str | None = None, inventory_s: float = 0.0,
          sessions: Sessions | None = None) -> JobSummary:
    """Run one job to the end; returns the summary, raises JobFailed on failure.
    ``inventory_s``: how long reading the inventory took (the timeline's first phase);
    ``sessions``: the SSH sessions a cold launch began (prestart), the job's from now on."""
    try:
        job = Job(inventory, request, say, first_key, sessions=sessions)
    except BaseException:  # a request refused: the sessions are closed all the same
        if sessions is not None:
            sessions.close()
        raise
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
