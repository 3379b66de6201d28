"""The ZooKeeper layout and record formats, in one place (see docs/zookeeper-layout.md).

::

    <root>/resources/<host>    ephemeral  AgentRecord: one node's addresses, port and GPUs
    <root>/matrix              persistent Matrix: servers x GPUs (free / unavailable / task key)
    <root>/jobs/<task_key>     persistent JobRecord: request, placement, ports, state
    <root>/leases/<task_key>   ephemeral  held by the launcher's session while the job lives

Every payload is JSON with a ``format`` number so that a newer HyperTF can refuse (or
upgrade) what an older one wrote instead of misreading it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from hypertf.errors import StoreError
from hypertf.inventory import ClusterSettings

FORMAT = 1
# ZooKeeper refuses a znode larger than jute.maxbuffer (1 MiB by default); stay under it.
MAX_ZNODE_BYTES = 1024 * 1024 - 1024
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Layout:
    """The znode paths under one root; nothing else spells them out."""

    root: str = "/hypertf"

    @property
    def resources(self) -> str:
        return f"{self.root}/resources"

    @property
    def matrix(self) -> str:
        return f"{self.root}/matrix"

    @property
    def jobs(self) -> str:
        return f"{self.root}/jobs"

    @property
    def leases(self) -> str:
        return f"{self.root}/leases"

    def resource(self, host: str) -> str:
        return f"{self.resources}/{host}"

    def job(self, task_key: str) -> str:
        return f"{self.jobs}/{task_key}"

    def lease(self, task_key: str) -> str:
        return f"{self.leases}/{task_key}"

    def ensure(self, client: KazooClient) -> None:
        """Create the persistent parents; idempotent, safe to race."""
        for path in (self.resources, self.jobs, self.leases):
            client.ensure_path(path)


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the agent saw it."""

    index: int
    name: str
    uuid: str
    utilization: float  # percent
    memory_used: int  # bytes
    memory_total: int  # bytes
    available: bool


@dataclass(frozen=True)
class AgentRecord:
    """The per-node record of the original design, plus detail.

    ``gpu`` and ``gpu_avail_list`` keep the original field names: 4 GPUs of which #1, #2
    and #4 are idle give ``gpu=4, gpu_avail_list=[0, 1, 3]``.
    """

    host: str
    mgmt_addr: str
    data_addr: str
    port: int
    gpu: int
    gpu_avail_list: list[int]
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_source: str = "none"
    heartbeat: float = 0.0
    pid: int = 0
    hostname: str = ""

    def to_json(self) -> bytes:
        return encode({**asdict(self)})

    @classmethod
    def from_json(cls, data: bytes) -> AgentRecord:
        payload = decode(data, "agent record")
        try:
            payload["gpus"] = [GpuInfo(**gpu) for gpu in payload.get("gpus", [])]
            return cls(**payload)
        except TypeError as err:  # missing or unknown fields: a damaged or foreign record
            host = payload.get("host", "?")
            raise StoreError(f"ZooKeeper holds an unreadable agent record (host {host!r}): "
                             f"{err}; restart that host's agent to rewrite it") from None


def encode(payload: dict[str, Any]) -> bytes:
    """JSON bytes with the format number first; refuses what ZooKeeper would refuse."""
    fields = {key: value for key, value in payload.items() if key != "format"}
    data = json.dumps({"format": FORMAT, **fields}, separators=(",", ":")).encode()
    if len(data) > MAX_ZNODE_BYTES:
        raise StoreError(
            f"a record of {len(data)} bytes is over ZooKeeper's 1 MiB znode limit "
            f"(jute.maxbuffer): split the cluster into several hypertf_zk_root roots, or "
            f"raise jute.maxbuffer on every ZooKeeper server and client"
        )
    return data


def decode(data: bytes, what: str) -> dict[str, Any]:
    """Parse a record, refusing formats this version does not know."""
    try:
        payload = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StoreError(f"ZooKeeper holds an unreadable {what}: {err}") from None
    if not isinstance(payload, dict):
        raise StoreError(
            f"ZooKeeper holds an unreadable {what}: expected a JSON object, "
            f"got {type(payload).__name__}"
        )
    version = payload.pop("format", None)
    if type(version) is not int or version != FORMAT:
        raise StoreError(
            f"ZooKeeper holds a {what} in format {version!r}; this HyperTF reads format "
            f"{FORMAT}: upgrade HyperTF on every node, or use another hypertf_zk_root"
        )
    return payload


def connect(cluster: ClusterSettings, timeout: float = 10.0) -> KazooClient:
    """A started client for the inventory's ZooKeeper, or a message saying how to start one."""
    client = KazooClient(
        hosts=cluster.zookeeper_hosts,
        timeout=cluster.zk_session_timeout,
        connection_retry={"max_tries": -1, "delay": 0.2, "max_delay": 2.0},
        command_retry={"max_tries": 5, "delay": 0.2, "max_delay": 2.0},
        logger=logging.getLogger("hypertf.kazoo"),
    )
    try:
        client.start(timeout=timeout)
    except (KazooTimeoutError, KazooException, OSError) as err:
        client.stop()
        client.close()
        raise StoreError(
            f"cannot reach ZooKeeper at {cluster.zookeeper_hosts} ({err or 'timed out'}): "
            f"start it with 'invoke zk.start' or fix hypertf_zookeeper_hosts in the inventory"
        ) from None
    return client


def close(client: KazooClient) -> None:
    """Stop and close; ephemeral nodes of this session go away at once."""
    try:
        client.stop()
    finally:
        client.close()


def read_records(client: KazooClient, layout: Layout,
                 only: Iterable[str] | None = None) -> dict[str, AgentRecord]:
    """Every live agent's record (or those of the ``only`` hosts), keyed by host name."""
    records: dict[str, AgentRecord] = {}
    try:
        hosts = client.get_children(layout.resources)
    except NoNodeError:
        return records
    if only is not None:
        hosts = sorted(set(hosts) & set(only))
    for host in hosts:
        try:
            data, _ = client.get(layout.resource(host))
        except NoNodeError:
            continue  # the agent went away between the two reads
        records[host] = AgentRecord.from_json(data)
    return records


def read_leases(client: KazooClient, layout: Layout) -> set[str]:
    """Task keys whose launcher is still alive."""
    try:
        return set(client.get_children(layout.leases))
    except NoNodeError:
        return set()
