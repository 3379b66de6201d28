"""The ZooKeeper layout and record formats, in one place (see docs/zookeeper-layout.md).

::

    <root>/hosts/<host>        persistent a registered host (the admin's): its agent's folder
    <root>/hosts/<host>/agent  ephemeral  AgentRecord: one node's addresses, port and GPUs
    <root>/matrix              persistent MatrixIndex: how many shards hold the matrix
    <root>/matrix/<i>          persistent Matrix: the rows (free / unavailable / task key) of
                                          the hosts whose name hashes to shard i
    <root>/jobs/<user>/<task_key>    persistent JobRecord: request, placement, ports, state
    <root>/leases/<user>/<task_key>  ephemeral  held by the launcher's session while the job lives
    <root>/keeper/lease        ephemeral  held by the session of the agent that keeps the matrix
    <root>/keeper/queue        ephemeral  the keeper's view of the queue (position, reason)

A task key ends with its owner (``20261122-085000-a1b2c3.alice``), so the owner's parents
are found from the key alone; every znode carries an ACL (hypertf.store.acltable).

Every payload is JSON with a ``format`` number so that a newer HyperTF can refuse (or
upgrade) what an older one wrote instead of misreading it.
"""

from __future__ import annotations

# re-exported: the layout and the record formats are part of the store's interface
from hypertf.core.layout import Layout, owner_of
from hypertf.core.records import (
    FORMAT,
    MAX_ZNODE_BYTES,
    AgentRecord,
    GpuInfo,
    GpuProcess,
    decode,
    encode,
)
from hypertf.store import acltable, bootstrap, credentials, fourletter, quotas
from hypertf.store.connection import (
    acls,
    close,
    connect,
    credential_of,
    credentials_dir,
    outage_patience,
    secure_cluster,
)
from hypertf.store.retry import until_committed
from hypertf.store.session import Store, opened
from hypertf.store.zkstore import LeaseState, RecordWrite, StoreReads

__all__ = [
    "FORMAT",
    "MAX_ZNODE_BYTES",
    "AgentRecord",
    "GpuInfo",
    "GpuProcess",
    "Layout",
    "LeaseState",
    "RecordWrite",
    "Store",
    "StoreReads",
    "acls",
    "acltable",
    "bootstrap",
    "close",
    "connect",
    "credential_of",
    "credentials",
    "credentials_dir",
    "decode",
    "encode",
    "fourletter",
    "opened",
    "outage_patience",
    "owner_of",
    "quotas",
    "secure_cluster",
    "until_committed",
]
