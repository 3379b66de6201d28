"""A job's run directory on a node, ``<workdir>/runs/<task key>/``: the one place its layout
is spelled. The launcher names remote files with it, ``tasknode`` reads and writes them,
the agent finds runs to reap and drain with it, and ``task.sh`` gets every file it writes
as an argument (it spells nothing itself).

::

    <workdir>/runs/<task key>/<task>.log    the task's output (task = worker0, ps1, chief0)
    <workdir>/runs/<task key>/<task>/       the task's working directory (its relative
                                            outputs), unless --sync or --workdir
    <workdir>/runs/<task key>/<task>.pid    its wrapper's record: "PID START", its PID (= its
                                            process group) and its start time (field 22 of
                                            /proc/PID/stat): a recycled PID has another
    <workdir>/runs/<task key>/started       made (O_EXCL) by the one 'tasknode start' of the
                                            run: a second start into it is refused
    <workdir>/runs/<task key>/<task>.exit   its exit code, written when it ends
    <workdir>/runs/<task key>/drained       the agent's mark: tasks starting now do not run
    <workdir>/runs/<task key>/stopped       every task seen dead (nothing left to reap)
    <workdir>/runs/<task key>/preempt       HYPERTF_PREEMPT_FILE: the preemption's deadline,
                                            written before its SIGTERM
    <workdir>/runs/<task key>/code/         the --sync upload
    <workdir>/runs/<task key>.start.json    the start request, while it is being read
    <workdir>/runs/<task key>.code.tar.gz   the --sync archive, while it is unpacked
    ./runs/<task key>/{<task>.log,summary.json}  the launcher's local copy (its working dir)
    <workdir>/checkpoints/<job id>/         HYPERTF_CHECKPOINT_DIR when --checkpoint-dir is not
                                            given (the job id: its first attempt's task key);
                                            made only for a job with --max-restarts
    A run directory, its files and a checkpoint directory a start makes are its user's
    alone (0700 directories, 0600 files: ``tasknode start`` and task.sh set umask 077).
    <workdir>/tensorboard/<job id>/         HYPERTF_TENSORBOARD_DIR: the job's own summaries
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path, PurePath, PurePosixPath

RUNS = "runs"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"


def checkpoint_dir(workdir: str, job_id: str) -> str:
    """``<workdir>/checkpoints/<job id>``: a job's checkpoints on a node, the same path for
    every attempt (the job id is its first attempt's task key)."""
    return str(PurePosixPath(workdir) / CHECKPOINTS / job_id)


def tensorboard_dir(workdir: str, job_id: str) -> str:
    """``<workdir>/tensorboard/<job id>``: HYPERTF_TENSORBOARD_DIR, where a job's tasks write
    their summaries (``tensorboard --logdir`` on it), the same for every attempt."""
    return str(PurePosixPath(workdir) / TENSORBOARD / job_id)


def make_private(path: Path) -> Path:
    """``path`` (a run directory) and its missing parents made 0700, whatever the umask: a
    run's logs, summary and request are its user's alone. One already there is narrowed."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        os.chmod(folder, 0o700)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, readable by its user only (0600 from the start: no moment
    where another user could open it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)


def replace_readable(path: Path, text: str) -> None:
    """``path`` replaced by ``text`` in one rename, 0644: a node's state its agent writes
    and every task account reads (``cgroups.json``, ``accounts.json``): a reader sees the
    old file or the new one whole, never a link followed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o644)
        handle.write(text)
    os.replace(tmp, path)


