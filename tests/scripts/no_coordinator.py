"""A script that says it rendezvouses on a coordinator (it imports jax: the launcher's scan
reads imports, it never runs them) but whose rank 0 never opens its port: it prints a line
a second for ``argv[1]`` seconds (30 by default) and exits 0. Every task writes, none
listens."""

from __future__ import annotations

import os
import sys
import time

if os.environ.get("NEVER"):  # never true: the import is only what the scan reads
    import jax  # noqa: F401


def main() -> int:
    seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    for second in range(seconds):
        print(f"{os.environ.get('HYPERTF_TASK')}: step {second}", flush=True)
        time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
