"""Where HyperTF keeps local state (ZooKeeper data, labs): one place, overridable."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hypertf.config import environment

if TYPE_CHECKING:
    from pathlib import Path


def state_home_str() -> str:
    """``$HYPERTF_HOME`` or ``~/.hypertf``; created with 0700 because it holds private keys.
    As a string, for the command's entry (hypertf.cli.warm), which imports no pathlib."""
    home = environment.HOME.read() or os.path.join(os.path.expanduser("~"), ".hypertf")
    os.makedirs(home, mode=0o700, exist_ok=True)
    return home


def state_home() -> Path:
    """``state_home_str()`` as a Path."""
    from pathlib import Path

    return Path(state_home_str())
