"""One task with its offload world (node side): start the world, run the task with the
hook's environment, stop the world, write what was offloaded.

With ``--offload-hosts`` the launcher starts each task as
``python -m hypertf.offload.runner --spec JSON -- python script.py ...`` under task.sh, so
the runner, mpiexec and the local ranks are all in the task's process group: a stop, a drain
or a SIGKILL of the group ends the world with the task, and the processors on the offload
hosts end when their SSH connections close. Hydra reaches the offload hosts over SSH with the
cluster's pinned known_hosts (``StrictHostKeyChecking yes``), never accepting a new key.

Right or local, never wrong: if the world does not start, one warning line is printed and
the task runs with local products; the task's exit code is the runner's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from hypertf.offload import trust
from hypertf.offload.taskspec import Spec
from hypertf.offload.world import World


def ssh_config(spec: Spec) -> str:
    """An ssh_config for hydra: per-host port and user first (ssh keeps the first value it
    reads), then the pinned, non-interactive defaults for every host: the cluster-internal
    key and the known_hosts the nodes share, at their paths on this node (trust.py)."""
    lines = []
    for host in spec.hosts:
        lines += [f"Host {host.address}", f"  Port {host.port}"]
        if host.user:
            lines.append(f"  User {host.user}")
    lines += ["Host *", "  BatchMode yes", "  StrictHostKeyChecking yes",
              f"  UserKnownHostsFile {trust.node_path(spec.known_hosts)}",
              "  ConnectTimeout 10",
              "  ServerAliveInterval 5", "  ServerAliveCountMax 3", "  LogLevel ERROR"]
    if spec.key_file:
        lines += ["  IdentitiesOnly yes", f"  IdentityFile {trust.node_path(spec.key_file)}"]
    return "\n".join(lines) + "\n"


def iface_of(address: str) -> str | None:
    """The network interface that holds ``address`` on this node."""
    interfaces: dict[str, list[Any]] = psutil.net_if_addrs()  # psutil carries no types
    for name, addrs in interfaces.items():
        if any(a.address == address for a in addrs):
            return name
    return None


def prepare(spec: Spec, private: Path) -> World:
    """The world for ``spec``, its SSH files written into ``private`` (mode 0700)."""
    private.mkdir(mode=0o700, parents=True, exist_ok=True)
    config = private / "ssh_config"
    config.write_text(ssh_config(spec))
    config.chmod(0o600)
    launcher = private / "ssh"
    launcher.write_text(f"#!/bin/sh\nexec ssh -F {shlex.quote(str(config))} \"$@\"\n")
    launcher.chmod(0o700)
    problem = trust.local_problem(spec)
    if problem:
        raise RuntimeError(problem)
    return trust.TrustedWorld(
        spec.channel, len(spec.hosts), private, hosts=tuple(h.address for h in spec.hosts),
        launcher_exec=str(launcher), iface=iface_of(spec.local_address),
        remote_python=tuple(h.python for h in spec.hosts), own_session=False,
        port_range=spec.port_range, known_hosts=spec.known_hosts)


def counts(spec: Spec, hook_stats: Path, failed: str, seconds: float) -> dict[str, Any]:
    """What summary.json's ``offload`` gets from this task."""
    result: dict[str, Any] = {"hosts": [h.address for h in spec.hosts], "ops": 0, "bytes": 0,
                              "seconds": 0.0, "fallbacks": 0, "local": 0,
                              "min_flops": spec.min_flops, "failed": failed,
                              "wall_s": round(seconds, 2)}
    with contextlib.suppress(OSError, ValueError):
        hook = json.loads(hook_stats.read_text())
        result |= {k: hook[k] for k in ("ops", "bytes", "seconds", "fallbacks", "local")
                   if k in hook}
        result["failed"] = failed or hook.get("failed", "")
    return result


