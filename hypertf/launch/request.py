"""What a user asks of ``hypertf train``: one typed request, its defaults, its checks.

Every default of a training job lives here, once: ``TRAIN_OPTIONS`` declares each option
(flag, type, default, help) for both ``hypertf train`` (argparse) and ``invoke train``, and
``TrainRequest.from_options`` turns the values of either into the request the launcher reads.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from hypertf.config.inventory import Node
from hypertf.config.settings import ENV_NAME, check_env
from hypertf.core import diagnose
from hypertf.core.errors import UsageError
from hypertf.core.rendezvous import Readiness
from hypertf.core.rundir import RunDir
from hypertf.core.scheduler import POLICIES, Policy, TaskSlot
from hypertf.core.spec import slots_for
from hypertf.offload import DEFAULT_MIN_FLOPS


class LegacyFlags(enum.StrEnum):
    """When the four legacy flags are passed: ``--legacy-flags``, ``--no-legacy-flags``,
    or neither (only when the script reads them). Written to request.json as its text."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


LEGACY_FLAG_MODES = tuple(LegacyFlags)
MAX_PATH_BYTES = 4096  # PATH_MAX
MAX_ARG_BYTES = 131072 - 1  # MAX_ARG_STRLEN: one argument the kernel passes to a program
MAX_ARGS_BYTES = 1024 * 1024  # all of them, well under ARG_MAX with TF_CONFIG beside
MAX_SYNC_SOURCES = 2000  # Python files of --sync DIR scanned for the legacy flags
MAX_OFFLOAD_HOSTS = 256  # one MPI world per task reaches each of them


