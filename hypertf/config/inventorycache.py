"""The parsed inventory, kept between commands: parsing 1,000 hosts with ansible-core takes
over a second, and every command starts by it.

The cache entry is keyed by what the parse read: every file of the inventory (the file with
its group_vars/host_vars, or every file of an inventory directory) by path and content
digest (not the modification time alone: a file rewritten within the same clock tick keeps
it), the user's home (``~`` in paths is expanded), and HyperTF's own parser (its source
files' digests: a new HyperTF parses again). Any change parses again; hashing 1,000 hosts'
inventory takes about a millisecond. Entries are private files (0600) under
``$HYPERTF_HOME/cache``; a damaged or foreign one is ignored. What is not seen: a value
that would change without a file changing (none today: the inventory is read without
templating).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from hypertf.config.paths import state_home

T = TypeVar("T")
FORMAT = 1
PARSER_FILES = ("inventory.py", "settings.py", "yamlguard.py", "inventorycache.py")


def cache_dir() -> Path:
    return state_home() / "cache" / "inventories"


def key_of(path: Path, files: Sequence[Path]) -> str:
    """What the parse depends on, as one string."""
    here = Path(__file__).parent
    parts = [f"format {FORMAT}", f"home {os.environ.get('HOME', '')}", f"path {path.resolve()}"]
    for file in [*files, *(here / name for name in PARSER_FILES)]:
        try:
            digest = hashlib.sha256(file.read_bytes()).hexdigest()
        except OSError:
            digest = "unreadable"
        parts.append(f"{file} {digest}")
    return "\n".join(parts)


def cached(path: Path, files: Sequence[Path], parse: Callable[[], T]) -> T:
    """``parse()``'s result for these files: from the cache when nothing changed."""
    key = key_of(path, files)
    entry = cache_dir() / f"{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]}.pickle"
    with contextlib.suppress(OSError, pickle.UnpicklingError, EOFError, AttributeError,
                             ImportError, ValueError, TypeError):
        if entry.stat().st_uid == os.getuid():
            stored_key, value = pickle.loads(entry.read_bytes())
            if stored_key == key:
                return value  # type: ignore[no-any-return]
    value = parse()
    with contextlib.suppress(OSError, pickle.PicklingError, TypeError):
        entry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = entry.with_name(f".{entry.name}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            pickle.dump((key, value), out)
        os.replace(tmp, entry)
    return value
