"""Python's cyclic garbage collector, set for processes that hold a large cluster.

With the default thresholds (700, 10, 10) a collection runs every 700 new containers, and
a full one whenever the old generation grew by a quarter. A keeper pass or a status at
10,000 hosts makes about a million containers (the agents' records, 16 MB of JSON), so
full collections walked every object the process held, again and again: measured in
``bench/scale.py`` at 10,000 hosts, with (100,000, 50, 100) instead of the defaults, the
keeper's pass that admits went from 0.99 s to 0.36 s, submit -> granted from 0.49 to
0.20 s and the inventory from its cache from 0.29 s to 0.04 s. Reference counting still
frees everything that is not in a cycle at once; cycles wait longer to be collected.
"""

from __future__ import annotations

import gc

THRESHOLDS = (100_000, 50, 100)  # new containers per young collection; its multiples


def tune() -> None:
    """Fewer collections for this process: called first by every HyperTF process that
    reads ZooKeeper (the commands, the agent and its keeper)."""
    gc.set_threshold(*THRESHOLDS)
