"""until_committed, the one retry of a version-checked write (hypertf.store.retry)."""

from __future__ import annotations

import pytest
from kazoo.retry import ForceRetryError

from hypertf.core.errors import StoreError
from hypertf.store.retry import until_committed


def test_a_write_that_loses_then_wins_commits_and_is_told_how_often_it_lost() -> None:
    seen: list[int] = []

    def attempt(lost: int) -> str:
        seen.append(lost)
        if lost < 2:
            raise ForceRetryError()
        return "done"

    assert until_committed(attempt, "writing") == "done"
    assert seen == [0, 1, 2]


def test_giving_up_says_what_the_last_conflict_said_or_how_many_tries_were_lost() -> None:
    def told(_lost: int) -> None:
        raise ForceRetryError("gave up setting user limits: try again")

    with pytest.raises(StoreError, match=r"^gave up setting user limits: try again$"):
        until_committed(told, "setting", deadline_s=0.05, max_tries=-1)

    def untold(_lost: int) -> None:
        raise ForceRetryError()

    with pytest.raises(StoreError, match=r"^gave up writing after \d+ tries lost to"):
        until_committed(untold, "writing", max_tries=3)


def test_any_other_error_ends_at_once() -> None:
    calls: list[int] = []

    def refused(lost: int) -> None:
        calls.append(lost)
        raise StoreError("refused")

    with pytest.raises(StoreError, match=r"^refused$"):
        until_committed(refused, "writing")
    assert calls == [0]
