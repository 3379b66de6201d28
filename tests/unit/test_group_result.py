"""Many hosts' results as one object: what succeeded, what failed, one error for people."""

from __future__ import annotations

import pytest

from hypertf.core.errors import GroupError, RemoteError
from hypertf.launch.remote import GroupResult, Result


def test_succeeded_and_failed_split_the_hosts_in_name_order():
    results: GroupResult[int] = GroupResult(h3=3, h1=RemoteError("h1: no answer"), h2=2)
    assert list(results.succeeded.items()) == [("h2", 2), ("h3", 3)]
    assert list(results.failed) == ["h1"]
    assert results.problems() == {"h1": "h1: no answer"}


def test_commands_that_exited_non_zero_are_problems_too():
    results = GroupResult(
        b=Result("b", "true", 0, "", ""),
        a=Result("a", "false", 2, "", "first\nlast words\n"),
        c=Result("c", "false", 1, "", ""),
    )
    assert results.problems() == {"a": "exit 2: last words", "c": "exit 1: no output"}


def test_raise_failed_makes_one_error_listing_each_host():
    results = GroupResult(h2=ValueError("bad"), h1=ValueError("worse"), h3="fine")
    with pytest.raises(RemoteError) as caught:
        results.raise_failed("preflight", "; nothing was started or allocated")
    assert str(caught.value) == ("preflight failed on 2 host(s); nothing was started or "
                                 "allocated:\n  h1: worse\n  h2: bad")
    assert isinstance(caught.value, GroupError)
    assert {h: str(e) for h, e in caught.value.failures.items()} == {"h1": "worse", "h2": "bad"}
    GroupResult(h1="fine").raise_failed("anything")  # nothing failed: no error
    with pytest.raises(RemoteError, match=r"^agent start failed on 1 node\(s\):"):
        GroupResult(n=OSError("x")).raise_failed("agent start", noun="node")