@dataclass(frozen=True)
class TrainRequest:
    """What the user asked for on the command line."""

    script: str
    workers: int = 1
    ps: int = 0
    chief: bool = False
    policy: str = Policy.ROUND_ROBIN.value  # plain text: options and exports print it
    gpus_per_worker: int = 1
    gpus_per_ps: int = 0
    gpus_per_chief: int | None = None  # None: as many as a worker
    sync_dir: str | None = None
    workdir: str | None = None  # the tasks' working directory (default: one per task)
    start_timeout: float = 120.0
    timeout: float | None = None
    rendezvous: str | None = None  # a Readiness's text; None: from the script's imports
    legacy_flags: LegacyFlags = LegacyFlags.AUTO
    grace: float = 5.0
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()  # NAME=VALUE or NAME (from os.environ), over the inventory's
    idle_timeout: float | None = 300.0  # warn when every task listens and none writes
    idle_fail: bool = False  # ... and end the job then
    max_restarts: int = 0  # new attempts after a retryable failure (a lost host, a signal...)
    restart_on_failure: bool = False  # ... also after a finisher's own non-zero exit
    checkpoint_dir: str | None = None  # HYPERTF_CHECKPOINT_DIR; default per node's work dir
    priority: int = 0  # higher first in the queue; FIFO within a priority
    wait: bool = True  # wait in the queue when the GPUs are busy (False: refuse at once)
    timings: bool = False  # print the launch's timeline at the end
    offload_hosts: int = 0  # hosts lent to the tasks' matrix products (hypertf.offload)
    offload_min_flops: int = DEFAULT_MIN_FLOPS  # smaller products stay in the task

    def to_json(self) -> dict[str, Any]:
        """The request as plain JSON (a detached launcher's request.json, a sweep's trials)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, fields: Mapping[str, Any]) -> TrainRequest:
        """The request ``to_json`` wrote; a field it does not know is refused by name."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise UsageError(f"a saved train request has fields this HyperTF does not know: "
                             f"{', '.join(unknown)} (written by a newer version?)")
        return cls(**{**fields, "args": tuple(fields.get("args", ())),
                      "env": tuple(fields.get("env", ()))})

    @classmethod
    def from_options(cls, values: Mapping[str, Any], args: Sequence[str] = ()) -> TrainRequest:
        """The request for ``TRAIN_OPTIONS`` values (keyed by ``Option.name``): the one place
        where an option becomes a field, whichever command line gave it."""
        if values["legacy_flags"] and values["no_legacy_flags"]:
            raise UsageError("--legacy-flags and --no-legacy-flags exclude each other")
        legacy = (LegacyFlags.ON if values["legacy_flags"] else
                  LegacyFlags.OFF if values["no_legacy_flags"] else LegacyFlags.AUTO)
        return cls(
            script=values["script"], workers=values["worker"], ps=values["ps"],
            chief=values["chief"], policy=values["policy"],
            gpus_per_worker=values["gpus_per_worker"], gpus_per_ps=values["gpus_per_ps"],
            gpus_per_chief=values["gpus_per_chief"], sync_dir=values["sync"],
            workdir=values["workdir"], start_timeout=values["start_timeout"],
            rendezvous=values["rendezvous"],
            timeout=values["timeout"], grace=values["grace"], legacy_flags=legacy,
            env=tuple(values["env"] or ()), idle_timeout=values["idle_timeout"] or None,
            idle_fail=values["idle_fail"], max_restarts=values["max_restarts"],
            restart_on_failure=values["restart_on_failure"],
            checkpoint_dir=values["checkpoint_dir"], priority=values["priority"],
            wait=not values["no_wait"], timings=values["timings"],
            offload_hosts=values["offload_hosts"], offload_min_flops=values["offload_min_flops"],
            args=tuple(args))

    def env_vars(self) -> dict[str, str]:
        """--env NAME=VALUE and --env NAME (its value from this process's environment, so a
        secret never shows on a command line) as a mapping; a bad name, a reserved one or
        an unset NAME is a usage error."""
        result = {}
        for item in self.env:
            name, sep, value = item.partition("=")
            try:
                if not sep:
                    value = from_environment(name)
                result[name] = check_env(name, value, "--env")
            except ValueError as err:
                raise UsageError(str(err)) from err
        return result

    def env_names(self) -> list[str]:
        """The names --env sets, never their values: what records, summaries and logs keep."""
        return sorted({item.partition("=")[0] for item in self.env})

    def without_env_values(self) -> TrainRequest:
        """This request with every --env as a bare NAME: what a file or a command line may
        hold (the values travel another way, see hypertf.launch.detach)."""
        return dataclasses.replace(self, env=tuple(self.env_names()))

    def with_env(self, values: Mapping[str, str]) -> TrainRequest:
        """This request with ``values`` as its --env NAME=VALUE (in memory only)."""
        return dataclasses.replace(self, env=tuple(f"{k}={v}" for k, v in values.items()))

    def task_env(self, node: Node) -> dict[str, str]:
        """The user's environment for the tasks on ``node``: the inventory's
        hypertf_task_env, then --env over it."""
        return {**dict(node.settings.task_env), **self.env_vars()}

    def task_cwd(self, node_workdir: str, run: RunDir, task: str) -> str:
        """Where ``task`` runs on its node (hypertf_workdir ``node_workdir``): --workdir
        (a relative one: below the node's work dir), else with --sync the synced copy (as
        before: the script's neighbours are where it expects them), else a directory of its
        own in the run, so two tasks on one node never write the same relative file."""
        if self.workdir:
            return str(PurePosixPath(node_workdir) / self.workdir)
        return str(run.code if self.sync_dir else run.task_dir(task))

    def script_on(self, node_workdir: str, run: RunDir, script: str) -> str:
        """The script's absolute path on the node, whatever the task's working directory:
        in the synced copy with --sync, else ``script`` (absolute when it is a file here,
        see Job.script_path) with a relative path below the node's work dir."""
        if self.sync_dir:
            return str(run.code / self.script)
        return str(PurePosixPath(node_workdir) / script)

    @property
    def makes_checkpoint_dir(self) -> bool:
        """Whether HYPERTF_CHECKPOINT_DIR is made before the tasks start: for
        --checkpoint-dir and for a job that may restart (its attempts resume from it);
        otherwise it is only named, and a script that saves makes it (TensorFlow's
        checkpoint writers do), so a job leaves no empty directory behind."""
        return self.checkpoint_dir is not None or self.max_restarts > 0

    def slots(self, cpu_only: bool) -> tuple[TaskSlot, ...]:
        """The tasks to place (no GPUs asked on a cluster without any)."""
        return slots_for(self.ps, self.workers, self.chief,
                         0 if cpu_only else self.gpus_per_worker,
                         0 if cpu_only else self.gpus_per_ps, self.offload_hosts,
                         chief_gpus=0 if cpu_only else self.chief_gpus)

    @property
    def chief_gpus(self) -> int:
        """The chief's GPUs: --gpus-per-chief, else as many as a worker."""
        return self.gpus_per_worker if self.gpus_per_chief is None else self.gpus_per_chief

    def passes_legacy_flags(self, script_reads_flags: bool) -> bool:
        """Pass --ps_hosts/--worker_hosts/--job_name/--task_index? In ``auto`` only when the
        script reads them (preflight looked at it; --sync: every .py of the directory):
        absl and strict argparse scripts die of flags they do not know."""
        if self.legacy_flags != LegacyFlags.AUTO:
            return self.legacy_flags == LegacyFlags.ON
        if self.sync_dir:
            sources = itertools.islice(Path(self.sync_dir).rglob("*.py"), MAX_SYNC_SOURCES)
            return diagnose.files_read_legacy_flags(sources)
        return script_reads_flags

    def legacy_flags_note(self, passed: bool) -> str:
        why = {LegacyFlags.ON: "--legacy-flags", LegacyFlags.OFF: "--no-legacy-flags"}.get(
            self.legacy_flags,
            "the script reads them" if passed else
            "the script does not read them; --legacy-flags forces them")
        return (f"legacy flags (--ps_hosts, --worker_hosts, --job_name, --task_index) "
                f"{'passed' if passed else 'not passed'}: {why}")

    def topology_notice(self, ps_strategy: bool | None = None) -> str | None:
        """What ends the job, said before it starts: a wrong guess here is a silent hang.
        ``ps_strategy``: whether the script names ParameterServerStrategy or
        ClusterCoordinator (None: not known); --chief is suggested unless it does not (a
        TF1 script that reads TF_CONFIG breaks on a 'chief' task type)."""
        if self.ps and not self.chief:
            return ("ps and no chief: the job ends when every worker has exited 0 (TF1 "
                    "between-graph)" + ("" if ps_strategy is False else
                                        "; a TF2 ParameterServerStrategy script needs --chief "
                                        "(its workers and ps only serve)"))
        return None

    def idle_causes(self, legacy_flags: bool = False, ps_strategy: bool | None = None) -> str:
        """What usually keeps every task listening and silent, for this shape of job
        (``legacy_flags``: the script reads them, so it is TF1 between-graph, not TF2;
        ``ps_strategy`` False: it names no ParameterServerStrategy, so TF1 too)."""
        if self.ps and not self.chief and (legacy_flags or ps_strategy is False):
            return ("a TF1 between-graph worker waiting for worker 0 to initialise the model, "
                    "or for a peer (without device_filters its session waits for every task "
                    "of the cluster spec)")
        if self.ps and not self.chief:
            return ("with ps and no chief the workers are the finishers (TF1 between-graph); "
                    "a TF2 ParameterServerStrategy script needs --chief, or every task only "
                    "serves")
        return ("a task waiting for a peer that never connects (a wrong address or network), "
                "a collective stuck on a dead peer, or a script that only serves")

    def validate(self) -> None:
        if self.workers < 0 or self.ps < 0 or self.gpus_per_worker < 0 or self.gpus_per_ps < 0 \
                or self.chief_gpus < 0:
            raise UsageError("--worker, --ps and the GPU counts cannot be negative")
        if self.gpus_per_chief is not None and not self.chief:
            raise UsageError("--gpus-per-chief needs --chief (a job without a chief has none "
                             "to give GPUs to)")
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
        if self.rendezvous is not None and self.rendezvous not in set(Readiness):
            raise UsageError(f"--rendezvous must be one of {', '.join(Readiness)}, not "
                             f"{self.rendezvous!r}")
        if not self.start_timeout > 0 or (self.timeout is not None and not self.timeout > 0):
            raise UsageError("--start-timeout and --timeout must be positive seconds")
        if self.idle_timeout is not None and not self.idle_timeout > 0:
            raise UsageError("--idle-timeout must be positive seconds")
        if not -1000 <= self.priority <= 1000:
            raise UsageError(f"--priority must lie within -1000..1000, not {self.priority}")
        if not 0 <= self.offload_hosts <= MAX_OFFLOAD_HOSTS:
            raise UsageError(f"--offload-hosts must lie within 0..{MAX_OFFLOAD_HOSTS}, not "
                             f"{self.offload_hosts}")
        if self.offload_min_flops < 0:
            raise UsageError(f"--offload-min-flops must be 0 or more, not "
                             f"{self.offload_min_flops}")
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts must be 0 or more, not {self.max_restarts}")
        if self.checkpoint_dir is not None and (
                not self.checkpoint_dir.startswith("/") or "\0" in self.checkpoint_dir):
            raise UsageError(f"--checkpoint-dir {self.checkpoint_dir!r} must be an absolute "
                             f"path (the same on every node, e.g. on shared storage)")
        if self.workdir is not None and (not self.workdir or "\0" in self.workdir):
            raise UsageError(f"--workdir {self.workdir!r} must be a directory path (absolute, "
                             f"or relative to the node's hypertf_workdir)")
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