def read_pid_record(path: Path) -> tuple[int, int] | None:
    """A task's pid file (task.sh writes ``PID START``): its wrapper's PID and start time in
    clock ticks after boot. None while it is not written yet (missing or empty); ValueError
    for anything else (a bare PID, a forged line): such a record proves nothing."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is unreadable") from err
    if not text.strip():
        return None
    fields = text.split()
    if len(fields) != 2 or not all(f.isascii() and f.isdigit() for f in fields):
        raise ValueError(f"{path} is no pid record: {text[:40]!r}")
    pid, start = int(fields[0]), int(fields[1])
    if not 1 < pid < 1 << 31:
        raise ValueError(f"{path} names no process: {pid}")
    return pid, start


class RunDir:
    """Paths of one run; ``PurePosixPath`` for a remote node, ``Path`` on the node itself.

    An immutable value, written out rather than a frozen dataclass: ``tasknode start``
    imports this module on every node of every job, and ``dataclasses`` (with ``inspect``
    and ``ast``) was a fifth of that Python start."""

    __match_args__ = ("path",)
    path: PurePath

    def __init__(self, path: PurePath) -> None:
        object.__setattr__(self, "path", path)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"RunDir is immutable: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"RunDir is immutable: cannot delete {name}")

    def __eq__(self, other: object) -> bool:
        return other.path == self.path if isinstance(other, RunDir) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"RunDir(path={self.path!r})"

    @classmethod
    def of(cls, workdir: str | PurePath, task_key: str, local: bool = False) -> RunDir:
        base = Path(workdir) if local else PurePosixPath(workdir)
        return cls(base / RUNS / task_key)

    @staticmethod
    def runs(workdir: str | PurePath) -> Path:
        """The node's directory of run directories (on the node)."""
        return Path(workdir) / RUNS

    @classmethod
    def all_on(cls, workdir: str | PurePath) -> Iterator[RunDir]:
        """Every run directory on this node, in name order."""
        runs = cls.runs(workdir)
        if runs.is_dir():
            for path in sorted(runs.iterdir()):
                if path.is_dir():
                    yield cls(path)

    @property
    def local(self) -> Path:
        return Path(self.path)

    @property
    def task_key(self) -> str:
        return self.path.name

    def log(self, task: str) -> PurePath:
        return self.path / f"{task}.log"

    def task_dir(self, task: str) -> PurePath:
        """The task's own working directory: where its relative outputs land (made when
        the task starts; --sync and --workdir replace it)."""
        return self.path / task

    def pid(self, task: str) -> PurePath:
        return self.path / f"{task}.pid"

    def exit(self, task: str) -> PurePath:
        return self.path / f"{task}.exit"

    @property
    def drained(self) -> PurePath:
        return self.path / "drained"

    @property
    def summary(self) -> PurePath:
        """summary.json: in the launcher's local copy of a run (its logs beside it)."""
        return self.path / "summary.json"

    @property
    def metrics(self) -> PurePath:
        """HYPERTF_METRICS_FILE: the JSON the reporting task writes (copied back at the end)."""
        return self.path / "metrics.json"

    def offload(self, task: str) -> PurePath:
        """What the task's offload did (hypertf.offload.runner writes it at the task's end)."""
        return self.path / f"{task}.offload.json"

    def offload_dir(self, task: str) -> PurePath:
        """The task's offload world's private files: its SSH config, logs, the hook's counts."""
        return self.path / f"{task}.offload"

    @property
    def started(self) -> PurePath:
        """Made (O_EXCL) by the run's one ``tasknode start``: another start is refused."""
        return self.path / "started"

    @property
    def stopped(self) -> PurePath:
        return self.path / "stopped"

    @property
    def preempt(self) -> PurePath:
        """HYPERTF_PREEMPT_FILE: written by 'tasknode stop --preempt-deadline' before the SIGTERM
        (hypertf.core.preemptnotice); a task may also poll for it."""
        return self.path / "preempt"

    @property
    def code(self) -> PurePath:
        return self.path / "code"

    def task_names(self) -> list[str]:
        """The tasks that have (had) a process here: those with a pidfile (on the node)."""
        try:  # a listing, not a glob: no pattern compiled on every node's stop
            names = os.listdir(self.local)
        except OSError:
            return []
        return sorted(name[:-4] for name in names
                      if name.endswith(".pid") and not name.startswith("."))
