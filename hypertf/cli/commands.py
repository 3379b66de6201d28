"""The job verbs of ``hypertf`` as functions with typed arguments: train, jobs, kill,
cancel, queue, usage, hold, unhold, logs.

``hypertf`` (hypertf.cli.main) parses a command line into these arguments; Invoke's tasks.py
calls the same functions with typed values (no argv round trip). Each returns the exit code;
a HyperTFError is turned into one message and its code by ``exits.run``. The other verbs, by
subject: clusterverbs (status, the nodes' agents, ZooKeeper, provisioning, the inventory,
the dashboard), authverbs (credentials, limits, accounts) and labverbs (the lab).
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
import time
from collections.abc import Iterator

from hypertf.config.inventory import load_inventory
from hypertf.core.errors import UsageError
from hypertf.launch.request import TrainRequest


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: importing modules makes many objects and hardly
    any garbage, and the collector's passes over them were ~10% of a launcher's start
    (0.02 of 0.2 s of CPU here)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def jobs(inventory: str, last: int = 20, as_json: bool = False) -> int:
    """Recent jobs of every user, newest first; unreadable records (a user's own junk) are
    skipped and counted on stderr, never an error for everyone."""
    from hypertf import store
    from hypertf.cli.jobtable import job_table
    from hypertf.store.jobs import job_state

    with store.opened(load_inventory(inventory).cluster) as zk:
        listed = zk.jobs.collect()
    found = listed.jobs[:last]
    for note in listed.notes():
        print(f"hypertf: {note}", file=sys.stderr)
    if as_json:
        print(json.dumps([{**job, "status": job_state(job)} for job in found], indent=2))
        return 0
    if not found:
        print("no jobs")
        return 0
    print("\n".join(job_table(found)))
    return 0


def kill(inventory: str, task_key: str, command: str = "hypertf kill") -> int:
    """End a running job, or take a waiting one out of the queue (owner or admin); the job
    record names ``command``, so the launcher and ``hypertf jobs`` say which one it was."""
    from hypertf import store
    from hypertf.core.jobrecord import JobState

    with store.opened(load_inventory(inventory).cluster) as zk:
        killed = zk.matrix.kill(task_key, command)
        state = (zk.jobs.read(task_key) or {}).get("state")
    if state == JobState.CANCELLED and killed:
        print(f"job {task_key}: cancelled; it left the queue and never started")
    else:
        print(f"job {task_key}: " + ("lease dropped; its GPUs drain until the agents have "
                                     "stopped its tasks" if killed else
                                     f"was neither running nor waiting ({state or 'unknown'})"))
    return 0


def cancel(inventory: str, task_key: str) -> int:
    """``hypertf cancel``: ``kill`` under its own name."""
    return kill(inventory, task_key, "hypertf cancel")


def queue(inventory: str, as_json: bool = False, shares: bool = False,
          direct: bool = False) -> int:
    """The waiting jobs in admission order, like squeue: position, reason, waiting time;
    with ``shares``, each user's fair share (like sshare)."""
    from hypertf import store
    from hypertf.core.fairshare import DAY_S
    from hypertf.keeper import queueview

    inv = load_inventory(inventory)
    half_life_s = inv.cluster.fairshare_half_life * DAY_S
    with store.opened(inv.cluster) as zk:
        if shares:
            rows = queueview.shares(zk, half_life_s)
        else:
            view = None if direct else queueview.collect_view(zk)
            rows = view if view is not None else queueview.collect(
                zk, inv.cluster.user_gpu_limit, half_life_s=half_life_s)
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        print(queueview.render_shares(rows, half_life_s) if shares else
              queueview.render(rows))
    return 0


def usage(inventory: str, since: str | None = None, until: str | None = None,
          by: str = "user", as_json: bool = False, as_csv: bool = False) -> int:
    """GPU-hours from the keeper's ledger (the admin: every user; a user: their own and
    the total)."""
    from hypertf import store
    from hypertf.keeper.usageview import collect
    from hypertf.store import credentials

    if as_json and as_csv:
        raise UsageError("hypertf usage: give --json or --csv, not both")
    kind, _, name = credentials.default_identity().partition(".")
    with store.opened(load_inventory(inventory).cluster) as zk:
        report = collect(zk, by, since, until, viewer=name if kind == "user" else "")
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.to_csv() if as_csv else report.render(), end="\n" if not as_csv else "")
    return 0


def hold(inventory: str, task_key: str, held: bool = True) -> int:
    """Keep a waiting job in the queue without admitting it (or let it go again)."""
    from hypertf import store

    with store.opened(load_inventory(inventory).cluster) as zk:
        zk.queue.set_held(task_key, held)
    print(f"job {task_key}: " + ("held: it keeps its place and starts only after "
                                 f"'hypertf unhold {task_key}'" if held else "no longer held"))
    return 0


def unhold(inventory: str, task_key: str) -> int:
    return hold(inventory, task_key, held=False)


def logs(inventory: str, task_key: str, follow: bool = False, task: str | None = None) -> int:
    from hypertf import store
    from hypertf.launch.joblogs import show_logs

    inv = load_inventory(inventory)
    with store.opened(inv.cluster, long_lived=follow,
                      on_pause=lambda msg: print(f"hypertf: {msg}", file=sys.stderr)) as zk:
        return show_logs(zk, inv, task_key, follow=follow, task=task)


def train(inventory: str, request: TrainRequest, detach: bool = False) -> int:
    """Run a job in the foreground, or (``detach``) hand it to a background launcher."""
    if detach:
        from hypertf.launch.detach import start_detached

        return start_detached(inventory, request)
    with _collector_paused():  # the launcher's imports (kazoo, paramiko) and the inventory
        started = time.monotonic()
        inv = load_inventory(inventory)
        inventory_s = time.monotonic() - started
        # the SSH connections (and the nodes' start) begin now, overlapping the imports
        from hypertf.launch.prestart import connect_early

        sessions = connect_early(inv, request)
        try:
            from hypertf.launch.launcher import train as run_job
        except BaseException:  # Ctrl-C among the imports: leave nothing open
            sessions.close()
            raise
    run_job(inv, request, say=lambda line: print(line, flush=True), inventory_s=inventory_s,
            sessions=sessions)
    return 0
