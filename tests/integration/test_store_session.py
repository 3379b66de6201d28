"""``Store`` is one ZooKeeper session and owns what it learns (hypertf.store.session): its
credential and ACLs, and its recipes (``matrix``, ``queue``, ``jobs``) with their caches,
made once with it. A new session (the agent's new client after a long outage) starts from
nothing, whatever the old one knew; two sessions never share a cache. Against a real
ZooKeeper and the real keeper."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from kazoo.client import KazooClient

import hypertf
from hypertf import store
from hypertf.core.errors import StoreError
from hypertf.core.jobrecord import JobState
from hypertf.core.placement import new_task_key
from hypertf.store import Store
from hypertf.store.allocation import GRANT_WATCHES_KEPT
from tests.integration.zkspy import one_gpu, spy

PACKAGE = Path(hypertf.__file__).parent


def test_a_store_is_made_with_its_recipes_and_its_credential(zk, layout):
    session = Store(zk, layout)
    assert session.credential.identity == "admin" and session.acls is session.acls
    assert session.matrix.store is session and session.jobs.store is session
    assert session.queue.matrix is session.matrix and session.queue.jobs is session.jobs
    assert session.matrix.known is session.jobs.known, "one memory of this session's records"


def test_what_a_session_learnt_stays_with_it_and_a_new_session_starts_afresh(
        secured, zk, layout, fake_agents, keeper):
    """The shard count, the records it wrote, the grant watches: a second Store (another
    connection, or the same client after a reconnect made a new one) knows none of them,
    and does the reads the first one saved."""
    fake_agents({"n1": 1, "n2": 1})
    keeper()
    first = Store(zk, layout)
    key = new_task_key("root")
    first.queue.submit(one_gpu(), key)  # reads the grant with a watch, knows its record
    first.matrix.read()
    second_client = store.connect(secured, identity="admin")
    try:
        second = Store(second_client, layout)
        assert second.matrix.forget_grant_watch(key) is None
        assert second.jobs.known.take(key) is None
        gets = spy(second_client, "get")
        second.jobs.update(key, state=JobState.STARTING)
        assert layout.job(key) in gets, "a session that never wrote the record reads it first"
        assert first.matrix.forget_grant_watch(key) is not None, "the first keeps its own"
    finally:
        store.close(second_client)
    assert first.matrix.release(key) is True


def test_a_sessions_grant_watches_are_bounded(zk, layout):
    session = Store(zk, layout)
    for i in range(GRANT_WATCHES_KEPT + 10):
        session.matrix.watch_grant(f"k{i}")
    assert session.matrix.forget_grant_watch("k0") is None, "the oldest went first"
    assert session.matrix.forget_grant_watch(f"k{GRANT_WATCHES_KEPT + 9}") is not None


def test_a_client_not_made_by_connect_has_no_credential_to_write_with(layout):
    plain = Store(KazooClient(hosts="127.0.0.1:1"), layout)  # never started: no network
    with pytest.raises(StoreError, match=r"not made by hypertf\.store\.connect"):
        plain.acls.lease()


def test_no_module_keeps_state_keyed_by_a_client():
    """The session owns its caches: no registry of clients in a module's globals, and the
    store's operations are methods of the session's recipes, not module functions that
    take a store."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if "weakref.Weak" in text:
            found.append(f"{path.name}: a weakref registry")
        if path.parent.name != "store":
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.args.args and \
                    ast.unparse(node.args.args[0].annotation or ast.Constant(None)) in (
                        "Store", "StoreReads"):
                found.append(f"{path.name}: def {node.name}(store, ...)")
    assert not found, found

