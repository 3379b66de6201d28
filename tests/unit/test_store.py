"""The ZooKeeper layout and the record format, without a ZooKeeper.

Paths are spelled out only in Layout, and every payload carries a format number so a
newer HyperTF refuses what it cannot read instead of misreading it.
"""

from __future__ import annotations

import json

import pytest

from hypertf.core.errors import HyperTFError, StoreError, UsageError
from hypertf.store import (
    FORMAT,
    MAX_ZNODE_BYTES,
    AgentRecord,
    GpuInfo,
    GpuProcess,
    Layout,
    decode,
    encode,
)

# --- Layout ---------------------------------------------------------------------------------

ROOTS = ["/hypertf", "/team", "/a/b/c", "/test-1a2b3c4d"]


def all_paths(layout: Layout) -> list[str]:
    return [
        layout.hosts, layout.host("node1"), layout.matrix, layout.jobs, layout.leases,
        layout.resource("node1"), layout.job("20240101-abc.u"), layout.lease("20240101-abc.u"),
    ]


def test_default_root_and_paths_match_the_documented_layout():
    layout = Layout()
    assert layout.root == "/hypertf"
    assert layout.hosts == "/hypertf/hosts"
    assert layout.matrix == "/hypertf/matrix"
    assert layout.jobs == "/hypertf/jobs"
    assert layout.leases == "/hypertf/leases"
    assert layout.host("node1") == "/hypertf/hosts/node1"
    assert layout.resource("node1") == "/hypertf/hosts/node1/agent"
    key = "20261122-085000-a1b2c3.alice"
    assert layout.job(key) == f"/hypertf/jobs/alice/{key}"
    assert layout.lease(key) == f"/hypertf/leases/alice/{key}"
    assert layout.user_leases("alice") == "/hypertf/leases/alice"


@pytest.mark.parametrize("key", ["k1", ".alice", "x/y.alice", ""])
def test_a_task_key_without_an_owner_is_refused_with_the_expected_form(key):
    with pytest.raises(UsageError, match="is not a task key"):
        Layout().job(key)


@pytest.mark.parametrize("root", ROOTS)
def test_every_path_lies_under_the_root_without_double_slashes(root):
    layout = Layout(root)
    for path in all_paths(layout):
        assert path.startswith(root + "/")
        assert "//" not in path
        assert not path.endswith("/")


@pytest.mark.parametrize("root", ROOTS)
def test_children_lie_under_their_parents(root):
    layout = Layout(root)
    assert layout.host("h1") == f"{layout.hosts}/h1"
    assert layout.resource("h1") == f"{layout.host('h1')}/agent"
    assert layout.job("k.u") == f"{layout.jobs}/u/k.u"
    assert layout.lease("k.u") == f"{layout.leases}/u/k.u"
    assert layout.matrix == f"{root}/matrix"


def test_the_four_top_level_paths_are_distinct():
    layout = Layout("/x")
    tops = [layout.hosts, layout.matrix, layout.jobs, layout.leases]
    assert len(set(tops)) == 4


def test_two_roots_share_no_path():
    """Separate roots are how several clusters share one ZooKeeper."""
    assert not set(all_paths(Layout("/a"))) & set(all_paths(Layout("/b")))


def test_layout_is_a_frozen_value():
    assert Layout("/a") == Layout("/a")
    assert hash(Layout("/a")) == hash(Layout("/a"))
    with pytest.raises(AttributeError):
        Layout("/a").root = "/b"  # type: ignore[misc]


# --- AgentRecord ----------------------------------------------------------------------------


def gpu(index: int, available: bool = True) -> GpuInfo:
    return GpuInfo(
        index=index, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{index:08x}-0000",
        utilization=0.0 if available else 97.5, memory_used=0 if available else 70 * 2**30,
        memory_total=80 * 2**30, available=available,
        reason="" if available else "in use by 20261122-085000-a1b2c3.alice",
        processes=[] if available else [GpuProcess(77, 70 * 2**30, "20261122-085000-a1b2c3.alice")],
    )


