"""What a script's source and a task's log say: whether it reads the legacy flags, and why
a task died, in words a user can act on (see TENSORFLOW.md)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

LEGACY_FLAGS = ("ps_hosts", "worker_hosts", "job_name", "task_index")
# A script reads a legacy flag when it defines or parses it: argparse's
# add_argument("--ps_hosts"), a hand-written parser's "--ps_hosts=", absl's and
# tf.compat.v1.flags' DEFINE_string("ps_hosts", ...) or DEFINE_string(name="ps_hosts").
# A bare quoted name elsewhere (an error message in a docstring) does not count.
_FLAG_NAMES = "|".join(LEGACY_FLAGS)
_READS_FLAG = re.compile(
    rf"""["']--(?:{_FLAG_NAMES})["'=]"""
    rf"""|DEFINE_\w+\(\s*(?:name\s*=\s*)?["'](?:{_FLAG_NAMES})["']""")
MAX_SOURCE_BYTES = 4 * 1024 * 1024

# What absl (and tf.compat.v1.flags, which is absl) and argparse print for a flag they do not
# know; the first group is the flag.
_UNKNOWN_FLAG = (
    re.compile(r"Unknown command line flag '(\w+)'"),
    re.compile(rf"unrecognized arguments?: .*?--({_FLAG_NAMES})\b"),
    re.compile(rf"no such option: --({_FLAG_NAMES})\b"),
)
_CAUSE = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception|Exit)\b.*|^(?:F|E)\d{4} .*|FATAL.*|"
                    r"^Killed$|^Segmentation fault.*|^\w+Error: .*")


def reads_legacy_flags(source: str) -> bool:
    """True when the source names --ps_hosts/--worker_hosts/--job_name/--task_index."""
    return bool(_READS_FLAG.search(source))


def files_read_legacy_flags(paths: Iterable[Path]) -> bool:
    """Any of these Python files reads the legacy flags (unreadable ones do not)."""
    for path in paths:
        try:
            with open(path, "rb") as source:
                text = source.read(MAX_SOURCE_BYTES).decode(errors="replace")
        except OSError:
            continue
        if reads_legacy_flags(text):
            return True
    return False


def unknown_legacy_flag(lines: Sequence[str]) -> str | None:
    """The legacy flag a task's log says its script refused, if that is how it died."""
    for line in lines:
        for pattern in _UNKNOWN_FLAG:
            match = pattern.search(line)
            if match and match.group(1) in LEGACY_FLAGS:
                return match.group(1)
    return None


def cause_lines(lines: Sequence[str], limit: int = 4) -> list[str]:
    """The lines that name why a task died: FATAL and error lines, then the last
    traceback's innermost frame and its final line (kept whatever the limit); at most
    ``limit`` lines, in log order."""
    traceback: list[str] = []
    start = max((i for i, line in enumerate(lines)
                 if line.startswith("Traceback (most recent call last)")), default=-1)
    if start >= 0:
        frames = [i for i in range(start, len(lines)) if lines[i].lstrip().startswith('File "')]
        final = next((i for i in range(len(lines) - 1, start, -1)
                      if _CAUSE.match(lines[i].strip())), None)
        traceback = [lines[i].strip() for i in (frames[-1:] + ([final] if final else []))]
    others = [line.strip() for line in lines[:start] if _CAUSE.match(line.strip())] \
        if start >= 0 else [line.strip() for line in lines if _CAUSE.match(line.strip())]
    room = max(0, limit - len(traceback))
    return (others[-room:] if room else []) + traceback
