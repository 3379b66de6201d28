"""``StoreReads``: one ZooKeeper session's client, the layout of its root and the credential
it logged in with, together, with the reads every part shares (hosts, agent records,
leases, job keys) and the two writes an agent makes about itself (its record, the keeper
lease). The outcomes of those writes are enums (``RecordWrite``, ``LeaseState``), never
bare strings. hypertf.store.session.Store adds the recipes (matrix, queue, job records);
the recipes are handed this base, so none of them imports the session.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from hypertf.core.errors import StoreError
from hypertf.core.layout import RESOURCE_LEAF, Layout, is_task_key
from hypertf.core.records import AgentRecord
from hypertf.store import acltable, credentials
from hypertf.store.connection import credential_of
from hypertf.store.zkclient import get_many, pipelined

log = logging.getLogger(__name__)

__all__ = ["LeaseState", "RecordWrite", "StoreReads"]


class RecordWrite(StrEnum):
    """What an agent's write of its own record did."""

    CREATED = "created"
    UPDATED = "updated"
    OLDER_SESSION = "older-session"  # its previous session's record: wait for it to expire
    TAKEN = "taken"  # another session created it meanwhile


class LeaseState(StrEnum):
    """The keeper lease, as an agent that tried to take it sees it."""

    HELD = "held"  # this session holds it (since before)
    TAKEN = "taken"  # this session took it now
    OTHER = "other"  # another agent keeps


def _children(client: KazooClient, path: str) -> list[str]:
    try:
        return sorted(client.get_children(path))
    except NoNodeError:
        return []


