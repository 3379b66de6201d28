"""What a user asks of ``hypertf train``: one typed request, its defaults, its checks.

Every default of a training job lives here, once: the command line and ``invoke train``
build a ``TrainRequest`` and the launcher reads it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from hypertf import diagnose
from hypertf.errors import UsageError
from hypertf.inventory import Node
from hypertf.scheduler import POLICIES, TaskSlot
from hypertf.settings import check_env
from hypertf.spec import slots_for

LEGACY_FLAG_MODES = ("auto", "on", "off")
MAX_PATH_BYTES = 4096  # PATH_MAX
MAX_ARG_BYTES = 131072 - 1  # MAX_ARG_STRLEN: one argument the kernel passes to a program
MAX_ARGS_BYTES = 1024 * 1024  # all of them, well under ARG_MAX with TF_CONFIG beside
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
    max_restarts: int = 0  # new attempts after a retryable failure (a lost host, a signal...)
    restart_on_failure: bool = False  # ... also after a finisher's own non-zero exit
    checkpoint_dir: str | None = None  # HYPERTF_CHECKPOINT_DIR; default per node's work dir
    priority: int = 0  # higher first in the queue; FIFO within a priority
    wait: bool = True  # wait in the queue when the GPUs are busy (False: refuse at once)

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

    def task_env(self, node: Node) -> dict[str, str]:
        """The user's environment for the tasks on ``node``: the inventory's
        hypertf_task_env, then --env over it."""
        return {**dict(node.settings.task_env), **self.env_vars()}

    def slots(self, cpu_only: bool) -> list[TaskSlot]:
        """The tasks to place (no GPUs asked on a cluster without any)."""
        return slots_for(self.ps, self.workers, self.chief,
                         0 if cpu_only else self.gpus_per_worker,
                         0 if cpu_only else self.gpus_per_ps)

    def passes_legacy_flags(self, script_reads_flags: bool) -> bool:
        """Pass --ps_hosts/--worker_hosts/--job_name/--task_index? In ``auto`` only when the
        script reads them (preflight looked at it; --sync: every .py of the directory):
        absl and strict argparse scripts die of flags they do not know."""
        if self.legacy_flags != "auto":
            return self.legacy_flags == "on"
        if self.sync_dir:
            sources = itertools.islice(Path(self.sync_dir).rglob("*.py"), MAX_SYNC_SOURCES)
            return diagnose.files_read_legacy_flags(sources)
        return script_reads_flags

    def legacy_flags_note(self, passed: bool) -> str:
        why = {"on": "--legacy-flags", "off": "--no-legacy-flags"}.get(
            self.legacy_flags,
            "the script reads them" if passed else
            "the script does not read them; --legacy-flags forces them")
        return (f"legacy flags (--ps_hosts, --worker_hosts, --job_name, --task_index) "
                f"{'passed' if passed else 'not passed'}: {why}")

    def topology_notice(self) -> str | None:
        """What ends the job, said before it starts: a wrong guess here is a silent hang."""
        if self.ps and not self.chief:
            return ("ps and no chief: the job ends when every worker has exited 0 (TF1 "
                    "between-graph); a TF2 ParameterServerStrategy script needs --chief (its "
                    "workers and ps only serve)")
        return None

    def idle_causes(self) -> str:
        """What usually keeps every task listening and silent, for this shape of job."""
        if self.ps and not self.chief:
            return ("with ps and no chief the workers are the finishers (TF1 between-graph); "
                    "a TF2 ParameterServerStrategy script needs --chief, or every task only "
                    "serves")
        return ("a task waiting for a peer that never connects (a wrong address or network), "
                "a collective stuck on a dead peer, or a script that only serves")

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
        if not -1000 <= self.priority <= 1000:
            raise UsageError(f"--priority must lie within -1000..1000, not {self.priority}")
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts must be 0 or more, not {self.max_restarts}")
        if self.checkpoint_dir is not None and (
                not self.checkpoint_dir.startswith("/") or "\0" in self.checkpoint_dir):
            raise UsageError(f"--checkpoint-dir {self.checkpoint_dir!r} must be an absolute "
                             f"path (the same on every node, e.g. on shared storage)")
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
