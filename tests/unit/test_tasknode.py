"""hypertf.node.tasknode against real local tasks: the node side of a job, without SSH.

Tasks are started the way ``tasknode start`` starts them on a node (``task.sh LOG PIDFILE
EXITFILE DRAINED VENV CWD -- python SCRIPT`` in a new session, the files named by
``RunDir``), so the pid, log and exit files, the process groups and the wrapper check in
``runcontrol.wrapper`` are the real ones. Every process a test
starts is killed by PID (or by the process group its own setsid made) when the test ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hypertf.core.rundir import RunDir
from hypertf.node import runcontrol, tasknode
from hypertf.node.procs import alive, group_members
from tests.conftest import wait_for as shared_wait_for

REPO = Path(__file__).resolve().parents[2]

# A task that prints, listens on its port until the watcher's probe connects, then ends
# with a given code; its last line has no newline (the watcher must still deliver it).
SERVER = """
    import socket, sys
    port, code = int(sys.argv[1]), int(sys.argv[2])
    print("hello from the task", flush=True)
    print("caf\\u00e9 line", flush=True)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen()
    srv.settimeout(20)
    conn, _ = srv.accept()
    conn.close()
    sys.stdout.write("last words, no newline")
    sys.exit(code)
"""

# A task that waits until the test creates a file, so the test decides when it ends.
WAITER = """
    import sys, time
    from pathlib import Path
    deadline = time.monotonic() + 20
    while not Path(sys.argv[1]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print("released", flush=True)
"""

# A task that ends on SIGTERM (the default disposition).
SLEEPER = """
    import time
    print("sleeping", flush=True)
    time.sleep(60)
"""

# Like MultiWorkerMirroredStrategy: ignores SIGTERM, and so does a child it starts.
STUBBORN = """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(sys.argv[1] + ".tmp", "w") as out:
        out.write(f"{os.getpid()} {child.pid}")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(60)
"""


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> object:
    """The suite's poll-with-a-deadline, at a finer interval for local processes."""
    return shared_wait_for(predicate, timeout, what, interval=0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Node:
    """One node's work dir: a stand-in venv, task scripts, run dirs, and what was started."""

    root: Path
    venv: Path
    started: list[subprocess.Popen] = field(default_factory=list)

    def script(self, name: str, body: str) -> Path:
        path = self.root / f"{name}.py"
        if not path.exists():
            path.write_text(textwrap.dedent(body))
        return path

    def run_dir(self, task_key: str = "job") -> RunDir:
        run = RunDir.of(self.root, task_key, local=True)
        run.local.mkdir(parents=True, exist_ok=True)
        return run

    def start(self, run: RunDir, name: str, argv: list[str], cwd: Path | None = None,
              ) -> int:
        """Start a task as ``tasknode start`` does; its wrapper's PID once the pidfile says it."""
        env = {"PYTHONUNBUFFERED": "1", "HYPERTF_TASK": name, "HYPERTF_TASK_KEY": run.task_key}
        proc = subprocess.Popen(
            tasknode.wrapper_argv(run, name, str(self.venv), str(cwd or self.root), argv),
            env={**os.environ, **env}, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.started.append(proc)
        pidfile = Path(run.pid(name))
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10,
                 f"{pidfile} to be written")
        pid = int(pidfile.read_text().split()[0])  # the record: "PID START"
        # A new session: wrapper PID = Popen PID = PGID.
        assert pid == proc.pid
        return pid

    def python_task(self, run: RunDir, name: str, body: str, *args: str) -> int:
        return self.start(run, name, [sys.executable, str(self.script(name, body)), *args])

    def cleanup(self) -> None:
        for proc in self.started:
            # The wrapper is our unreaped child, so its PID (= its group) cannot be reused yet.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """A work dir with an empty venv ``activate`` (tasks run ``sys.executable`` directly)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("# stand-in venv\n")
    node = Node(tmp_path, venv)
    try:
        yield node
    finally:
        node.cleanup()


class Watcher:
    """``python -m hypertf.node.tasknode watch`` as the launcher runs it; its events, in order."""

    def __init__(self, run: RunDir, tasks: dict[str, int]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hypertf.node.tasknode", "watch", str(run.path),
             *(f"{name}={port}" for name, port in tasks.items())],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.events: list[dict] = []
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def until(self, predicate: Callable[[dict], bool], timeout: float = 10) -> dict:
        """The first event (seen or still to come) that matches; fail if none comes in time."""
        for event in self.events:
            if predicate(event):
                return event
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no matching event within {timeout} s; got "
                                     f"{self.events}") from None
            if line is None:
                raise AssertionError(f"watch ended before a matching event; got {self.events}")
            event = json.loads(line)
            self.events.append(event)
            if predicate(event):
                return event

    def of(self, task: str, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("task") == task and e["e"] == kind]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)