def full_record() -> AgentRecord:
    return AgentRecord(
        host="node1", mgmt_addr="192.168.0.11", data_addr="10.40.0.11", port=20000, gpu=4,
        gpu_avail_list=[0, 1, 3], gpus=[gpu(0), gpu(1), gpu(2, available=False), gpu(3)],
        gpu_source="nvml", gpu_driver={"driver": "550.54.15", "nvml": "12.550.54.15"},
        heartbeat=1712345678.25, pid=4242, hostname="node1.example",
    )


def minimal_record() -> AgentRecord:
    return AgentRecord(host="cpu1", mgmt_addr="192.168.0.12", data_addr="10.40.0.12",
                       port=20000, gpu=0, gpu_avail_list=[])


@pytest.mark.parametrize("record", [full_record(), minimal_record()], ids=["full", "minimal"])
def test_agent_record_round_trip(record):
    back = AgentRecord.from_json(record.to_json())
    assert back == record
    assert all(isinstance(g, GpuInfo) for g in back.gpus)
    assert back.to_json() == record.to_json()


def test_minimal_record_takes_the_defaults():
    record = AgentRecord.from_json(minimal_record().to_json())
    assert record.gpus == []
    assert record.gpu_source == "none"
    assert record.heartbeat == 0.0
    assert record.pid == 0
    assert record.hostname == ""


def test_agent_record_json_has_the_documented_fields_with_format_first():
    payload = json.loads(full_record().to_json())
    assert next(iter(payload)) == "format"
    assert payload["format"] == FORMAT == 1
    assert set(payload) == {
        "format", "host", "mgmt_addr", "data_addr", "port", "gpu", "gpu_avail_list", "gpus",
        "gpu_source", "gpu_driver", "heartbeat", "pid", "hostname",
    }
    assert set(payload["gpus"][0]) == {
        "index", "name", "uuid", "utilization", "memory_used", "memory_total", "available",
    }  # an idle GPU: reason, mig and processes say nothing and are left out
    assert set(payload["gpus"][2]) == {
        "index", "name", "uuid", "utilization", "memory_used", "memory_total", "available",
        "reason", "processes",
    }
    assert payload["gpu"] == 4
    assert payload["gpu_avail_list"] == [0, 1, 3]
    assert payload["gpus"][2]["available"] is False


def test_a_record_without_gpus_key_reads_as_no_gpu_detail():
    """An agent that found no GPU library may leave 'gpus' out; that is not an error."""
    data = json.dumps({
        "format": 1, "host": "h1", "mgmt_addr": "10.0.0.1", "data_addr": "10.40.0.1",
        "port": 20000, "gpu": 2, "gpu_avail_list": [0, 1],
    }).encode()
    record = AgentRecord.from_json(data)
    assert record.gpus == []
    assert record.gpu_avail_list == [0, 1]


# --- encode ---------------------------------------------------------------------------------


def test_encode_puts_the_format_first_in_compact_json():
    data = encode({"a": 1, "b": [1, 2]})
    assert isinstance(data, bytes)
    assert data == b'{"format":1,"a":1,"b":[1,2]}'
    assert json.loads(data)["format"] == FORMAT


def test_encode_then_decode_gives_back_the_payload_without_the_format():
    payload = {"gpus": {"h1": [1, 0, "job"]}, "ports": {}}
    assert decode(encode(payload), "GPU matrix") == payload


def test_encode_does_not_change_its_argument():
    payload = {"a": 1}
    encode(payload)
    assert payload == {"a": 1}


def test_encode_accepts_a_record_of_exactly_the_limit():
    overhead = len(encode({"x": ""}))
    data = encode({"x": "y" * (MAX_ZNODE_BYTES - overhead)})
    assert len(data) == MAX_ZNODE_BYTES


def test_encode_refuses_a_record_over_the_znode_limit_with_advice():
    overhead = len(encode({"x": ""}))
    with pytest.raises(StoreError) as err:
        encode({"x": "y" * (MAX_ZNODE_BYTES - overhead + 1)})
    message = str(err.value)
    assert f"{MAX_ZNODE_BYTES + 1} bytes" in message
    assert "jute.maxbuffer" in message
    assert "hypertf_zk_root" in message


def test_the_limit_stays_under_zookeepers_default_one_mebibyte():
    assert MAX_ZNODE_BYTES < 1024 * 1024


# --- decode and the errors it gives ---------------------------------------------------------


