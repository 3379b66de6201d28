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
are found from the key alone; every znode carries an ACL (hypertf.store.auth).

Every payload is JSON with a ``format`` number so that a newer HyperTF can refuse (or
upgrade) what an older one wrote instead of misreading it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry, RetryFailedError

from hypertf.config.settings import ClusterSettings
from hypertf.core.errors import StoreError
from hypertf.core.layout import Layout as Layout  # re-exported: part of the store's interface
from hypertf.core.layout import owner_of as owner_of

# re-exported: the record formats are part of the store's interface
from hypertf.core.records import (
    FORMAT as FORMAT,
)
from hypertf.core.records import MAX_ZNODE_BYTES as MAX_ZNODE_BYTES
from hypertf.core.records import AgentRecord as AgentRecord
from hypertf.core.records import GpuInfo as GpuInfo
from hypertf.core.records import GpuProcess as GpuProcess
from hypertf.core.records import decode as decode
from hypertf.core.records import encode as encode
from hypertf.store import auth
from hypertf.store.zkclient import PatientClient, get_many

T = TypeVar("T")
log = logging.getLogger(__name__)


_credentials: weakref.WeakKeyDictionary[KazooClient, auth.Credential] = \
    weakref.WeakKeyDictionary()


def credentials_dir(cluster: ClusterSettings) -> Path:
    return auth.credentials_dir(cluster.zk_credentials, cluster.zookeeper_hosts, cluster.zk_root)


def outage_patience(cluster: ClusterSettings) -> float:
    """How long a long-lived client waits for ZooKeeper to answer again: well past its
    session (a restarted server keeps sessions for a session timeout after it is back).
    Longer means ZooKeeper refuses us: it lost its data and will never take this session
    (it refuses a client that has seen a newer transaction id), so waiting would hang."""
    return max(3 * cluster.zk_session_timeout, 10.0)


def connect(cluster: ClusterSettings, timeout: float = 10.0, identity: str | None = None,
            check: bool = True, long_lived: bool = False,
            on_pause: Callable[[str], None] | None = None,
            also: tuple[str, ...] = ()) -> KazooClient:
    """A started client for the inventory's ZooKeeper, authenticated as ``identity``
    (default ``$HYPERTF_ZK_IDENTITY`` or ``user.<login>``), or a message saying how to
    start ZooKeeper or which credential file to fix. ``check``: the root must exist, be
    secured and accept the credential. Its calls wait out a connection loss
    (hypertf.store.zkclient): a ``long_lived`` client until ZooKeeper answers, its session
    expires or ``outage_patience`` is spent (``on_pause`` hears of the outage once), a
    one-shot one for at most a session timeout. ``also``: further identities this client
    logs in as (a keeper host's agent: ``keeper``)."""
    credential = auth.load(credentials_dir(cluster), identity or auth.default_identity())
    extra = [auth.load(credentials_dir(cluster), name) for name in also]
    tls = {"use_ssl": True, "ca": cluster.zk_tls_ca, "verify_certs": True} \
        if cluster.zk_tls_ca else {}
    client = PatientClient(
        patience_s=outage_patience(cluster) if long_lived else cluster.zk_session_timeout,
        on_pause=on_pause,
        hosts=cluster.zookeeper_hosts,
        timeout=cluster.zk_session_timeout,
        # Reconnect attempts at most 0.5 s apart: a restarted ZooKeeper keeps a session only
        # for one session timeout after it serves again (4 s in the lab), and a slow JVM
        # start on a busy machine leaves little of it; a longer backoff missed it (issue 27).
        connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 0.5},
        command_retry={"max_tries": 5, "delay": 0.2, "max_delay": 2.0},
        logger=logging.getLogger("hypertf.kazoo"),
        auth_data=credential.auth_data() + [
            ("digest", f"{other.identity}:{other.secret}") for other in extra],
        **tls,
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
    _credentials[client] = credential
    if check:
        try:
            auth.check_access(client, cluster.zk_root, credential)
        except BaseException:
            close(client)
            raise
    return client


def secure_cluster(cluster: ClusterSettings, hosts: list[str], users: list[str] | None = None,
                   reset: bool = False, matrix_hosts: int = 0) -> Path:
    """``hypertf auth init``: credentials for the admin, every host's agent, the running
    user and ``users``, then the secured root. Idempotent; returns the directory.
    ``matrix_hosts``: shard the matrix for at least that many hosts (benches whose hosts
    have no credential)."""
    directory = credentials_dir(cluster)
    auth.ensure_credentials(directory, hosts, [auth.job_owner(), *(users or [])])
    client = connect(cluster, identity="admin", check=False)
    try:
        auth.secure_root(client, cluster.zk_root, directory, reset=reset,
                         hosts=matrix_hosts)
    finally:
        close(client)
    return directory


