"""A job's grant (``grants/<task key>``): where its tasks run, their GPUs and ports, as the
keeper admitted it. Pure: the store writes and reads the znode.

Only the keeper's identity (and the admin) may write a grant, so a launcher starts tasks on
a grant and never on the placements in its job record (which its owner writes), and a new
keeper rebuilds what running jobs hold from grants alone (docs/zookeeper-layout.md, "Trust").
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from hypertf.core.errors import StoreError
from hypertf.core.jobrecord import placements_json, placements_of, ports_of
from hypertf.core.matrix import Held
from hypertf.core.placement import Grant
from hypertf.core.records import decode, encode
from hypertf.core.scheduler import Placement


def grant_to_json(task_key: str, placements: Sequence[Placement], ports: Mapping[str, int],
                  when: float | None = None) -> bytes:
    return encode({"task_key": task_key, "placements": placements_json(placements, ports),
                   "granted": time.time() if when is None else when})


def grant_from_json(data: bytes, task_key: str) -> Grant:
    """The grant stored for ``task_key``; ValueError when it is damaged or names another
    job (the keeper wrote it, so this is a bug or a thief of the keeper's credential)."""
    try:
        payload = decode(data, "grant")
        if payload.get("task_key") != task_key:
            raise ValueError(f"names {payload.get('task_key')!r}")
        placements = placements_of(payload)
        ports = ports_of(payload)
    except (KeyError, TypeError, ValueError, AttributeError, StoreError) as err:
        raise ValueError(f"the grant of {task_key} is damaged ({err})") from None
    return Grant(task_key, placements, ports)


def held_of_grant(grant: Grant) -> Held:
    """What a grant holds in the matrix, per host."""
    return Held.of(grant.placements, grant.ports)
