"""Every record is hostile input (docs/zookeeper-layout.md, "Trust"): what a user's or an
agent's own credential can write is refused with a reason, never raised past its reader,
and never decides an address or a port for anyone else."""

from __future__ import annotations

import json

import pytest

from hypertf.core.addresses import HostAddresses, data_addresses
from hypertf.core.errors import StoreError
from hypertf.core.records import AgentRecord, decode
from hypertf.core.requestcheck import InvalidRequest, waiting_from_record

KEY = "20261127-030000-a1b2c3.bob"


def agent_record(**changes: object) -> bytes:
    payload = json.loads(AgentRecord(
        host="h4", mgmt_addr="10.0.0.4", data_addr="10.40.0.4", port=20000, gpu=2,
        gpu_avail_list=[0, 1], heartbeat=1.0).to_json())
    payload["gpus"] = [{"index": i, "name": "A100", "uuid": f"GPU-{i}", "utilization": 0.0,
                        "memory_used": 0, "memory_total": 80 << 30, "available": True}
                       for i in range(2)]
    payload.update(changes)
    return json.dumps(payload).encode()


def nested(depth: int) -> bytes:
    return b'{"format":1,"host":"h4","x":' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("depth", [40, 900, 20_000])
def test_a_deeply_nested_record_is_unreadable_not_a_recursion_error(depth):
    with pytest.raises(StoreError, match="nested"):
        decode(nested(depth), "job record")
    with pytest.raises(StoreError, match="unreadable agent record"):
        AgentRecord.from_json(nested(depth))


def test_a_record_over_its_size_is_unreadable():
    with pytest.raises(StoreError, match="over the"):
        AgentRecord.from_json(agent_record(hostname="x" * 600_000))


@pytest.mark.parametrize("changes, says", [
    ({"gpu": "2"}, "'gpu'"),
    ({"gpu": 2.5}, "'gpu'"),
    ({"gpu": True}, "'gpu'"),
    ({"gpu": -1}, "'gpu'"),
    ({"gpu": 600_000, "gpu_avail_list": []}, "'gpu'"),
    ({"gpu_avail_list": [0, 7]}, "gpu_avail_list"),
    ({"gpu_avail_list": "01"}, "gpu_avail_list"),
    ({"data_addr": "evil.example.com"}, "data_addr"),
    ({"mgmt_addr": ["10.0.0.4"]}, "data_addr"),
    ({"port": 70_000}, "'port'"),
    ({"heartbeat": "soon"}, "heartbeat"),
    ({"drained": [[KEY]]}, "drained"),
    ({"trespasses": [{"pid": "1"}]}, "Trespass"),
], ids=lambda v: str(v)[:30])
def test_an_agent_record_of_the_wrong_type_or_range_is_refused_naming_the_field(changes,
                                                                                 says):
    with pytest.raises(StoreError, match="unreadable agent record") as err:
        AgentRecord.from_json(agent_record(**changes))
    assert says in str(err.value)


@pytest.mark.parametrize("gpu_change, says", [
    ({"utilization": float("nan")}, "finite"),
    ({"memory_used": -5}, "finite"),
    ({"memory_total": "80G"}, "finite"),
    ({"index": 9}, "indices"),
    ({"available": "yes"}, "true/false"),
    ({"processes": [{"pid": 1, "task_key": {"a": 1}}]}, "process"),
])
def test_a_gpu_of_the_wrong_type_or_range_is_refused(gpu_change, says):
    payload = json.loads(agent_record())
    payload["gpus"][1].update(gpu_change)
    with pytest.raises(StoreError, match="unreadable agent record") as err:
        AgentRecord.from_json(json.dumps(payload).encode())
    assert says in str(err.value)


def test_a_well_formed_record_still_reads():
    record = AgentRecord.from_json(agent_record())
    assert record.gpu == 2 and [g.index for g in record.gpus] == [0, 1]