def from_environment(name: str) -> str:
    """``--env NAME``'s value: NAME as this process's environment has it."""
    if not ENV_NAME.match(name):
        raise ValueError(f"--env {name!r} must look like NAME=VALUE or NAME (a variable set "
                         f"in your environment)")
    try:
        return os.environ[name]
    except KeyError:
        raise ValueError(f"--env {name}: {name} is not set in your environment (export it "
                         f"first, or give NAME=VALUE)") from None


@dataclass(frozen=True)
class Option:
    """One option of ``train``, declared once for argparse, Invoke and the README table."""

    name: str  # the Python name; the flag is --name with dashes (both command lines)
    kind: type  # int, float or str take a value; bool is a flag; list repeats (str items)
    default: Any
    help: str
    metavar: str | None = None
    required: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


R = TrainRequest
TRAIN_OPTIONS: tuple[Option, ...] = (
    Option("script", str, None, "training script (a path on the nodes, or inside --sync DIR)",
           "PATH", required=True),
    Option("worker", int, R.workers, "number of workers (default 1)", "N"),
    Option("ps", int, R.ps, "parameter servers (0: a mirrored job)", "N"),
    Option("chief", bool, R.chief, "add a chief task: the coordinator of a TF2 "
           "ParameterServerStrategy job, or the first worker of a mirrored one (TF_CONFIG's "
           "'chief'; it saves checkpoints and summaries)"),
    Option("policy", str, R.policy, f"{' or '.join(POLICIES)} (default {R.policy})"),
    Option("gpus_per_worker", int, R.gpus_per_worker, "GPUs per worker and chief (default 1)",
           "N"),
    Option("gpus_per_chief", int, R.gpus_per_chief, "GPUs for the chief (default: as many as "
           "a worker; 0 for a parameter-server coordinator that computes nothing)", "N"),
    Option("gpus_per_ps", int, R.gpus_per_ps, "GPUs per parameter server (default 0)", "N"),
    Option("sync", str, R.sync_dir, "upload this directory into the job's run directory first; "
           "the node's tasks run in that copy", "DIR"),
    Option("workdir", str, R.workdir, "run every task of the job in this directory on its "
           "node, made if missing and shared by the node's tasks (relative: to the node's "
           "hypertf_workdir); default: a directory of its own per task, <workdir>/runs/<key>/"
           "<task>/ (with --sync: the synced copy)", "DIR"),
    Option("start_timeout", float, R.start_timeout,
           "seconds for every task to listen on its port (default 120)", "S"),
    Option("rendezvous", str, R.rendezvous, "which ports 'started' waits for: tf (every "
           "task's, TensorFlow's cluster), coordinator (rank 0's: JAX, Keras 3 on JAX, "
           "PyTorch) or none; default: coordinator when the script imports jax or torch, else "
           "tf (docs/frameworks.md)", "MODE"),
    Option("timeout", float, R.timeout, "seconds for the whole job (default none)", "S"),
    Option("grace", float, R.grace, "seconds from SIGTERM to SIGKILL when stopping tasks "
           "(default 5)", "S"),
    Option("legacy_flags", bool, False, "always pass --ps_hosts/--worker_hosts/--job_name/"
           "--task_index (default: only if the script reads them)"),
    Option("no_legacy_flags", bool, False, "never pass the legacy flags"),
    Option("env", list, None, "an environment variable for every task (repeatable; over the "
           "inventory's hypertf_task_env); NAME alone takes its value from your environment, "
           "so a secret stays off command lines; values are never recorded, names are",
           "NAME[=VALUE]"),
    Option("idle_timeout", float, R.idle_timeout, "warn when every task listens and none has "
           "written a line for this many seconds (default 300; 0: never)", "S"),
    Option("idle_fail", bool, R.idle_fail, "end the job (failed) at the idle timeout instead "
           "of warning"),
    Option("max_restarts", int, R.max_restarts, "after a retryable failure (a host lost, a task "
           "killed by a signal, the start-up deadline) start the whole job again, up to N "
           "times (default 0); tasks see HYPERTF_ATTEMPT", "N"),
    Option("restart_on_failure", bool, R.restart_on_failure,
           "with --max-restarts: also restart after a task's own non-zero exit"),
    Option("checkpoint_dir", str, R.checkpoint_dir, "HYPERTF_CHECKPOINT_DIR for every task: an "
           "absolute path, the same for every attempt (default <workdir>/checkpoints/<job> on "
           "each node; multi-worker jobs want shared storage)", "DIR"),
    Option("priority", int, R.priority, "place in the queue: higher first, first come first "
           "served within a priority (default 0)", "N"),
    Option("no_wait", bool, False, "fail at once (exit 4) when the GPUs are busy instead of "
           "waiting in the queue"),
    Option("timings", bool, False, "print where the job's time went at the end (each phase, "
           "per host; summary.json keeps the timeline whatever this says)"),
    Option("offload_hosts", int, R.offload_hosts, "also take N hosts that run no task and "
           "compute the tasks' large matrix products on their CPUs (MPI; docs/offload.md); "
           "default 0", "N"),
    Option("offload_min_flops", int, R.offload_min_flops, "with --offload-hosts: products "
           f"of fewer flops stay in the task (default {R.offload_min_flops})", "F"),
    Option("detach", bool, False, "print the job's key and return: a background launcher "
           "waits, runs and cleans up (its output: runs/<key>/launcher.log)"),
)
"""Every option of ``train`` (``-i/--inventory`` aside), in the README's order of topics."""
