"""The ``hypertf`` command's entry: ``train`` through a warm launcher when one is wanted.

A launcher's Python start is most of a short job's fixed cost: importing paramiko, Fabric,
Invoke and kazoo takes ~0.16 s before anything happens (docs/benchmarks.md, section 2).
With ``HYPERTF_WARM_S=<seconds>`` set, ``hypertf train`` hands its command line, working
directory, environment and terminal (stdin, stdout, stderr, passed as descriptors) to a
*warm launcher* of this user (``hypertf.cli.warmserver``): a process that has those modules
imported and forks one launcher per command. The fork runs the command exactly as a cold
start would, writes to this terminal and gives its exit code back; Ctrl-C, SIGTERM and
SIGHUP are passed on to it, and if this command is killed outright the fork stops its job
as for a SIGTERM. The warm launcher ends after that many seconds without a command, as
OpenSSH's ``ControlPersist`` does. The first command starts it and runs cold; it serves only
its own user (a 0700 directory and the peer's uid checked) and only commands of the same
interpreter, search path and HyperTF files (their stamp is in the socket's name), so an
upgrade is never served by the old code. The client trusts nothing it finds either: the run
directory and the socket must be this user's own, neither a symlink, and the process that
answers must run as this user (``SO_PEERCRED``) before a byte of the command, its
environment or its terminal is sent; otherwise the command says so in one line and runs cold.

Standard library only on the way to a command: this module runs before every one, warm or
not (``hypertf warm status|stop`` reads PIDs with psutil, through hypertf.node.procs).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import socket
import stat
import struct
import sys
import zlib
from collections.abc import Sequence

from hypertf.config import environment
from hypertf.core.errors import say_interrupted

ENV = environment.WARM_S.name  # idle seconds before the warm launcher ends; unset or 0: off
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
VERBS = ("train",)  # what goes through it: the launch path, where the start is the cost
SIZE = struct.Struct("!I")  # the request's length, sent with the descriptors
PID = struct.Struct("!q")  # the fork's PID, its first answer
CODE = struct.Struct("!i")  # the command's exit code, its last
PEERCRED = struct.Struct("3i")  # SO_PEERCRED's struct ucred: pid, uid, gid


class Refused(OSError):
    """Something at the warm launcher's place is not this user's own: not used."""


def run_dir() -> str:
    """``<state home>/run``, 0700 and ours: where warm launchers' sockets and pidfiles are.
    Refused (OSError) when it is a symlink, someone else's or open to others."""
    from hypertf.config.paths import state_home_str

    path = os.path.join(state_home_str(), "run")
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise Refused(f"{path} is a symlink, not a directory of yours")
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise Refused(f"{path} must be a 0700 directory of uid {os.getuid()}")
    return path