@pytest.fixture
def watchers() -> Iterator[list[Watcher]]:
    made: list[Watcher] = []
    try:
        yield made
    finally:
        for watcher in made:
            watcher.close()


# -- watch ------------------------------------------------------------------------------


def test_watch_streams_logs_listening_and_exits_until_every_task_ends(
        node: Node, watchers: list[Watcher]) -> None:
    """The launcher's only view of a node: one JSON event per line, ending with 'done'."""
    run = node.run_dir()
    port, silent_port = free_port(), free_port()
    release = node.root / "release"
    node.python_task(run, "worker0", SERVER, str(port), "3")
    node.python_task(run, "worker1", WAITER, str(release))
    # A work dir that does not exist: the wrapper says so in the log and exits 1.
    node.start(run, "ps0", [sys.executable, "-c", "pass"], cwd=node.root / "missing")

    watcher = Watcher(run, {"worker0": port, "worker1": silent_port, "ps0": free_port()})
    watchers.append(watcher)
    watcher.until(lambda e: e["e"] == "exit" and e["task"] == "worker0")
    watcher.until(lambda e: e["e"] == "exit" and e["task"] == "ps0")
    watcher.until(lambda e: e["e"] == "beat")
    assert not watcher.of("worker1", "exit"), "worker1 is still waiting to be released"
    release.touch()
    watcher.until(lambda e: e["e"] == "done")
    assert watcher.proc.wait(timeout=5) == 0

    events = watcher.events
    assert [e["line"] for e in watcher.of("worker0", "log")] == [
        "hello from the task", "caf\u00e9 line", "last words, no newline"]
    assert watcher.of("worker0", "listening") == [{"e": "listening", "task": "worker0"}]
    assert watcher.of("worker0", "exit") == [
        {"e": "exit", "task": "worker0", "code": 3, "killed": False}]
    order = [(e["task"], e["e"]) for e in events if e.get("task") == "worker0"]
    assert order.index(("worker0", "listening")) < order.index(("worker0", "exit"))
    assert order[-1] == ("worker0", "exit"), "every log line comes before the exit event"

    assert watcher.of("worker1", "log") == [{"e": "log", "task": "worker1", "line": "released"}]
    assert watcher.of("worker1", "exit") == [
        {"e": "exit", "task": "worker1", "code": 0, "killed": False}]
    assert not watcher.of("worker1", "listening"), "nothing listens on worker1's port"

    assert watcher.of("ps0", "exit") == [{"e": "exit", "task": "ps0", "code": 1, "killed": False}]
    assert [e["line"] for e in watcher.of("ps0", "log")] == [
        f"hypertf: cannot enter {node.root / 'missing'}"]
    assert events[-1] == {"e": "done"}
    assert (run.local / "worker0.exit").read_text().strip() == "3"


