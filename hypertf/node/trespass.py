"""Grants enforced on the node: processes on this host's GPUs that their job was not granted.

The keeper's grant says which job may use which GPU; a launcher of a hostile user (or a
script run by hand) can still start a process with ``CUDA_VISIBLE_DEVICES`` naming another
job's GPUs. The agent is the one party on the node that sees every process, so it checks:

- a process *on* a GPU (NVML's list of compute processes), and
- a process whose ``CUDA_VISIBLE_DEVICES`` or ``NVIDIA_VISIBLE_DEVICES`` names a GPU of
  this host in any spelling CUDA accepts (``claimed``),

against the GPU's cell in the matrix (held or draining by job J, or granted to none). The
process's job is its ``HYPERTF_TASK_KEY``, believed only when the process is in the process
group of (or descends from) one of that job's task wrappers on this host that the node can
prove (``runcontrol.wrapper``: a live group leader running our wrapper for that run, with the
start time recorded beside its PID, owned by the run directory's owner); a number in a pid
file proves nothing, and an unbelieved claim counts as no claim. A process of job K on a
GPU of J != K is a trespass, and so is one with no (believable) job on a GPU some job holds.
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

import psutil

from hypertf.core.matrix import Cell, job_of
from hypertf.core.records import GpuInfo, Trespass
from hypertf.core.rundir import RunDir
from hypertf.node import runcontrol

log = logging.getLogger(__name__)
KEY_ENV, DEVICES_ENV, CONTAINER_ENV = (
    "HYPERTF_TASK_KEY", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
NAMES_NONE = ("all", "none", "void", "")  # NVIDIA_VISIBLE_DEVICES values naming no GPU


@dataclass(frozen=True)
class Seen:
    """One process and the GPUs of this host it uses (by index), and how each was seen."""

    pid: int
    pgid: int
    claims: str  # its HYPERTF_TASK_KEY, "" for none or an unbelieved one
    gpus: Mapping[int, str]  # GPU index -> "nvml" or "env"
    user: str = ""


def _names(spelling: str, uuids: Sequence[str]) -> int | None:
    """The position in ``uuids`` of the GPU one entry of a device list names, as the CUDA
    driver reads it (measured on an H100, driver 580, docs/gpu.md): an integer, signs,
    zeros and spaces allowed, is an index; ``GPU-`` (exactly so) and a UUID, its hex in any
    case, or a prefix of one that fits exactly one GPU. None: no GPU of this host (CUDA
    refuses ``gpu-``, a UUID without ``GPU-`` and ``all``)."""
    entry = spelling.strip()
    digits = entry.removeprefix("+")
    if digits.isascii() and digits.isdigit():
        return int(digits) if int(digits) < len(uuids) else None
    if not entry.startswith("GPU-") or entry == "GPU-":
        return None
    entry = entry.lower()
    known = [uuid.lower() for uuid in uuids]
    if entry in known:
        return known.index(entry)
    fits = [at for at, uuid in enumerate(known) if uuid.startswith(entry)]
    return fits[0] if len(fits) == 1 else None


def _listed(value: str, uuids: Sequence[str]) -> list[int]:
    """The positions a comma-separated device list names; CUDA stops at the first entry
    that names no device, and so does this."""
    found: list[int] = []
    for spelling in value.split(","):
        at = _names(spelling, uuids)
        if at is None:
            break
        if at not in found:
            found.append(at)
    return found


def claimed(env: Mapping[str, str], gpus: Sequence[GpuInfo], baseline: str | None = None,
            ) -> list[int]:
    """The indices of this host's ``gpus`` that a process with environment ``env`` names.

    ``NVIDIA_VISIBLE_DEVICES`` (the container runtime's: the GPUs a container gets, by index
    or UUID) is the list CUDA then numbers from; ``all``, ``none``, ``void`` or empty, or
    the value the agent itself was started with (``baseline``: a node that is itself such a
    container hands it to every process), name no GPU: a process that names none can
    still open any GPU, as one without either variable can, and only NVML tells (docs/gpu.md,
    "Trespasses"). ``CUDA_VISIBLE_DEVICES`` picks from that list (``_names``): indices (in
    NVML's PCI order, which HyperTF's tasks ask for with CUDA_DEVICE_ORDER=PCI_BUS_ID), or
    ``GPU-`` UUIDs, their hex in any case, or a unique prefix of one."""
    ordered = sorted(gpus, key=lambda g: g.index)
    uuids = [g.uuid for g in ordered]
    container = env.get(CONTAINER_ENV)
    visible = list(range(len(ordered)))
    names_some = container is not None and container.strip().lower() not in NAMES_NONE \
        and container != baseline
    if names_some:
        visible = _listed(container or "", uuids)
    cuda = env.get(DEVICES_ENV)
    if cuda is not None:
        chosen = [visible[at] for at in _listed(cuda, [uuids[v] for v in visible])]
    elif names_some:
        chosen = visible
    else:
        chosen = []
    return [ordered[at].index for at in chosen]


class _Wrappers:
    """The proven task wrappers (PID = process group) of each job on this host, each job's
    looked up once per scan."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.found: dict[str, set[int]] = {}

    def of(self, task_key: str) -> set[int]:
        if task_key not in self.found:
            pids: set[int] = set()
            with contextlib.suppress(OSError, ValueError):
                run = RunDir.of(self.workdir, task_key, local=True)
                for name in run.task_names():
                    pid = runcontrol.wrapper(run, name)
                    if pid:
                        pids.add(pid)
            self.found[task_key] = pids
        return self.found[task_key]


def _believed(proc: psutil.Process, claim: str, wrappers: _Wrappers) -> bool:
    """Whether the process really is of job ``claim``: it is in the process group of (or
    descends from) one of that job's task wrappers here that the node can prove."""
    if not claim or "/" in claim or claim.startswith(".") or "\0" in claim:
        return False
    pids = wrappers.of(claim)
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
    readable process whose environment names one of them (``claimed``)."""
    baseline = os.environ.get(CONTAINER_ENV)
    wrappers = _Wrappers(workdir)
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
        if env is not None and (DEVICES_ENV in env or CONTAINER_ENV in env):
            for index in claimed(env, gpus, baseline):
                used.setdefault(proc.pid, {}).setdefault(index, "env")
        gpus_used = used.pop(proc.pid, None)
        if not gpus_used:
            continue
        claim = (env or {}).get(KEY_ENV) or ""
        found.append(_seen(proc, claim if _believed(proc, claim, wrappers) else "", gpus_used))
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
