"""Test helpers for counting a client's requests: which paths a synchronous call reads,
and the one-GPU request on two fake hosts the request-count tests cycle."""

from __future__ import annotations

from typing import Any

from kazoo.client import KazooClient

from hypertf.core.placement import Request
from hypertf.core.scheduler import TaskSlot

HOSTS = ("n1", "n2")


def one_gpu() -> Request:
    return Request(slots=(TaskSlot("worker", 0, 1),), hosts=HOSTS)


def spy(client: KazooClient, method: str) -> list[str]:
    """The paths this client's synchronous ``method`` (``get``, ``exists``) is asked
    about from now on."""
    asked: list[str] = []
    plain = getattr(client, method)

    def call(path: str, watch: Any = None) -> Any:
        asked.append(path)
        return plain(path, watch=watch)

    setattr(client, method, call)
    return asked