def test_watch_reports_a_task_killed_without_an_exit_code(
        node: Node, watchers: list[Watcher]) -> None:
    """A group killed outright writes no exit file: the event says killed, code None."""
    run = node.run_dir()
    pid = node.python_task(run, "worker0", SLEEPER)
    watcher = Watcher(run, {"worker0": free_port()})
    watchers.append(watcher)
    watcher.until(lambda e: e["e"] == "log" and e["line"] == "sleeping")
    os.killpg(pid, signal.SIGKILL)
    watcher.until(lambda e: e["e"] == "done")
    assert watcher.of("worker0", "exit") == [
        {"e": "exit", "task": "worker0", "code": None, "killed": True}]
    assert not (run.local / "worker0.exit").exists()


# -- stop -------------------------------------------------------------------------------


def test_stop_kills_a_group_that_ignores_sigterm_after_the_grace(node: Node) -> None:
    """Mirrored workers catch TERM: after the grace the whole group, child too, is KILLed."""
    run = node.run_dir()
    pids_file = node.root / "stubborn.pids"
    wrapper = node.python_task(run, "worker0", STUBBORN, str(pids_file))
    wait_for(pids_file.exists, 10, "the stubborn task and its child to start")
    task_pid, child_pid = map(int, pids_file.read_text().split())
    assert {task_pid, child_pid} <= set(group_members(wrapper))

    started = time.monotonic()
    result = runcontrol.stop(run, ["worker0"], grace=0.5)
    elapsed = time.monotonic() - started

    assert result == {"worker0": "killed"}
    assert elapsed >= 0.5, "KILL must wait for the grace period"
    wait_for(lambda: not alive(task_pid) and not alive(child_pid), 5, "the group to be gone")
    assert group_members(wrapper) == []
    assert (run.local / "stopped").exists()


def test_stop_terminates_a_cooperative_task_without_waiting_for_the_grace(node: Node) -> None:
    """A task that ends on TERM is reported 'stopped', and stop does not sit out the grace."""
    run = node.run_dir()
    wrapper = node.python_task(run, "ps0", SLEEPER)
    wait_for(lambda: len(group_members(wrapper)) >= 2, 10, "the task to start under its wrapper")
    started = time.monotonic()
    assert runcontrol.stop(run, grace=5) == {"ps0": "stopped"}
    assert time.monotonic() - started < 4
    assert group_members(wrapper) == []
    # the wrapper outlives the TERM long enough to record how the task ended
    assert (run.local / "ps0.exit").read_text().strip() == "143"


def test_stop_of_exited_or_unknown_tasks_is_harmless(node: Node) -> None:
    """Stopping twice, or a task that ended on its own or never started, is no error."""
    run = node.run_dir()
    node.start(run, "worker0", [sys.executable, "-c", "print('done')"])
    wait_for((run.local / "worker0.exit").exists, 10, "worker0 to exit")
    # the wrapper writes the exit file a moment before it exits itself (under load, the
    # stop could come in between and find it running)
    wrapper = int((run.local / "worker0.pid").read_text().split()[0])
    wait_for(lambda: not alive(wrapper), 10, "worker0's wrapper to exit")
    assert runcontrol.stop(run, grace=0.5) == {"worker0": "not running"}
    assert runcontrol.stop(run, ["worker0", "worker7"], grace=0.5) == {
        "worker0": "not running", "worker7": "not running"}
    (run.local / "ps0.pid").write_text("not a pid")
    assert runcontrol.stop(run, ["ps0"], grace=0.5) == {"ps0": "not running"}
    assert (run.local / "stopped").exists()


def test_stop_never_signals_a_pid_that_is_not_our_wrapper(node: Node) -> None:
    """A stale or forged pidfile must not make stop kill someone else's process group."""
    run = node.run_dir()
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (run.local / "worker0.pid").write_text(str(stranger.pid))
        assert runcontrol.stop(run, grace=0.5) == {"worker0": "not running"}
        assert runcontrol.reap([run], set(), grace=0.5) == {}  # nothing of ours to stop
        assert (run.local / "stopped").exists()
        assert stranger.poll() is None and alive(stranger.pid)
    finally:
        stranger.kill()
        stranger.wait(timeout=5)