def check_socket(path: str) -> bool:
    """Whether a warm launcher's socket is at ``path``: False when nothing is there;
    Refused when what is there is a symlink, not a socket or not this user's."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(info.st_mode):
        raise Refused(f"{path} is a symlink, not a socket of yours (remove it)")
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
        raise Refused(f"{path} is not a socket of uid {os.getuid()} (remove it)")
    return True


def peer_uid(conn: socket.socket) -> int:
    """The uid the process at the other end of ``conn`` ran as when it listened."""
    uid: int = PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                               PEERCRED.size))[1]
    return uid


def stamp() -> str:
    """A digest of what a launcher's code depends on: the interpreter, ``sys.path`` (with
    its package directories' modification times: installing a package changes them) and
    every file of the hypertf package (path, size, modification time). Equal: same code."""
    import hypertf

    parts = [sys.executable, str(os.getuid())]
    for entry in sys.path[1:]:  # [0] is the script's or working directory: not the code
        parts.append(entry)
        if entry.endswith(("site-packages", "dist-packages")):
            with contextlib.suppress(OSError):
                parts.append(str(os.stat(entry).st_mtime_ns))
    for top in hypertf.__path__:
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                info = os.stat(os.path.join(folder, name))
                parts.append(f"{folder}/{name} {info.st_size} {info.st_mtime_ns}")
    data = "\0".join(parts).encode()
    # zlib, not hashlib: importing OpenSSL's hashes took 5 ms of every command's start
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"


def socket_path(directory: str, code_stamp: str) -> str:
    return os.path.join(directory, f"warm-{code_stamp}.sock")


def sibling(path: str, suffix: str) -> str:
    """The warm launcher's other files beside its socket ``warm-<stamp>.sock``: ``.pid``
    (its PID) and ``.log`` (a line per command served)."""
    return os.path.splitext(path)[0] + suffix


def main() -> int:
    """The ``hypertf`` console script and ``python -m hypertf.cli``."""
    argv = sys.argv[1:]
    if argv[:1] == ["warm"]:
        return warm_command(argv[1:])
    idle = environment.WARM_S.read()  # 0 (off) when unset, not a number or <= 0
    if idle and argv[:1] and argv[0] in VERBS:
        code = through_warm(argv, idle)
        if code is not None:
            return code
    try:
        from hypertf.cli.main import main as cold_main
    except KeyboardInterrupt:  # Ctrl-C among the imports (0.1 s): nothing has started yet
        return say_interrupted()
    return cold_main()


def through_warm(argv: Sequence[str], idle: float) -> int | None:
    """Run ``argv`` in this user's warm launcher and return its exit code; None when there
    is none to use (then one is started for the next command, and this one runs cold)."""
    try:
        directory = run_dir()
        path = socket_path(directory, stamp())
        there = check_socket(path)
    except OSError as err:
        print(f"hypertf: warm launcher not used ({err}); running cold", file=sys.stderr)
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not there:
            raise FileNotFoundError(path)
        conn.connect(path)
    except OSError:
        conn.close()
        spawn(path, idle)
        return None
    with conn:
        uid = peer_uid(conn)
        if uid != os.getuid():
            print(f"hypertf: warm launcher not used (the process on {path} runs as uid {uid}, "
                  f"not {os.getuid()}); running cold", file=sys.stderr)
            return None
        return _served(conn, argv)


def _served(conn: socket.socket, argv: Sequence[str]) -> int | None:
    request = json.dumps({"argv": list(argv), "cwd": os.getcwd(), "env": dict(os.environ),
                          "umask": _umask()}).encode()
    forward = _Forward()
    previous = {sig: signal.signal(sig, forward.handle) for sig in FORWARDED}
    try:
        try:
            conn.sendmsg([SIZE.pack(len(request))],
                         [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", (0, 1, 2)))])
            conn.sendall(request)
            forward.to(PID.unpack(read_exactly(conn, PID.size))[0])
        except (OSError, EOFError):
            if forward.pending:  # interrupted before anything ran
                return 128 + forward.pending[0]
            return None  # it went away before forking: nothing ran, run cold
        try:
            code: int = CODE.unpack(read_exactly(conn, CODE.size))[0]
            return code
        except (OSError, EOFError):
            print(f"hypertf: error: the warm launcher's process {forward.pid} ended without "
                  "an exit code", file=sys.stderr)
            return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Forward:
    """Ctrl-C, SIGTERM and SIGHUP of this command, passed on to the fork running it; those
    that come before its PID is known are held and passed on then."""

    def __init__(self) -> None:
        self.pid = 0
        self.pending: list[int] = []

    def handle(self, signum: int, _frame: object) -> None:
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)
        else:
            self.pending.append(signum)

    def to(self, pid: int) -> None:
        self.pid = pid
        for signum in self.pending:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def read_exactly(conn: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``conn``; EOFError when it closes first."""
    data = b""
    while len(data) < size:
        try:
            chunk = conn.recv(size - len(data))
        except InterruptedError:
            continue
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def spawn(path: str, idle: float) -> None:
    """Start the warm launcher for ``path`` in a session of its own (no terminal), detached;
    it binds ``path`` once its imports are done. Two commands racing here start two: the
    second finds the socket taken and ends."""
    import subprocess

    with open(os.devnull, "rb") as nothing_in, open(os.devnull, "wb") as nothing_out:
        subprocess.Popen([sys.executable, "-m", "hypertf.cli.warmserver", path, str(idle)],
                         stdin=nothing_in, stdout=nothing_out, stderr=nothing_out,
                         start_new_session=True, close_fds=True, cwd="/")


def warm_command(argv: Sequence[str]) -> int:
    """``hypertf warm status`` lists this user's warm launchers; ``hypertf warm stop`` ends
    them (SIGTERM, by the PID in each one's pidfile, checked to be a warm launcher)."""
    if list(argv) not in (["status"], ["stop"]):
        print("usage: hypertf warm {status,stop}  (HYPERTF_WARM_S=<idle seconds> turns the "
              "warm launcher on for 'hypertf train')", file=sys.stderr)
        return 2
    try:
        directory = run_dir()
    except OSError as err:
        print(f"hypertf: error: {err}", file=sys.stderr)
        return 1
    found = 0
    for name in sorted(os.listdir(directory)):
        if not (name.startswith("warm-") and name.endswith(".pid")):
            continue
        pid = _warm_pid(os.path.join(directory, name))
        if pid is None:
            continue
        found += 1
        if argv[0] == "stop":
            os.kill(pid, signal.SIGTERM)
            print(f"stopped warm launcher {pid}")
        else:
            path = sibling(os.path.join(directory, name), ".sock")
            served = 0
            with contextlib.suppress(OSError), open(sibling(path, ".log")) as log:
                served = sum(1 for _ in log)
            print(f"warm launcher {pid}: {path}, {served} commands served")
    if not found and argv[0] == "status":
        print(f"no warm launcher ({ENV}={environment.WARM_S.raw()})")
    return 0


def _warm_pid(pidfile: str) -> int | None:
    """The PID in ``pidfile`` if that process is a warm launcher now (a PID is reused)."""
    from hypertf.node.procs import cmdline_args

    try:
        with open(pidfile) as handle:
            pid = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return pid if "hypertf.cli.warmserver" in cmdline_args(pid) else None
