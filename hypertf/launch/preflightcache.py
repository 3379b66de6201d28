"""Preflight answers kept briefly, so a sweep of short trials or a retried job does not
ask every node again.

A node's answer (venv, work dir, script, legacy flags, tf-keras) is kept for ``ttl`` seconds
(``HYPERTF_PREFLIGHT_CACHE_S``, default 120; 0 turns the cache off) under a key made of
everything the answer depends on: the host's name, address, port, user and key file, the
pinned known_hosts file's content (a host key removed or changed is a miss, so it is
checked, and refused, again), the venv, the work dir, the script's path and the digest of
its content. A failed preflight or a failed start on a host removes the host's entries.
Only answers for a script this machine can read are kept: a script that exists only on
the nodes has no digest to key it by. The start checks the script again anyway (one stat,
in the same command), so a stale answer cannot start a job on a missing script.

The cache is one JSON file in HyperTF's state directory (0600), replaced atomically; two
launchers writing at once may lose an entry, never corrupt the file (it is a cache).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hypertf.config import environment
from hypertf.config.inventory import Node
from hypertf.config.paths import state_home
from hypertf.core import diagnose
from hypertf.core.protocol import PROTOCOL_VERSION

FILE_NAME = "preflight-cache.json"


def ttl_s() -> float:
    """How long an answer is kept: ``HYPERTF_PREFLIGHT_CACHE_S`` (0: never)."""
    return environment.PREFLIGHT_CACHE_S.read()


def _digest(path: str | os.PathLike[str] | None) -> str | None:
    if not path:
        return ""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _script_digest(script: str, files: Sequence[Path] | None = None) -> str | None:
    """The script's content and that of the local modules it imports (its flags may live
    there: ``files``, as diagnose.scan_script found them; scanned here when not given), so
    an edited module beside it is a miss too."""
    path = Path(script)
    digest = hashlib.sha256()
    try:
        for source in (diagnose.scan_script(path).files if files is None else files) or (path,):
            digest.update(str(source).encode() + b"\0" + source.read_bytes())
    except OSError:
        return None
    return digest.hexdigest()


class PreflightCache:
    """Preflight answers per (host, venv, script digest), each valid ``ttl`` seconds."""

    def __init__(self, known_hosts: str, script: str, ttl: float | None = None,
                 path: Path | None = None, clock: Any = time.time,
                 files: Sequence[Path] | None = None) -> None:
        self.ttl = ttl_s() if ttl is None else ttl
        self.path = path
        self.clock = clock
        self._known_hosts = _digest(known_hosts)
        # a relative script is a path on the node (its work dir): no local content to key by
        self._script = ("" if not script else _script_digest(script, files)
                        if Path(script).is_absolute() else None)
        self.script = script

    @property
    def enabled(self) -> bool:
        return self.ttl > 0 and self._script is not None and self._known_hosts is not None

    def key(self, node: Node) -> str:
        parts = [node.name, node.address, str(node.port), node.user or "",
                 node.key_file or "", self._known_hosts or "", node.settings.venv,
                 node.settings.workdir, self.script, self._script or "",
                 f"protocol {PROTOCOL_VERSION}"]  # another launcher version's answers: a miss
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def _file(self) -> Path:
        return self.path or state_home() / FILE_NAME

    def _load(self) -> dict[str, Any]:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self._file().read_text())
            if isinstance(data, dict):
                return data
        return {}

    def _save(self, data: dict[str, Any]) -> None:
        path = self._file()
        now = self.clock()
        fresh = {k: v for k, v in data.items()
                 if isinstance(v, dict) and now - v.get("at", 0) < self.ttl}
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        with contextlib.suppress(OSError):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(fresh, handle)
            os.replace(tmp, path)

    def get(self, nodes: Iterable[Node]) -> dict[str, dict[str, Any]]:
        """The fresh answers among ``nodes``, by host name."""
        if not self.enabled:
            return {}
        data, now = self._load(), self.clock()
        found = {}
        for node in nodes:
            entry = data.get(self.key(node))
            if isinstance(entry, dict) and 0 <= now - entry.get("at", 0) < self.ttl \
                    and isinstance(entry.get("answer"), dict):
                found[node.name] = entry["answer"]
        return found

    def put(self, answers: Iterable[tuple[Node, dict[str, Any]]]) -> None:
        """Keep these hosts' answers (preflights that passed)."""
        answers = list(answers)
        if not self.enabled or not answers:
            return
        data, now = self._load(), self.clock()
        for node, answer in answers:
            data[self.key(node)] = {"host": node.name, "at": now, "answer": answer}
        self._save(data)

    def forget(self, hosts: Iterable[str]) -> None:
        """Drop every entry of these hosts (whatever venv or script): they failed."""
        names = set(hosts)
        if not names or self.ttl <= 0:
            return
        data = self._load()
        kept = {k: v for k, v in data.items() if not (isinstance(v, dict)
                                                       and v.get("host") in names)}
        if len(kept) != len(data):
            self._save(kept)
