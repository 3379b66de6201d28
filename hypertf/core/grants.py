"""A job's grant (``grants/<task key>``): where its tasks run, their GPUs and ports, as the
keeper admitted it. Pure: the store writes and reads the znode.

Only the keeper's identity (and the admin) may write a grant, so a launcher starts tasks on
a grant and never on the placements in its job record (which its owner writes), and a new
keeper rebuilds what running jobs hold from grants alone (docs/zookeeper-layout.md, "Trust").
A grant also keeps the keeper's terms of the admission that preemption goes by
(``GrantTerms``: the tier and queue place it was admitted with, how often the job was
preempted, whom it displaced), so a new keeper decides as the old one would have.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hypertf.core.errors import StoreError
from hypertf.core.jobrecord import placements_json, placements_of, ports_of
from hypertf.core.layout import is_task_key
from hypertf.core.matrix import Held
from hypertf.core.placement import Grant
from hypertf.core.records import decode, encode
from hypertf.core.scheduler import Placement

MAX_DISPLACED = 1000  # users a grant's terms name: more is damage, not a chain


@dataclass(frozen=True)
class GrantTerms:
    """The keeper's terms of one admission, for preemption (hypertf.keeper.preempter):
    ``priority`` the capped tier it was admitted at, ``order`` its place in the queue (its
    record's czxid, or the one a preemption notice kept for it), ``preemptions`` how often
    its job was preempted before, ``displaced`` the users its preemptions displaced (no
    cycles: hypertf.core.preemption), ``resumes`` the preempted attempt it continues."""

    priority: int = 0
    order: int = 0
    preemptions: int = 0
    displaced: frozenset[str] = frozenset()
    resumes: str = ""

    def to_plain(self) -> dict[str, Any]:
        plain: dict[str, Any] = {"priority": self.priority, "order": self.order}
        if self.preemptions:
            plain["preemptions"] = self.preemptions
        if self.displaced:
            plain["displaced"] = sorted(self.displaced)
        if self.resumes:
            plain["resumes"] = self.resumes
        return plain

    @classmethod
    def from_plain(cls, value: object) -> GrantTerms | None:
        """The terms a grant holds; None when it has none (a grant of an older keeper) or
        they are damaged (only the keeper writes grants, but a reader checks)."""
        if not isinstance(value, dict):
            return None
        priority, order = value.get("priority"), value.get("order")
        count, displaced = value.get("preemptions", 0), value.get("displaced", [])
        resumes = value.get("resumes", "")
        if type(priority) is not int or type(order) is not int or type(count) is not int \
                or order < 0 \
                or not 0 <= count <= 10_000 or not isinstance(displaced, list) \
                or len(displaced) > MAX_DISPLACED \
                or not all(isinstance(u, str) and 0 < len(u) <= 64 for u in displaced) \
                or not isinstance(resumes, str) or (resumes and not is_task_key(resumes)):
            return None
        return cls(priority, order, count, frozenset(displaced), resumes)


@dataclass(frozen=True)
class RecordStamp:
    """Which job record the admission wrote beside the grant: its znode's version after
    the write and the SHA-256 of its bytes. The launcher that queued the job can then
    rebuild the record (its own queued record, admitted at ``admitted`` with the grant's
    placements) and know it, version included, without reading it back: its next write
    to it (``starting``, the release) saves a request. A rebuild whose digest differs is
    not believed: the launcher reads the record as before."""

    version: int
    sha256: str
    admitted: float

    @classmethod
    def of(cls, data: bytes, version: int, admitted: float) -> RecordStamp:
        return cls(version, hashlib.sha256(data).hexdigest(), admitted)

    def matches(self, data: bytes) -> bool:
        return hashlib.sha256(data).hexdigest() == self.sha256

    def to_plain(self) -> dict[str, Any]:
        return {"version": self.version, "sha256": self.sha256}

    @classmethod
    def from_plain(cls, value: object, admitted: object) -> RecordStamp | None:
        """The stamp a grant holds; None for none (an older keeper's grant) or a damaged one."""
        if not isinstance(value, dict) or not isinstance(admitted, (int, float)):
            return None
        version, digest = value.get("version"), value.get("sha256")
        if type(version) is not int or version < 1 or not isinstance(digest, str) \
                or len(digest) != 64:
            return None
        return cls(version, digest, float(admitted))


def grant_to_json(task_key: str, placements: Sequence[Placement], ports: Mapping[str, int],
                  when: float | None = None, terms: GrantTerms | None = None,
                  record: RecordStamp | None = None) -> bytes:
    return encode({"task_key": task_key, "placements": placements_json(placements, ports),
                   "granted": time.time() if when is None else when,
                   **({"terms": terms.to_plain()} if terms is not None else {}),
                   **({"record": record.to_plain()} if record is not None else {})})


def terms_of_grant(data: bytes) -> GrantTerms | None:
    """The keeper's terms kept in a grant (None: none, or unreadable)."""
    try:
        return GrantTerms.from_plain(decode(data, "grant").get("terms"))
    except (StoreError, AttributeError):
        return None


def grant_from_json(data: bytes, task_key: str) -> Grant:
    """The grant stored for ``task_key``; ValueError when it is damaged or names another
    job (the keeper wrote it, so this is a bug or a thief of the keeper's credential)."""
    return grant_and_stamp(data, task_key)[0]


def grant_and_stamp(data: bytes, task_key: str) -> tuple[Grant, RecordStamp | None]:
    """``grant_from_json``, with the stamp of the record its admission wrote (if any)."""
    try:
        payload = decode(data, "grant")
        if payload.get("task_key") != task_key:
            raise ValueError(f"names {payload.get('task_key')!r}")
        placements = placements_of(payload)
        ports = ports_of(payload)
    except (KeyError, TypeError, ValueError, AttributeError, StoreError) as err:
        raise ValueError(f"the grant of {task_key} is damaged ({err})") from err
    stamp = RecordStamp.from_plain(payload.get("record"), payload.get("granted"))
    return Grant(task_key, placements, ports), stamp


def held_of_grant(grant: Grant) -> Held:
    """What a grant holds in the matrix, per host."""
    return Held.of(grant.placements, grant.ports)
