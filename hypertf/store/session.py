"""``Store``: one ZooKeeper session, and everything tied to it.

A ``Store`` is made once per connection (``opened``, or ``Store(connect(...), layout)``) and
owns what that session knows: the credential it logged in with and the ACLs it writes
(``StoreReads``), and its recipes, kazoo-style, made with it:

- ``matrix`` (``allocation.StoredMatrix``): the sharded GPU matrix, its shard count and
  the grant watches this session's launcher set;
- ``queue`` (``waitqueue.JobQueue``): submitting, waiting, the grants, the watches its
  enqueue set for its own waiter;
- ``jobs`` (``jobs.JobRecords``): job records, and the records this session wrote itself
  (``jobs.known``), so that its next write needs no read.

A reconnect with a new client (the agent's, after a long outage) makes a new ``Store``: no
cache outlives the session it was learnt in. What kazoo itself keeps per client (the
batching, the watch taps) is on the client (``zkclient.PatientClient``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from kazoo.client import KazooClient

from hypertf.config.settings import ClusterSettings
from hypertf.core.layout import Layout
from hypertf.store.allocation import StoredMatrix
from hypertf.store.connection import close, connect
from hypertf.store.jobs import JobRecords
from hypertf.store.knownrecords import KnownRecords
from hypertf.store.waitqueue import JobQueue
from hypertf.store.zkstore import StoreReads

__all__ = ["Store", "opened"]


class Store(StoreReads):
    """One session's store: the reads (``StoreReads``) and its recipes."""

    def __init__(self, client: KazooClient, layout: Layout) -> None:
        super().__init__(client, layout)
        known = KnownRecords()
        self.jobs = JobRecords(self, known)
        self.matrix = StoredMatrix(self, known)
        self.queue = JobQueue(self, self.matrix, self.jobs)


@contextlib.contextmanager
def opened(cluster: ClusterSettings, long_lived: bool = False,
           on_pause: Callable[[str], None] | None = None) -> Iterator[Store]:
    """A command's Store: connected as the default identity, closed after (``long_lived``:
    it waits out ZooKeeper outages, see ``connect``)."""
    client = connect(cluster, long_lived=long_lived, on_pause=on_pause)
    try:
        yield Store(client, Layout(cluster.zk_root))
    finally:
        close(client)
