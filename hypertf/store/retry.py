"""Version-checked read-modify-writes, retried the way kazoo retries (``until_committed``)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TypeVar

from kazoo.retry import ForceRetryError, KazooRetry, RetryFailedError

from hypertf.core.errors import StoreError

__all__ = ["until_committed"]

T = TypeVar("T")


def until_committed(attempt: Callable[[int], T], what: str, deadline_s: float | None = 30.0,
                    max_tries: int = 200) -> T:
    """Run a version-checked read-modify-write until it commits, kazoo's way: ``attempt``
    (given how many tries lost so far) raises ``ForceRetryError`` when another writer won;
    ``KazooRetry`` retries that (and a lost connection) with backoff and jitter, until
    ``deadline_s`` or ``max_tries`` (-1: no limit but the deadline). Giving up is a
    ``StoreError``: the last ``ForceRetryError``'s message when it has one (what the writer
    would tell its user), else how many tries were lost while ``what``."""
    tries = itertools.count()
    conflicts: list[ForceRetryError] = []

    def once() -> T:
        try:
            return attempt(next(tries))
        except ForceRetryError as conflict:
            conflicts[:] = [conflict]
            raise

    retry = KazooRetry(max_tries=max_tries, delay=0.005, backoff=2, max_jitter=0.8,
                       max_delay=0.2, deadline=deadline_s)
    try:
        result: T = retry(once)
        return result
    except RetryFailedError as err:
        told = str(conflicts[0]) if conflicts else ""
        raise StoreError(told or f"gave up {what} after {next(tries) - 1} tries lost to "
                         f"other writers") from err
