"""Whose a task key is (``20261122-085000-a1b2c3.alice``: the part after its first dot),
spelled once without dataclasses: ``tasknode start`` reads it on every node of every job,
and hypertf.core.layout (which imports dataclasses, ~5 ms) raises its usage error on it."""

from __future__ import annotations

__all__ = ["key_owner"]


def key_owner(task_key: str) -> str:
    """The user ``task_key`` belongs to; "" when it is not a task key."""
    stamp, _, user = task_key.partition(".")
    return user if stamp and user and "/" not in task_key else ""
