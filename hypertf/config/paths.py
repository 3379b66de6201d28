"""Where HyperTF keeps local state (ZooKeeper data, labs): one place, overridable."""

from __future__ import annotations

import os
from pathlib import Path


def state_home() -> Path:
    """``$HYPERTF_HOME`` or ``~/.hypertf``; created with 0700 because it holds private keys."""
    home = Path(os.environ.get("HYPERTF_HOME") or Path.home() / ".hypertf")
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home

