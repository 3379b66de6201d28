"""The matrix keeper: the one actor that decides who gets GPUs (docs/queue.md).

An agent on a keeper host that holds ``keeper/lease`` (``role.KeeperTerm``) runs the pass,
on a thread of its own (``passes``): it keeps the matrix in line with the agents' records,
reports and leases (``sync``), reads the queue (``reader``), screens what can never be
admitted (``screen``) and admits or refuses waiting jobs in one transaction each pass
(``admitter``), with the records and leases kept by watches (``recordcache``,
``leasecache``, ``hostwatch``) and old job records pruned beside it (``prune``).
``thread`` runs the same pass for benches and tests; ``queueview`` shows the queue as the
keeper would decide it.

Between the node and the store in the layers: the store reads and writes znodes, the
keeper decides; a launcher never imports this package (pyproject.toml's contracts).
"""