def _host(claimed: str, network: str | None = "10.40.0.0/16",
          inventory: str = "10.0.0.4") -> HostAddresses:
    return HostAddresses(inventory=inventory, claimed=claimed, network=network)


def test_a_data_address_outside_the_inventorys_network_is_not_taken():
    chosen = data_addresses({"h4": _host("203.0.113.9"),
                             "h3": _host("10.40.0.3", inventory="10.0.0.3")})
    assert chosen["h4"].address == "10.0.0.4" and "outside" in chosen["h4"].refused
    assert chosen["h3"] == ("10.40.0.3", "")


def test_another_hosts_data_address_is_not_taken_from_either():
    chosen = data_addresses({"h4": _host("10.40.0.3"),
                             "h3": _host("10.40.0.3", inventory="10.0.0.3"),
                             "h2": _host("10.0.0.3", network=None, inventory="10.0.0.2")})
    assert chosen["h4"].address == "10.0.0.4" and "h3" in chosen["h4"].refused
    assert chosen["h3"].address == "10.0.0.3"  # the thief costs it its data network only
    assert chosen["h2"].address == "10.0.0.2"  # another host's inventory address


def test_without_a_subnet_only_the_inventory_address_is_taken():
    for network in (None, "eth1"):
        chosen = data_addresses({"h4": _host("10.40.0.4", network=network)})
        assert chosen["h4"].address == "10.0.0.4" and chosen["h4"].refused
    same = data_addresses({"h4": _host("10.0.0.4", network=None)})
    assert same["h4"] == ("10.0.0.4", "")


def test_a_request_for_a_system_port_is_invalid():
    record = {"task_key": KEY, "state": "queued",
              "queue": {"hosts": ["h1"], "slots": [["worker", 0, 1]],
                        "port_range": [22, 22]}}
    with pytest.raises(InvalidRequest, match="1024"):
        waiting_from_record(record, 0, KEY)
    record["queue"]["port_range"] = [20000, 20999]
    assert waiting_from_record(record, 0, KEY).task_key == KEY


def test_the_keeper_refuses_ports_outside_the_inventorys_ranges():
    from hypertf.core.admission import Waiting
    from hypertf.core.limits import UserLimits
    from hypertf.core.matrix import FREE, Matrix
    from hypertf.core.placement import PortRanges, Request
    from hypertf.core.requestcheck import PortBounds
    from hypertf.core.scheduler import TaskSlot
    from hypertf.keeper.screen import Screen

    hosts = ("h1", "h2", "h3")
    bounds = PortBounds.of({"h1": (20000, 20999), "h2": (20000, 20999), "h3": (30000, 30099)})
    assert bounds is not None and bounds.differing == {"h3": (30000, 30099)}

    def job(n: int, common: tuple[int, int], **differing: tuple[int, int]) -> Waiting:
        ranges = PortRanges(hosts, common, differing)
        return Waiting(f"20261127-0300{n:02d}-aaaaaa.bob",
                       Request((TaskSlot("worker", 0, 1),), hosts, port_ranges=ranges), order=n)

    jobs = [job(1, (20000, 20999), h3=(30000, 30099)),  # what the launcher asks: kept
            job(2, (20000, 20999)),  # h3 at 20000-20999: outside h3's range
            job(3, (2181, 2181), h3=(30000, 30099)),  # ZooKeeper's port on h1 and h2
            job(4, (20000, 20999), h3=(30000, 30100))]
    matrix = Matrix(gpus={h: [FREE] for h in hosts}, ports={})
    kept, refused = Screen(port_bounds=bounds)(jobs, {}, matrix, UserLimits())
    assert [j.task_key for j in kept] == [jobs[0].task_key]
    assert "h3 are outside its hypertf_port_range 30000-30099" in refused[jobs[1].task_key]
    assert "2181-2181 are outside the inventory's" in refused[jobs[2].task_key]
    assert "30000-30100 on h3" in refused[jobs[3].task_key]
