"""Ctrl-C is the user's, not a host's failure: it ends the command with 130 and one line.

Found while measuring cold launches: SIGINT while the launcher waited on its hosts'
preflight answers was caught with the hosts' exceptions (``Cluster.each``) and the job
ended with exit 6, "preflight failed on 1 host(s): h1: interrupted by SIGINT"; one during
the command's imports ended in a traceback. Both are driven here for real: the signal is
sent to the process at the moment named, not simulated.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hypertf.core.errors import Interrupted
from hypertf.launch.attempt import interrupted_by_signals
from hypertf.launch.remote import Cluster

REPO = Path(__file__).resolve().parents[2]


def test_sigint_while_waiting_on_hosts_is_interrupted_not_a_host_failure():
    interrupted, finished = threading.Event(), []
    cluster = Cluster([], None)  # type: ignore[arg-type]  # no node: sessions set below
    cluster.sessions = {"h1": "session-1", "h2": "session-2"}  # type: ignore[dict-item]
    started = threading.Barrier(3)

    def slow(session: str) -> str:  # a host's preflight or start, under way at the Ctrl-C
        started.wait(5)
        interrupted.wait(5)
        time.sleep(0.2)
        finished.append(session)
        return "ok"

    def interrupt() -> None:
        started.wait(5)
        time.sleep(0.05)  # the main thread is in future.result()
        os.kill(os.getpid(), signal.SIGINT)
        interrupted.set()

    threading.Thread(target=interrupt, daemon=True).start()
    with interrupted_by_signals(), pytest.raises(Interrupted, match="SIGINT"):
        cluster.each(slow)
    # what had begun on the hosts ended before the error left: the cleanup sees it all
    assert sorted(finished) == ["session-1", "session-2"]


def test_other_exceptions_are_still_the_hosts_own():
    cluster = Cluster([], None)  # type: ignore[arg-type]
    cluster.sessions = {"h1": "a", "h2": "b"}  # type: ignore[dict-item]

    def action(session: object) -> str:
        if session == "b":
            raise RuntimeError("h2 is down")
        return "fine"

    results = cluster.each(action)
    assert results.succeeded == {"h1": "fine"}
    assert str(results.failed["h2"]) == "h2 is down"


# A finder that sends SIGINT to its own process when the CLI's command module is about to
# be imported: the signal lands among the imports every time, not by a sleep's luck.
SIGINT_AMONG_IMPORTS = """
import os, signal, sys
# Python installs its Ctrl-C handler only where SIGINT was not ignored at its start, and
# pytest-xdist's workers ignore it: a terminal's command has it, so this one gets it too
signal.signal(signal.SIGINT, signal.default_int_handler)
class Finder:
    def find_spec(self, name, path=None, target=None):
        if name == "hypertf.cli.commands":
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Finder())
sys.argv = ["hypertf", "status", "-i", "/nonexistent.yml"]
from hypertf.cli.warm import main
sys.exit(main())
"""


def test_sigint_among_the_imports_is_one_line_and_130():
    done = subprocess.run([sys.executable, "-c", SIGINT_AMONG_IMPORTS], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HYPERTF_WARM_S": ""})
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "hypertf: interrupted"
    assert done.returncode == 130
