"""Preflight: SSH with verified host keys, the venv, the script and the work dir on each
host a job will use, checked before anything is started or allocated.

``Preflight`` keeps what the job learnt (which hosts passed, as task hosts or as offload
hosts; tf-keras in each venv; whether the script reads the legacy flags, whether it names
ParameterServerStrategy), and only the
launcher's main thread changes it. A round is two steps: ``ask`` (the hosts, the cache;
writes nothing of the job) and ``take`` (records the answers). So the round a waiting job
runs in another thread (``EarlyPreflight``) hands its answers back through a queue, and
the main thread takes them after its join: no attribute is written by two threads.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterable, Set
from dataclasses import dataclass
from pathlib import Path

from hypertf.config.inventory import Inventory
from hypertf.core import diagnose
from hypertf.core.diagnose import ScriptScan
from hypertf.core.protocol import (
    PROTOCOL_VERSION,
    PreflightAnswer,
    ProtocolError,
    VersionMismatch,
)
from hypertf.core.timeline import Timeline
from hypertf.launch.nodeclient import NodeClient
from hypertf.launch.preflightcache import PreflightCache
from hypertf.launch.remote import Cluster, GroupResult, Session
from hypertf.launch.request import TrainRequest
from hypertf.launch.sessions import Sessions

__all__ = ["EARLY_PREFLIGHT_HOSTS", "Answers", "EarlyPreflight", "Preflight"]

EARLY_PREFLIGHT_HOSTS = 32  # hosts a waiting job preflights while it waits


@dataclass(frozen=True)
class Answers:
    """One round's answers: per host its ``PreflightAnswer`` or what failed; ``offload``:
    the hosts asked as offload hosts (checked for other things than a task's host)."""

    results: GroupResult[PreflightAnswer]
    offload: frozenset[str]


class Preflight:
    """What preflight found on the job's hosts, and the rounds that find it. ``offload``
    arguments name the hosts the job lends to its tasks' offloaded products."""

    def __init__(self, inventory: Inventory, request: TrainRequest, sessions: Sessions,
                 timeline: Timeline) -> None:
        self.inventory = inventory
        self.request = request
        self.sessions = sessions
        self.timeline = timeline
        self.preflighted: set[str] = set()
        self.offload_checked: set[str] = set()
        self.tf_keras: dict[str, bool] = {}  # tf-keras in each host's venv
        self.script_reads_flags = False
        self.ps_strategy: dict[str, bool | None] = {}  # each host's answer (None: unknown)
        self.coordinator: dict[str, str | None] = {}  # why it needs a coordinator, per host
        self.confine: dict[str, str] = {}  # what each host enforces (hypertf.node.confine)
        # the script and its local modules as read here, once per job (None: not a file here)
        local = local_script(request)
        self.local_scan: ScriptScan | None = diagnose.scan_script(local) if local else None

    def run(self, hosts: list[str], offload: Set[str]) -> None:
        """Preflight ``hosts``, in parallel; hosts that passed are remembered (and their
        sessions kept) for the whole job, any failure raised as one error."""
        results = self.check(hosts, offload)
        versions = {host: err.hosts[host] for host, err in results.failed.items()
                    if isinstance(err, VersionMismatch)}
        if versions:  # one line for them all: nothing else matters until they are upgraded
            raise VersionMismatch(versions)
        results.raise_failed("preflight", "; nothing was started or allocated")

    def check(self, hosts: list[str], offload: Set[str]) -> GroupResult[PreflightAnswer]:
        """Preflight ``hosts``; what passed is remembered, what failed is returned."""
        return self.take(self.ask(self.sessions.of(hosts), hosts, offload))

    def ask(self, cluster: Cluster, hosts: list[str], offload: Set[str]) -> Answers:
        """Each host's answer, over ``cluster``'s sessions; a host whose answer is in the
        preflight cache (same venv, script digest, host key file; seconds old) is not
        asked again. Writes the cache, nothing of this object: safe in another thread."""
        script, cache = self.script(), self.cache()
        lent = frozenset(host for host in hosts if host in offload)
        results: GroupResult[PreflightAnswer] = GroupResult()
        for host, cached in cache.get(self.inventory.node(h) for h in hosts
                                      if h not in lent).items():
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
                    offload=session.node.name in lent)

        asked = cluster.each(check, [host for host in hosts if host not in results])
        results.update(asked)
        cache.put((self.inventory.node(host), answer.wire())
                  for host, answer in asked.succeeded.items() if host not in lent)
        cache.forget(asked.failed)
        return Answers(results, lent)

    def take(self, answers: Answers) -> GroupResult[PreflightAnswer]:
        """Remember what passed (the main thread's step of a round); the results back."""
        passed, lent = answers.results.succeeded, answers.offload
        self.script_reads_flags |= any(v.legacy_flags for v in passed.values())
        self.tf_keras.update({host: v.tf_keras for host, v in passed.items()
                              if host not in lent})
        self.ps_strategy.update({host: v.ps_strategy for host, v in passed.items()
                                 if host not in lent})
        self.coordinator.update({host: v.coordinator for host, v in passed.items()
                                 if host not in lent})
        self.confine.update({host: v.confine for host, v in passed.items()
                             if host not in lent and v.confine})
        self.preflighted.update(h for h in passed if h not in lent)
        self.offload_checked.update(h for h in passed if h in lent)
        return answers.results

    def unconfined(self) -> list[str]:
        """One line per preflighted host whose tasks are not fully confined (its agent
        cannot make cgroups or filter devices there), for the launcher to say."""
        lines = []
        for host, label in sorted(self.confine.items()):
            if label == "cgroup":
                lines.append(f"{host}: tasks in their job's cgroup, but no device filter: "
                             f"only the trespass detector keeps them off other GPUs")
            elif label != "devices+cgroup":
                lines.append(f"{host}: tasks not confined ({label}): the trespass detector "
                             f"guards its GPUs, and a daemon a task starts is stopped only "
                             f"with its process group")
        return lines

    @property
    def script_ps_strategy(self) -> bool | None:
        """Does the script (or a local module it imports) name ParameterServerStrategy or
        ClusterCoordinator, as the nodes read it? None: no node said (nodes from before the
        answer had the field, or the script comes with --sync)."""
        said = list(self.ps_strategy.values())
        if any(said):
            return True
        return False if said and all(v is False for v in said) else None

    @property
    def script_coordinator(self) -> str | None:
        """Why the script rendezvouses on a coordinator as the nodes read it ("it imports
        jax"), "" when no node found a sign of it, None when no node said."""
        said = [v for v in self.coordinator.values() if v is not None]
        return next((v for v in said if v), "" if said else None)

    def unchecked(self, hosts: Iterable[str], offload: Set[str]) -> list[str]:
        """Those of ``hosts`` not yet preflighted for their part (a task's or an offload
        host's: checked for different things)."""
        return [host for host in hosts if host not in (
            self.offload_checked if host in offload else self.preflighted)]

    def forget(self, hosts: Iterable[str]) -> None:
        """Hosts where a start failed: their cached preflight answers go, and this job
        preflights them again if it places tasks there again."""
        hosts = list(hosts)
        self.preflighted.difference_update(hosts)
        self.offload_checked.difference_update(hosts)
        self.cache().forget(hosts)

    def while_waiting(self, hosts: list[str], offload: Set[str]) -> EarlyPreflight | None:
        """A job that waits preflights the hosts it may get meanwhile (at most
        EARLY_PREFLIGHT_HOSTS of them), so that once admitted it starts at once. A host
        failing here is only checked again, loudly, if the job is placed on it."""
        todo = [host for host in hosts if host not in self.preflighted][:EARLY_PREFLIGHT_HOSTS]
        if not todo:
            return None
        return EarlyPreflight(self, self.sessions.apart(todo), todo, offload)

    def script(self) -> str:
        """The script preflight looks for on a node ("" with --sync: the start brings it)."""
        return "" if self.request.sync_dir else script_path(self.request)

    def cache(self) -> PreflightCache:
        scanned = self.local_scan.files if self.local_scan and not self.request.sync_dir else None
        return PreflightCache(self.inventory.cluster.known_hosts, self.script(), files=scanned)


