"""The keeper's view of the hosts (hypertf.core.hostview): what the keeper encodes is what
``hypertf status`` decodes, and whatever else a shard holds is refused, never printed."""

from __future__ import annotations

import json

import pytest

from hypertf.core.errors import StoreError
from hypertf.core.hostview import (
    SHARD_BYTES_MAX,
    HostView,
    decode_shard,
    encode_shard,
    host_view,
    runs,
)
from hypertf.core.records import AgentRecord, GpuInfo, GpuProcess, Trespass


def record(host: str, processes: int = 0) -> AgentRecord:
    gpus = [GpuInfo(index=0, name="A100", uuid="GPU-0", utilization=0.0, memory_used=0,
                    memory_total=80, available=True),
            GpuInfo(index=1, name="A100", uuid="GPU-1", utilization=90.0, memory_used=70,
                    memory_total=80, available=False, reason="90% busy",
                    processes=[GpuProcess(pid=100 + i)
                               for i in range(processes)])]
    return AgentRecord(host=host, mgmt_addr="10.0.0.1", data_addr="10.1.0.1", port=20000,
                       gpu=2, gpu_avail_list=[0], gpus=gpus, gpu_source="nvml",
                       gpu_driver={"driver": "550"}, confine="devices+cgroup",
                       trespasses=[Trespass(pid=7, gpu=1, uuid="GPU-1", claims="",
                                            holder="", how="nvml", stopped=False)])


def test_a_shard_round_trips_what_status_shows() -> None:
    key = "20261127-100000-abcdef.alice"
    up = host_view(record("n1", processes=2), 1700000000.5, [key, 0], {"20001": key}, [],
                   "")
    down = host_view(None, None, [1, 1], {}, [], "host n2's record is not JSON")
    shard, count, hosts = decode_shard(encode_shard(3, 8, [("n1", up), ("n2", down)]))
    assert (shard, count) == (3, 8)
    assert hosts == {"n1": up, "n2": down}
    assert list(up.gpus) == [1], "only a GPU that says something (a reason, a process)"
    assert up.gpus[1]["reason"] == "90% busy" and len(up.gpus[1]["processes"]) == 2
    assert down.unreadable and not down.up and down.written is None


def test_a_row_is_stored_as_runs() -> None:
    assert runs(["k", "k", "k", 1, 1, 0]) == [["k", 3], [1, 2], [0, 1]]
    assert runs([]) == []


def test_a_hostile_agent_cannot_grow_its_entry_past_what_status_shows() -> None:
    view = host_view(record("n1", processes=500), 1.0, [1, 1], {}, [])
    assert len(view.gpus[1]["processes"]) == 8


def test_a_shard_past_its_bound_is_published_as_omitted() -> None:
    big = HostView(up=True, written=1.0, confine="x", cpu_jobs=["k" * 100] * 6000)
    data = encode_shard(0, 4, [("n1", big)])
    assert len(data) < 1024
    assert decode_shard(data) == (0, 4, None)
    assert SHARD_BYTES_MAX == 512 * 1024


@pytest.mark.parametrize("change", [
    lambda p: p.update(shard=9),
    lambda p: p.update(of="4"),
    lambda p: p["hosts"].update(n1=[1, 2]),
    lambda p: p["hosts"]["n1"].__setitem__(5, 99),  # no such driver
    lambda p: p["hosts"]["n1"].__setitem__(7, [["k", 10**6]]),  # a row of a million cells
    lambda p: p["hosts"]["n1"].__setitem__(2, "x" * 100_000),
    lambda p: p["hosts"]["n1"].__setitem__(8, {"0": "not a GPU"}),
    lambda p: p.update(format=7),
])
def test_a_shard_that_is_not_what_the_keeper_writes_is_refused(change) -> None:
    payload = json.loads(encode_shard(0, 4, [("n1", host_view(record("n1"), 1.0, [1, 1],
                                                                    {}, []))]))
    change(payload)
    with pytest.raises(StoreError):
        decode_shard(json.dumps(payload).encode())
