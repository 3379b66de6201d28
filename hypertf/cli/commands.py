"""Every ``hypertf`` verb as a function with typed arguments.

``hypertf`` (hypertf.cli.main) parses a command line into these arguments; Invoke's tasks.py
calls the same functions with typed values (no argv round trip). Each returns the exit code;
a HyperTFError is turned into one message and its code by ``exits.run``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypertf.config.inventory import load_inventory
from hypertf.core.errors import UsageError
from hypertf.launch.request import TrainRequest

if TYPE_CHECKING:
    from hypertf.config.inventory import Inventory
    from hypertf.core.jobrecord import JobRecord


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


def status(inventory: str, as_json: bool = False, direct: bool = False) -> int:
    from hypertf import store
    from hypertf.cli import statustable
    from hypertf.store import status as cluster_status

    inv = load_inventory(inventory)
    client = store.connect(inv.cluster)
    try:
        compact = not as_json and len(inv.nodes) > statustable.COMPACT_FROM_HOSTS
        # a large cluster's compact view from the keeper's view, when it is whole
        report = cluster_status.collect_view(client, inv) if compact and not direct else None
        if report is None:
            report = cluster_status.collect(client, inv, gpu_details=not compact)
    finally:
        store.close(client)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        statustable.render(report)
    return 0


def _clock(stamp: Any) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(stamp)) \
        if isinstance(stamp, (int, float)) else "-"


def _span(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


JOB_COLUMNS = ("TASK KEY", "STATE", "OWNER", "SUBMITTED", "WAITED", "RAN", "SCRIPT", "TASKS",
               "NOTE")
REASON_WIDTH = 100  # a failure's reason in the NOTE column: its first line, cut here


def _reason(job: JobRecord, state: str) -> str:
    """Why a job that did not succeed ended: its summary's first line (or the keeper's
    refusal), short; the whole text is in ``hypertf jobs --json`` and summary.json."""
    from hypertf.core.jobrecord import JobState

    if state not in (JobState.FAILED, JobState.INTERRUPTED, JobState.LOST, JobState.REFUSED,
                     JobState.RETRIED, JobState.PREEMPTED):  # 'preempted by <key> at <time>'
        return ""
    summary = job.get("summary")
    text = str((summary.get("message") if isinstance(summary, dict) else None)
               or job.get("refused_reason") or
               ("its launcher went away without releasing it" if state == JobState.LOST else ""))
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= REASON_WIDTH else line[:REASON_WIDTH - 3] + "..."


def _job_row(job: JobRecord) -> tuple[str, ...]:
    """A job as JOB_COLUMNS' cells: when it was submitted, how long it waited and ran, and
    a note (who ended it, its attempt, why it failed)."""
    from hypertf.core.jobrecord import JobState, task_hosts
    from hypertf.store.jobs import job_state

    owner = job.get("owner", {})
    tasks = ", ".join(f"{name}@{host}" for name, host in task_hosts(job))
    state = job_state(job)
    notes = []
    for how, by, when in ((JobState.KILLED, job.get("killed_by"), job.get("killed")),
                          (JobState.CANCELLED, job.get("cancelled_by"), job.get("cancelled"))):
        if state == how and by:
            who = by.get("identity") or by.get("user", "?")
            command = f" ({by['command']})" if isinstance(by.get("command"), str) else ""
            notes.append(f"{how} by {who}{command} from {by.get('host', '?')} at "
                         f"{_clock(when)}")
    if job.get("attempt", 1) > 1:
        notes.append(f"attempt {job['attempt']} of {job['job_id']}")
    reason = _reason(job, state)
    if reason:
        notes.append(reason)
    created = job.get("created")
    started = job.get("admitted", created) if state != JobState.QUEUED else None
    ends = [job.get(k) for k in ("released", "killed", "cancelled", "lost", "refused")]
    end = max((t for t in ends if isinstance(t, (int, float))), default=None)
    waited = job.get("waited_s") if state != JobState.QUEUED else \
        (time.time() - created if isinstance(created, (int, float)) else None)
    if state != JobState.QUEUED and isinstance(waited, (int, float)) and waited < 1.0:
        waited = None  # admitted at once (every job passes the keeper): it did not wait
    ran = (end or time.time()) - started if isinstance(started, (int, float)) and \
        state not in (JobState.QUEUED, JobState.CANCELLED, JobState.REFUSED) else None
    return (str(job["task_key"]), state, f"{owner.get('user', '?')}@{owner.get('host', '?')}",
            _clock(created), _span(waited), _span(ran), str(job.get("script", "")),
            tasks or "-", "; ".join(notes))


def printable(text: str) -> str:
    """A cell as it may reach a terminal: every record is written by its owner (or their
    launcher), and another user's ``hypertf jobs`` prints it, so a control character (an
    escape sequence that retitles, clears or rewrites the terminal) shows as '?'."""
    from hypertf.core.records import plain_text

    return plain_text(text, instead="?")


def job_table(found: list[JobRecord]) -> list[str]:
    """``hypertf jobs``' lines: a header, then a row per job, columns as wide as their
    widest cell (the last, the note, is not padded)."""
    rows = [JOB_COLUMNS, *(tuple(map(printable, _job_row(job))) for job in found)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(JOB_COLUMNS) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)),
                       row[-1]]).rstrip() for row in rows]


def jobs(inventory: str, last: int = 20, as_json: bool = False) -> int:
    """Recent jobs of every user, newest first; unreadable records (a user's own junk) are
    skipped and counted on stderr, never an error for everyone."""
    from hypertf import store
    from hypertf.store.jobs import collect_jobs, job_state

    with store.opened(load_inventory(inventory).cluster) as zk:
        listed = collect_jobs(zk)
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
    from hypertf.store.allocation import kill as kill_job
    from hypertf.store.jobs import read_job

    with store.opened(load_inventory(inventory).cluster) as zk:
        killed = kill_job(zk, task_key, command)
        state = (read_job(zk, task_key) or {}).get("state")
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
    from hypertf.store import auth as credentials

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


def dashboard(inventory: str, port: int = 8470, bind: str | None = None) -> int:
    """Serve the read-only dashboard until interrupted, reading with the user's credential;
    127.0.0.1 unless ``bind`` names another address (then requests need its token)."""
    from hypertf import store
    from hypertf.dashboard import ClusterSource, serve

    inv = load_inventory(inventory)
    with store.opened(inv.cluster, long_lived=True,
                      on_pause=lambda msg: print(f"hypertf: {msg}", file=sys.stderr)) as zk:
        serve(ClusterSource(inv, zk), port=port, bind=bind)
    return 0


def hold(inventory: str, task_key: str, held: bool = True) -> int:
    """Keep a waiting job in the queue without admitting it (or let it go again)."""
    from hypertf import store
    from hypertf.store.waitqueue import set_held

    with store.opened(load_inventory(inventory).cluster) as zk:
        set_held(zk, task_key, held)
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


def agent(inventory: str, host: str, once: bool = False) -> int:
    from hypertf.node import agent as resource_agent

    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hypertf.kazoo").setLevel(logging.WARNING)
    inv = load_inventory(inventory)
    inv.node(host)
    if once:
        record = resource_agent.NodeAgent(inv, host).run(once=True)
        print(record.to_json().decode() if record else "")
        return 0
    resource_agent.serve(inv, host)
    return 0


def agent_ctl(inventory: str, host: str, action: str) -> int:
    from hypertf.node import service as agentctl

    workdir = load_inventory(inventory).node(host).settings.workdir
    if action == "start":
        pid, started = agentctl.local_start(inventory, host, workdir)
        print(f"agent {host} {'started' if started else 'already running'} (pid {pid})")
    elif action == "stop":
        stopped = agentctl.local_stop(workdir)
        print(f"agent {host} {'stopped' if stopped else 'was not running'}")
    else:
        running = agentctl.running_pid(workdir)
        print(f"agent {host} {f'running (pid {running})' if running else 'not running'}")
        return 0 if running else 1
    return 0


def agents(inventory: str, action: str, host: str | None = None) -> int:
    from hypertf.ops import agentctl

    act = agentctl.start_agents if action == "start" else agentctl.stop_agents
    for name, result in act(load_inventory(inventory), [host] if host else None).items():
        print(f"{name}: {result.stdout.strip()}")
    return 0


def zk(inventory: str, action: str) -> int:
    from hypertf import store
    from hypertf.config.paths import state_home
    from hypertf.ops.zkserver import local_server

    inv = load_inventory(inventory)
    server = local_server(inv.cluster.zookeeper_hosts, state_home())
    if action == "start":
        pid = server.start()
        directory = store.secure_cluster(inv.cluster, list(inv.nodes))
        print(f"ZooKeeper {server.mode()} on {server.hosts} (pid {pid}, data {server.directory}); "
              f"root {inv.cluster.zk_root} secured, credentials in {directory}")
    elif action == "stop":
        print(f"ZooKeeper on {server.hosts} {'stopped' if server.stop() else 'was not running'}")
    else:
        mode = server.mode()
        print(f"ZooKeeper on {server.hosts}: {mode or 'not serving'}")
        return 0 if mode else 1
    return 0


def auth(inventory: str, action: str, user: str | None = None, reset: bool = False,
         print_dir: bool = False, max_priority: int | None = None,
         gpu_limit: int | None = None, share: float | None = None,
         gpu_hours_per_month: float | None = None, no_preempt_ok: bool = False,
         preemptible: bool = False, ssh_key: str | None = None, uid: int | None = None,
         no_nodes: bool = False, as_json: bool = False) -> int:
    from hypertf import store
    from hypertf.store import auth as credentials

    inv = load_inventory(inventory)
    if action == "accounts":
        return _accounts(inv, as_json)
    if action in ("add-user", "limits") and not user:
        raise UsageError(f"hypertf auth {action} NAME: name the user")
    if action == "limits":
        if no_preempt_ok and preemptible:
            raise UsageError("--no-preempt-ok and --preemptible exclude each other: give one")
        exempt = True if no_preempt_ok else False if preemptible else None
        with store.opened(inv.cluster) as zk:
            limits = credentials.set_user_limits(zk.client, inv.cluster.zk_root, str(user),
                                                 max_priority, gpu_limit, share,
                                                 gpu_hours_per_month, exempt).of(str(user))
        cap = limits.gpu_limit or "the cluster's hypertf_user_gpu_limit"
        budget = f"{limits.gpu_hours_per_month:g} GPU-hours a month" \
            if limits.gpu_hours_per_month else "no budget"
        never = ", never preempted" if limits.no_preempt_ok else ""
        print(f"{user}: priority at most {limits.max_priority}, GPUs at most {cap}, "
              f"share {limits.share:g}, {budget}{never}")
        return 0
    users = [credentials.check_name("user", user)] if action == "add-user" and user else []
    directory = store.secure_cluster(inv.cluster, list(inv.nodes), users, reset=reset)
    if action == "add-user":
        print(credentials.handover_note(str(user), directory, inv.cluster.zk_credentials,
                                        inv.cluster.zookeeper_hosts, inv.cluster.zk_root))
        if inv.cluster.account_policy.per_user:
            _add_account(inv, directory, str(user), ssh_key, uid, no_nodes)
    else:
        print(f"ZooKeeper root {inv.cluster.zk_root} secured; credentials in {directory}")
    if print_dir:
        print(directory)
    return 0


def _accounts(inv: Inventory, as_json: bool) -> int:
    """``hypertf auth accounts``: the admin's register of node accounts."""
    from hypertf import store
    from hypertf.ops import accounts

    rows = accounts.registered(store.credentials_dir(inv.cluster), inv.cluster.account_policy)
    if as_json:
        print(accounts.to_json(rows))
        return 0
    policy = inv.cluster.account_policy
    print(f"tasks run as: {policy.mode} accounts" + (
        "" if policy.per_user else " (every user as the inventory's ansible_user)"))
    for row in rows:
        uid = str(row.uid) if row.uid is not None else "(the site's)"
        print(f"{row.user:<16} {row.account:<24} uid {uid:<12} "
              f"{'key' if row.public_key else 'NO KEY'}")
    return 0


def _add_account(inv: Inventory, directory: Path, user: str, ssh_key: str | None,
                 uid: int | None, no_nodes: bool) -> None:
    """``auth add-user`` on a per-user cluster: the account registered, its key made or
    taken, and made on every node (the user_accounts role) unless ``no_nodes``."""
    from hypertf.ops import accounts, provision

    policy = inv.cluster.account_policy
    row, made = accounts.register(directory, policy, user,
                                  Path(ssh_key).expanduser() if ssh_key else None, uid)
    print(f"{user}'s tasks run as the account {row.account}"
          + (f" (uid {row.uid} on every node)" if row.uid is not None else
             " (the site's own account, on every node)"))
    if made is not None:
        where = inv.cluster.user_ssh_key.replace("{user}", user)
        print(f"{made}: {user}'s SSH private key for it: give it to {user} with the "
              f"credential (mode 0600, as {where} on the machine they launch from)")
    remote = [n for n in inv.nodes.values() if not n.local]
    if no_nodes or not remote:
        print("the nodes get the account at the next 'invoke cluster.setup'" if remote else "")
        return
    run = provision.run_playbook(provision.ACCOUNTS, inv.path, tags=["accounts"],
                                 extra_vars={"hypertf_gpu_group": inv.cluster.gpu_group})
    provision.recap(run)
    if not run.succeeded:
        raise provision.ProvisionError(f"{user}'s account was registered but not made on "
                                       f"every node; see {run.log}, fix it and run "
                                       f"'invoke cluster.setup --tags accounts'", run)


def lab_up(hosts: int = 3, gpus: int = 4, agents: bool = True, zookeeper_members: int = 1,
           per_user: bool = True) -> int:
    from hypertf.ops import lab

    built = lab.up(hosts=hosts, gpus=gpus, agents=agents, zookeeper_members=zookeeper_members,
                   per_user=per_user)
    for host in built.hosts:
        print(f"{host.name} {host.address} (namespace {host.namespace})")
    print(f"ZooKeeper {built.zookeeper_hosts}" if built.zookeeper else "no ZooKeeper")
    if built.per_user:
        print(f"each user's tasks run as {built.account_prefix}<user> (keys in "
              f"{built.dir / 'users'}; 'hypertf auth add-user' on this inventory adds one)")
    print(built.inventory)
    return 0


def lab_down(name: str | None = None) -> int:
    from hypertf.ops import lab

    labs = lab.find(name)
    for each in labs:
        lab.down(each)
        print(f"lab {each.lab_id} removed")
    if not labs:
        print("no lab to remove")
    return 0


def lab_list() -> int:
    from hypertf.ops import lab

    for each in lab.find(None):
        print(f"{each.lab_id} {len(each.hosts)} hosts {each.inventory}")
    return 0


def lab_inventory(inventory: str, zookeeper: str = "h1", tensorflow: str = "tensorflow-cpu",
                  operator_dir: str | None = None, name: str = "provision.yml") -> int:
    """An inventory that provisions a lab's bare hosts; prints its path."""
    from hypertf.ops.labprovision import lab_inventory as write

    print(write(Path(inventory).resolve().parent, name=name,
                zookeeper=[h for h in zookeeper.split(",") if h], tensorflow=tensorflow,
                operator_dir=operator_dir))
    return 0


def agent_settings() -> int:
    """The hypertf_* settings a node's agent reads, as JSON: the hypertf_agent role copies
    exactly these from the inventory into the node's agent inventory (one source)."""
    from hypertf.config.settings import AGENT_SETTINGS

    print(json.dumps(list(AGENT_SETTINGS)))
    return 0


def keeper_hosts(inventory: str) -> int:
    """The hosts whose agent may keep the matrix, as JSON: the hypertf_agent role copies
    keeper.yml to these alone (docs/zookeeper-layout.md, "Trust")."""
    print(json.dumps(list(load_inventory(inventory).keeper_hosts)))
    return 0


def cluster_setup(inventory: str, ask_pass: bool = False, check: bool = False) -> int:
    from hypertf.cli import statustable
    from hypertf.ops import provision

    provision.setup(inventory, ask_pass=ask_pass, check=check, show=statustable.render)
    return 0


def cluster_teardown(inventory: str, zookeeper: bool = False, purge: bool = False) -> int:
    from hypertf.ops import provision

    provision.teardown(inventory, zookeeper=zookeeper, purge=purge)
    return 0


def local_packages(inventory: str) -> int:
    """The inventory's hypertf_python_packages in this virtualenv (as python_env does on
    nodes): ./dev.sh up uses it for the embedded default."""
    from hypertf.ops.provision import install_local_packages

    return install_local_packages(inventory)


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
