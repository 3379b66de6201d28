"""Provisioning: bare nodes to a working HyperTF cluster, through Ansible.

``setup`` runs ``deploy.yml`` with ``ansible-playbook`` on the inventory: the very playbook an
operator can run by hand, so there is one code path. It follows the run's events (the
``hypertf_events`` callback in ``playbooks/callback_plugins``) to show progress per host and
to name the step at which a node failed, and ends with the cluster status: every node's
agent registered and its GPUs in the matrix. ``teardown`` runs ``playbooks/teardown.yml``.
Ansible's own output goes to a log file under ``$HYPERTF_HOME/provision``.

``lab_inventory`` writes the inventory that provisions a lab's bare hosts (see hypertf.ops.lab):
virtualenvs and ZooKeeper under each host's private ``/srv``, wheels from a directory built
once on this machine (lab hosts have no internet).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypertf.config.inventory import Inventory, load_inventory
from hypertf.config.paths import state_home
from hypertf.core.errors import HyperTFError

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy.yml"
TEARDOWN = REPO / "playbooks" / "teardown.yml"
ACCOUNTS = REPO / "playbooks" / "accounts.yml"  # deploy.yml's users' accounts play, alone
CALLBACK_DIR = REPO / "playbooks" / "callback_plugins"
ANSIBLE_CFG = REPO / "ansible.cfg"
WHEEL_DIR = REPO / ".hypertf" / "wheels"
POLL_S = 0.2

Say = Callable[[str], None]


class ProvisionError(HyperTFError):
    """A playbook run failed; ``run`` holds what every host did."""

    exit_code = 7

    def __init__(self, message: str, run: PlaybookRun | None = None) -> None:
        super().__init__(message)
        self.run = run


@dataclass
class HostResult:
    """One host's share of a playbook run."""

    name: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    failed_step: str | None = None
    message: str | None = None

    @property
    def status(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        return "changed" if self.changed else "ok"


@dataclass
class PlaybookRun:
    """What ``ansible-playbook`` did, host by host."""

    playbook: Path
    inventory: Path
    check: bool
    returncode: int
    seconds: float
    log: Path
    hosts: dict[str, HostResult] = field(default_factory=dict)

    @property
    def changed(self) -> int:
        return sum(h.changed for h in self.hosts.values())

    @property
    def failed_hosts(self) -> list[HostResult]:
        return [h for h in self.hosts.values() if h.status in ("failed", "unreachable")]

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0 and not self.failed_hosts


class Progress:
    """Turns the callback's events into one line per task: every host's outcome."""

    def __init__(self, say: Say) -> None:
        self.say = say
        self.task: dict[str, Any] | None = None
        self.outcomes: dict[str, str] = {}
        self.hosts: dict[str, HostResult] = {}
        self.failed_at: dict[str, tuple[str, str]] = {}
        self.play_hosts: set[str] = set()
        self.stopped_by: tuple[str, str] | None = None

    def _step(self, event: Mapping[str, Any]) -> str:
        return f"{event['role']} | {event['task']}" if event.get("role") else str(event["task"])

    def _flush(self) -> None:
        if self.task is None or not self.outcomes:
            return
        if any(state != "skipped" for state in self.outcomes.values()):
            hosts = ", ".join(f"{h} {s}" for h, s in sorted(self.outcomes.items()))
            self.say(f"  [{self.task['t']:6.1f}s] {self._step(self.task)}: {hosts}")
        self.outcomes = {}

    def feed(self, event: Mapping[str, Any]) -> None:
        kind = event.get("e")
        if kind == "play":
            self._flush()
            self.task = None
            self.play_hosts = set()
            self.say(f"== {event['name']}{' (check mode)' if event.get('check') else ''}")
        elif kind == "task":
            self._flush()
            self.task = dict(event)
        elif kind == "result":
            host, status = str(event["host"]), str(event["status"])
            self.outcomes[host] = status
            self.play_hosts.add(host)
            if status in ("failed", "unreachable"):
                step = self._step(event)
                message = str(event.get("msg") or "").strip()
                self.failed_at.setdefault(host, (step, message))
                if event.get("run_once"):
                    # Ansible stops the whole play: every host of it is left unfinished.
                    self.stopped_by = (step, message)
                    for other in self.play_hosts:
                        self.failed_at.setdefault(
                            other, (step, f"not finished: {step} failed for every node"))
                lines = message.splitlines() or [""]
                self.say(f"  !! {host} {status.upper()} at {step}: {lines[0]}")
                for line in lines[1:5]:
                    self.say(f"       {line}")
        elif kind == "stats":
            self._flush()
            for host, counts in event["hosts"].items():
                failed: tuple[str | None, str | None] = self.failed_at.get(host, (None, None))
                failed_step, failed_message = failed
                self.hosts[host] = HostResult(
                    name=host, ok=counts["ok"], changed=counts["changed"],
                    failed=counts["failures"] or int(failed_step is not None),
                    unreachable=counts["unreachable"], skipped=counts["skipped"],
                    failed_step=failed_step, message=failed_message,
                )


def _ansible_playbook() -> str:
    beside = Path(sys.executable).with_name("ansible-playbook")
    found = str(beside) if beside.exists() else shutil.which("ansible-playbook")
    if not found:
        raise ProvisionError("ansible-playbook not found: pip install ansible-core (it comes "
                             "with HyperTF's dependencies; run from HyperTF's virtualenv)")
    return found


def ansible_env(events: Path | None = None) -> dict[str, str]:
    """The environment every HyperTF playbook run gets (also used by the tests' molecule)."""
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(ANSIBLE_CFG),
        ANSIBLE_CALLBACK_PLUGINS=str(CALLBACK_DIR),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    if events is not None:
        env.update(ANSIBLE_CALLBACKS_ENABLED="hypertf_events",
                   HYPERTF_PROVISION_EVENTS=str(events))
    return env


def run_playbook(playbook: Path, inventory: str | os.PathLike[str], *, check: bool = False,
                 ask_pass: bool = False, extra_vars: Mapping[str, Any] | None = None,
                 say: Say = print, tags: Sequence[str] = ()) -> PlaybookRun:
    """Run one playbook (only its plays and tasks tagged ``tags``, if any), showing progress
    per host; never raises on a failed host."""
    if not playbook.is_file():
        raise ProvisionError(f"{playbook} not found: run HyperTF from its source checkout "
                             f"(the playbooks and roles are not part of the wheel)")
    if ask_pass and not shutil.which("sshpass"):
        raise ProvisionError("--ask-pass needs sshpass on this machine: apt-get install sshpass")
    logs = state_home() / "provision"
    logs.mkdir(mode=0o700, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log = logs / f"{stamp}-{playbook.stem}.log"
    events = logs / f"{stamp}-{playbook.stem}.events.jsonl"
    events.write_text("")
    argv = [_ansible_playbook(), "-i", str(Path(inventory).resolve()), str(playbook)]
    argv += ["--check"] if check else []
    argv += ["--ask-pass"] if ask_pass else []
    argv += ["--tags", ",".join(tags)] if tags else []
    if extra_vars:
        argv += ["--extra-vars", json.dumps(dict(extra_vars))]
    progress = Progress(say)
    started = time.monotonic()
    with open(log, "wb") as out, open(events, encoding="utf-8") as feed:
        proc = subprocess.Popen(argv, cwd=REPO, env=ansible_env(events), stdout=out,
                                stderr=subprocess.STDOUT,
                                stdin=None if ask_pass else subprocess.DEVNULL)
        try:
            pending = ""
            while True:
                done = proc.poll() is not None
                pending += feed.read()
                *lines, pending = pending.split("\n")
                for line in lines:
                    if line.strip():
                        progress.feed(json.loads(line))
                if done:
                    break
                time.sleep(POLL_S)
        except BaseException:
            proc.terminate()
            proc.wait(30)
            raise
    events.unlink(missing_ok=True)
    return PlaybookRun(playbook=playbook, inventory=Path(inventory), check=check,
                       returncode=proc.returncode, seconds=time.monotonic() - started, log=log,
                       hosts=progress.hosts)


def recap(run: PlaybookRun, say: Say = print) -> None:
    """The per-host table at the end of a run, and what it amounts to."""
    width = max([len(h) for h in run.hosts] + [4])
    say(f"{'host':<{width}}  {'ok':>4}  {'changed':>7}  result")
    for name, host in sorted(run.hosts.items()):
        result = host.status
        if host.failed_step:
            result = f"{host.status.upper()} at {host.failed_step}"
        say(f"{name:<{width}}  {host.ok:>4}  {host.changed:>7}  {result}")
    verb = "would change" if run.check else "changed"
    if run.failed_hosts:
        say(f"{len(run.failed_hosts)} of {len(run.hosts)} node(s) failed; Ansible's log: {run.log}")
    elif run.changed == 0:
        say(f"No changes: every node was already set up ({run.seconds:.0f} s).")
    else:
        nodes = sum(1 for h in run.hosts.values() if h.changed)
        say(f"{verb} {run.changed} thing(s) on {nodes} node(s) in {run.seconds:.0f} s.")


def _failure(run: PlaybookRun, what: str) -> ProvisionError:
    if not run.failed_hosts:
        return ProvisionError(f"{what}: ansible-playbook exited {run.returncode}; see {run.log}",
                              run)
    lines = []
    for host in run.failed_hosts:
        detail = (host.message or "").strip().splitlines()
        lines.append(f"  {host.name}: {host.status} at {host.failed_step or 'an unknown step'}"
                     + (f": {detail[0]}" if detail else "")
                     + (f" ({detail[-1].strip()})" if len(detail) > 1 else ""))
    return ProvisionError(f"{what} failed on {len(lines)} node(s):\n" + "\n".join(lines)
                          + f"\nAnsible's log: {run.log}", run)


def _check_remote(inventory: Inventory) -> None:
    local = [n.name for n in inventory.nodes.values() if n.local]
    if local:
        raise ProvisionError(
            f"{inventory.path}: {', '.join(local)} is this machine (ansible_connection: local); "
            f"cluster.setup provisions nodes over SSH. For this machine use ./dev.sh up "
            f"(invoke zk.start, invoke agent.start)"
        )


def wait_for_agents(inventory: Inventory, hosts: Iterable[str], timeout: float = 60.0,
                    ) -> dict[str, Any]:
    """Poll the cluster status until every host in ``hosts`` has a live agent (status
    brings its GPUs into the matrix) or the timeout passes; returns the last report."""
    from hypertf import store
    from hypertf.store import status

    wanted = set(hosts)
    client = store.connect(inventory.cluster)
    try:
        deadline = time.monotonic() + timeout
        while True:
            report = status.collect(client, inventory)
            ready = {h["name"] for h in report["hosts"] if h["agent"] == status.AgentState.UP}
            if wanted <= ready or time.monotonic() > deadline:
                return report
            time.sleep(0.5)
    finally:
        store.close(client)


def setup(inventory_path: str | os.PathLike[str], *, ask_pass: bool = False,
          check: bool = False, say: Say = print, wait_s: float = 60.0,
          tags: Sequence[str] = (),
          show: Callable[[dict[str, Any]], None] | None = None) -> PlaybookRun:
    """``invoke cluster.setup``: run deploy.yml (only the plays tagged ``tags``, if any:
    ``ansible-playbook --tags``), then show the cluster status with ``show`` (the command
    line's table, hypertf.cli.statustable.render; None: not shown)."""
    from hypertf.store import status

    inventory = load_inventory(inventory_path)
    _check_remote(inventory)
    say(f"Provisioning {len(inventory.nodes)} GPU node(s)"
        + (f" and ZooKeeper on {', '.join(inventory.zookeeper_nodes)}"
           if inventory.zookeeper_nodes else f" (ZooKeeper {inventory.cluster.zookeeper_hosts})")
        + f" from {inventory.path}{' in check mode' if check else ''}")
    run = run_playbook(DEPLOY, inventory.path, check=check, ask_pass=ask_pass, say=say,
                       extra_vars={"hypertf_gpu_group": inventory.cluster.gpu_group}, tags=tags)
    recap(run, say)
    if check:
        if not run.succeeded:
            raise _failure(run, "cluster.setup --check")
        return run
    failed = {h.name for h in run.failed_hosts}
    expected = [name for name in inventory.nodes if name not in failed]
    try:
        report = wait_for_agents(inventory, expected, wait_s)
    except HyperTFError as err:
        if run.succeeded:
            raise
        say(f"(no cluster status: {err})")
    else:
        if show is not None:
            show(report)
        missing = [h["name"] for h in report["hosts"]
                   if h["name"] in expected and h["agent"] != status.AgentState.UP]
        if missing and run.succeeded:
            raise ProvisionError(f"the agents of {', '.join(missing)} did not register within "
                                 f"{wait_s:.0f} s; see <workdir>/agent.log on them", run)
    if not run.succeeded:
        raise _failure(run, "cluster.setup")
    return run


def teardown(inventory_path: str | os.PathLike[str], *, zookeeper: bool = False,
             purge: bool = False, say: Say = print) -> PlaybookRun:
    """``invoke cluster.teardown``: stop the agents (and ZooKeeper on request), clean up."""
    inventory = load_inventory(inventory_path)
    _check_remote(inventory)
    say(f"Tearing down {len(inventory.nodes)} GPU node(s)"
        + (" and ZooKeeper" if zookeeper else "") + (", purging data" if purge else ""))
    run = run_playbook(TEARDOWN, inventory.path, say=say, extra_vars={
        "hypertf_gpu_group": inventory.cluster.gpu_group,
        "teardown_zookeeper": zookeeper, "teardown_purge": purge,
    })
    recap(run, say)
    if not run.succeeded:
        raise _failure(run, "cluster.teardown")
    return run


def install_local_packages(inventory_path: str) -> int:
    """``./dev.sh up``: this machine's virtualenv gets what the python_env role would give a
    node (the settings of the inventory's first node); nothing named, nothing done."""
    inventory = load_inventory(inventory_path)
    settings = next(iter(inventory.nodes.values())).settings
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if settings.python_packages:
        subprocess.run([*pip, *settings.python_packages], check=True)
    if settings.python_packages_no_deps:
        subprocess.run([*pip, "--no-deps", *settings.python_packages_no_deps], check=True)
    named = [*(settings.python_packages or ()), *(settings.python_packages_no_deps or ())]
    print(f"local packages: {', '.join(named) if named else 'none named'}")
    return 0
