"""Connecting to the cluster's ZooKeeper: as which identity, how patiently, and making its
root secure (``hypertf auth init``). Every client HyperTF makes comes from ``connect``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from hypertf.config.settings import ClusterSettings
from hypertf.core.errors import StoreError
from hypertf.store import acltable, bootstrap, credentials, quotas
from hypertf.store.zkclient import PatientClient

__all__ = ["acls", "close", "connect", "credential_of", "credentials_dir", "outage_patience",
           "secure_cluster"]

def credentials_dir(cluster: ClusterSettings) -> Path:
    return credentials.credentials_dir(cluster.zk_credentials, cluster.zookeeper_hosts,
                                       cluster.zk_root)


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
    credential = credentials.load(credentials_dir(cluster),
                                  identity or credentials.default_identity())
    extra = [credentials.load(credentials_dir(cluster), name) for name in also]
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
        ) from err
    client.credential = credential
    if check:
        try:
            bootstrap.check_access(client, cluster.zk_root, credential)
        except BaseException:
            close(client)
            raise
    return client


def secure_cluster(cluster: ClusterSettings, hosts: list[str], users: list[str] | None = None,
                   reset: bool = False, matrix_hosts: int = 0, own_server: bool = False) -> Path:
    """``hypertf auth init``: credentials for the admin, every host's agent, the running
    user and ``users``, then the secured root. Idempotent; returns the directory.
    ``matrix_hosts``: shard the matrix for at least that many hosts (benches whose hosts
    have no credential)."""
    directory = credentials_dir(cluster)
    credentials.ensure_credentials(directory, hosts, [credentials.job_owner(), *(users or [])])
    client = connect(cluster, identity="admin", check=False)
    try:
        bootstrap.secure_root(client, cluster.zk_root, directory, reset=reset,
                              hosts=matrix_hosts, own_server=own_server,
                              quotas=quotas.UserQuotas.of(
                             cluster.user_queue_limit, cluster.job_records_max,
                             cluster.user_records_mb))
    finally:
        close(client)
    return directory


def credential_of(client: KazooClient) -> credentials.Credential:
    """The credential a client from ``connect`` authenticated with (it keeps it)."""
    credential = client.credential if isinstance(client, PatientClient) else None
    if credential is None:
        raise StoreError("this ZooKeeper client was not made by hypertf.store.connect: it "
                         "has no credential")
    return credential


def acls(client: KazooClient) -> acltable.Acls:
    """The ACLs this client writes on the znodes it creates."""
    return acltable.Acls(credential_of(client))


def close(client: KazooClient) -> None:
    """Stop and close; ephemeral nodes of this session go away at once."""
    try:
        client.stop()
    finally:
        client.close()