def test_stop_cli_prints_the_result_as_json(node: Node) -> None:
    """The launcher runs 'tasknode stop RUN_DIR --grace S' over SSH and parses the last line."""
    run = node.run_dir()
    wrapper = node.python_task(run, "worker0", SLEEPER)
    wait_for(lambda: len(group_members(wrapper)) >= 2, 10, "the task to start under its wrapper")
    out = subprocess.run(
        [sys.executable, "-m", "hypertf.node.tasknode", "stop", str(run.path), "--grace", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=30, check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"worker0": "stopped"}
    assert group_members(wrapper) == []


def test_stop_with_logs_answers_the_logs_and_metrics_in_the_same_command(node: Node) -> None:
    """'stop --logs': a job's end is one round trip per host (stop, logs, metrics); logs
    past the inline limit are left for the launcher to copy on its own."""
    run = node.run_dir()
    wrapper = node.python_task(run, "worker0", SLEEPER)
    log = Path(run.log("worker0"))
    wait_for(lambda: log.exists() and "sleeping" in log.read_text(), 10, "its log")
    Path(run.metrics).write_text('{"acc": 0.5}')
    out = subprocess.run(
        [sys.executable, "-m", "hypertf.node.tasknode", "stop", str(run.path), "--grace", "1",
         "--logs"], cwd=REPO, capture_output=True, text=True, timeout=30, check=True)
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer["stopped"] == {"worker0": "stopped"}
    assert answer["logs"] == {"worker0": Path(run.log("worker0")).read_text()}
    assert "sleeping" in answer["logs"]["worker0"]
    assert answer["metrics"] == '{"acc": 0.5}'
    assert group_members(wrapper) == []
    assert runcontrol.logs(run, limit=3) == {}  # too large to ride on the answer


# -- reap and unstopped_runs ------------------------------------------------------------


def test_reap_stops_runs_without_a_lease_and_leaves_leased_runs_alone(node: Node) -> None:
    """The agent's safety net: a launcher killed outright leaves tasks only reap can stop."""
    assert runcontrol.unstopped_runs(node.root) == [], "no runs/ directory yet"
    orphan, leased, ended, done = (node.run_dir(k) for k in ("k1", "k2", "k3", "k4"))
    (node.root / "runs" / "notes.txt").write_text("a file, not a run")
    (done.local / "stopped").touch()
    orphan_pid = node.python_task(orphan, "worker0", SLEEPER)
    leased_pid = node.python_task(leased, "worker0", SLEEPER)
    node.start(ended, "worker0", [sys.executable, "-c", "pass"])
    wait_for((ended.local / "worker0.exit").exists, 10, "the ended run's task to exit")
    wait_for(lambda: len(group_members(orphan_pid)) >= 2, 10, "the orphan task to start")

    runs = runcontrol.unstopped_runs(node.root)
    assert runs == [orphan, leased, ended]

    assert runcontrol.reap(runs, {"k2"}, grace=0.5) == {"k1": {"worker0": "stopped"}}
    assert group_members(orphan_pid) == []
    assert alive(leased_pid), "a run with a lease is left alone"
    assert not (leased.local / "stopped").exists()
    assert (ended.local / "stopped").exists(), "a dead run without a lease is marked stopped"
    assert runcontrol.unstopped_runs(node.root) == [leased]


# -- preflight --------------------------------------------------------------------------


def test_preflight_names_a_missing_script_and_an_unwritable_run_dir(tmp_path: Path) -> None:
    """Checked before anything is allocated: each problem is a sentence for the user."""
    (tmp_path / "train.py").write_text("")
    ok = tasknode.preflight(str(tmp_path), "train.py")
    assert ok["problems"] == []
    assert RunDir.runs(tmp_path).is_dir()
    assert not (RunDir.runs(tmp_path) / ".write-test").exists()

    blocked = tmp_path / "blocked"
    blocked.mkdir()
    RunDir.runs(blocked).write_text("a file where the run dirs should go")
    bad = tasknode.preflight(str(blocked), "nope.py")
    assert len(bad["problems"]) == 2
    assert "not writable" in bad["problems"][0]
    assert "nope.py not found" in bad["problems"][1]

    out = subprocess.run(
        [sys.executable, "-m", "hypertf.node.tasknode", "preflight", "--workdir", str(tmp_path),
         "--script", "nope.py"],
        cwd=REPO, capture_output=True, text=True, timeout=30, check=True,
    )
    assert json.loads(out.stdout)["problems"] == [
        f"script nope.py not found (relative paths start in {tmp_path})"]


def test_stop_finds_a_group_whose_wrapper_is_already_dead(node: Node) -> None:
    """The wrapper killed alone (by hand, or by the OOM killer): its TERM-ignoring child still
    holds the GPU. stop and run_alive judge by the group and the job's key, not the wrapper."""
    run = node.run_dir()
    wrapper = node.python_task(run, "worker0", SLEEPER)
    wait_for(lambda: len(group_members(wrapper)) >= 2, 10, "the task to start under its wrapper")
    os.kill(wrapper, signal.SIGKILL)
    wait_for(lambda: wrapper not in group_members(wrapper), 10, "the wrapper to die alone")
    assert group_members(wrapper), "the child lives on in the group"
    assert runcontrol.run_alive(run)
    assert runcontrol.stop(run, grace=0.5)["worker0"] in ("stopped", "killed")
    assert group_members(wrapper) == []
    assert not runcontrol.run_alive(run)


# -- start ------------------------------------------------------------------------------


def test_start_reads_its_request_on_stdin_and_refuses_a_taken_port(node: Node) -> None:
    """'tasknode start' as the launcher runs it: a JSON request on stdin, a JSON answer."""
    run = node.run_dir("20261122-085000-a1b2c3.alice")
    script = str(node.script("worker0", SLEEPER))
    port = free_port()

    def request(port: int) -> str:
        return json.dumps({"run_dir": str(run.path), "venv": str(node.venv), "tasks": [
            {"name": "worker0", "port": port, "cwd": str(node.root), "argv": [sys.executable,
             script], "env": {"HYPERTF_TASK_KEY": run.task_key, "PYTHONUNBUFFERED": "1"}}]})

    def start(port: int) -> dict:
        out = subprocess.run([sys.executable, "-m", "hypertf.node.tasknode", "start"],
                             input=request(port), cwd=REPO, capture_output=True, text=True,
                             timeout=30, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        assert start(port) == {"busy": [port]}
    assert not Path(run.pid("worker0")).exists(), "nothing is started beside a squatter"

    answer = start(port)
    pid = answer["started"]["worker0"]
    try:
        wait_for(lambda: Path(run.pid("worker0")).exists(), 10, "the pidfile")
        assert int(Path(run.pid("worker0")).read_text().split()[0]) == pid
        assert os.getpgid(pid) == pid, "each task leads its own process group"
        log = Path(run.log("worker0"))  # made by task.sh after the pidfile: may not exist yet
        wait_for(lambda: log.exists() and "sleeping" in log.read_text(), 10, "its log")
        assert runcontrol.run_alive(run)
    finally:
        assert runcontrol.stop(run, grace=0.5)["worker0"] in ("stopped", "killed")
    assert not runcontrol.run_alive(run)


def test_start_with_nothing_on_stdin_starts_nothing_and_says_nothing() -> None:
    """A launcher starts 'tasknode start --watch' on a node before it knows the job's
    placement (Session.open_soon); a node it then does not use gets an empty stdin."""
    out = subprocess.run([sys.executable, "-m", "hypertf.node.tasknode", "start", "--watch"],
                         input="", cwd=REPO, capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


def one_task_request(node: Node, run: RunDir, script: Path) -> dict:
    """A 'start' request for one task, worker0, running ``script``."""
    return {"run_dir": str(run.path), "venv": str(node.venv), "tasks": [
        {"name": "worker0", "port": free_port(), "cwd": str(node.root),
         "argv": [sys.executable, str(script)], "env": {"HYPERTF_TASK_KEY": run.task_key}}]}


def start_watch(request: dict, *python: str) -> subprocess.CompletedProcess[str]:
    """``tasknode start --watch`` (or ``python`` given) fed ``request``, run to its end."""
    return subprocess.run([sys.executable, *(python or ("-m", "hypertf.node.tasknode", "start",
                                                         "--watch"))],
                          input=json.dumps(request) + "\n", cwd=REPO, capture_output=True,
                          text=True, timeout=30, check=True)


def test_start_watch_ends_a_run_whose_tasks_all_ended_by_themselves(node: Node) -> None:
    """'start --watch': the answer, the events, and a 'done' that ends the run here (drained,
    stopped, nothing left) with the logs, so the launcher needs no stop round trip."""
    run = node.run_dir("20261124-120000-a1b2c3.alice")
    script = node.script("worker0", 'print("bye", flush=True)\n')
    request = one_task_request(node, run, script)
    out = start_watch(request)
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert set(lines[0]["started"]) == {"worker0"}
    assert {"e": "log", "task": "worker0", "line": "bye"} in lines
    assert lines[-1] == {"e": "done", "ended": {"stopped": {"worker0": "not running"},
                                                "logs": {"worker0": "bye\n"}, "metrics": None,
                                                "offload": {}}}
    assert Path(run.stopped).exists() and Path(run.drained).exists()


def test_start_watch_of_tasks_that_end_needs_no_process_scan(node: Node) -> None:
    """Every node of every job runs 'start --watch': its wrappers are its children, reaped
    as they end, so neither psutil (14 ms to import) nor a scan of the node's processes is
    needed to know they and their groups are gone."""
    run = node.run_dir("20261125-120000-b2c3d4.alice")
    script = node.script("worker0", 'print("bye", flush=True)\n')
    request = one_task_request(node, run, script)
    code = ("import sys; from hypertf.node import tasknode; tasknode.main(['start', '--watch']); "
            "print('psutil' in sys.modules, file=sys.stderr)")
    out = start_watch(request, "-c", code)
    assert out.stderr.strip() == "False"
    assert json.loads(out.stdout.splitlines()[-1])["ended"]["stopped"] == {
        "worker0": "not running"}


def test_start_watch_leaves_a_run_with_a_process_behind_to_the_launchers_stop(
        node: Node) -> None:
    """A task that ends but leaves a process in its group: 'done' carries no 'ended' (the
    run is not marked stopped here), so the launcher's stop deals with what is left."""
    run = node.run_dir("20261125-120000-c3d4e5.alice")
    script = node.script("worker0", (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"))
    request = one_task_request(node, run, script)
    out = start_watch(request)
    pgid = int(Path(run.pid("worker0")).read_text().split()[0])
    try:
        assert json.loads(out.stdout.splitlines()[-1]) == {"e": "done"}
        assert not Path(run.stopped).exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def test_task_names_are_the_pidfiles_of_the_run_and_nothing_else(tmp_path: Path) -> None:
    """A listing, as the glob it replaced: each '<name>.pid' once, sorted; not a hidden
    file, not another suffix; none for a run directory that is not there."""
    run = RunDir(tmp_path / "runs" / "20261127-160000-abcdef.alice")
    assert run.task_names() == []
    run.local.mkdir(parents=True)
    for name in ("worker1.pid", "worker0.pid", "ps0.pid", ".hidden.pid", "worker0.log",
                 "worker0.exit", "pid"):
        (run.local / name).write_text("")
    assert run.task_names() == ["ps0", "worker0", "worker1"]