class Supervisor:
    """The task's world, started again when it dies under the live task.

    Hydra's mpiexec (MPICH 4.0.2) binds its control port on every address and ends the
    whole world on one connection there that is not one of its proxies; a processor or an
    offload host lost ends it too. The hook then computes locally for a moment and attaches
    to the next world under the same channel name (hook.py), so such an event costs a few
    local products, not the job's offloading. Bounded: at most ``RESTARTS`` restarts within
    ``WINDOW_S``, each start tried ``len(BACKOFF_S) + 1`` times; past that, one line and
    local products for the rest of the task."""

    RESTARTS = 3
    WINDOW_S = 600.0
    BACKOFF_S = (1.0, 2.0, 4.0)

    def __init__(self, make: Callable[[], World], start_timeout: float) -> None:
        self.make = make  # a new World, not started (the same channel name each time)
        self.start_timeout = start_timeout
        self.world: World | None = None
        self.failed = ""
        self.restarts: list[float] = []  # monotonic times of the restarts in the window
        self.restarted = 0

    def start(self, child: subprocess.Popen[Any] | None = None) -> bool:
        """A world up (tried again after each backoff while ``child`` lives); False, with
        ``failed`` said in one line, when none came up."""
        last = ""
        for delay in (0.0, *(self.BACKOFF_S if child is not None else ())):
            if delay and child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(delay)
                    return False  # the task ended meanwhile: no world needed
            try:
                self.world = self.make().start(self.start_timeout)
                return True
            except (RuntimeError, OSError) as exc:
                last = str(exc)
        self.give_up(f"the offload world did not start ({last})")
        return False

    def give_up(self, why: str) -> None:
        self.failed = why
        self.world = None
        print(f"hypertf offload: {why}; matrix products stay local", file=sys.stderr,
              flush=True)

    def died(self) -> bool:
        world = self.world
        return world is not None and world.proc is not None and world.proc.poll() is not None

    def restart(self, child: subprocess.Popen[Any]) -> None:
        """The world ended under the live task: its names unlinked, a new one started."""
        assert self.world is not None
        said = self.world.output().strip().splitlines()
        self.world.stop()
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < self.WINDOW_S] + [now]
        if len(self.restarts) > self.RESTARTS:
            self.give_up(f"the offload world ended {len(self.restarts)} times in "
                         f"{self.WINDOW_S / 60:.0f} min (last: "
                         f"{said[-1] if said else 'no output'})")
            return
        self.restarted += 1
        self.world = None
        self.start(child)

    def wait(self, child: subprocess.Popen[Any], poll_s: float = 0.5) -> int:
        """The task's exit code; the world watched (and restarted) meanwhile."""
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return child.wait(poll_s if self.world is not None else None)
            if self.died():
                self.restart(child)

    def stop(self) -> None:
        if self.world is not None:
            self.world.stop()


def run(spec: Spec, argv: Sequence[str], private: Path, out: Path) -> int:
    """Start the world, run ``argv`` beside it (its world restarted if it dies), stop it;
    write ``out``; the task's code."""
    started = time.monotonic()
    hook_stats = private / "hook.json"
    supervisor = Supervisor(lambda: prepare(spec, private), spec.start_timeout)
    supervisor.start()
    world = supervisor.world
    env = {**os.environ, **(world.task_env(spec.min_flops, hook_stats) if world else {})}
    child = subprocess.Popen(list(argv), env=env)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    code = supervisor.wait(child)
    supervisor.stop()
    result = counts(spec, hook_stats, supervisor.failed, time.monotonic() - started)
    result["restarts"] = supervisor.restarted
    out.write_text(json.dumps(result))
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hypertf.offload.runner")
    parser.add_argument("--spec", required=True, help="the launcher's Spec as JSON")
    parser.add_argument("--private", required=True, help="a folder for the world's files")
    parser.add_argument("--out", required=True, help="where to write what was offloaded")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    task = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not task:
        parser.error("no task command after --")
    return run(Spec.from_json(args.spec), task, Path(args.private), Path(args.out))


if __name__ == "__main__":
    sys.exit(main())
