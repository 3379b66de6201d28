"""The warm launcher: one user's process with the launcher's modules imported, forking one
launcher per ``hypertf train`` (see hypertf.cli.warm, the client side, for why and how).

``python -m hypertf.cli.warmserver SOCKET IDLE_S``: imports, binds ``SOCKET`` (its directory
is the user's 0700 run dir), writes ``SOCKET``'s pidfile, then serves until ``IDLE_S`` pass
without a command or a SIGTERM comes. Each connection from the same uid sends its standard
descriptors and ``{"argv", "cwd", "env", "umask"}``; the fork takes them on (descriptors,
directory, environment, umask, fresh stdio objects) and runs the command as
``hypertf.cli.main`` would, then sends its exit code and ends. Single-threaded until it
forks: a fork copies only the calling thread, so no other thread may exist here.
"""

from __future__ import annotations

import array
import contextlib
import gc
import io
import json
import os
import signal
import socket
import stat
import sys
import threading
import time
from typing import Any

import hypertf.cli.main as cli_main
from hypertf.cli import commands  # noqa: F401 - imported here, inherited by every fork
from hypertf.cli.warm import CODE, PID, SIZE, peer_uid, read_exactly, sibling
from hypertf.launch import launcher  # noqa: F401 - paramiko, Fabric, Invoke, kazoo

REQUEST_TIMEOUT_S = 5.0  # a client that connected but does not send its request


def serve(path: str, idle: float) -> int:
    listener = _bind(path)
    if listener is None:
        return 0  # another one serves this path
    pidfile, log = sibling(path, ".pid"), sibling(path, ".log")
    bound = os.stat(path).st_ino  # a successor may bind the same path: remove only ours
    signal.signal(signal.SIGTERM, _stop)
    try:
        with open(pidfile, "w") as handle:
            handle.write(f"{os.getpid()}\n")
        gc.collect()
        gc.freeze()  # what the imports made stays shared with every fork (copy on write)
        last = time.monotonic()
        listener.settimeout(min(idle, 5.0))
        while time.monotonic() - last < idle:
            _reap()
            try:
                conn, _ = listener.accept()
            except (TimeoutError, InterruptedError):
                continue
            last = time.monotonic()
            with conn:
                _accept(conn, listener, log)
    except _Stopped:
        pass
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == bound:
                os.unlink(path)
        for leftover in (pidfile, log):
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        listener.close()
    return 0


class _Stopped(Exception):
    """SIGTERM (``hypertf warm stop``): leave the accept loop at once."""


def _stop(_signum: int, _frame: object) -> None:
    raise _Stopped


def _bind(path: str) -> socket.socket | None:
    """A listening socket at ``path``; None if a live warm launcher holds it. A socket file
    nobody answers on (its launcher was killed) is replaced."""
    with contextlib.suppress(OSError):
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return None  # not ours to follow or replace: the client refuses it and says so
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return None
    except FileNotFoundError:
        pass
    except ConnectionRefusedError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    finally:
        probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o077)
    try:
        listener.bind(path)
    except OSError:  # another one bound it just now
        listener.close()
        return None
    finally:
        os.umask(old_mask)
    listener.listen(64)
    return listener


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _accept(conn: socket.socket, listener: socket.socket, log: str) -> None:
    """One command: check the peer, read its request, fork it."""
    if peer_uid(conn) != os.getuid():
        return  # not this user's: closed without a word
    conn.settimeout(REQUEST_TIMEOUT_S)
    fds = array.array("i")
    try:
        header, ancillary, _flags, _addr = conn.recvmsg(
            SIZE.size, socket.CMSG_SPACE(3 * fds.itemsize))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        if len(header) != SIZE.size or len(fds) != 3:
            return
        request = json.loads(read_exactly(conn, SIZE.unpack(header)[0]))
        pid = os.fork()
        if pid == 0:
            listener.close()
            _child(conn, list(fds), request)  # never returns
        _served(log, pid, request)
    except (OSError, ValueError, EOFError):
        return
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _served(log: str, pid: int, request: dict[str, Any]) -> None:
    """A line per command in ``warm-<stamp>.log`` beside the socket: what it served, when."""
    with contextlib.suppress(OSError), open(log, "a") as handle:
        handle.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid {pid}: "
                     f"{(request['argv'] or ['?'])[0]} in {request['cwd']}\n")


def _child(conn: socket.socket, fds: list[int], request: dict[str, Any]) -> None:
    """In the fork: become the client's command, run it, send its code, end."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        conn.settimeout(None)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.umask(int(request["umask"]))
        _fresh_stdio()
        sys.argv = ["hypertf", *request["argv"]]
        conn.sendall(PID.pack(os.getpid()))
        threading.Thread(target=_client_gone, args=(conn,), daemon=True).start()
        code = cli_main.main(list(request["argv"]))
    except SystemExit as done:  # argparse's --help and usage errors
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 2)
    except KeyboardInterrupt:  # Ctrl-C before the command's own handling began
        code = 130
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            cli_main.flush_output()  # all of it out before the client, given the code, ends
        with contextlib.suppress(OSError):
            conn.sendall(CODE.pack(code))
        os._exit(code)


def _fresh_stdio() -> None:
    """stdin, stdout and stderr objects for the client's descriptors, buffered as Python
    would have chosen for them (line-buffered on a terminal, PYTHONUNBUFFERED honoured)."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    encoding = os.environ.get("PYTHONIOENCODING", "").split(":")[0] or "utf-8"
    # each stays open as sys.stdin/stdout/stderr until this process ends
    sys.stdin = open(0, encoding=encoding, closefd=False)  # noqa: SIM115

    def out(fd: int, errors: str) -> io.TextIOWrapper:
        return io.TextIOWrapper(open(fd, "wb", closefd=False),
                                encoding=encoding, errors=errors,
                                line_buffering=os.isatty(fd) or fd == 2,
                                write_through=unbuffered)

    sys.stdout, sys.stderr = out(1, "strict"), out(2, "backslashreplace")


def _client_gone(conn: socket.socket) -> None:
    """The client (``hypertf train``) was killed outright: stop the job as a SIGTERM does
    (its tasks stopped, its GPUs released) instead of running on unseen."""
    with contextlib.suppress(OSError):
        while conn.recv(64):
            pass
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m hypertf.cli.warmserver SOCKET IDLE_S", file=sys.stderr)
        return 2
    return serve(args[0], float(args[1]))


if __name__ == "__main__":
    sys.exit(main())
