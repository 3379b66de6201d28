"""The keeper's prune by data (hypertf.keeper.prune.doomed with ``max_bytes``): past the
bound the oldest finished records go, never a running one, and nothing more than needed."""

from __future__ import annotations

from kazoo.protocol.states import ZnodeStat

from hypertf.keeper.prune import doomed
from hypertf.store.jobs import Folder


def stat(zxid: int, size: int) -> ZnodeStat:
    return ZnodeStat(czxid=zxid, mzxid=zxid, ctime=0, mtime=1_000_000, version=0,
                     cversion=0, aversion=0, ephemeralOwner=0, dataLength=size,
                     numChildren=0, pzxid=zxid)


def folder(sizes: list[int]) -> Folder:
    return Folder("bob", records=[(f"2026120{i}-000000-aaaaaa.bob", {"state": "done"},
                                   stat(i, size)) for i, size in enumerate(sizes)])


def test_the_oldest_finished_go_until_the_data_is_within_its_bound():
    keys = [key for key, _, _ in folder([400] * 5).records]
    chosen, _ = doomed(folder([400] * 5), set(), 1e9, 100, now=1000.0, max_bytes=1000)
    assert [key for key, _ in chosen] == keys[:3]  # 2,000 bytes -> 800


def test_a_running_job_is_never_pruned_for_bytes_nor_anything_within_the_bound():
    running = {key for key, _, _ in folder([5000]).records}
    chosen, _ = doomed(folder([5000, 10, 10]), running, 1e9, 100, now=1000.0,
                       max_bytes=1000)
    assert {key for key, _ in chosen} == {"20261201-000000-aaaaaa.bob",
                                          "20261202-000000-aaaaaa.bob"}
    assert doomed(folder([10, 10]), set(), 1e9, 100, now=1000.0, max_bytes=1000)[0] == []