def credential_of(client: KazooClient) -> auth.Credential:
    """The credential a client from ``connect`` authenticated with."""
    return _credentials[client]


def acls(client: KazooClient) -> auth.Acls:
    """The ACLs this client writes on the znodes it creates."""
    return auth.Acls(_credentials[client])


def close(client: KazooClient) -> None:
    """Stop and close; ephemeral nodes of this session go away at once."""
    try:
        client.stop()
    finally:
        client.close()


def _children(client: KazooClient, path: str) -> list[str]:
    try:
        return sorted(client.get_children(path))
    except NoNodeError:
        return []


@dataclass(frozen=True)
class Store:
    """One cluster's ZooKeeper: the client and the layout of its root, always together.
    The reads are here; hypertf.store.allocation's version-checked writes take a Store."""

    client: KazooClient
    layout: Layout

    @property
    def acls(self) -> auth.Acls:
        """The ACLs this client writes on the znodes it creates."""
        return acls(self.client)

    @property
    def credential(self) -> auth.Credential:
        return credential_of(self.client)

    def hosts(self) -> list[str]:
        """Every registered host (live or not)."""
        return _children(self.client, self.layout.hosts)

    def live_hosts(self) -> list[str]:
        """Hosts whose agent record exists: one listing and multi-reads (no parse)."""
        return sorted(self.raw_records(self.hosts()))

    def raw_records(self, hosts: Iterable[str]) -> dict[str, bytes]:
        """The record bytes of the ``hosts`` that have one, in multi-reads (zkclient.get_many:
        10,000 hosts in 0.1 s instead of 2-3 s of single gets)."""
        hosts = list(hosts)
        found: dict[str, bytes] = {}
        results = get_many(self.client, [self.layout.resource(host) for host in hosts])
        for host, result in zip(hosts, results, strict=True):
            if isinstance(result, NoNodeError):
                continue  # no agent (or it went between the listing and the read)
            if isinstance(result, Exception):
                raise result
            found[host] = result[0]
        return found

    def records(self, only: Iterable[str] | None = None) -> dict[str, AgentRecord]:
        """Every live agent's record (or those of the ``only`` hosts: no listing then; a host
        without a record, registered or not, is left out), keyed by host name."""
        hosts = self.hosts() if only is None else sorted(set(only))
        return {host: AgentRecord.from_json(data)
                for host, data in self.raw_records(hosts).items()}

    def _keys_of_every_user(self, parent: str) -> list[str]:
        """The task keys under each user's folder that are that user's: a key is counted
        only under its owner (a user may create ``leases/mallory/<bob's key>`` in its own
        folder; that must not keep bob's job alive, nor end it)."""
        keys: list[str] = []
        for user in _children(self.client, parent):
            with contextlib.suppress(NoNodeError):  # a user removed meanwhile
                keys.extend(key for key in self.client.get_children(f"{parent}/{user}")
                            if key.endswith(f".{user}") and key.partition(".")[2] == user)
        return keys

    def leases(self) -> set[str]:
        """Task keys whose launcher is still alive (a lease counts only under its key's
        owner)."""
        return set(self._keys_of_every_user(self.layout.leases))

    def job_keys(self) -> list[str]:
        """Every job record's task key, of every user."""
        return self._keys_of_every_user(self.layout.jobs)

    def records_soon(self, wanted: Iterable[str], window_s: float,
                     say: Callable[[str], None] = lambda _line: None,
                     ) -> dict[str, AgentRecord]:
        """``records(only=wanted)``; when none of them has a record yet and the admin made
        the root's hosts folder less than ``window_s`` ago (``hypertf auth init`` after
        ZooKeeper lost its data: the agents are running and re-register within their retry
        period), wait for the first until then, saying so once."""
        wanted = list(wanted)
        found = self.records(only=wanted)
        stat = None if found else self.client.exists(self.layout.hosts)
        if stat is None:
            return found
        deadline = stat.ctime / 1000 + window_s
        if time.time() >= deadline:
            return found
        say(f"hypertf: ZooKeeper's root {self.layout.root} was secured "
            f"{time.time() - stat.ctime / 1000:.0f} s ago and no agent has registered yet: "
            f"waiting up to {deadline - time.time():.0f} s for them")
        while not found and time.time() < deadline:
            time.sleep(0.5)
            found = self.records(only=wanted)
        return found

    def publish_record(self, record: AgentRecord) -> str:
        """An agent writes its own record, creating it if missing: "created", "updated",
        "older-session" (a record of this agent's previous session, after a restart within
        the session timeout: an agent may not delete records, so it waits for that one to
        expire) or "taken" (another session created it meanwhile)."""
        path = self.layout.resource(record.host)
        data = record.to_json()
        stat = self.client.exists(path)
        if stat is None:
            try:
                self.client.create(path, data, acl=self.acls.agent_record(), ephemeral=True)
            except NodeExistsError:
                return "taken"
            return "created"
        if stat.ephemeralOwner != self.client.client_id[0]:
            return "older-session"
        self.client.set(path, data)
        return "updated"

    def take_keeper_lease(self, host: str, watch: Callable[..., Any]) -> str:
        """The matrix keeper holds ``keeper/lease``, an ephemeral znode of its own session:
        the first agent to create it keeps until its session ends (a clean stop at once, a
        SIGKILL or a cut-off host after the session timeout); every agent watches it and the
        next to try takes over. Returns "held", "taken" (now), or "other". A root secured
        by an older HyperTF has no ``keeper/``: the lowest-named live agent keeps then."""
        path = self.layout.keeper_lease
        try:
            stat = self.client.exists(path, watch=watch)
            if stat is not None:
                return "held" if stat.ephemeralOwner == self.client.client_id[0] else "other"
            self.client.create(path, host.encode(), acl=self.acls.keeper_lease(),
                               ephemeral=True)
        except NodeExistsError:
            return "other"  # another agent took it first
        except NoNodeError:
            live = self.live_hosts()
            return "held" if live and min(live) == host else "other"
        return "taken"


