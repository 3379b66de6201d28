"""Grants enforced on the node: processes on this host's GPUs that their job was not granted.

The keeper's grant says which job may use which GPU; a launcher of a hostile user (or a
script run by hand) can still start a process with ``CUDA_VISIBLE_DEVICES`` naming another
job's GPUs. The agent is the one party on the node that sees every process, so it checks:

- a process *on* a GPU (NVML's list of compute processes), and
- a process whose ``CUDA_VISIBLE_DEVICES`` names a GPU of this host by UUID,

against the GPU's cell in the matrix (held or draining by job J, or granted to none). The
process's job is its ``HYPERTF_TASK_KEY``, believed only when the process descends from one
of that job's task wrappers on this host (their PIDs are in the job's run directory, which
only the job's owner writes); an unbelieved claim counts as no claim. A process of job K on
a GPU of J != K is a trespass, and so is one with no (believable) job on a GPU some job holds.
A process without a job on a GPU nobody holds is "foreign" (the GPU is simply unavailable,
docs/gpu.md), not a trespass. ``hypertf_gpu_enforce: stop`` stops a trespasser's process
group (never the agent's own); ``report`` only reports it (``status``, ``/metrics``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from hypertf.core.matrix import Cell, job_of
from hypertf.core.records import GpuInfo, Trespass
from hypertf.core.rundir import RunDir

log = logging.getLogger(__name__)
KEY_ENV, DEVICES_ENV = "HYPERTF_TASK_KEY", "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class Seen:
    """One process and the GPUs of this host it uses (by index), and how each was seen."""

    pid: int
    pgid: int
    claims: str  # its HYPERTF_TASK_KEY, "" for none or an unbelieved one
    gpus: Mapping[int, str]  # GPU index -> "nvml" or "env"
    user: str = ""


def _task_pids(workdir: str, task_key: str) -> set[int]:
    """The PIDs (= process groups) of ``task_key``'s task wrappers on this host."""
    pids = set()
    with contextlib.suppress(OSError, ValueError):
        run = RunDir.of(workdir, task_key, local=True)
        for name in run.task_names():
            with contextlib.suppress(OSError, ValueError):
                pids.add(int(Path(run.pid(name)).read_text().split()[0]))
    return pids


def _believed(proc: psutil.Process, claim: str, workdir: str) -> bool:
    """Whether the process really is of job ``claim``: it descends from (or leads the
    process group of) one of that job's task wrappers here."""
    if not claim or "/" in claim or claim.startswith("."):
        return False
    pids = _task_pids(workdir, claim)
    if not pids:
        return False
    with contextlib.suppress(psutil.Error, OSError):
        if os.getpgid(proc.pid) in pids:
            return True
        return any(parent.pid in pids for parent in proc.parents())
    return False


def scan(gpus: Sequence[GpuInfo], workdir: str, pids: Iterable[int] | None = None,
         ) -> list[Seen]:
    """Every process that uses a GPU of this host: NVML's per-GPU lists, and every
    readable process whose CUDA_VISIBLE_DEVICES names one of their UUIDs."""
    by_uuid = {g.uuid: g.index for g in gpus if g.uuid}
    used: dict[int, dict[int, str]] = {}
    for gpu in gpus:
        for process in gpu.processes:
            used.setdefault(process.pid, {})[gpu.index] = "nvml"
    candidates = psutil.process_iter() if pids is None else (
        p for pid in pids for p in _process(pid))
    found = []
    for proc in candidates:
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            env = None
        if env is not None:
            for uuid in (env.get(DEVICES_ENV) or "").split(","):
                index = by_uuid.get(uuid.strip())
                if index is not None:
                    used.setdefault(proc.pid, {}).setdefault(index, "env")
        gpus_used = used.pop(proc.pid, None)
        if not gpus_used:
            continue
        claim = (env or {}).get(KEY_ENV) or ""
        found.append(_seen(proc, claim if _believed(proc, claim, workdir) else "", gpus_used))
    for pid, gpus_used in used.items():  # NVML named it, the scan did not (it just went)
        for proc in _process(pid):
            found.append(_seen(proc, "", gpus_used))
    return found


def _process(pid: int) -> list[psutil.Process]:
    try:
        return [psutil.Process(pid)]
    except psutil.Error:
        return []


def _seen(proc: psutil.Process, claim: str, gpus: Mapping[int, str]) -> Seen:
    try:
        pgid, user = os.getpgid(proc.pid), proc.username()
    except (psutil.Error, OSError, KeyError):
        pgid, user = proc.pid, ""
    return Seen(proc.pid, pgid, claim, dict(gpus), user)


def judge(seen: Iterable[Seen], row: Sequence[Cell], gpus: Sequence[GpuInfo],
          ) -> list[Trespass]:
    """The trespasses among ``seen``, against this host's matrix ``row``."""
    uuids = {g.index: g.uuid for g in gpus}
    found = []
    for process in seen:
        for index, how in sorted(process.gpus.items()):
            holder = job_of(row[index]) if index < len(row) else None
            if process.claims and process.claims == holder:
                continue
            if not process.claims and holder is None:
                continue  # foreign work on a GPU nobody holds: unavailable, not a trespass
            found.append(Trespass(pid=process.pid, gpu=index, uuid=uuids.get(index, ""),
                                  claims=process.claims, holder=holder or "", how=how,
                                  user=process.user))
    return found


def stop(trespasses: Sequence[Trespass], seen: Iterable[Seen]) -> list[Trespass]:
    """SIGKILL each trespasser's process group (never the agent's own, never init's): a
    process on another job's GPU is stopped at once, not politely, since every second it
    runs is a second of double-booking. Returns the trespasses, marked ``stopped``."""
    pgids = {s.pid: s.pgid for s in seen}
    own = {os.getpgid(0), 0, 1}
    done: set[int] = set()
    marked = []
    for trespass in trespasses:
        pgid = pgids.get(trespass.pid, trespass.pid)
        stopped = pgid in done
        if not stopped and pgid not in own:
            try:
                os.killpg(pgid, signal.SIGKILL)
                stopped = True
                done.add(pgid)
                log.warning("stopped process group %d: pid %d (%s) on GPU %d granted to "
                            "%s", pgid, trespass.pid, trespass.claims or "no job",
                            trespass.gpu, trespass.holder or "no job")
            except OSError as err:
                log.error("cannot stop trespassing pid %d: %s", trespass.pid, err)
        marked.append(replace(trespass, stopped=stopped))
    return marked
