"""Running commands on nodes: Fabric over SSH with pinned host keys, or locally.

Host keys are always verified against the known_hosts the inventory names: paramiko's
default of accepting unknown keys is switched off (hypertf.launch.connection opens each
node's connection). A node with ``ansible_connection: local`` runs its commands through
Invoke on this machine, with the same interface.

Shell startup files: sshd runs every command (and the sftp-server) through the user's login
shell, and bash sources ``~/.bashrc`` for a command that comes from sshd (``SSH_CLIENT``
set, ``SHLVL`` below 2). HyperTF cannot stop sshd from starting that shell, so:

- what the startup files print is dropped: each command first prints ``FRAME`` on stdout
  and on stderr, and only what follows it is the command's output (``framed``/``unframe``);
- each command is sent with ``SHLVL=1``: where sshd accepts it (``AcceptEnv SHLVL`` in
  sshd_config, or ``SetEnv SHLVL=1`` as the lab does), bash skips ``~/.bashrc``, its time and
  its hangs (a stale pyenv lock made every command wait 60 s); elsewhere the file still
  runs, and a slow or hanging one is paid by every command (docs/provisioning.md);
- files go to the node on a command's stdin (``feed``), not SFTP: a ``~/.bashrc`` that
  prints breaks the SFTP protocol unless sshd uses ``internal-sftp``.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import shlex
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import paramiko
from fabric import Connection
from invoke.exceptions import UnexpectedExit

from hypertf.config.inventory import Node
from hypertf.config.settings import ClusterSettings
from hypertf.core.errors import GroupError, Interrupted, RemoteError
from hypertf.launch.connection import Runner, open_connection

T = TypeVar("T")


def quote(value: object) -> str:
    """Every user value that reaches a remote shell goes through here."""
    return shlex.quote(str(value))


def command_line(argv: Sequence[object]) -> str:
    return " ".join(quote(arg) for arg in argv)


FRAME = "HYPERTF-OUTPUT-BEGINS"  # printed before a command's own output (see above)
QUIET_SHELL = {"SHLVL": "1"}  # bash skips ~/.bashrc for sshd's commands when SHLVL >= 2


def framed(command: str) -> str:
    """``command`` after a mark on stdout and stderr: what comes before is startup files'."""
    return f"printf '%s\\n' {FRAME}; printf '%s\\n' {FRAME} >&2; {command}"


def unframe(text: str) -> str:
    """What a framed command printed after its mark; all of ``text`` when the mark is
    missing (the shell ended in its startup files: what they said is the news)."""
    at = text.find(FRAME + "\n")
    return text if at < 0 else text[at + len(FRAME) + 1:]


class _Unframed(io.TextIOBase):
    """A stream's output after its mark, as it arrives (``Session.stream``)."""

    def __init__(self, sink: io.TextIOBase) -> None:
        self.sink, self.held, self.open = sink, "", False

    def write(self, text: str) -> int:
        if self.open:
            self.sink.write(text)
            return len(text)
        self.held += text
        if FRAME + "\n" in self.held:
            self.open, rest, self.held = True, unframe(self.held), ""
            if rest:
                self.sink.write(rest)
        return len(text)

    def flush(self) -> None:
        self.sink.flush()


