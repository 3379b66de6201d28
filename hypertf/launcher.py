"""The job lifecycle behind ``invoke train`` / ``hypertf train``.

plan -> preflight -> allocate -> start -> watch -> decide -> stop -> release -> report.
Each step is a method of ``Job``; ``Job.run`` calls them in that order and guarantees the
last three whatever happens (failure, Ctrl-C, SIGTERM). If the launcher is killed outright,
its ZooKeeper lease expires and the agents stop the job's tasks and free its GPUs.
"""

from __future__ import annotations

import io
import itertools
import json
import queue
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.client import KazooState
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from hypertf import auth, diagnose, store
from hypertf import spec as specs
from hypertf.allocation import (
    Grant,
    PortsExhausted,
    Request,
    allocate,
    new_task_key,
    plan,
    release,
    update_job,
)
from hypertf.errors import (
    HyperTFError,
    InsufficientResources,
    StoreError,
    UsageError,
)
from hypertf.inventory import Inventory, check_env
from hypertf.monitor import Event, Limits, Monitor, TaskState, Verdict
from hypertf.nodeclient import NodeClient, PortsBusy
from hypertf.remote import Cluster, GroupResult, Session
from hypertf.rundir import RunDir
from hypertf.scheduler import POLICIES
from hypertf.store import Layout

QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONUNBUFFERED": "1",
             "GRPC_FAIL_FAST": "use_caller"}
MAX_PORT_RETRIES = 3
MAX_PATH_BYTES = 4096  # PATH_MAX
MAX_ARG_BYTES = 131072 - 1  # MAX_ARG_STRLEN: one argument the kernel passes to a program
MAX_ARGS_BYTES = 1024 * 1024  # all of them, well under ARG_MAX with TF_CONFIG beside
MAX_PLACE_ATTEMPTS = 20  # lost allocation races before giving up


class JobFailed(HyperTFError):
    """The job ran and failed; the message names the task and shows its last lines."""

    exit_code = 1


class Interrupted(HyperTFError):
    exit_code = 130


LEGACY_FLAG_MODES = ("auto", "on", "off")
MAX_SYNC_SOURCES = 2000  # Python files of --sync DIR scanned for the legacy flags


@dataclass(frozen=True)
class TrainRequest:
    """What the user asked for on the command line."""

    script: str
    workers: int = 1
    ps: int = 0
    chief: bool = False
    policy: str = "round_robin"
    gpus_per_worker: int = 1
    gpus_per_ps: int = 0
    sync_dir: str | None = None
    start_timeout: float = 120.0
    timeout: float | None = None
    legacy_flags: str = "auto"  # auto: only if the script reads them; on; off
    grace: float = 5.0
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()  # NAME=VALUE for every task, over the inventory's
    idle_timeout: float | None = 300.0  # warn when every task listens and none writes
    idle_fail: bool = False  # ... and end the job then

    def env_vars(self) -> dict[str, str]:
        """--env NAME=VALUE as a mapping; a bad name or a reserved one is a usage error."""
        result = {}
        for item in self.env:
            name, sep, value = item.partition("=")
            try:
                if not sep:
                    raise ValueError(f"--env {item!r} must look like NAME=VALUE")
                result[name] = check_env(name, value, "--env")
            except ValueError as err:
                raise UsageError(str(err)) from None
        return result

    def validate(self) -> None:
        if self.workers < 0 or self.ps < 0 or self.gpus_per_worker < 0 or self.gpus_per_ps < 0:
            raise UsageError("--worker, --ps and the GPU counts cannot be negative")
        if self.workers == 0 and not self.chief:
            raise UsageError("a job needs at least one worker (--worker N) or --chief")
        if self.workers + self.ps + self.chief > 1024:
            raise UsageError(f"{self.workers + self.ps + self.chief} tasks is more than the "
                             f"1024 a job may have")
        self.env_vars()
        if self.legacy_flags not in LEGACY_FLAG_MODES:
            raise UsageError(f"legacy flags must be one of {', '.join(LEGACY_FLAG_MODES)}, "
                             f"not {self.legacy_flags!r}")
        if self.policy not in POLICIES:
            raise UsageError(f"unknown policy {self.policy!r}; choose {' or '.join(POLICIES)}")
        if not self.start_timeout > 0 or (self.timeout is not None and not self.timeout > 0):
            raise UsageError("--start-timeout and --timeout must be positive seconds")
        if self.idle_timeout is not None and not self.idle_timeout > 0:
            raise UsageError("--idle-timeout must be positive seconds")
        if not self.grace >= 0:
            raise UsageError(f"--grace must be zero or more seconds, not {self.grace}")
        if "\0" in self.script or any("\0" in arg for arg in self.args):
            raise UsageError("the script path and its arguments cannot hold NUL bytes")
        if len(self.script.encode()) > MAX_PATH_BYTES:
            raise UsageError(f"--script is {len(self.script.encode())} bytes long; a path "
                             f"has at most {MAX_PATH_BYTES}")
        longest = max((len(arg.encode()) for arg in self.args), default=0)
        if longest > MAX_ARG_BYTES:
            raise UsageError(f"a script argument of {longest} bytes is longer than the "
                             f"{MAX_ARG_BYTES} bytes Linux passes to a program; put such "
                             f"values in a file and pass its path")
        total = sum(len(arg.encode()) + 1 for arg in self.args)
        if total > MAX_ARGS_BYTES:
            raise UsageError(f"the script's arguments total {total} bytes, more than the "
                             f"{MAX_ARGS_BYTES} a task's command line may have; put them in "
                             f"a file and pass its path")
        if self.sync_dir:
            if not Path(self.sync_dir).is_dir():
                raise UsageError(f"--sync {self.sync_dir}: no such directory")
            if not (Path(self.sync_dir) / self.script).is_file():
                raise UsageError(f"--script {self.script} not found in --sync {self.sync_dir}")


