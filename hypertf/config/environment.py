"""Every ``HYPERTF_*`` environment variable HyperTF reads, declared once: its name, what it
means, its default and how its text is read. Code reads them here (``WARM_S.read()``),
never with ``os.environ`` by name; ``VARIABLES`` is the one list (a unit test checks both).

The variables HyperTF *sets* for every task (``HYPERTF_TASK_KEY``, ``HYPERTF_ATTEMPT``...)
are the task contract, listed in hypertf.core.taskenv; the ones here are read by HyperTF's
own processes: the command, the launcher, the dashboard, the offload hook in a task.

A variable set to nothing (or to spaces) counts as unset. A number that is not one reads as
the default, a negative one as 0: a typo never stops a command.

Standard library only, and no ``typing`` or ``dataclasses`` at run time: the command's entry
(hypertf.cli.warm) and the offload hook (loaded at every task's interpreter start) read these.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


class Variable:
    """One variable: ``name``, a one-line ``meaning``, and its subclass's ``default`` and
    parse (``read``)."""

    __slots__ = ("meaning", "name")

    def __init__(self, name: str, meaning: str) -> None:
        self.name, self.meaning = name, meaning

    def raw(self, env: Mapping[str, str] | None = None) -> str:
        """The value as set in ``env`` (default: this process's environment), spaces
        trimmed; "" when unset."""
        return (os.environ if env is None else env).get(self.name, "").strip()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Text(Variable):
    """A text (a path, a name, a token): as set, else ``default`` ("" for none)."""

    __slots__ = ("default",)

    def __init__(self, name: str, meaning: str, default: str = "") -> None:
        super().__init__(name, meaning)
        self.default = default

    def read(self, env: Mapping[str, str] | None = None) -> str:
        return self.raw(env) or self.default


class Seconds(Variable):
    """A duration in seconds (a float, at least 0); ``default`` when unset or no number."""

    __slots__ = ("default",)

    def __init__(self, name: str, meaning: str, default: float) -> None:
        super().__init__(name, meaning)
        self.default = default

    def read(self, env: Mapping[str, str] | None = None) -> float:
        try:
            return max(0.0, float(self.raw(env) or self.default))
        except ValueError:
            return self.default


class Integer(Variable):
    """A whole number, at least 0; ``default`` when unset or no number."""

    __slots__ = ("default",)

    def __init__(self, name: str, meaning: str, default: int) -> None:
        super().__init__(name, meaning)
        self.default = default

    def read(self, env: Mapping[str, str] | None = None) -> int:
        try:
            return max(0, int(self.raw(env) or self.default))
        except ValueError:
            return self.default


class Flag(Variable):
    """On when set to ``1``; off otherwise (unset, ``0``, anything else)."""

    __slots__ = ()
    default = False

    def read(self, env: Mapping[str, str] | None = None) -> bool:
        return self.raw(env) == "1"


# -- the operator's machine: the command, the launcher, the dashboard -----------------------
HOME = Text("HYPERTF_HOME", "HyperTF's private state directory, 0700 (default ~/.hypertf): "
            "credentials, labs, caches, warm launchers")
INVENTORY = Text("HYPERTF_INVENTORY", "the inventory every command reads when -i/--inventory "
                 "is not given", "inventory/local.yml")
ZK_IDENTITY = Text("HYPERTF_ZK_IDENTITY", "the ZooKeeper identity a command connects as "
                   "(admin, user.bob, agent.<host>; default user.<login>)")
WARM_S = Seconds("HYPERTF_WARM_S", "idle seconds a warm launcher serves 'hypertf train' "
                 "before it ends (0: no warm launcher)", 0.0)
PREFLIGHT_CACHE_S = Seconds("HYPERTF_PREFLIGHT_CACHE_S", "how long a node's preflight answer "
                            "is kept (0: not kept)", 120.0)
PROTOCOL_STRICT = Flag("HYPERTF_PROTOCOL_STRICT", "1: a node message the launcher cannot read "
                       "is a ProtocolError instead of noise (the tests)")
DASHBOARD_TOKEN = Text("HYPERTF_DASHBOARD_TOKEN", "the dashboard's token beyond loopback "
                       "(default a fresh random one per start)")

# -- a task's process: the offload hook (the task's runner sets these) ----------------------
OFFLOAD_CHANNEL = Text("HYPERTF_OFFLOAD_CHANNEL", "the offload agent's channel; the hook "
                       "does nothing without it")
OFFLOAD_MIN_FLOPS = Integer("HYPERTF_OFFLOAD_MIN_FLOPS", "the smallest product (flops) the "
                            "hook offloads; smaller ones stay local", 1 << 24)
OFFLOAD_TIMEOUT = Seconds("HYPERTF_OFFLOAD_TIMEOUT", "seconds the hook waits for the agent "
                          "before computing a product locally", 60.0)
OFFLOAD_STATS = Text("HYPERTF_OFFLOAD_STATS", "the file the hook writes its counts to at "
                     "exit (none: not written)")

VARIABLES: tuple[Variable, ...] = (
    HOME, INVENTORY, ZK_IDENTITY, WARM_S, PREFLIGHT_CACHE_S, PROTOCOL_STRICT, DASHBOARD_TOKEN,
    OFFLOAD_CHANNEL, OFFLOAD_MIN_FLOPS, OFFLOAD_TIMEOUT, OFFLOAD_STATS,
)
