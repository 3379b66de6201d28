"""Each job's cgroups on a node: its tasks and everything they start inside, only its granted
GPUs openable, and nothing of it left once it is stopped (docs/gpu.md, "Confinement").

The agent owns a subtree per host, ``<mount>/<hypertf_cgroup_root>/<host>``, in the cgroup
v2 hierarchy (membership, ``cgroup.kill``) and the v1 ``devices`` hierarchy (the device
filter) when the node has them; on a v2-only node the filter is a BPF device program
(hypertf.node.bpfdevice). It makes a job's cgroup, ``<subtree>/<task key>``, from its own
row of the matrix (cells only the keeper writes), with every GPU of the host refused but
the ones granted to that job, before the job's tasks start (its shard watch wakes it on a
grant), and removes it once the job has no cell here and the cgroup is empty. What it
found is in ``<workdir>/cgroups.json`` (``NodeCgroups``): ``tasknode start`` reads it, waits
for the job's cgroup and has each task's wrapper join it before the command runs, so every
child, a ``setsid`` daemon included, is in it too. Stopping a run stops every process of
its cgroups; the run is not dead (its cells not reported drained) while one is left.

Standard library only: ``tasknode start`` imports it on every job's critical path.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from hypertf.core.rundir import replace_readable

if TYPE_CHECKING:
    import logging

STATE_FILE = "cgroups.json"  # in the node's workdir, written by the agent
WAIT_S = 5.0  # how long a start waits for the agent to make its job's cgroup
KILL_WAIT_S = 2.0  # after cgroup.kill / SIGKILL, how long until the cgroup must be empty
NVIDIA_MAJOR = 195  # /dev/nvidiaN is 195:N (nvidiactl 195:255, nvidia-modeset 195:254)
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,199}$")  # a task key as a directory name



def _log() -> logging.Logger:
    """The agent's logger, imported when the agent (not 'tasknode start') needs it."""
    import logging

    return logging.getLogger(__name__)


class Mode(StrEnum):
    """What a node enforces, as ``hypertf status`` shows it."""

    DEVICES = "devices+cgroup"  # the job's processes held together, only its GPUs openable
    CGROUP = "cgroup"  # held together (stopped whole), no device filter
    NONE = "none"  # neither: the trespass detector only