class RecordCache:
    """The keeper's parsed copy of the agents' records: every pass reads them all (one
    multi-read per 256 hosts: 0.1 s for 10,000) and parses again only those whose bytes
    changed; an idle agent's record does not (parsing 10,000 records is ~0.7 s)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._parsed: dict[str, tuple[bytes, AgentRecord]] = {}

    def records(self, hosts: Iterable[str]) -> dict[str, AgentRecord]:
        """The records of ``hosts`` that exist (as ``Store.records(only=hosts)``)."""
        parsed = {}
        for host, data in self.store.raw_records(hosts).items():
            known = self._parsed.get(host)
            if known is None or known[0] != data:
                known = (data, AgentRecord.from_json(data))
            parsed[host] = known
        self._parsed = parsed  # hosts gone are forgotten
        return {host: record for host, (_, record) in parsed.items()}


class HostWatch:
    """Calls ``wake`` whenever a host is registered or its agent record comes or goes: a
    watch on ``hosts`` and one on each host's folder (the record is a grandchild of
    ``hosts``, so one watch there cannot see it). ``watch_records(changed)``: also calls
    ``changed`` whenever a record's content changes (the keeper's matrix follows them)."""

    def __init__(self, client: KazooClient, layout: Layout, wake: Callable[..., Any]) -> None:
        self.client = client
        self.layout = layout
        self.wake = wake
        self.watched: set[str] = set()
        self.changed: Callable[[], Any] | None = None
        self._records: set[str] = set()
        client.ChildrenWatch(layout.hosts, self._on_hosts)

    def _on_hosts(self, hosts: list[str]) -> Any:
        for host in sorted(set(hosts) - self.watched):
            self.watched.add(host)
            self.client.ChildrenWatch(self.layout.host(host), self.wake)
        self._watch_records()
        return self.wake()

    def watch_records(self, changed: Callable[[], Any]) -> None:
        """From now on, ``changed()`` after every change of a host's record (idempotent)."""
        self.changed = changed
        self._watch_records()

    def _watch_records(self) -> None:
        if self.changed is None:
            return
        for host in sorted(self.watched - self._records):
            self._records.add(host)
            self.client.DataWatch(self.layout.resource(host), self._on_record)

    def _on_record(self, _data: bytes | None, _stat: object) -> bool:
        if self.changed is not None:
            self.changed()
        return True  # keep watching


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


def until_committed(attempt: Callable[[int], T], what: str, deadline_s: float | None = 30.0,
                    max_tries: int = 200) -> T:
    """Run a version-checked read-modify-write until it commits, kazoo's way: ``attempt``
    (given how many tries lost so far) raises ``ForceRetryError`` when another writer won;
    ``KazooRetry`` retries that (and a lost connection) with backoff and jitter."""
    tries = itertools.count()
    retry = KazooRetry(max_tries=max_tries, delay=0.005, backoff=2, max_jitter=0.8,
                       max_delay=0.2, deadline=deadline_s)
    try:
        result: T = retry(lambda: attempt(next(tries)))
        return result
    except RetryFailedError:
        raise StoreError(f"gave up {what} after {next(tries) - 1} tries lost to other "
                         f"writers") from None
