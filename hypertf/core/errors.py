"""One exception hierarchy: the CLI turns a HyperTFError into a message and an exit code.

Anything that is not a HyperTFError is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping


class HyperTFError(Exception):
    """A problem the user can fix; ``str(err)`` is the message shown to them."""

    exit_code = 1


class InventoryError(HyperTFError):
    """The inventory file is missing, malformed or inconsistent."""

    exit_code = 2


class UsageError(HyperTFError):
    """A request that cannot be valid whatever the cluster looks like."""

    exit_code = 2


class StoreError(HyperTFError):
    """ZooKeeper is unreachable or holds data HyperTF cannot read."""

    exit_code = 3


class InsufficientResources(HyperTFError):
    """The request is valid but the cluster cannot meet it now."""

    exit_code = 4


class LabError(HyperTFError):
    """The local multi-host lab could not be built or torn down."""

    exit_code = 5


class RemoteError(HyperTFError):
    """A node could not be reached or a remote command failed."""

    exit_code = 6


class GroupError(RemoteError):
    """One action failed on several hosts, as Fabric's ``GroupException``: the message
    words each host's failure on a line of its own for people; ``failures`` keeps what
    each host answered (its exception, or its command's non-zero result) for code and
    logs, so nothing a host said is lost in the one string."""

    def __init__(self, message: str, failures: Mapping[str, object]) -> None:
        super().__init__(message)
        self.failures = dict(failures)


class Cancelled(HyperTFError):
    """Someone ended the job (``hypertf cancel`` or ``kill``): not a failure of the job, so
    scripts and the sweep driver can tell the two apart by the exit code."""

    exit_code = 8


class NotAllowed(HyperTFError):
    """This identity may not do that (another user's job, an agent's write)."""

    exit_code = 7


class Interrupted(HyperTFError):
    """SIGINT or SIGTERM reached the launcher's main thread (the job stops and releases
    what it holds). Raised where the main thread waits, so a fan-out that collects its
    hosts' exceptions must pass this one on: it is no host's failure."""

    exit_code = 130


def say_interrupted() -> int:
    """Ctrl-C that reached a command outside a job's own handling (its imports, a plain
    command): one line, no traceback, and the exit code a shell gives an interrupt."""
    print("hypertf: interrupted", file=sys.stderr)
    return Interrupted.exit_code
