"""The POSIX names of an offload channel, spelled once.

The launcher names each task's channel after the job's task key
(``taskstart.StartPlan.offload_spec``), the offload agent creates its shared memory and
semaphores under that name (``offload.channel``), and the node's ``tasknode stop`` removes
what a SIGKILLed agent left in /dev/shm by the same key: if two of them spelled it
differently, the segments would leak until the node reboots.
"""

from __future__ import annotations

PREFIX = "hypertf-offload"


def channel_name(owner: str, task: str) -> str:
    """A channel's base name: ``owner`` is the job's task key (a standalone world: its
    process), ``task`` the task's file name (``worker0``). The channel's other names all
    start with it (``-req``, ``-done``, ``-d<generation>``)."""
    return f"/{PREFIX}-{owner}-{task}"


def shm_prefixes(owner: str) -> tuple[str, str]:
    """How every name, in /dev/shm, of every channel of ``owner`` begins: Linux keeps
    shared memory there under its name and a semaphore as ``sem.<name>``. Prefixes, not
    glob patterns: a name is matched as it is spelled (no pattern to compile on every
    node's stop: ~0.6 ms each)."""
    base = channel_name(owner, "")[1:]
    return base, f"sem.{base}"