class EarlyPreflight:
    """A round in a thread of its own (``early-preflight``) while the job waits in the
    queue. The thread only asks; its answers come back on a queue, and ``join`` (the main
    thread) takes them."""

    def __init__(self, preflight: Preflight, cluster: Cluster, hosts: list[str],
                 offload: Set[str]) -> None:
        self.preflight = preflight
        self._answers: queue.Queue[Answers | None] = queue.Queue(maxsize=1)
        lent = frozenset(offload)  # a copy: the main thread's set may change meanwhile

        def run() -> None:
            answers = None
            try:
                answers = preflight.ask(cluster, hosts, lent)
            finally:  # a failure still wakes join (and keeps its traceback on stderr)
                self._answers.put(answers)

        threading.Thread(target=run, daemon=True, name="early-preflight").start()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the round and take its answers. A round still
        running, or one that failed, is left: its hosts are asked again if the job is
        placed on them."""
        with contextlib.suppress(queue.Empty):
            answers = self._answers.get(timeout=timeout)
            if answers is not None:
                self.preflight.take(answers)


def local_script(request: TrainRequest) -> Path | None:
    """The script as a file on this machine (with --sync: in DIR), if it is one here."""
    path = Path(request.sync_dir or ".") / request.script
    return path if path.is_file() else None


def script_path(request: TrainRequest) -> str:
    """The script as the job names it to the nodes: absolute when it is a file here."""
    script = request.script
    return str(Path(script).resolve()) if Path(script).is_file() else script
