"""``hypertf logs KEY [-f] [--task worker:1]``: a job's task logs from any terminal.

The logs are read where they are written, on the nodes (``<workdir>/runs/<key>/<task>.log``)
over SSH with the inventory's verified host keys, so this works for running and finished
jobs alike and needs nothing of the launcher. ``-f`` follows with ``tail -F --pid``: each
remote tail ends by itself when its task's wrapper process has exited, so nothing is left
running on a node when the job ends (or when this command is interrupted: its SSH channel
closes and the tail with it at its next write).
"""

from __future__ import annotations

import io
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

from hypertf.config.inventory import Inventory
from hypertf.core.errors import HyperTFError, UsageError
from hypertf.core.jobrecord import JobRecord, JobState, task_hosts
from hypertf.core.layout import owner_of
from hypertf.core.rundir import RunDir
from hypertf.launch.login import as_job_owner
from hypertf.launch.remote import Session, quote
from hypertf.store import Store
from hypertf.store.credentials import default_identity

WAIT_FOR_START_S = 600  # how long a remote follower waits for a task's PID file
WAITING_STATES = (JobState.QUEUED, JobState.ALLOCATED)


class _PrefixedLines(io.TextIOBase):
    """Whole lines to ``out``, each after ``prefix``; one lock for every task's sink."""

    def __init__(self, prefix: str, out: TextIO, lock: threading.Lock) -> None:
        self.prefix, self.out, self.lock, self.buffer = prefix, out, lock, ""

    def write(self, text: str) -> int:
        self.buffer += text
        *lines, self.buffer = self.buffer.split("\n")
        if lines:
            with self.lock:
                for line in lines:
                    self.out.write(f"{self.prefix}{line}\n")
                self.out.flush()
        return len(text)

    def flush_rest(self) -> None:
        if self.buffer:
            self.write("\n")


def _tasks(record: Mapping[str, Any], only: str | None) -> list[tuple[str, str]]:
    """(task name "worker:1", host) of the job, or of the one task asked for."""
    tasks = task_hosts(record)
    if only is not None:
        chosen = [t for t in tasks if t[0] == only]
        if not chosen:
            names = ", ".join(name for name, _ in tasks) or "none yet"
            raise UsageError(f"job {record['task_key']} has no task {only!r} (its tasks: "
                             f"{names})")
        return chosen
    return tasks


def _wait_for_placement(store: Store, task_key: str, out: TextIO) -> JobRecord:
    """A queued job has no tasks yet: say so and wait until it has started."""
    said = False
    while True:
        record = store.jobs.read(task_key) or JobRecord()
        if record.get("state") not in WAITING_STATES:
            return record
        if not said:
            out.write(f"hypertf: job {task_key} waits in the queue (hypertf queue); following "
                      f"its logs once it starts\n")
            out.flush()
            said = True
        time.sleep(1.0)


def follow_command(run: RunDir, file_name: str) -> str:
    """Print the log, follow it while the task's wrapper lives, then end (the pid file
    holds the wrapper's PID, then its start time)."""
    log, pid = quote(run.log(file_name)), quote(run.pid(file_name))
    return (f"for i in $(seq {WAIT_FOR_START_S * 2}); do [ -s {pid} ] && break; "
            f"[ -e {quote(run.stopped)} ] && break; sleep 0.5; done; "
            f"p=$(cut -d' ' -f1 {pid} 2>/dev/null); touch -a {log} 2>/dev/null; "
            f"if [ -n \"$p\" ] && kill -0 \"$p\" 2>/dev/null; then "
            f"exec tail -n +1 -s 0.5 -F --pid=\"$p\" {log} 2>/dev/null; "
            f"else cat {log} 2>/dev/null; fi")


def show_logs(store: Store, inventory: Inventory, task_key: str, follow: bool = False,
              task: str | None = None, out: TextIO = sys.stdout) -> int:
    """Print (or follow) the task logs of ``task_key``; the exit code."""
    record = store.jobs.read(task_key)
    if record is None:
        raise UsageError(f"no job {task_key!r}; list them with 'hypertf jobs'")
    if record.get("state") in WAITING_STATES:
        if not follow:
            out.write(f"job {task_key} waits in the queue: no logs yet (follow it with "
                      f"'hypertf logs {task_key} -f')\n")
            return 0
        record = _wait_for_placement(store, task_key, out)
    tasks = _tasks(record, task)
    if not tasks:
        out.write(f"job {task_key} ({record.get('state')}) never started a task\n")
        return 0
    unknown = sorted({host for _, host in tasks if host not in inventory.nodes})
    if unknown:
        raise UsageError(f"job {task_key} ran on {', '.join(unknown)}, which "
                         f"{inventory.path} does not list: use the job's inventory "
                         f"({record.get('inventory', '?')}) with -i")
    lock = threading.Lock()
    failures: dict[str, str] = {}
    # the caller's own account (another user's logs are not theirs to read); the admin's
    # identity logs in as the inventory's admin account
    login = inventory if default_identity() == "admin" else as_job_owner(inventory)
    sessions = {name: Session(login.node(host), inventory.cluster) for name, host in tasks}

    def read(name: str, host: str) -> None:
        """One session per task: each follower streams on its own connection."""
        run = RunDir.of(inventory.node(host).settings.workdir, task_key)
        file_name = name.replace(":", "")
        sink = _PrefixedLines(f"[{name}] " if len(tasks) > 1 else "", out, lock)
        command = follow_command(run, file_name) if follow else \
            f"cat {quote(run.log(file_name))}"
        try:
            result = sessions[name].stream(command, sink)
        except HyperTFError as err:
            failures[name] = str(err)
            return
        sink.flush_rest()
        if not result.ok and "Permission denied" in result.stderr:
            failures[name] = (f"{host} does not let {login.node(host).user or 'this account'} "
                              f"read {run.log(file_name)}: job {task_key} is "
                              f"{owner_of(task_key)}'s, and its files are that user's alone")
        elif not result.ok and not follow:
            failures[name] = f"no log on {host} ({run.log(file_name)})"

    threads = [threading.Thread(target=read, args=t, daemon=True) for t in tasks]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for session in sessions.values():
            session.close()
    for name, why in sorted(failures.items()):
        print(f"hypertf: warning: {name}: {why}", file=sys.stderr)
    return 6 if failures and len(failures) == len(tasks) else 0