class _LineSink(io.TextIOBase):
    """Invoke/Fabric write the watcher's stdout here; whole lines go to the queue."""

    def __init__(self, host: str, events: queue.Queue[Event]) -> None:
        self.host, self.events, self.buffer = host, events, ""

    def write(self, text: str) -> int:
        self.buffer += text
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            if line.strip():
                try:
                    self.events.put(Event.from_node(self.host, json.loads(line)))
                except (json.JSONDecodeError, AttributeError):  # not a JSON object
                    self.events.put(Event("noise", self.host, line=line))
        return len(text)


class Job:
    """One training job from plan to report."""

    def __init__(self, inventory: Inventory, request: TrainRequest,
                 say: Callable[[str], None] = print) -> None:
        request.validate()
        self.inventory = inventory
        self.request = request
        self.say = say
        self.layout = Layout(inventory.cluster.zk_root)
        self.task_key = new_task_key(auth.job_owner())
        self.client: Any = None
        self.grant: Grant | None = None
        self.tasks: dict[str, TaskState] = {}
        self.cluster: Cluster | None = None
        self.events: queue.Queue[Event] = queue.Queue()
        self.lost_session = threading.Event()
        self.lease_dropped = threading.Event()
        self.started_at = time.time()
        self.result = "failed"
        self.message = ""
        self.preflighted: set[str] = set()
        self.script_reads_flags = False
        self.legacy_flags_said = False
        self.cpu_only = False
        self.lost_hosts: set[str] = set()

    @property
    def local_dir(self) -> Path:
        """Where the task logs and summary.json land on this machine."""
        return Path("runs") / self.task_key

    # -- plan ---------------------------------------------------------------------------
    def plan(self) -> list[str]:
        """Connect, and find the candidate hosts (inventory GPU nodes with a live agent)."""
        self.client = store.connect(self.inventory.cluster)
        self.client.add_listener(self._on_state)
        records = store.read_records(self.client, self.layout)
        hosts = [name for name in self.inventory.nodes if name in records]
        if not hosts:
            raise HyperTFError(
                f"no agent is running on any host of {self.inventory.path}: start them with "
                f"'invoke agent.start -i {self.inventory.path}' (status: hypertf status)"
            )
        self.records = records
        self.cpu_only = sum(records[h].gpu for h in hosts) == 0
        if self.cpu_only and (self.request.gpus_per_worker or self.request.gpus_per_ps):
            self.say("hypertf: notice: no GPU on any node of this cluster: every task runs on CPU")
        return hosts

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self.lost_session.set()

    # -- preflight ----------------------------------------------------------------------
    def preflight(self, hosts: list[str]) -> None:
        """SSH with verified host keys, venv, script, work dir: on every host, in parallel.
        Hosts that passed are remembered (and their sessions kept) for the whole job."""
        if self.cluster is None:
            self.cluster = Cluster([], self.inventory.cluster)
        for host in hosts:
            self.cluster.sessions.setdefault(
                host, Session(self.inventory.node(host), self.inventory.cluster))
        script = "" if self.request.sync_dir else self._script_path()

        def check(session: Session) -> dict[str, Any]:
            return NodeClient(session).preflight(
                script, timeout=self.inventory.cluster.ssh_timeout * 3)

        results = self.cluster.each(check, hosts)
        results.raise_failed("preflight", "; nothing was started or allocated")
        self.script_reads_flags |= any(v.get("legacy_flags") for v in results.succeeded.values())
        self.preflighted.update(hosts)

    @property
    def legacy_flags(self) -> bool:
        """Pass --ps_hosts/--worker_hosts/--job_name/--task_index? In ``auto`` only when the
        script reads them: absl and strict argparse scripts die of flags they do not know."""
        mode = self.request.legacy_flags
        if mode != "auto":
            return mode == "on"
        if self.request.sync_dir:
            sources = itertools.islice(Path(self.request.sync_dir).rglob("*.py"),
                                       MAX_SYNC_SOURCES)
            return diagnose.files_read_legacy_flags(sources)
        return self.script_reads_flags

    def _say_legacy_flags(self, passed: bool) -> None:
        why = {"on": "--legacy-flags", "off": "--no-legacy-flags"}.get(
            self.request.legacy_flags,
            "the script reads them" if passed else
            "the script does not read them; --legacy-flags forces them")
        self.say(f"hypertf: legacy flags (--ps_hosts, --worker_hosts, --job_name, --task_index) "
                 f"{'passed' if passed else 'not passed'}: {why}")

    def _script_path(self) -> str:
        script = self.request.script
        return str(Path(script).resolve()) if Path(script).is_file() else script

    # -- allocate -----------------------------------------------------------------------
    def _allocation_request(self, hosts: list[str]) -> Request:
        gpus = 0 if self.cpu_only else self.request.gpus_per_worker
        ps_gpus = 0 if self.cpu_only else self.request.gpus_per_ps
        slots = specs.slots_for(self.request.ps, self.request.workers, self.request.chief,
                                gpus, ps_gpus)
        return Request(slots=slots, hosts=tuple(hosts), policy=self.request.policy,
                       port_ranges={h: self.inventory.node(h).settings.port_range
                                    for h in hosts})

    def needed_hosts(self, hosts: list[str]) -> list[str]:
        """The hosts the job would use now (a dry run): only those are preflighted, so a
        broken node the job does not need does not fail it."""
        placements = plan(self.client, self.layout, self._allocation_request(hosts))
        used = {p.host for p in placements}
        return [host for host in hosts if host in used]

    def place(self, live: list[str], exclude: dict[str, set[int]]) -> Grant:
        """Plan over every live host, preflight the hosts chosen that have not passed yet,
        then allocate on the hosts that passed. A lost race (a neighbour took the GPUs
        between the plan and the allocation) plans again over every live host, so a
        request is refused only when it does not fit now (and the message lists every
        host's free GPUs)."""
        for _ in range(MAX_PLACE_ATTEMPTS):
            chosen = self.needed_hosts(live)  # InsufficientResources: does not fit now
            new = [host for host in chosen if host not in self.preflighted]
            if new:
                self.preflight(new)
            try:
                return self.allocate([h for h in live if h in self.preflighted], exclude)
            except PortsExhausted:
                raise
            except InsufficientResources:
                time.sleep(random.uniform(0.01, 0.1))  # lost a race: plan again, staggered
        raise InsufficientResources(
            f"other jobs took the free GPUs first {MAX_PLACE_ATTEMPTS} times in a row; "
            f"the cluster is too busy for this request now (hypertf status)")

    def allocate(self, hosts: list[str], exclude: dict[str, set[int]] | None = None) -> Grant:
        request = self._allocation_request(hosts)
        job = {"script": self.request.script, "args": list(self.request.args),
               "inventory": str(self.inventory.path)}
        grant = allocate(self.client, self.layout, request, self.task_key, job=job,
                         exclude_ports=exclude)
        self.grant = grant
        self.tasks = {p.name: TaskState(p, grant.ports[p.name]) for p in grant.placements}
        self.lease_dropped.clear()
        key = self.task_key

        def on_lease(data: bytes | None, _stat: object) -> bool:
            if data is None and key == self.task_key and self.grant is not None:
                self.lease_dropped.set()  # 'hypertf kill', or the session expired
            return data is not None and key == self.task_key  # False ends the watch

        self.client.DataWatch(self.layout.lease(key), on_lease)
        return grant

    # -- start --------------------------------------------------------------------------
    def run_dir(self, host: str) -> RunDir:
        return RunDir.of(self.inventory.node(host).settings.workdir, self.task_key)

    def start(self) -> dict[str, set[int]]:
        """Every task at once: one SSH command per host, hosts in parallel.

        Returns the granted ports found already in use, per host (nothing is started on such
        a host; the caller retries on fresh ports). A port probe would otherwise mistake the
        squatter for our task.
        """
        assert self.grant and self.cluster
        addresses = {p.name: f"{self.records[p.host].data_addr}:{self.grant.ports[p.name]}"
                     for p in self.grant.placements}
        by_host: dict[str, list[specs.TaskSpec]] = {}
        for task_spec in specs.build(self.grant.placements, addresses):
            by_host.setdefault(task_spec.placement.host, []).append(task_spec)
        if self.request.sync_dir:
            sync_dir = self.request.sync_dir
            self.cluster.each(lambda s: NodeClient(s).upload(self.run_dir(s.node.name), sync_dir),
                              list(by_host)).raise_failed("--sync upload")

        legacy_flags = self.legacy_flags
        if not self.legacy_flags_said:
            self._say_legacy_flags(legacy_flags)
            self.say_topology()
            self.legacy_flags_said = True

        def launch(session: Session) -> None:
            host = session.node.name
            run = self.run_dir(host)
            cwd = str(run.code) if self.request.sync_dir else session.node.settings.workdir
            script = self.request.script if self.request.sync_dir else self._script_path()
            tasks = []
            for task_spec in by_host[host]:
                task = self.tasks[task_spec.placement.name]
                env = {**QUIET_ENV, **self.task_env(host), "TF_CONFIG": task_spec.tf_config,
                       **specs.gpu_env(task_spec.placement.gpus, self.records[host].gpus),
                       "HYPERTF_TASK_KEY": self.task_key, "HYPERTF_TASK": task.name}
                argv = ["python", script, *(task_spec.flags if legacy_flags else ()),
                        *self.request.args]
                tasks.append({"name": task.file_name, "port": task.port, "cwd": cwd,
                              "env": env, "argv": argv})
            NodeClient(session).start(run, tasks)

        update_job(self.client, self.layout, self.task_key, state="starting")
        results = self.cluster.each(launch, list(by_host))
        busy = {h: v.ports for h, v in results.failed.items() if isinstance(v, PortsBusy)}
        failed = {h: v for h, v in results.failed.items() if not isinstance(v, PortsBusy)}
        if failed:
            raise JobFailed("could not start tasks: " +
                            "; ".join(f"{h}: {v}" for h, v in failed.items()))
        if busy:
            return busy
        self.say(f"hypertf: job {self.task_key}: started {len(self.tasks)} tasks: " + ", ".join(
            f"{t.name}@{t.placement.host}:{t.port}"
            + (f" GPU {','.join(map(str, t.placement.gpus))}" if t.placement.gpus else "")
            for t in self.tasks.values()))
        for host in by_host:
            threading.Thread(target=self._watch_host, args=(host,), daemon=True).start()
        return busy

    def _watch_host(self, host: str) -> None:
        assert self.cluster
        ports = {t.file_name: t.port for t in self.tasks.values() if t.placement.host == host}
        try:
            NodeClient(self.cluster.sessions[host]).watch(
                self.run_dir(host), ports, _LineSink(host, self.events))
        except Exception as err:  # the host went away; the Monitor decides what it means
            self.events.put(Event("lost", host, why=str(err)))
        else:
            self.events.put(Event("closed", host))

    def watch(self) -> Verdict:
        """Stream logs and feed every event to the job's Monitor until it decides: the
        verdict (succeeded, or a port clash to retry); a failure raises JobFailed."""
        assert self.grant is not None
        limits = Limits(start_timeout=self.request.start_timeout, timeout=self.request.timeout,
                        idle_timeout=self.request.idle_timeout, idle_fail=self.request.idle_fail,
                        host_silence=max(2 * self.inventory.cluster.ssh_timeout, 10.0))
        monitor = Monitor(self.tasks, limits, time.monotonic(), logs_hint=f"{self.local_dir}/",
                          idle_causes=self._idle_causes())
        while True:
            try:
                event = self.events.get(timeout=0.2)
            except queue.Empty:
                event = Event("tick")
            if event.kind == "exit" and event.killed:
                self.lease_dropped.wait(1.0)  # killed by an agent after 'hypertf kill'?
            if self.lost_session.is_set():
                event = Event("session-lost")
            elif self.lease_dropped.is_set():
                event = Event("lease-dropped", why=(
                    f"job {self.task_key} was killed: its lease was dropped (hypertf kill); "
                    f"its tasks are stopped and its GPUs returned"))
            decision = monitor.feed(event, time.monotonic())
            for line in decision.say:
                self.say(line)
            self.lost_hosts |= monitor.lost_hosts
            if decision.verdict in (Verdict.SUCCEEDED, Verdict.PORT_CLASH):
                return decision.verdict
            if decision.final:
                raise JobFailed(decision.message)

    def _idle_causes(self) -> str:
        if self.request.ps and not self.request.chief:
            return ("with ps and no chief the workers are the finishers (TF1 between-graph); "
                    "a TF2 ParameterServerStrategy script needs --chief, or every task only "
                    "serves")
        return ("a task waiting for a peer that never connects (a wrong address or network), "
                "a collective stuck on a dead peer, or a script that only serves")

    def say_topology(self) -> None:
        """What ends the job, said before it starts: a wrong guess here is a silent hang."""
        if self.request.ps and not self.request.chief:
            self.say("hypertf: ps and no chief: the job ends when every worker has exited 0 "
                     "(TF1 between-graph); a TF2 ParameterServerStrategy script needs "
                     "--chief (its workers and ps only serve)")

    # -- stop ---------------------------------------------------------------------------
    def stop(self) -> GroupResult[dict[str, str]]:
        """TERM each task's process group, KILL after the grace period; every host at once."""
        if not self.cluster or not self.tasks:
            return GroupResult()
        hosts = sorted({t.placement.host for t in self.tasks.values()} - self.lost_hosts)
        for host in sorted(self.lost_hosts):
            self.say(f"hypertf: warning: {host} does not answer: its agent stops the job's "
                     f"tasks there when it can reach ZooKeeper again (the lease is released)")

        def halt(session: Session) -> dict[str, str]:
            return NodeClient(session).stop(self.run_dir(session.node.name), self.request.grace)

        results = self.cluster.each(halt, hosts)
        for host, value in results.succeeded.items():
            for task in self.tasks.values():
                if task.placement.host == host and task.file_name in value:
                    task.stop_result = task.stop_result or value[task.file_name]
        for host, err in results.failed.items():
            self.say(f"hypertf: warning: could not stop tasks on {host} ({err}); its "
                     f"agent stops them once the job's lease is released")
        return results

    def _confirmed_dead(self, stopped: GroupResult[dict[str, str]]) -> list[str]:
        """Hosts where the stop saw every task of the job dead: only their GPUs go back
        now; the others drain until their agent has confirmed."""
        hosts = {t.placement.host for t in self.tasks.values()}
        if not hosts:
            return sorted({p.host for p in self.grant.placements}) if self.grant else []
        return sorted(
            host for host in hosts
            if host in stopped.succeeded
            and "survived SIGKILL" not in stopped.succeeded[host].values()
        )

    # -- report -------------------------------------------------------------------------
    def collect_logs(self) -> None:
        if not self.cluster or not self.tasks:
            return
        self.local_dir.mkdir(parents=True, exist_ok=True)

        def fetch(session: Session) -> None:
            node = NodeClient(session)
            for task in self.tasks.values():
                if task.placement.host == session.node.name:
                    log = node.fetch_log(self.run_dir(session.node.name), task.file_name)
                    (self.local_dir / f"{task.file_name}.log").write_text(log)

        hosts = sorted({t.placement.host for t in self.tasks.values()} - self.lost_hosts)
        self.cluster.each(fetch, hosts)

    def task_env(self, host: str) -> dict[str, str]:
        """The user's environment for the tasks on ``host``: the inventory's
        hypertf_task_env, then --env over it."""
        node = self.inventory.node(host)
        return {**dict(node.settings.task_env), **self.request.env_vars()}

    def summary(self) -> dict[str, Any]:
        return {
            "task_key": self.task_key,
            "result": self.result,
            "message": self.message,
            "script": self.request.script,
            "args": list(self.request.args),
            "inventory": str(self.inventory.path),
            "policy": self.request.policy,
            "cpu_only": self.cpu_only,
            "env": {host: self.task_env(host)
                    for host in sorted({t.placement.host for t in self.tasks.values()})},
            "wall_s": round(time.time() - self.started_at, 2),
            "tasks": [
                {"task": t.name, "host": t.placement.host, "gpus": list(t.placement.gpus),
                 "port": t.port, "exit_code": t.exit_code, "killed": t.killed,
                 "end": t.end(t.placement.host in self.lost_hosts),
                 "duration_s": round(t.ended - t.started, 2) if t.ended and t.started else None}
                for t in self.tasks.values()
            ],
        }

    # -- the lifecycle ------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Plan to report; stop, release and report happen whatever goes wrong."""
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def interrupt(signum: int, _frame: object) -> None:
            raise Interrupted(f"interrupted by {signal.Signals(signum).name}: job stopped, "
                              f"GPUs released")

        for sig in previous:
            signal.signal(sig, interrupt)
        try:
            live = self.plan()
            exclude: dict[str, set[int]] = {}
            for attempt in range(MAX_PORT_RETRIES + 1):
                self.place(live, exclude)
                busy = self.start()
                outcome = Verdict.PORT_CLASH if busy else self.watch()
                if outcome is not Verdict.PORT_CLASH or attempt == MAX_PORT_RETRIES:
                    break
                self.say("hypertf: a task could not bind its port: retrying on fresh ports")
                for host, ports in busy.items():
                    exclude.setdefault(host, set()).update(ports)
                if not busy:
                    for task in self.tasks.values():
                        exclude.setdefault(task.placement.host, set()).add(task.port)
                self.result = "retried"
                self._finish("retried")
                self.task_key = new_task_key(auth.job_owner())
                self.events = queue.Queue()
            if outcome is Verdict.PORT_CLASH:
                raise JobFailed("tasks could not bind their ports after "
                                f"{MAX_PORT_RETRIES} retries")
            self.result = "succeeded"
            self.message = "all finishers exited 0"
        except HyperTFError as err:
            self.result = "interrupted" if isinstance(err, Interrupted) else "failed"
            self.message = str(err)
            raise
        finally:
            for sig in previous:
                signal.signal(sig, signal.SIG_IGN)  # cleanup must not be interrupted
            try:
                self._finish(self.result)
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        return self.summary()

    def _release(self, state: str, stopped_on: list[str] | None, wait_s: float = 15.0) -> None:
        """Release, or explain why the GPUs come back anyway when ZooKeeper is out of reach."""
        deadline = time.monotonic() + wait_s
        while not self.client.connected and time.monotonic() < deadline:
            time.sleep(0.2)  # calls on a disconnected client would queue and block
        try:
            if not self.client.connected:
                raise StoreError("not connected")
            release(self.client, self.layout, self.task_key, state=state,
                    extra={"summary": self.summary()}, stopped_on=stopped_on)
        except (StoreError, KazooException, KazooTimeoutError) as err:
            self.say(f"hypertf: warning: could not reach ZooKeeper to release job "
                     f"{self.task_key} ({err or type(err).__name__}); its lease ends with "
                     f"this session and the next sync returns the GPUs")

    def _finish(self, state: str) -> None:
        """Stop every task, release, collect logs, write the summary."""
        stopped: GroupResult[dict[str, str]] = GroupResult()
        try:
            stopped = self.stop()
        finally:
            if self.client is not None and self.grant is not None:
                self._release(state, self._confirmed_dead(stopped))  # GPUs first; logs wait
            self.collect_logs()
            if self.tasks:
                self.local_dir.mkdir(parents=True, exist_ok=True)
                (self.local_dir / "summary.json").write_text(json.dumps(self.summary(), indent=2))
            if state != "retried":
                if self.cluster:
                    self.cluster.close()
                if self.client is not None:
                    store.close(self.client)
            self.grant = None
            self.tasks = {} if state == "retried" else self.tasks


def train(inventory: Inventory, request: TrainRequest, say: Callable[[str], None] = print,
          ) -> dict[str, Any]:
    """Run one job to the end; returns the summary, raises JobFailed on failure."""
    job = Job(inventory, request, say)
    summary = job.run()
    say(f"hypertf: job {summary['task_key']} {summary['result']} in {summary['wall_s']:.1f} s")
    for task in summary["tasks"]:
        say(f"  {task['task']:<10} {task['host']:<12} {task['end']}")
    say(f"  logs and summary.json: {job.local_dir}/")
    return summary

