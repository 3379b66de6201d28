"""What each user may ask of the keeper: a maximum priority and a GPU limit, set by the admin.

Kept in ``<root>/limits`` (docs/zookeeper-layout.md), which only the admin may write: a job
record is its owner's to write, so a priority read from it is only a wish. The keeper clamps
it to the owner's maximum, and admits no job that would take its owner past the GPU limit.
Pure: the store reads and writes the znode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hypertf.core.errors import UsageError
from hypertf.core.records import decode, encode

DEFAULT_MAX_PRIORITY = 10  # a user the admin said nothing about: --priority up to 10


@dataclass(frozen=True)
class UserLimit:
    """One user's ceiling: ``gpu_limit`` 0 means the cluster's hypertf_user_gpu_limit."""

    max_priority: int = DEFAULT_MAX_PRIORITY
    gpu_limit: int = 0


@dataclass(frozen=True)
class UserLimits:
    """Every user's ceiling; users not named get ``default``."""

    default: UserLimit = field(default_factory=UserLimit)
    users: Mapping[str, UserLimit] = field(default_factory=dict)

    def of(self, user: str) -> UserLimit:
        return self.users.get(user, self.default)

    def priority(self, user: str, asked: int) -> int:
        """The priority that counts: what the job asks, at most the owner's maximum."""
        return min(asked, self.of(user).max_priority)

    def gpu_limit(self, user: str, cluster_limit: int) -> int:
        """GPUs the user may hold at once (0: no limit)."""
        return self.of(user).gpu_limit or cluster_limit

    def with_user(self, user: str, max_priority: int | None, gpu_limit: int | None) -> UserLimits:
        """A copy where ``user`` has the given ceilings (None keeps what was there)."""
        old = self.of(user)
        new = UserLimit(old.max_priority if max_priority is None else max_priority,
                        old.gpu_limit if gpu_limit is None else gpu_limit)
        if gpu_limit is not None and gpu_limit < 0:
            raise UsageError(f"--gpu-limit {gpu_limit}: give 0 (the cluster's limit) or more")
        return UserLimits(self.default, {**self.users, user: new})

    def to_json(self) -> bytes:
        return encode({"default": _plain(self.default),
                       "users": {u: _plain(limit) for u, limit in sorted(self.users.items())}})

    @classmethod
    def from_json(cls, data: bytes | None) -> UserLimits:
        if not data:
            return cls()
        payload = decode(data, "user limits")
        return cls(_limit(payload.get("default", {})),
                   {str(u): _limit(v) for u, v in payload.get("users", {}).items()})


def _plain(limit: UserLimit) -> dict[str, int]:
    return {"max_priority": limit.max_priority, "gpu_limit": limit.gpu_limit}


def _limit(value: Mapping[str, Any]) -> UserLimit:
    return UserLimit(int(value.get("max_priority", DEFAULT_MAX_PRIORITY)),
                     int(value.get("gpu_limit", 0)))
