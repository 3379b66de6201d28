"""Opening one node's command channel: Fabric over SSH with the host key verified, or
Invoke on this machine for a node with ``ansible_connection: local``.

Host keys are always verified against the known_hosts the inventory names: paramiko's
default of accepting unknown keys is switched off. Every way a connection fails becomes a
``RemoteError`` that names the node and the fix, so ``Session`` (hypertf.launch.remote)
only keeps the connection this makes and never meets paramiko's exceptions at the door.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Any, Protocol

import paramiko
from fabric import Config, Connection
from invoke.context import Context

from hypertf.config.inventory import Node
from hypertf.config.settings import ClusterSettings
from hypertf.core.errors import RemoteError

__all__ = ["QuickAckSocket", "Runner", "nodelay_socket", "open_connection"]


class Runner(Protocol):
    """What a session runs commands on: a fabric ``Connection`` or an invoke ``Context``."""

    def run(self, command: str, **kwargs: Any) -> Any: ...


TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only


class QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges what it receives at once. sshd leaves Nagle's
    algorithm on for a command without a terminal, so a small message it sends right after
    another one waits until this side acknowledges the first; Linux delays that ACK (up to
    40 ms) while it has nothing to send. paramiko then waited ~43 ms for the confirmation
    of each connection's first channel, here on every host of every launch (1 ms with
    this). Quick-ACK mode is not sticky (the kernel leaves it by itself), so it is asked
    for again before each read: one setsockopt, ~1 us."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if TCP_QUICKACK is not None:
            with contextlib.suppress(OSError):
                self.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)
        return super().recv(bufsize, flags)


def nodelay_socket(address: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection for SSH with Nagle's algorithm off, as OpenSSH does. paramiko
    leaves it on, and then every small message that follows another unanswered one waits
    for the peer's delayed ACK (40 ms on Linux): the handshake took 70-110 ms instead of
    ~25, and every command two such waits (~85 ms for ``true``, 3 ms without). Its reads
    acknowledge at once (``QuickAckSocket``): the same wait, the other way round."""
    plain = socket.create_connection((address, port), timeout=timeout)
    plain.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if TCP_QUICKACK is None:
        return plain
    sock = QuickAckSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
    sock.settimeout(timeout)
    return sock


def open_connection(node: Node, cluster: ClusterSettings) -> Runner:
    """``node``'s connection, open: an invoke ``Context`` for a local node, else a fabric
    ``Connection`` whose host key matched the pinned one; a ``RemoteError`` otherwise."""
    if node.local:
        context: Runner = Context()
        return context
    known_hosts = Path(cluster.known_hosts)
    if not known_hosts.is_file():
        raise RemoteError(
            f"{node.name}: known_hosts file {known_hosts} does not exist; "
            f"pin the nodes' host keys first (invoke cluster.setup does it)"
        )
    connect_kwargs: dict[str, Any] = {"look_for_keys": False, "allow_agent": False}
    if node.key_file:
        connect_kwargs["key_filename"] = node.key_file
    conn = Connection(
        host=node.address,
        user=node.user,
        port=node.port,
        connect_timeout=cluster.ssh_timeout,
        connect_kwargs=connect_kwargs,
        config=Config(overrides={"load_ssh_configs": False}),
        inline_ssh_env=False,  # SHLVL as an SSH env request, read before bash starts
    )
    conn.client.load_host_keys(str(known_hosts))
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        connect_kwargs["sock"] = nodelay_socket(node.address, node.port, cluster.ssh_timeout)
        conn.open()
    except paramiko.BadHostKeyException as err:
        raise RemoteError(
            f"{node.name} ({node.address}): its SSH host key CHANGED since it "
            f"was pinned in {known_hosts}; check the node, then re-pin it"
        ) from err
    except paramiko.AuthenticationException as err:
        raise RemoteError(
            f"{node.name} ({node.address}): SSH refused the key "
            f"{node.key_file or '(none given)'} for {node.user}: it is not in "
            f"that user's authorized_keys, or sshd's StrictModes ignores that file because "
            f"it, ~/.ssh or a directory above is writable by group or others or owned by "
            f"another user (the node's sshd log names the path: 'Authentication refused: "
            f"bad ownership or modes'); invoke cluster.setup authorizes the key"
        ) from err
    except paramiko.SSHException as err:
        if "not found in known_hosts" in str(err):
            raise RemoteError(
                f"{node.name} ({node.address}): host key unknown: it is not "
                f"in {known_hosts}; verify the node and pin its key (invoke cluster.setup)"
            ) from err
        raise RemoteError(f"{node.name} ({node.address}): SSH failed: {err}") from err
    except TimeoutError as err:
        raise RemoteError(
            f"{node.name} ({node.address}:{node.port}): no answer within "
            f"{cluster.ssh_timeout:.0f} s; is the node up and reachable?"
        ) from err
    except OSError as err:
        raise RemoteError(
            f"{node.name} ({node.address}:{node.port}): cannot connect: "
            f"{err.strerror or err}"
        ) from err
    runner: Runner = conn  # a fabric Connection (untyped): what a session uses of it
    return runner
