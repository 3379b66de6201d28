"""PollHandler.select keeps kazoo's selector_select contract (readable, writable, the
empty third list, errors for bad input) with one poll call, descriptors past 1,024 too."""

from __future__ import annotations

import os
import resource
import socket
import threading
import time

import pytest
from kazoo.handlers.utils import selector_select

from hypertf.store.pollhandler import PollHandler


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def both(r, w, timeout):
    """Ours and kazoo's answer to the same question."""
    return PollHandler().select(r, w, [], timeout), selector_select(r, w, [], timeout)


def test_it_answers_as_kazoos_selector_does(pair):
    a, b = pair
    assert both([a, b], [], 0.01) == (([], [], []), ([], [], []))
    b.send(b"x")
    assert both([a, b], [], 0.01) == (([a], [], []), ([a], [], []))
    assert both([], [a], 0.01) == (([], [a], []), ([], [a], []))
    assert both([a.fileno()], [], 0) == (([a.fileno()], [], []), ([a.fileno()], [], []))


def test_a_hang_up_is_readable(pair):
    a, b = pair
    b.close()
    assert PollHandler().select([a], [], [], 0.01)[0] == [a]


def test_it_waits_its_timeout_rounded_up(pair):
    a, _ = pair
    started = time.monotonic()
    assert PollHandler().select([a], [], [], 0.0004) == ([], [], [])
    assert time.monotonic() - started < 0.5


def test_bad_input_raises_as_kazoo_does(pair):
    a, _ = pair
    with pytest.raises(ValueError):
        PollHandler().select([a], [], [], -1)
    with pytest.raises(TypeError):
        PollHandler().select([a], [], [], "1")
    closed = socket.socket()
    closed.close()
    with pytest.raises(TypeError):
        PollHandler().select([closed], [], [], 0)


def test_a_descriptor_past_1024(pair):
    a, b = pair
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if max(soft, hard) < 2048:
        pytest.skip("this account may not open 2,048 files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    high = os.dup2(a.fileno(), 1500)
    try:
        b.send(b"x")
        assert PollHandler().select([high], [], [], 0.01)[0] == [high]
    finally:
        os.close(high)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_threads_wait_at_once_on_one_handler(pair):
    """Each thread polls with its own kept poll object (one may not be polled twice at
    once); a kept one answers again for the same descriptors."""
    a, b = pair
    handler = PollHandler()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            for _ in range(5):
                handler.select([a], [], [], 0.02)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    b.send(b"x")
    assert handler.select([a], [], [], 0.01)[0] == [a]
    assert handler.select([a], [], [], 0.01)[0] == [a]
