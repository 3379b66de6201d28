"""The offload world: one mpiexec (MPICH's hydra) running the agent as rank 0 and K
processors, started and stopped by PID, its channel unlinked even if the agent died.

On one machine hydra forks the ranks (``-launcher fork``); across hosts it reaches them over
SSH (``-launcher ssh -launcher-exec SSH``), where SSH is a script that pins host keys. Every
address is loopback unless hosts are given: nothing listens wider than needed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hypertf.offload import channel as channel_module
from hypertf.offload.hook import ENV_CHANNEL, ENV_MIN_FLOPS, ENV_STATS

BOOT = Path(__file__).resolve().parent / "boot"
REPO = Path(__file__).resolve().parents[2]


def mpiexec_argv(channel: str, processors: int, python: str = sys.executable,
                 hosts: Sequence[str] = (), launcher_exec: str | None = None,
                 ready: str | None = None, stats: str | None = None,
                 data_mb: int = 64, iface: str | None = None,
                 remote_python: Sequence[str] = (), pin: Sequence[str] = ()) -> list[str]:
    """mpiexec's command line: the agent here (rank 0), the processors on ``hosts`` (one
    each, started with ``remote_python``: their venv) or, without hosts, forked here.
    ``pin`` (forked worlds, bench/offload.py --pin): CPU lists, the agent's first, then one
    per processor, each run under ``taskset`` with as many BLAS threads as it has CPUs."""
    if processors < 1:
        raise ValueError("an offload world needs at least one processor")
    agent = [python, "-m", "hypertf.offload.agent", "--channel", channel,
             "--data-mb", str(data_mb)]
    if ready:
        agent += ["--ready", ready]
    if stats:
        agent += ["--stats", stats]
    if not hosts and pin:
        if len(pin) != processors + 1:
            raise ValueError(f"pin names {len(pin)} CPU lists for {processors + 1} ranks")
        argv = ["mpiexec", "-launcher", "fork", "-hosts", "localhost", "-iface", "lo"]
        for rank, cpus in enumerate(pin):
            threads = str(len(cpus.split(",")))
            command = agent if rank == 0 else [python, "-m", "hypertf.offload.processor"]
            argv += [*([":"] if rank else []), "-n", "1", "-env", "OMP_NUM_THREADS", threads,
                     "-env", "OPENBLAS_NUM_THREADS", threads, "taskset", "-c", cpus, *command]
        return argv
    if not hosts:
        return ["mpiexec", "-launcher", "fork", "-hosts", "localhost", "-iface", "lo",
                "-n", "1", *agent, ":", "-n", str(processors), python, "-m",
                "hypertf.offload.processor"]
    argv = ["mpiexec", "-launcher", "ssh"]
    if launcher_exec:
        argv += ["-launcher-exec", launcher_exec]
    if iface:
        argv += ["-iface", iface]
    # One slot per host, in order: hydra fills the slots in the order of the MPMD sections,
    # so rank 0 (the agent) is here and rank i, a section of its own started with host i's
    # python (its venv), on host i.
    argv += ["-hosts", ",".join(f"{h}:1" for h in ("localhost", *hosts)), "-n", "1", *agent]
    pythons = list(remote_python) + [python] * (len(hosts) - len(remote_python))
    for host_python in pythons[:len(hosts)]:
        # hydra's proxies enter mpiexec's working directory on every host, and the task's
        # own (<workdir>/runs/<key>/<task>/) exists only on the task's node
        argv += [":", "-n", "1", "-wdir", "/", host_python, "-m", "hypertf.offload.processor"]
    return argv


@functools.cache
def private_network() -> list[str]:
    """A prefix that runs a command in a network namespace of its own, loopback only, or
    nothing where namespaces are not allowed (not root).

    Hydra's mpiexec listens for its proxies on 0.0.0.0 whatever -iface says; a world on one
    machine needs no network at all (the ranks talk through shared memory and loopback), so
    in its own namespace that socket is reachable from nowhere else."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        return []
    prefix = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    try:
        done = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return prefix if done.returncode == 0 else []


def loopback_env() -> dict[str, str]:
    """MPICH and libfabric kept on loopback (the network rule: nothing listens wider)."""
    return {"MPIR_CVAR_CH3_INTERFACE_HOSTNAME": "127.0.0.1", "MPIR_CVAR_CH4_NETMOD": "ofi",
            "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "lo", "FI_SOCKETS_IFACE": "lo",
            "HYDRA_IFACE": "lo"}