DROP = object()  # a field value meaning "leave this key out"


def record_bytes(**changes) -> bytes:
    payload = {**json.loads(full_record().to_json()), **changes}
    return json.dumps({k: v for k, v in payload.items() if v is not DROP}).encode()


@pytest.mark.parametrize("data, shown", [
    (record_bytes(format=2), "2"),
    (record_bytes(format=99), "99"),
    (record_bytes(format=0), "0"),
    (record_bytes(format="1"), "'1'"),
    (record_bytes(format=None), "None"),
    (record_bytes(format=DROP), "None"),
], ids=["newer", "far-newer", "older", "string", "null", "missing"])
def test_an_unknown_or_missing_format_is_a_store_error_naming_what_to_do(data, shown):
    with pytest.raises(StoreError) as err:
        AgentRecord.from_json(data)
    message = str(err.value)
    assert f"agent record in format {shown}" in message
    assert f"this HyperTF reads format {FORMAT}" in message
    assert "upgrade HyperTF on every node" in message
    assert "hypertf_zk_root" in message


@pytest.mark.parametrize("data", [
    b"{not json", b"", b"   ", b'{"format": 1, "host": ', b"\x00\x01",
], ids=["garbage", "empty", "blank", "truncated", "binary"])
def test_bytes_that_are_not_json_are_a_store_error(data):
    with pytest.raises(StoreError, match="ZooKeeper holds an unreadable agent record"):
        AgentRecord.from_json(data)


@pytest.mark.parametrize("data", [b"\xff\xfe", b'{"format": 1, "host": "\xe9"}', b"\xc3"],
                         ids=["bom-like", "latin-1", "truncated-utf8"])
def test_bytes_that_are_not_utf8_are_a_store_error(data):
    with pytest.raises(StoreError, match="ZooKeeper holds an unreadable agent record"):
        AgentRecord.from_json(data)


@pytest.mark.parametrize("data, kind", [
    (b"[]", "list"), (b"[1, 2]", "list"), (b"null", "NoneType"), (b'"record"', "str"),
    (b"1", "int"), (b"1.5", "float"), (b"true", "bool"),
])
def test_json_that_is_not_an_object_is_a_store_error_naming_the_type(data, kind):
    with pytest.raises(StoreError) as err:
        AgentRecord.from_json(data)
    message = str(err.value)
    assert "unreadable agent record" in message
    assert f"expected a JSON object, got {kind}" in message


@pytest.mark.parametrize("what", ["agent record", "GPU matrix", "job record"])
def test_decode_errors_name_what_was_being_read(what):
    for data in (b"{", b"[]", b'{"format": 2}'):
        with pytest.raises(StoreError, match=what):
            decode(data, what)


def test_store_errors_are_hypertf_errors_with_their_exit_code():
    """The CLI turns a HyperTFError into a message; anything else is a traceback."""
    with pytest.raises(HyperTFError) as err:
        decode(b"{", "agent record")
    assert isinstance(err.value, StoreError)
    assert err.value.exit_code == 3


def test_decode_errors_hide_the_parser_traceback():
    """``from None``: the user sees the message, not a chained JSONDecodeError."""
    with pytest.raises(StoreError) as err:
        decode(b"{", "agent record")
    assert err.value.__cause__ is None
    assert err.value.__suppress_context__


def test_decode_returns_the_payload_without_the_format_key():
    assert decode(b'{"format": 1, "a": [1], "b": {"c": null}}', "x") == {
        "a": [1], "b": {"c": None},
    }


@pytest.mark.parametrize("data", [
    record_bytes(host=DROP),
    record_bytes(gpu_avail_list=DROP),
    record_bytes(port=DROP, data_addr=DROP),
    record_bytes(gpus=[{"index": 0, "name": "gpu"}]),
    record_bytes(gpus=[0]),
], ids=["no-host", "no-avail-list", "no-port-nor-data-addr", "gpu-missing-fields",
        "gpu-not-an-object"])
def test_a_record_missing_required_fields_is_a_store_error(data):
    """A damaged znode must give the user a message, never a raw TypeError traceback."""
    with pytest.raises(StoreError, match="agent record"):
        AgentRecord.from_json(data)