def run_on_channel(channel: paramiko.Channel, command: str, timeout: float | None,
                   sink: io.TextIOBase | None = None, data: bytes = b"",
                   started: bool = False, stderr_wait: float | None = None,
                   ) -> tuple[int, str, str]:
    """``command`` on ``channel`` through the login shell (framed, with ``SHLVL=1``; already
    running there when ``started``: ``Session.open_soon``), ``data`` on its stdin, then
    closed; its stderr read beside its stdout (neither may fill the channel's window
    unread). Returns the exit code and what it printed after the frames. With ``sink``,
    stdout goes there as it arrives and is not kept (a watch streams for a job's whole
    life): what is returned is only what came before a frame that never came (the shell
    ended in its startup files). ``timeout``: how long the node may stay silent (None: as
    long as it runs), then TimeoutError; ``stderr_wait``: how long stderr is waited for
    once stdout ended (default ``timeout``). Not Fabric's runner: its loop looks at a
    command every 10 ms."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    kept = io.StringIO() if sink is None else None
    unframed = _Unframed(sink) if sink is not None else None
    errors: list[bytes] = []

    def read_stderr() -> None:
        with contextlib.suppress(OSError, EOFError):  # the main read says what failed
            errors.append(channel.makefile_stderr("rb").read())

    channel.settimeout(timeout)
    if not started:
        channel.update_environment(QUIET_SHELL)
        channel.exec_command(framed(command))
    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    with contextlib.suppress(OSError):  # the command ended early: its exit says why
        if data:
            channel.sendall(data)
        channel.shutdown_write()
    for chunk in iter(lambda: channel.recv(65536), b""):
        text = decoder.decode(chunk)
        if unframed is not None:
            unframed.write(text)
        elif kept is not None:
            kept.write(text)
    code = channel.recv_exit_status()
    reader.join(timeout if stderr_wait is None else stderr_wait)
    if kept is not None:
        stdout = unframe(kept.getvalue())
    else:
        stdout = "" if unframed is None or unframed.open else unframe(unframed.held)
    return code, stdout, unframe(b"".join(errors).decode(errors="replace"))


@dataclass(frozen=True)
class Result:
    """A finished command: what HyperTF needs of Invoke's and Fabric's results."""

    host: str
    command: str
    exited: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exited == 0


class Session:
    """One node's command channel; reused for every command to that node."""

    def __init__(self, node: Node, cluster: ClusterSettings) -> None:
        self.node = node
        self.cluster = cluster
        self._runner: Runner | None = None
        self._opening = threading.Lock()  # one connection, also when opened early (open_soon)
        self._closes = 0  # close() counts: a background connect that ends after one is closed
        self._ready: dict[str, paramiko.Channel] = {}  # open_soon's started commands
        self._starting: dict[str, threading.Event] = {}  # ... set once started (or failed)
        self._early_error: RemoteError | None = None  # open_soon's failure, for the next _open

    def open_soon(self, command: str | None = None) -> None:
        """Connect in the background now, so that the first command finds the connection
        made (the launcher does this while the keeper admits the job: the SSH handshake,
        and sshd's set-up of the session after it, ~40 ms here, overlap the admission).
        With ``command``, also start it there, waiting for its stdin: a later
        ``feed_stream`` of the same command feeds that one, whose shell and Python have
        started meanwhile (what nobody feeds reads an empty stdin when the session
        closes). A failure to connect is raised by the next command (not met twice: a
        host that does not answer costs one ``ssh_timeout``, as without this)."""
        closes = self._closes
        done = threading.Event()
        if command and not self.node.local:
            self._starting.setdefault(command, done)

        def connect() -> None:
            try:
                with contextlib.suppress(Exception):  # the first command meets it again
                    runner = self._open(early=True)
                    if command and isinstance(runner, Connection):
                        channel = self._session_channel(runner)
                        channel.update_environment(QUIET_SHELL)
                        channel.exec_command(framed(command))
                        with self._opening:
                            self._ready.setdefault(command, channel)
                    if self._closes != closes:  # the job ended meanwhile: leave nothing open
                        self.close()
            finally:
                done.set()

        threading.Thread(target=connect, daemon=True, name=f"ssh-{self.node.name}").start()

    def _open(self, early: bool = False) -> Runner:
        """The connection, made now if need be. ``early`` (``open_soon``): a failure is kept
        for the next caller, which raises it instead of trying again."""
        with self._opening:
            if self._runner is not None:
                return self._runner
            error, self._early_error = self._early_error, None
            if error is not None:
                raise error
            try:
                return self._connect()
            except RemoteError as err:
                if early:
                    self._early_error = err
                raise

    def _connect(self) -> Runner:
        self._runner = open_connection(self.node, self.cluster)
        return self._runner

    def run(self, command: str, timeout: float | None = None, **kwargs: Any) -> Result:
        """Run a shell command; a non-zero exit is returned, never raised. On a node over
        SSH it runs on a channel of its own (``_exec``), not through Fabric's runner,
        whose loop looks at the command every 10 ms (~8 ms of every preflight, stop and log
        copy); ``out_stream`` (``stream``) gets its stdout as it arrives."""
        runner = self._open()
        if isinstance(runner, Connection):  # the user's login shell: framed, no ~/.bashrc
            return self._exec(runner, command, timeout, kwargs.get("out_stream"))
        kwargs.setdefault("in_stream", False)
        kwargs.setdefault("hide", True)
        try:
            result = runner.run(command, warn=True, timeout=timeout, **kwargs)
        except UnexpectedExit as err:  # only with warn=False, kept for safety
            result = err.result
        except (OSError, EOFError) as err:
            self.close()
            raise RemoteError(f"{self.node.name}: connection lost: "
                              f"{err or type(err).__name__}") from err
        return Result(self.node.name, command, result.exited, result.stdout, result.stderr)

    def _exec(self, runner: Connection, command: str, timeout: float | None,
              sink: io.TextIOBase | None) -> Result:
        """``run_on_channel`` on a new channel: silent past ``timeout`` is a RemoteError; a
        lost connection is closed (the next command opens another)."""
        channel = self._session_channel(runner)
        try:
            code, stdout, stderr = run_on_channel(channel, command, timeout, sink)
        except TimeoutError as err:
            raise RemoteError(f"{self.node.name}: {command.split()[0]}: no answer within "
                              f"{timeout:g} s") from err
        except (OSError, EOFError, paramiko.SSHException) as err:
            self.close()
            raise RemoteError(f"{self.node.name}: connection lost: "
                              f"{err or type(err).__name__}") from err
        finally:
            channel.close()
        return Result(self.node.name, command, code, stdout, stderr)

    def feed(self, command: str, data: bytes, timeout: float = 300.0) -> Result:
        """Run ``command`` with ``data`` on its stdin, in one round trip: how files reach a
        node (``put``) and how ``tasknode start`` gets its request and the ``--sync``
        archive with it. A non-zero exit is returned, never raised. Not Invoke's stdin
        feeding (slow, and it breaks on large inputs): paramiko's ``sendall`` on a channel
        of its own, framed like ``run`` (startup files' output is dropped)."""
        runner = self._open()
        if not isinstance(runner, Connection):
            try:
                done = subprocess.run(["/bin/bash", "-c", command], input=data, timeout=timeout,
                                      capture_output=True, check=False)
            except subprocess.TimeoutExpired as err:
                raise RemoteError(f"{self.node.name}: no answer within {timeout:.0f} s") from err
            return Result(self.node.name, command, done.returncode,
                          done.stdout.decode(errors="replace"),
                          done.stderr.decode(errors="replace"))
        channel = self._session_channel(runner)
        errors: list[bytes] = []
        try:
            channel.settimeout(timeout)
            channel.update_environment(QUIET_SHELL)
            channel.exec_command(framed(command))
            # stderr read beside stdout: neither may fill the channel's window unread
            reader = threading.Thread(
                target=lambda: errors.append(channel.makefile_stderr("rb").read()), daemon=True)
            reader.start()
            why = ""
            try:
                channel.sendall(data)
                channel.shutdown_write()
            except OSError as err:  # the command ended early: its exit and stderr say why
                why = str(err) or type(err).__name__
            stdout = channel.makefile("rb").read().decode(errors="replace")
            code = channel.recv_exit_status()
            reader.join(timeout)
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise RemoteError(f"{self.node.name}: {command.split()[0]}: "
                              f"{err or type(err).__name__}") from err
        finally:
            channel.close()
        stderr = unframe(b"".join(errors).decode(errors="replace"))
        if code != 0 and not stderr.strip() and why:
            stderr = why
        return Result(self.node.name, command, code, unframe(stdout), stderr)

    def _started(self, command: str) -> paramiko.Channel | None:
        """``command`` as ``open_soon`` started it, still waiting for its stdin, or None.
        One still being started is waited for: it is further along than a new one."""
        starting = self._starting.pop(command, None)
        if starting is not None:
            starting.wait(self.cluster.ssh_timeout)
        with self._opening:
            channel = self._ready.pop(command, None)
        if channel is not None and (channel.closed or channel.exit_status_ready()):
            channel.close()  # it ended (its connection lost?): a fresh one says why
            return None
        return channel

    def _session_channel(self, runner: Connection) -> paramiko.Channel:
        """A new session channel on the host's connection (a lost connection is closed, so
        the next command opens another)."""
        try:
            return runner.transport.open_session(timeout=self.cluster.ssh_timeout)
        except (OSError, EOFError, paramiko.SSHException) as err:
            self.close()
            raise RemoteError(f"{self.node.name}: connection lost: "
                              f"{err or type(err).__name__}") from err

    def feed_stream(self, command: str, data: bytes, sink: io.TextIOBase) -> Result:
        """``feed``, with the command's stdout going to ``sink`` as it arrives (after the
        frame), for as long as the command runs: ``tasknode start --watch`` gets its
        request and then streams the tasks' events on the same channel."""
        runner = self._open()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        errors: list[bytes] = []
        if not isinstance(runner, Connection):
            process = subprocess.Popen(["/bin/bash", "-c", command], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            stdin, stdout, stderr = process.stdin, process.stdout, process.stderr
            assert stdin and stdout and stderr
            reader = threading.Thread(target=lambda: errors.append(stderr.read()), daemon=True)
            reader.start()
            with contextlib.suppress(OSError):  # the command ended early: its exit says why
                stdin.write(data)
                stdin.close()
            for chunk in iter(lambda: os.read(stdout.fileno(), 65536), b""):
                sink.write(decoder.decode(chunk))
            stdout.close()
            code = process.wait()
            reader.join()
            return Result(self.node.name, command, code, "",
                          b"".join(errors).decode(errors="replace"))
        started = self._started(command)
        channel = started or self._session_channel(runner)
        try:
            code, said, warned = run_on_channel(channel, command, None, sink, data,
                                                started=started is not None,
                                                stderr_wait=self.cluster.ssh_timeout)
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise RemoteError(f"{self.node.name}: connection lost: "
                              f"{err or type(err).__name__}") from err
        finally:
            channel.close()
        return Result(self.node.name, command, code, said, warned)

    def put(self, data: bytes, path: str, timeout: float = 300.0) -> None:
        """Write ``data`` to ``path`` on the node (``cat`` fed by ``feed``: not SFTP, which
        startup files' output breaks)."""
        try:
            result = self.feed(f"cat > {quote(path)}", data, timeout)
        except RemoteError as err:
            raise RemoteError(f"{self.node.name}: cannot write {path}: "
                              f"{str(err).split(': ', 1)[-1]}") from err
        if not result.ok:
            lines = result.stderr.strip().splitlines()
            raise RemoteError(f"{self.node.name}: cannot write {path}: "
                              f"{lines[-1] if lines else f'exit {result.exited}'}")

    def stream(self, command: str, sink: io.TextIOBase) -> Result:
        """Run a long command whose stdout goes to ``sink`` as it arrives."""
        return self.run(command, hide=False, out_stream=sink, err_stream=io.StringIO())

    def close(self) -> None:
        self._closes += 1
        self._ready.clear()  # their channels end with the connection
        runner, self._runner = self._runner, None
        if isinstance(runner, Connection):
            runner.close()


class Cluster:
    """Sessions to many nodes, with parallel fan-out (threads: SSH waits on the network)."""

    def __init__(self, nodes: Iterable[Node], cluster: ClusterSettings) -> None:
        self.sessions = {node.name: Session(node, cluster) for node in nodes}

    def each(self, action: Callable[[Session], T], names: Iterable[str] | None = None,
             ) -> GroupResult[T]:
        """Run ``action`` per node in parallel; each value is its result or its exception."""
        chosen = list(self.sessions if names is None else names)
        results: GroupResult[T] = GroupResult()
        if not chosen:
            return results
        with ThreadPoolExecutor(max_workers=min(32, len(chosen))) as pool:
            futures = {name: pool.submit(action, self.sessions[name]) for name in chosen}
            for name, future in futures.items():
                try:
                    results[name] = future.result()
                except Interrupted:  # Ctrl-C in this (the main) thread: no host's failure.
                    # What has begun ends first (leaving the pool waits for it), so the
                    # caller's cleanup sees every task a start round did start.
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
                except Exception as err:  # collected and reported per host
                    results[name] = err
        return results

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GroupResult(dict[str, Any], Generic[T]):
    """Per host, an action's result or the exception it raised (fabric's GroupResult):
    ``succeeded`` and ``failed`` split them, ``problems`` words the failures, host by host
    in name order, and ``raise_failed`` makes them one error."""

    @property
    def succeeded(self) -> dict[str, T]:
        return {h: v for h, v in sorted(self.items()) if not isinstance(v, BaseException)}

    @property
    def failed(self) -> dict[str, BaseException]:
        return {h: v for h, v in sorted(self.items()) if isinstance(v, BaseException)}

    def problems(self) -> dict[str, str]:
        """What went wrong per host: exceptions, and commands that exited non-zero."""
        found = {}
        for host, value in sorted(self.items()):
            if isinstance(value, BaseException):
                found[host] = str(value)
            elif isinstance(value, Result) and not value.ok:
                detail = (value.stderr or value.stdout).strip().splitlines()
                found[host] = f"exit {value.exited}: {detail[-1] if detail else 'no output'}"
        return found

    def raise_failed(self, what: str, consequence: str = "", noun: str = "host") -> None:
        """``GroupError("<what> failed on N host(s)<consequence>:\n  host: why ...")``,
        with each failed host's own answer in its ``failures``."""
        problems = self.problems()
        if problems:
            lines = "\n".join(f"  {host}: {why}" for host, why in problems.items())
            raise GroupError(f"{what} failed on {len(problems)} {noun}(s){consequence}:\n"
                             f"{lines}", {host: self[host] for host in problems})
