"""``HYPERTF_WARM_S``: ``hypertf train`` through the user's warm launcher, on the 3-host lab."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import hypertf as package
from hypertf.cli import warm
from tests.conftest import wait_for
from tests.launcher.helpers import (
    FAKE,
    all_free,
    processes_of,
    start_hypertf,
    summaries,
    task_key,
    until_line,
)
from tests.launcher.helpers import (
    hypertf as run_hypertf,
)


def gone(pid: int) -> bool:
    """Ended (a zombie of this test process counts: warm.spawn made it our child)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def servers(state_home: Path) -> dict[int, str]:
    """This user's live warm launchers: PID -> socket path."""
    run = state_home / "run"
    found = {}
    for pidfile in run.glob("warm-*.pid") if run.is_dir() else ():
        pid = warm._warm_pid(str(pidfile))
        if pid is not None:
            found[pid] = str(pidfile.with_suffix(".sock"))
    return found


def served(state_home: Path) -> list[str]:
    return [line for log in (state_home / "run").glob("warm-*.log")
            for line in log.read_text().splitlines()]


@pytest.fixture
def warm_on(state_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Warm launchers on for the commands this test runs; every one stopped after."""
    monkeypatch.setenv(warm.ENV, "120")
    try:
        yield
    finally:
        started = list(servers(state_home))
        subprocess.run([sys.executable, "-m", "hypertf.cli", "warm", "stop"], check=True,
                       capture_output=True, timeout=30)
        wait_for(lambda: all(gone(pid) for pid in started), 30, "the warm launchers to end")


def hypertf(*argv: str, cwd: Path, cold: bool = False) -> subprocess.CompletedProcess[str]:
    if not cold:
        return run_hypertf(*argv, cwd=cwd, timeout=120)
    env = {k: v for k, v in os.environ.items() if k != warm.ENV}
    return subprocess.run([sys.executable, "-m", "hypertf.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_warm_train_is_the_same_command_with_its_output_and_exit_code(
        lab, tmp_path, state_home, warm_on):
    """The first command runs cold and starts the warm launcher; the next ones are forks
    of it that print the same, exit the same and leave nothing behind."""
    cold = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2", "--",
                   "--work_s", "0", cwd=tmp_path)
    assert cold.returncode == 0, cold.stderr
    wait_for(lambda: servers(state_home), 60, "the warm launcher to listen")
    assert served(state_home) == []
    done = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2", "--",
                   "--work_s", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(served(state_home)) == 1 and f"train in {tmp_path}" in served(state_home)[0]
    assert "worker:0 listening on" in done.stdout and "succeeded in" in done.stdout
    _first, second = summaries(tmp_path)
    assert [t["exit_code"] for t in second["tasks"]] == [0, 0]
    assert processes_of(lab.inventory, second["task_key"]) == {}
    assert all_free(lab.inventory)

    missing = hypertf("train", "-i", lab.inventory, "--script", "nowhere.py", "--worker", "1",
                      cwd=tmp_path)
    cold_missing = hypertf("train", "-i", lab.inventory, "--script", "nowhere.py",
                           "--worker", "1", cwd=tmp_path, cold=True)
    assert len(served(state_home)) == 2
    assert (missing.returncode, missing.stdout, missing.stderr) == (
        cold_missing.returncode, cold_missing.stdout, cold_missing.stderr)
    assert missing.returncode != 0 and "nowhere.py" in missing.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_a_signal_to_a_warm_train_stops_its_job(lab, tmp_path, state_home, warm_on, sig):
    """Ctrl-C reaches the fork (exit 130, the job stopped); a warm command killed outright
    takes its job with it: the fork stops it as for a SIGTERM."""
    first = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "1", "--",
                    "--work_s", "0", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    wait_for(lambda: servers(state_home), 60, "the warm launcher to listen")
    job = start_hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "2",
                        "--", "--work_s", "600", cwd=tmp_path)
    key = task_key(until_line(job, "tasks listening"))
    assert len(served(state_home)) == 1
    assert set(processes_of(lab.inventory, key)) == {"h1", "h2"}
    job.send_signal(sig)
    out, _ = job.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert job.returncode == 130, out
        assert "interrupted by SIGINT" in out
    wait_for(lambda: processes_of(lab.inventory, key) == {}, 60, "the job's tasks to stop")
    wait_for(lambda: all_free(lab.inventory), 60, "the GPUs to return")


def test_the_warm_launcher_serves_only_its_user_and_stops_on_demand(tmp_path, state_home,
                                                                     warm_on):
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if os.getuid() != 0 or system_python is None:
        pytest.skip("needs root and a system python3 to try as another user")
    path = warm.socket_path(warm.run_dir(), "test")
    warm.spawn(path, 120)
    wait_for(lambda: Path(path).exists(), 60, "the warm launcher to listen")
    other = subprocess.run(
        [system_python, "-c", "import socket; s = socket.socket(socket.AF_UNIX); "
         f"s.connect({path!r})"], user=65534, capture_output=True, text=True, timeout=30)
    assert other.returncode != 0 and "PermissionError" in other.stderr
    assert oct(os.stat(state_home / "run").st_mode & 0o777) == "0o700"
    (pid,) = [p for p, sock in servers(state_home).items() if sock == path]
    listed = subprocess.run([sys.executable, "-m", "hypertf.cli", "warm", "status"],
                            capture_output=True, text=True, timeout=30, check=True)
    assert f"warm launcher {pid}: {path}, 0 commands served" in listed.stdout
    subprocess.run([sys.executable, "-m", "hypertf.cli", "warm", "stop"], check=True,
                   capture_output=True, timeout=30)
    wait_for(lambda: gone(pid), 30, "the warm launcher to end")
    assert not Path(path).exists() and not Path(path).with_suffix(".pid").exists()
    probe = socket.socket(socket.AF_UNIX)
    with pytest.raises(OSError), probe:
        probe.connect(path)


def test_changed_code_gets_another_warm_launcher(tmp_path, monkeypatch):
    """The socket's name carries a stamp of the code: an edited or upgraded HyperTF is
    never served by a launcher that imported the old one."""
    code = tmp_path / "hypertf"
    code.mkdir()
    (code / "mod.py").write_text("x = 1\n")
    monkeypatch.setattr(package, "__path__", [str(code)])
    before = warm.stamp()
    assert warm.stamp() == before
    (code / "mod.py").write_text("x = 22\n")
    assert warm.stamp() != before


class Thief:
    """A socket of someone else at the warm launcher's place: records what it is sent."""

    def __init__(self, path: str) -> None:
        self.received = b""
        self.connections = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(4)
        self.listener.settimeout(0.2)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    while chunk := conn.recv(65536):
                        self.received += chunk
                        if len(self.received) > 4:
                            break  # the request came; closing it lets the client go cold

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.listener.close()


def warm_socket_path(cwd: Path) -> str:
    """The socket a ``hypertf train`` run from ``cwd`` looks for (its interpreter, search
    path and code: the same stamp)."""
    done = subprocess.run([sys.executable, "-c", "from hypertf.cli import warm; "
                           "print(warm.socket_path(warm.run_dir(), warm.stamp()))"],
                          cwd=cwd, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def cold_train(cwd: Path) -> subprocess.CompletedProcess[str]:
    """A ``hypertf train`` that fails at once when it runs cold (no such inventory)."""
    return hypertf("train", "-i", str(cwd / "missing.yml"), "--script", "x.py", cwd=cwd)


def ran_cold(done: subprocess.CompletedProcess[str], why: str) -> None:
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and "missing.yml not found" in done.stderr, done.stderr
    assert lines[0].startswith("hypertf: warm launcher not used (") and why in lines[0], lines
    assert lines[0].endswith("; running cold") and "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", ["symlink", "another user's socket"])
def test_the_client_refuses_a_socket_that_is_not_its_own_and_runs_cold(
        tmp_path, state_home, warm_on, kind):
    if kind != "symlink" and os.getuid() != 0:
        pytest.skip("needs root to make a socket of another user")
    path = warm_socket_path(tmp_path)
    elsewhere = str(tmp_path / "thief.sock")
    thief = Thief(elsewhere if kind == "symlink" else path)
    try:
        if kind == "symlink":
            os.symlink(elsewhere, path)
        else:
            os.chown(path, 65534, 65534)
        done = cold_train(tmp_path)
        again = cold_train(tmp_path)  # and no warm launcher was started to take its place
    finally:
        thief.close()
        Path(path).unlink(missing_ok=True)
    assert (thief.connections, thief.received[:60]) == (0, b"")  # not even connected
    ran_cold(done, "symlink" if kind == "symlink" else "is not a socket of uid")
    ran_cold(again, "symlink" if kind == "symlink" else "is not a socket of uid")
    assert not servers(state_home)


def test_the_client_refuses_a_server_of_another_uid_before_sending_anything(
        tmp_path, state_home, warm_on):
    """The socket file is this user's, the process listening on it is not (SO_PEERCRED):
    the client closes without a byte sent and runs cold."""
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if os.getuid() != 0 or system_python is None:
        pytest.skip("needs root and a system python3 to listen as another user")
    path = warm_socket_path(tmp_path)
    other = subprocess.Popen(
        [system_python, "-c", "import os, socket, sys\n"
         "s = socket.socket(socket.AF_UNIX)\n"
         f"s.bind({path!r})\n"
         "os.setgid(65534); os.setgroups([]); os.setuid(65534)\n"
         "s.listen(1); print('listening', flush=True)\n"
         "conn, _ = s.accept(); conn.settimeout(5); got = b''\n"
         "try:\n"
         "    while chunk := conn.recv(65536): got += chunk\n"
         "except OSError: pass\n"
         "print(len(got), flush=True)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "listening"
        assert os.stat(path).st_uid == os.getuid()  # the file passes; the peer must not
        done = cold_train(tmp_path)
        received = other.communicate(timeout=30)[0].strip()
    finally:
        if other.poll() is None:
            other.kill()
            other.communicate()
        Path(path).unlink(missing_ok=True)
    assert received == "0"  # bytes the other uid received
    ran_cold(done, "runs as uid 65534")


def test_a_symlinked_run_directory_is_refused(tmp_path, state_home, warm_on):
    run = state_home / "run"
    moved = tmp_path / "real-run"
    if run.exists():
        shutil.move(str(run), moved)
    else:
        moved.mkdir(mode=0o700)
    os.symlink(moved, run)  # a directory of ours, 0700: only the symlink is wrong
    try:
        done = cold_train(tmp_path)
    finally:
        run.unlink()
        shutil.move(str(moved), run)
    ran_cold(done, "is a symlink, not a directory of yours")
