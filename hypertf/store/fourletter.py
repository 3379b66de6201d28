"""ZooKeeper's four-letter words (``srvr``, ``ruok``): a server's health without a session,
for ``hypertf status`` and for starting a local server."""

from __future__ import annotations

import socket


def four_letter(address: str, port: int, command: str = "srvr", timeout: float = 2.0) -> str:
    """Send a four-letter word; '' if nothing answers."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.sendall(command.encode())
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def mode(address: str, port: int) -> str | None:
    """'standalone', 'leader', 'follower', or None when the server does not serve."""
    for line in four_letter(address, port).splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None