def network_env(iface: str | None, port_range: tuple[int, int] | None = None,
                ) -> dict[str, str]:
    """MPICH (UCX underneath) on the job's data network: the interface the task's host
    reaches the offload hosts through, the same name on every host (UCX then binds each
    rank's listener to that interface's address, never a wildcard). Hydra's control port
    comes from ``port_range`` (MPIEXEC_PORT_RANGE): hydra binds it on every address
    whatever -iface says, so the range is what a firewall can hold it to."""
    # UCX's "sm" transport failed the address exchange between hosts (MPICH 4.0.2, ch4:ucx)
    env = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": iface} if iface else {}
    if port_range:
        env["MPIEXEC_PORT_RANGE"] = f"{port_range[0]}:{port_range[1]}"
    return env


@dataclass
class World:
    """A running offload world: its mpiexec process and its channel's name."""

    channel: str
    processors: int
    workdir: Path
    proc: subprocess.Popen[Any] | None = None
    model: dict[str, float] = field(default_factory=dict)
    log: IO[bytes] | None = None
    hosts: tuple[str, ...] = ()  # processors there, one each (none: forked on this machine)
    launcher_exec: str | None = None  # the ssh hydra runs (pinned host keys)
    iface: str | None = None  # the network interface the ranks and proxies use
    remote_python: tuple[str, ...] = ()  # each host's python (its venv)
    own_session: bool = True  # False: in the caller's process group (a task's: stopped with it)
    port_range: tuple[int, int] | None = None  # hydra's control port (hosts only)
    pin: tuple[str, ...] = ()  # CPU lists: the agent's, then each processor's (forked only)

    @property
    def ready_file(self) -> Path:
        return self.workdir / f"ready-{self.channel.strip('/')}"

    @property
    def stats_file(self) -> Path:
        return self.workdir / f"agent-{self.channel.strip('/')}.json"

    def start(self, timeout: float = 30.0, python: str = sys.executable) -> World:
        argv = mpiexec_argv(
            self.channel, self.processors, python, hosts=self.hosts,
            launcher_exec=self.launcher_exec, ready=str(self.ready_file),
            stats=str(self.stats_file), iface=self.iface, remote_python=self.remote_python,
            pin=self.pin)
        if self.hosts:
            env = {**os.environ, **network_env(self.iface, self.port_range)}
        else:
            argv = private_network() + argv
            env = {**os.environ, **loopback_env()}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO), *filter(None, [env.get("PYTHONPATH")])])
        log_path = self.workdir / f"world-{self.channel.strip('/')}.log"
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL,
                                     start_new_session=self.own_session)
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"the offload world ended at start: {self.output()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the offload world was not ready in {timeout:.0f} s")
            time.sleep(0.02)
        with contextlib.suppress(ValueError, OSError):
            self.model = json.loads(self.ready_file.read_text())["model"]
        return self

    def output(self) -> str:
        path = self.workdir / f"world-{self.channel.strip('/')}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def task_env(self, min_flops: int, stats: Path | None = None) -> dict[str, str]:
        """What a task's environment needs for the hook to route its products here."""
        env = {ENV_CHANNEL: self.channel, ENV_MIN_FLOPS: str(min_flops),
               "PYTHONPATH": os.pathsep.join(
                   [str(BOOT), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
        if stats:
            env[ENV_STATS] = str(stats)
        return env

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to mpiexec (it forwards it; the agent stops its processors), SIGKILL to
        its process group if it lingers, then every channel name unlinked."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    if self.own_session:
                        os.killpg(proc.pid, signal.SIGKILL)  # the group mpiexec leads: its ranks
                    else:
                        proc.kill()
                proc.wait(5)
        if proc is not None and proc.poll() is not None and self.own_session:
            # Ranks outlive a SIGKILLed mpiexec only in its group, which we started.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self.log is not None:
            self.log.close()
        channel_module.unlink_all(self.channel)
        self.ready_file.unlink(missing_ok=True)


@contextlib.contextmanager
def world(processors: int, workdir: Path, timeout: float = 30.0) -> Any:
    """An offload world for the duration of a ``with`` block; always stopped."""
    w = World(channel_module.new_name(), processors, workdir)
    try:
        yield w.start(timeout)
    finally:
        w.stop()
