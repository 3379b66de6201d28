"""How a command ends: a HyperTFError becomes one line on stderr and its exit code, an
outage of ZooKeeper exit 3, Ctrl-C 130, a reader that left (``| head``) a quiet 141;
anything else is a bug and keeps its traceback. Shared by the CLI, Invoke's tasks and the
background launchers (detached jobs, sweep drivers), which import no CLI.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from types import TracebackType

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from hypertf.core.errors import Cancelled, HyperTFError, say_interrupted


def quiet_kazoo() -> None:
    """kazoo's connection warnings are noise for a one-shot command: our error says it."""
    kazoo_log = logging.getLogger("hypertf.kazoo")
    kazoo_log.addHandler(logging.NullHandler())
    kazoo_log.propagate = False


def run(func: Callable[[], int]) -> int:
    """Turn HyperTFError into a message and its exit code."""
    try:
        return func()
    except HyperTFError as err:
        # a job someone ended (hypertf cancel or kill) is no error of the job: no "error:"
        ended = err.exit_code == Cancelled.exit_code
        print(f"hypertf: {'' if ended else 'error: '}{err}", file=sys.stderr)
        return err.exit_code
    except (KazooException, KazooTimeoutError) as err:  # an outage, not a bug
        print(f"hypertf: error: ZooKeeper failed ({type(err).__name__}: {err or 'no detail'}); "
              f"check 'hypertf status' and the ZooKeeper servers", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return say_interrupted()
    except BrokenPipeError:
        return reader_gone()


SIGPIPE_EXIT = 128 + 13  # what a shell reports for a writer killed by SIGPIPE


def reader_gone() -> int:
    """The reader of stdout left (``| head -1``, ``| grep -q``): end quietly, as ``cat``
    does. Stdout goes to /dev/null so that the interpreter's last flush cannot complain."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return SIGPIPE_EXIT


def quiet_uncaught_broken_pipe() -> None:
    """Let a BrokenPipeError that reaches the top (Invoke prints a task's help itself, after
    loading tasks.py: ``invoke --help train | head -1``) end quietly with 141, as ``cat``
    does, instead of a traceback and exit 1. Every other exception keeps its traceback."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, BrokenPipeError):
            sys.stderr.flush()
            os._exit(reader_gone())  # SystemExit is not honoured inside an excepthook
        previous(kind, value, tb)

    sys.excepthook = hook