class StoreReads:
    """One cluster's ZooKeeper as one session sees it: the client, the layout of its root
    and the credential, always together, and what this session remembers (which hosts'
    unreadable records it has logged)."""

    def __init__(self, client: KazooClient, layout: Layout) -> None:
        self.client = client
        self.layout = layout
        self._acls: acltable.Acls | None = None
        self._said_unreadable: dict[str, str] = {}  # host -> the last reason logged

    @property
    def credential(self) -> credentials.Credential:
        """Whom this session logged in as (``connect``)."""
        return credential_of(self.client)

    @property
    def acls(self) -> acltable.Acls:
        """The ACLs this session writes on the znodes it creates."""
        if self._acls is None:
            self._acls = acltable.Acls(self.credential)
        return self._acls

    def check_registered(self, user: str) -> None:
        """Asked only after a refused request: a user without parents cannot hold a job."""
        if self.client.exists(self.layout.user_leases(user)) is None:
            raise StoreError(f"user {user!r} is not registered in ZooKeeper root "
                             f"{self.layout.root}: the cluster admin runs 'hypertf auth "
                             f"add-user {user}'")

    def hosts(self) -> list[str]:
        """Every registered host (live or not)."""
        return _children(self.client, self.layout.hosts)

    def live_hosts(self) -> list[str]:
        """Hosts whose agent record exists: one listing, then each host's folder's children
        in multi-reads (at 25,000 hosts a few hundred KB, not the records' 37 MB)."""
        hosts = self.hosts()
        folders = get_many(self.client, [self.layout.host(host) for host in hosts],
                           children=True)
        return sorted(host for host, names in zip(hosts, folders, strict=True)
                      if isinstance(names, list) and RESOURCE_LEAF in names)

    def raw_records(self, hosts: Iterable[str]) -> dict[str, bytes]:
        """The record bytes of the ``hosts`` that have one, in multi-reads (zkclient.get_many:
        10,000 hosts in 0.1 s instead of 2-3 s of single gets)."""
        return {host: data for host, (data, _) in self.raw_records_written(hosts).items()}

    def raw_records_written(self, hosts: Iterable[str]) -> dict[str, tuple[bytes, float]]:
        """``raw_records`` with when each was last written (seconds since the epoch), by
        ZooKeeper's clock (the znode's mtime), never the agent's own: a skewed or lying
        node's record cannot look fresher than it is."""
        hosts = list(hosts)
        found: dict[str, tuple[bytes, float]] = {}
        results = get_many(self.client, [self.layout.resource(host) for host in hosts])
        for host, result in zip(hosts, results, strict=True):
            if isinstance(result, NoNodeError):
                continue  # no agent (or it went between the listing and the read)
            if isinstance(result, Exception):
                raise result
            found[host] = (result[0], result[1].mtime / 1000)
        return found

    def records(self, only: Iterable[str] | None = None) -> dict[str, AgentRecord]:
        """Every live agent's record (or those of the ``only`` hosts: no listing then; a host
        without a record, registered or not, is left out), keyed by host name."""
        hosts = self.hosts() if only is None else sorted(set(only))
        return self.parse_records(self.raw_records(hosts))

    def _keys_of_every_user(self, parent: str) -> list[str]:
        """The task keys under each user's folder that are that user's: a key is counted
        only under its owner (a user may create ``leases/mallory/<bob's key>`` in its own
        folder; that must not keep bob's job alive, nor end it), and a name that is not a
        task key (``is_task_key``: a 100 KB name, a stray folder) is skipped, so no junk
        reaches a decision or a command's output. Each folder's size is bounded by the
        quota ``auth init`` sets; only the keeper and commands list them, never every
        agent (``leases_of``)."""
        return [key for user in self.users(parent) for key in self.keys_of(parent, user)]

    def users(self, parent: str) -> list[str]:
        """The users with a folder under ``parent`` (``leases`` or ``jobs``), sorted."""
        return _children(self.client, parent)

    def keys_of(self, parent: str, user: str) -> list[str]:
        """The task keys in ``user``'s folder under ``parent`` that are ``user``'s (junk
        names skipped: ``is_task_key``); none when the folder is gone."""
        try:
            names = self.client.get_children(f"{parent}/{user}")
        except NoNodeError:  # a user removed meanwhile
            return []
        return [key for key in names if is_task_key(key, owner=user)]

    def leases(self) -> set[str]:
        """Task keys whose launcher is still alive (a lease counts only under its key's
        owner). Lists every user's folder: the keeper's and commands' read; an agent asks
        about its own keys with ``leases_of``."""
        return set(self._keys_of_every_user(self.layout.leases))

    def leases_of(self, keys: Iterable[str], watch: Callable[..., Any] | None = None,
                  ) -> set[str]:
        """Which of ``keys`` still have their lease: one pipelined ``exists`` each (an
        agent's runs and its row's jobs, a few), never a listing whose size a user
        controls. ``watch`` (a data watch on each lease) fires when one goes."""
        wanted = sorted({key for key in keys if is_task_key(key)})
        with pipelined(self.client):
            pending = [(key, self.client.exists_async(self.layout.lease(key), watch=watch))
                       for key in wanted]
        return {key for key, result in pending if result.get(timeout=30) is not None}

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

    def publish_record(self, record: AgentRecord) -> RecordWrite:
        """An agent writes its own record, creating it if missing: CREATED, UPDATED,
        OLDER_SESSION (a record of this agent's previous session, after a restart within
        the session timeout: an agent may not delete records, so it waits for that one to
        expire) or TAKEN (another session created it meanwhile)."""
        path = self.layout.resource(record.host)
        data = record.to_json()
        stat = self.client.exists(path)
        if stat is None:
            try:
                self.client.create(path, data, acl=self.acls.agent_record(), ephemeral=True)
            except NodeExistsError:
                return RecordWrite.TAKEN
            return RecordWrite.CREATED
        if stat.ephemeralOwner != self.client.client_id[0]:
            return RecordWrite.OLDER_SESSION
        self.client.set(path, data)
        return RecordWrite.UPDATED

    def take_keeper_lease(self, host: str, watch: Callable[..., Any]) -> LeaseState:
        """The matrix keeper holds ``keeper/lease``, an ephemeral znode of its own session:
        the first agent to create it keeps until its session ends (a clean stop at once, a
        SIGKILL or a cut-off host after the session timeout); every agent watches it and the
        next to try takes over. Returns HELD, TAKEN (now), or OTHER. A root secured
        by an older HyperTF has no ``keeper/``: the lowest-named live agent keeps then."""
        path = self.layout.keeper_lease
        try:
            stat = self.client.exists(path, watch=watch)
            if stat is not None:
                return LeaseState.HELD if stat.ephemeralOwner == self.client.client_id[0] \
                    else LeaseState.OTHER
            self.client.create(path, host.encode(), acl=self.acls.keeper_lease(),
                               ephemeral=True)
        except NodeExistsError:
            return LeaseState.OTHER  # another agent took it first
        except NoNodeError:
            live = self.live_hosts()
            return LeaseState.HELD if live and min(live) == host else LeaseState.OTHER
        return LeaseState.TAKEN


    def parse_records(self, raw: dict[str, bytes]) -> dict[str, AgentRecord]:
        """The readable records of ``raw``: an unreadable one (any reason: not JSON, nested
        too deep, a field of the wrong type or range) counts its host down and is logged
        once per reason and session; it never fails the command or the pass for the
        other hosts."""
        records: dict[str, AgentRecord] = {}
        for host, data in raw.items():
            try:
                records[host] = AgentRecord.from_json(data)
            except StoreError as err:
                if self._said_unreadable.get(host) != str(err):
                    self._said_unreadable[host] = str(err)
                    log.warning("%s: host %s counts as down", err, host)
        return records
