"""A task that waits, before it serves, for a file it expects another task to write in the
working directory (each HyperTF task has its own, so it never comes): it says so once and
then blocks in silence (issue 54, defect 6)."""

from __future__ import annotations

import argparse
import os
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wait_for", default="vocab.txt")
    args, _ = parser.parse_known_args()
    print(f"waiting for {args.wait_for}", flush=True)
    while not os.path.exists(args.wait_for):
        time.sleep(0.2)
    print(f"found {args.wait_for}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
