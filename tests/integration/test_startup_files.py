"""Node commands do not depend on the user's shell startup files (issue 20, item 12).

sshd runs every command through the user's login shell, and Debian's bash sources
``~/.bashrc`` for it. A lab whose hosts' user has a ``.bashrc`` that prints a banner on
stdout (the last one without a newline) and on stderr, and sleeps: the node protocol
(preflight, put, upload-and-start in one command, watch, stop, metrics and logs) reads what the
node said. On h1 the file runs for every command (as on most real nodes); h2's sshd accepts
SHLVL from the client (``AcceptEnv SHLVL``), so there HyperTF's commands skip it entirely.
The lab has no ZooKeeper and no agents (the node protocol needs neither): it is up in
well under a second, so it is built here rather than bending the shared lab's hosts.
"""

from __future__ import annotations

import io
import json
import queue
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hypertf.config.inventory import Inventory, load_inventory
from hypertf.core.errors import RemoteError
from hypertf.core.monitor import Event
from hypertf.core.protocol import TaskStart
from hypertf.core.rundir import RunDir
from hypertf.launch.nodeclient import NodeClient
from hypertf.launch.remote import Session
from hypertf.ops import lab as lab_module
from hypertf.ops import labhosts

BASHRC = """\
echo "Welcome to $(hostname): banner on stdout"
echo "banner on stderr" >&2
echo '{"not": "an answer"}'
printf 'a banner without a newline'
printf 'and on stderr too' >&2
echo sourced >> "$HOME/sourced"
sleep 0.2
"""

TASK = """\
import json, os, sys, time
print("hello from", os.environ["HYPERTF_TASK"], flush=True)
if os.environ.get("HYPERTF_METRICS_FILE"):
    with open(os.environ["HYPERTF_METRICS_FILE"], "w") as handle:
        json.dump({"acc": 0.75}, handle)
if sys.argv[1] == "wait":
    time.sleep(120)
print("bye", flush=True)
"""
WORKDIR = "/srv/hypertf"


@pytest.fixture(scope="module")
def banner_lab(state_home: Path) -> Iterator[tuple[lab_module.Lab, Inventory]]:
    built = lab_module.up(hosts=2, gpus=0, agents=False, zookeeper=False,
                          startup_files=labhosts.StartupFiles(BASHRC, accept_shlvl=("h2",)))
    try:
        path = Path(built.inventory)  # an inventory names a ZooKeeper; none is contacted
        inventory = yaml.safe_load(path.read_text())
        inventory["all"]["vars"]["hypertf_zookeeper_hosts"] = "127.0.0.1:9"
        path.write_text(yaml.safe_dump(inventory))
        yield built, load_inventory(path)
    finally:
        lab_module.down(built)


def sourced(built: lab_module.Lab, host: str) -> int:
    """How many commands ran the host's .bashrc so far."""
    marks = built.dir / host / "home" / "sourced"
    return marks.read_text().count("sourced") if marks.exists() else 0


def events_until_closed(events: queue.Queue[Event], timeout: float = 30) -> list[Event]:
    seen: list[Event] = []
    deadline = time.monotonic() + timeout
    while not seen or seen[-1].kind not in ("closed", "lost"):
        seen.append(events.get(timeout=max(0.1, deadline - time.monotonic())))
    return seen


