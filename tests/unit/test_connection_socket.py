"""The launcher's SSH socket (hypertf.launch.connection.nodelay_socket): Nagle off, and reads
that acknowledge at once (sshd's Nagle would otherwise hold its second small message until
Linux's delayed ACK, ~40 ms, on every connection's first channel)."""

from __future__ import annotations

import socket
import threading

import pytest

from hypertf.launch.connection import TCP_QUICKACK, QuickAckSocket, nodelay_socket


@pytest.fixture
def server():
    """A loopback listener that sends two small messages back to back to each client."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener:
            peer, _ = listener.accept()
            with peer:
                peer.sendall(b"first")
                peer.recv(16)  # the client's word between the two
                peer.sendall(b"second")
                peer.recv(16)  # until the client closes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()
    thread.join(5)


@pytest.mark.skipif(TCP_QUICKACK is None, reason="TCP_QUICKACK is Linux's")
def test_the_socket_has_nagle_off_and_acknowledges_each_read(server):
    address, port = server
    sock = nodelay_socket(address, port, timeout=7.0)
    with sock:
        assert isinstance(sock, QuickAckSocket)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert sock.gettimeout() == 7.0  # the connect timeout stays the socket's
        assert sock.recv(16) == b"first"
        # quick-ACK mode was asked for before the read (the kernel may leave it after)
        sock.sendall(b"ok")
        assert sock.recv(16) == b"second"


def test_a_refused_connection_is_an_oserror_as_before():
    """What open_connection words as 'cannot connect' still arrives as OSError."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    with pytest.raises(OSError):
        nodelay_socket("127.0.0.1", port, timeout=2.0)
