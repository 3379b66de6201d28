"""The keeper's shards kept between passes (hypertf.store.allocation.ShardCache, issue 55):
a read gets only the shards the matrix's watch named, and what it returns is what
ZooKeeper holds, also after another writer's change and after a lost connection."""

from __future__ import annotations

from hypertf.core.matrix import shard_of
from hypertf.store import Store
from hypertf.store.matrixshards import ShardCache
from tests.conftest import wait_for


def test_a_read_gets_the_shards_that_changed_and_returns_what_is_stored(
        secured, layout, fake_agents, zk):
    hosts = {f"n{i}": 2 for i in range(12)}
    fake_agents(hosts)
    admin = Store(zk, layout)
    cache = ShardCache()
    woken: list[int] = []
    admin.matrix.watch(lambda *_: woken.append(1) or True, cache)
    assert cache.enabled
    matrix, version = admin.matrix.read(cache=cache)
    assert (matrix, version) == admin.matrix.read()
    assert sorted(cache.parts) == list(range(version.shards))

    # Another writer (the admin) changes one host's row: only its shard is read again.
    changed = dict(matrix.gpus)
    changed["n3"] = ["20261127-000000-abcdef.alice", 1]
    admin.matrix.overwrite(type(matrix)(changed, dict(matrix.ports)))
    shard = shard_of("n3", version.shards)
    wait_for(lambda: cache._dirty == {shard}, 10, "the watch naming the shard")
    kept = {i: part for i, (part, _) in cache.parts.items() if i != shard}
    matrix, version = admin.matrix.read(cache=cache)
    assert (matrix, version) == admin.matrix.read()
    assert matrix.gpus["n3"][0] == "20261127-000000-abcdef.alice"
    assert all(cache.parts[i][0] is part for i, part in kept.items()), "others kept"

    # A reconnect (events lost): every shard is read again.
    cache.invalidate()
    assert cache.wanted(version.shards) == list(range(version.shards))
    assert admin.matrix.read(cache=cache) == admin.matrix.read()


def test_without_the_watch_every_read_is_whole(secured, layout, fake_agents, zk):
    fake_agents({"n1": 1, "n2": 1})
    cache = ShardCache()  # never enabled: no persistent watch
    admin = Store(zk, layout)
    _, version = admin.matrix.read(cache=cache)
    assert cache.wanted(version.shards) == list(range(version.shards))
    assert cache.wanted(version.shards) == list(range(version.shards))