def node_protocol(inventory: Inventory, host: str, tmp_path: Path) -> None:
    """Every NodeClient verb against ``host``, each answer checked exactly."""
    session = Session(inventory.node(host), inventory.cluster)
    client = NodeClient(session)
    try:
        plain = session.run("echo out; echo err >&2; exit 3")
        assert (plain.stdout, plain.stderr, plain.exited) == ("out\n", "err\n", 3)
        assert session.run(f"mkdir -p {WORKDIR}").ok
        session.put(TASK.encode(), f"{WORKDIR}/task.py")
        report = client.preflight("task.py", timeout=30)
        assert report.problems == () and report.legacy_flags is False

        code = tmp_path / host / "code"
        code.mkdir(parents=True)
        (code / "task.py").write_text(TASK)
        run = RunDir.of(WORKDIR, f"startup-files-{host}")
        tasks = [TaskStart(name, port, str(run.code),
                           {"HYPERTF_TASK": name,
                            **({"HYPERTF_METRICS_FILE": str(run.metrics)} if metrics else {})},
                           ("python", "task.py", how))
                 for name, port, how, metrics in (("worker0", 23450, "exit", True),
                                                  ("worker1", 23451, "wait", False))]
        pids = client.start(run, tasks, sync_dir=str(code), script="task.py")  # one command
        assert set(pids) == {"worker0", "worker1"}

        events: queue.Queue[Event] = queue.Queue()
        client.follow(run, {"worker0": 23450, "worker1": 23451}, events)
        deadline = time.monotonic() + 30
        seen: list[Event] = []
        while not any(e.kind == "exit" and e.task == "worker0" for e in seen):
            seen.append(events.get(timeout=max(0.1, deadline - time.monotonic())))
        assert client.stop(run, grace=5) == {"worker0": "not running", "worker1": "stopped"}
        seen += events_until_closed(events)
        assert [e.line for e in seen if e.kind == "noise"] == []  # no banner in the stream
        logs = [(e.task, e.line) for e in seen if e.kind == "log"]
        assert ("worker0", "hello from worker0") in logs and ("worker0", "bye") in logs
        exits = {e.task: (e.code, e.killed) for e in seen if e.kind == "exit"}
        assert exits == {"worker0": (0, False), "worker1": (143, True)}
        assert [e.kind for e in seen][-2:] == ["done", "closed"]

        local = RunDir(tmp_path / host / "local")
        local.local.mkdir(parents=True)
        client.fetch_metrics(run, local)
        assert json.loads(Path(local.metrics).read_text()) == {"acc": 0.75}
        client.fetch_logs(run, ["worker0"], local)
        assert Path(local.log("worker0")).read_text() == "hello from worker0\nbye\n"

        # start and watch in one command (the launcher's way): the answer, then the events
        watched = RunDir.of(WORKDIR, f"startup-files-watch-{host}")
        events: queue.Queue[Event] = queue.Queue()
        task = tasks[0]._replace(cwd=str(watched.code), env={
            "HYPERTF_TASK": "worker0", "HYPERTF_METRICS_FILE": str(watched.metrics)})
        pids = client.start_watching(watched, [task], events, sync_dir=str(code),
                                     script="task.py")
        assert set(pids) == {"worker0"}
        seen = events_until_closed(events)
        assert [e.line for e in seen if e.kind == "noise"] == []
        assert ("worker0", "bye") in [(e.task, e.line) for e in seen if e.kind == "log"]
        assert [(e.task, e.code) for e in seen if e.kind == "exit"] == [("worker0", 0)]
        ended = client.stop_with_logs(watched, grace=5)
        assert ended.stopped == {"worker0": "not running"}
        assert ended.logs == {"worker0": "hello from worker0\nbye\n"}
        assert json.loads(ended.metrics or "") == {"acc": 0.75}
    finally:
        session.close()


def test_node_commands_ignore_what_startup_files_print(banner_lab, tmp_path):
    built, inventory = banner_lab
    before = sourced(built, "h1")
    node_protocol(inventory, "h1", tmp_path)
    assert sourced(built, "h1") - before >= 11  # the .bashrc ran for every command
    session = Session(inventory.node("h1"), inventory.cluster)
    try:  # a streamed command (hypertf logs) gets no banner either
        text = "".join(f"line {i}\n" for i in range(100))
        session.put(text.encode(), "/srv/streamed.txt")
        sink = io.StringIO()
        assert session.stream("cat /srv/streamed.txt", sink).ok
        assert sink.getvalue() == text
    finally:
        session.close()


def test_where_sshd_accepts_shlvl_node_commands_skip_the_startup_files(banner_lab, tmp_path):
    built, inventory = banner_lab
    node_protocol(inventory, "h2", tmp_path)
    assert sourced(built, "h2") == 0


def test_a_silent_command_past_its_timeout_is_the_nodes_error_and_the_session_goes_on(
        banner_lab):
    """``run`` on a channel of its own (not Fabric's runner): a command that stays silent
    past ``timeout`` is a RemoteError naming the node and the wait (not Invoke's
    CommandTimedOut), and the node's next command runs on the same connection."""
    _, inventory = banner_lab
    session = Session(inventory.node("h2"), inventory.cluster)
    try:
        started = time.monotonic()
        with pytest.raises(RemoteError, match=r"^h2: sleep: no answer within 0.5 s$"):
            session.run("sleep 30", timeout=0.5)
        assert time.monotonic() - started < 10
        after = session.run("echo still here; exit 4")
        assert (after.stdout, after.exited) == ("still here\n", 4)
    finally:
        session.close()


def test_the_lab_never_reads_the_operators_startup_files(state_home):
    """The lab's hosts log in as this machine's root: its sshd sets SHLVL=1, so bash started
    by sshd reads no ~/.bashrc (it would have run the operator's pyenv init)."""
    built = lab_module.up(hosts=1, gpus=0, agents=False, zookeeper=False)
    try:
        assert "SetEnv SHLVL=1" in (built.dir / "h1" / "sshd_config").read_text()
        address = built.hosts[0].address
        done = subprocess.run(  # OpenSSH's client, as Ansible uses it: it sends no SHLVL
            ["ssh", "-i", str(built.key_file), "-o", f"UserKnownHostsFile={built.known_hosts}",
             "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{address}",
             "echo SHLVL=$SHLVL"], capture_output=True, text=True, timeout=30)
        assert done.stdout == "SHLVL=2\n", done.stderr  # bash got 1: it read no ~/.bashrc
    finally:
        lab_module.down(built)