class NodeCgroups(NamedTuple):
    """What the agent found on its node and wrote for ``tasknode`` (``cgroups.json``); a
    NamedTuple: 'tasknode start' reads it and must not import dataclasses."""

    mode: Mode = Mode.NONE
    why: str = ""  # for NONE (or what is missing for CGROUP): a few words
    required: bool = False  # hypertf_gpu_confine: required
    unified: str = ""  # the host's subtree in the cgroup v2 hierarchy ('' : not used)
    devices: str = ""  # the host's subtree in the v1 devices hierarchy ('' : not used)
    filter: str = ""  # 'v1', 'bpf' or '' (no device filter)
    path: str = ""  # the host's subtree below each mount (host_subtree)

    @property
    def label(self) -> str:
        """``devices+cgroup``, ``cgroup`` or ``none: <why>`` (status, preflight)."""
        return f"none: {self.why}" if self.mode is Mode.NONE else self.mode.value

    def subtrees(self) -> list[Path]:
        return [Path(d) for d in (self.unified, self.devices) if d]

    def job_dirs(self, task_key: str) -> list[Path]:
        """The job's cgroups on this node (none when the node confines nothing)."""
        if self.mode is Mode.NONE or not _KEY.match(task_key):
            return []
        return [subtree / task_key for subtree in self.subtrees()]

    def to_json(self) -> str:
        return json.dumps(self._asdict(), sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> NodeCgroups:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("not an object")
        return cls(mode=Mode(raw.get("mode", "none")), why=str(raw.get("why", "")),
                   required=bool(raw.get("required", False)),
                   unified=str(raw.get("unified", "")), devices=str(raw.get("devices", "")),
                   filter=str(raw.get("filter", "")), path=str(raw.get("path", "")))


def read_state(workdir: str | Path) -> NodeCgroups:
    """The agent's ``cgroups.json`` on this node; NONE when there is none (no agent here,
    or an older one) or it cannot be read."""
    path = Path(workdir) / STATE_FILE
    try:
        return NodeCgroups.from_json(path.read_text())
    except FileNotFoundError:
        return NodeCgroups(why="no agent's cgroups.json on this node")
    except (OSError, ValueError) as err:
        return NodeCgroups(why=f"{path} unreadable ({err})")


def write_state(workdir: str | Path, state: NodeCgroups) -> None:
    """Replace ``cgroups.json`` in one rename (a start reads it whole or the old one);
    readable by every account that runs tasks, writable by the agent only."""
    replace_readable(Path(workdir) / STATE_FILE, state.to_json())


def mounts(mountinfo: str = "/proc/self/mountinfo") -> tuple[str, str]:
    """The cgroup v2 mount point and the v1 hierarchy that has the ``devices`` controller
    ('' for one the node does not have)."""
    unified = devices = ""
    with contextlib.suppress(OSError):
        for line in Path(mountinfo).read_text().splitlines():
            head, _, tail = line.partition(" - ")
            fields, more = head.split(), tail.split()
            if len(fields) < 5 or len(more) < 3:
                continue
            if more[0] == "cgroup2" and not unified:
                unified = fields[4]
            elif more[0] == "cgroup" and "devices" in more[2].split(",") and not devices:
                devices = fields[4]
    return unified, devices


def host_subtree(root: str, zk_root: str, host: str) -> str:
    """``<hypertf_cgroup_root>/<cluster>/<host>``, relative to a mount: one per cluster (its
    ZooKeeper root) and host, so two clusters or a lab's namespace hosts on one machine
    never share one (an agent removes the job cgroups of its subtree that its row lacks)."""
    cluster = zk_root.strip("/").replace("/", "_") or "root"
    return f"{root}/{cluster}/{host}"


def _subtree(mount: str, relative: str) -> tuple[str, str]:
    """The host's subtree made under ``mount``: (its path, '') or ('', why not)."""
    if not mount:
        return "", "no such hierarchy"
    path = Path(mount) / relative
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError as err:
        return "", f"{path}: {err.strerror or err}"
    return str(path), ""


def _v1_filter_works(subtree: str) -> str:
    """'' when this agent may write a devices cgroup's rules (CAP_SYS_ADMIN), else why."""
    probe = Path(subtree) / f".filter-{os.getpid()}"
    try:
        probe.mkdir(exist_ok=True)
        (probe / "devices.deny").write_text("c 1:3 m\n")  # no mknod of /dev/null: harmless
        return ""
    except OSError as err:
        return f"devices.deny: {err.strerror or err}"
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def _bpf_problem() -> str:
    """'' when a BPF device program can be attached on this host, else why."""
    try:
        from hypertf.node import bpfdevice
    except ImportError:  # pragma: no cover - the module ships with the package
        return "no BPF device filter in this build"
    return bpfdevice.available() or ""


def detect(relative: str, setting: str, mountinfo: str = "/proc/self/mountinfo",
           ) -> NodeCgroups:
    """What this node can enforce, its subtrees (``host_subtree``) made (the agent, at
    start); ``setting``: hypertf_gpu_confine (auto, required, off)."""
    required = setting == "required"
    if setting == "off":
        return NodeCgroups(why="hypertf_gpu_confine: off")
    v2_mount, v1_mount = mounts(mountinfo)
    unified, v2_why = _subtree(v2_mount, relative)
    devices, v1_why = _subtree(v1_mount, relative)
    if devices and (problem := _v1_filter_works(devices)):
        devices, v1_why = "", problem
    bpf_why = _bpf_problem() if unified and not devices else ""
    filt = "v1" if devices else ("bpf" if unified and not bpf_why else "")
    if not unified and not devices:
        why = f"cgroup v2 ({v2_why}), v1 devices ({v1_why})"
        return NodeCgroups(why=why, required=required)
    missing = "" if filt else f"no device filter: v1 devices ({v1_why}), BPF ({bpf_why})"
    return NodeCgroups(mode=Mode.DEVICES if filt else Mode.CGROUP, why=missing,
                       required=required, unified=unified, devices=devices, filter=filt,
                       path=relative.strip("/"))


def members(dirs: Iterable[Path]) -> set[int]:
    """Every process in these cgroups and their children cgroups."""
    found: set[int] = set()
    for top in dirs:
        for folder, _, _ in os.walk(top):
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in Path(folder, "cgroup.procs").read_text().split())
    found.discard(0)  # a process outside this PID namespace
    return found


def populated(dirs: Iterable[Path]) -> bool:
    """Is any process left in these cgroups?"""
    return bool(members(dirs))


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def _wait_empty(dirs: Sequence[Path], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:  # a zombie is no longer in its cgroup: nothing to reap first
        if not populated(dirs):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def term(dirs: Sequence[Path], spare: Iterable[int] = ()) -> None:
    """TERM every process of the cgroups but the process groups in ``spare`` (those the
    caller TERMs itself: a task's own group gets one TERM, not two)."""
    groups = set(spare)
    pids = []
    for pid in members(dirs):
        with contextlib.suppress(OSError):
            if os.getpgid(pid) in groups:
                continue
        pids.append(pid)
    _signal_all(pids, signal.SIGTERM)


def kill(dirs: Sequence[Path], grace: float = 0.0) -> bool:
    """Wait up to ``grace`` for the cgroups to empty, then KILL what is left
    (``cgroup.kill`` where the kernel has it, else each process, again until none is
    left); True once they are empty."""
    if not dirs or _wait_empty(dirs, grace):
        return True
    for top in dirs:
        with contextlib.suppress(OSError):
            (top / "cgroup.kill").write_text("1\n")
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        _signal_all(members(dirs), signal.SIGKILL)  # v1: no cgroup.kill; a fork in between
        if _wait_empty(dirs, 0.05):
            return True
    return not populated(dirs)


def stop(dirs: Sequence[Path], grace: float) -> bool:
    """TERM every process of the cgroups, KILL after ``grace``; True once they are empty."""
    if not populated(dirs):
        return True
    term(dirs)
    return kill(dirs, grace)


def join_env(state: NodeCgroups, task_key: str, wait: float | None = None,
             ) -> tuple[dict[str, str], str]:
    """What a task's wrapper needs to join its job's cgroups (``HYPERTF_CGROUP_PROCS``:
    their ``cgroup.procs`` files, ':'-separated; ``HYPERTF_CGROUP_REQUIRED``), waiting up
    to ``wait`` for the agent to make them; and a notice ('' if none) when the node would
    confine but the job's cgroups are not there: the task runs unconfined (auto) or not at
    all (required: the wrapper refuses, since the variable names files that do not exist)."""
    dirs = state.job_dirs(task_key)
    if not dirs:
        return {}, ""
    wait = WAIT_S if wait is None else wait
    deadline = time.monotonic() + wait
    while not all(d.is_dir() for d in dirs):
        if time.monotonic() >= deadline:
            if state.required:
                return ({"HYPERTF_CGROUP_PROCS": ":".join(str(d / "cgroup.procs")
                                                          for d in dirs),
                         "HYPERTF_CGROUP_REQUIRED": "1"},
                        f"the agent did not make the job's cgroups in {wait:.0f} s")
            return {}, (f"hypertf: this task is not confined: the agent did not make job "
                        f"{task_key}'s cgroups in {wait:.0f} s (is it running?)")
        time.sleep(0.005)
    env = {"HYPERTF_CGROUP_PROCS": ":".join(str(d / "cgroup.procs") for d in dirs),
           "HYPERTF_CGROUP_PATH": f"/{state.path}/{task_key}"}
    if state.required:
        env["HYPERTF_CGROUP_REQUIRED"] = "1"
    return env, ""


class JobCgroups:
    """The agent's side: each job of its row gets its cgroups and device rules; a job
    gone from its row loses them once they are empty."""

    def __init__(self, state: NodeCgroups) -> None:
        self.state = state
        self._denied: dict[str, frozenset[int]] = {}  # job -> GPU minors refused, as written

    def sync(self, jobs: Mapping[str, frozenset[int]], minors: Mapping[int, int]) -> None:
        """``jobs``: each job holding (or draining) a cell of this host, with the GPU
        indices it holds here; ``minors``: GPU index -> device minor (NVML's minor number;
        the index for the static source)."""
        if self.state.mode is Mode.NONE:
            return
        every = frozenset(minors.values())
        for key, gpus in jobs.items():
            dirs = self.state.job_dirs(key)
            if not dirs:
                continue
            denied = every - {minors.get(i, i) for i in gpus}
            try:
                for d in dirs:
                    d.mkdir(exist_ok=True)
                if self._denied.get(key) != denied:
                    self._apply(key, denied)
                    self._denied[key] = denied
            except OSError as err:
                _log().error("cannot prepare the cgroups of %s: %s", key, err)
        self._forget(set(jobs))

    def _apply(self, key: str, denied: frozenset[int]) -> None:
        if self.state.filter == "v1":
            rules = Path(self.state.devices) / key
            before = self._denied.get(key, frozenset())
            for minor in sorted(before - denied):
                (rules / "devices.allow").write_text(f"c {NVIDIA_MAJOR}:{minor} rwm\n")
            for minor in sorted(denied - before):
                (rules / "devices.deny").write_text(f"c {NVIDIA_MAJOR}:{minor} rwm\n")
        elif self.state.filter == "bpf":
            from hypertf.node import bpfdevice

            bpfdevice.deny_devices(Path(self.state.unified) / key,
                                   [("c", NVIDIA_MAJOR, m) for m in sorted(denied)])

    def jobs(self) -> list[str]:
        """The jobs whose cgroups this agent made and keeps."""
        return sorted(self._denied)

    def move_in(self, key: str, pid: int) -> tuple[list[str], bool]:
        """Move ``pid`` (a proven wrapper that could not join by itself) into each of the
        job's cgroups it is not in yet: the cgroups it was moved into, and whether it was
        in all of them already."""
        moved = []
        inside = True
        for folder in self.state.job_dirs(key):
            if pid not in members([folder]):
                inside = False
                with contextlib.suppress(OSError):
                    (folder / "cgroup.procs").write_text(f"{pid}\n")
                    moved.append(str(folder))
        return moved, inside

    def close(self, workdir: str | Path | None = None) -> None:
        """The agent stops: a start no longer waits for cgroups nobody makes (the state
        says so), and the host's subtrees go when nothing is in them."""
        if workdir is not None and self.state.mode is not Mode.NONE:
            with contextlib.suppress(OSError):
                write_state(workdir, NodeCgroups(why="the node's agent is stopped",
                                                 required=self.state.required))
        for subtree in self.state.subtrees():
            with contextlib.suppress(OSError):
                for entry in subtree.iterdir():  # a running job's, with processes, stays
                    if entry.is_dir() and _KEY.match(entry.name) and not populated([entry]):
                        _remove(entry)
            with contextlib.suppress(OSError):
                subtree.rmdir()
                subtree.parent.rmdir()  # the cluster's, when no other host is in it
                subtree.parent.parent.rmdir()  # hypertf_cgroup_root, when no other cluster

    def _forget(self, current: set[str]) -> None:
        """Remove the cgroups of jobs no longer in the row, once empty (a job's processes
        are the drain's to stop: its cells stay draining until they are gone)."""
        for subtree in self.state.subtrees():
            with contextlib.suppress(OSError):
                for entry in subtree.iterdir():
                    if entry.is_dir() and _KEY.match(entry.name) and entry.name not in current:
                        if populated([entry]):  # its job holds no cell here: nothing may run
                            _log().warning("job %s has no cell on this host but processes in its "
                                        "cgroup %s: killed", entry.name, entry)
                            kill([entry])
                        _remove(entry)
                        self._denied.pop(entry.name, None)


def _remove(top: Path) -> None:
    """rmdir a cgroup and its children cgroups, deepest first."""
    for folder, _, _ in sorted(os.walk(top), key=lambda walked: -len(walked[0])):
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def join(procs_files: str) -> str:
    """Move this process into each ``cgroup.procs`` of a ':'-separated list (what task.sh
    does in bash; for Python callers and tests): '' or why not."""
    for path in filter(None, procs_files.split(":")):
        try:
            Path(path).write_text(f"{os.getpid()}\n")
        except OSError as err:
            return f"{path}: {os.strerror(err.errno or errno.EIO)}"
    return ""
