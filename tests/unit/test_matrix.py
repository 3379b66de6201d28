"""The servers x GPUs matrix: JSON format, take, release and the sync with agent records."""

from __future__ import annotations

import json

import pytest

from hypertf.core.errors import StoreError
from hypertf.core.matrix import (
    DRAINING,
    FREE,
    HOSTS_PER_SHARD,
    MIN_SHARDS,
    UNAVAILABLE,
    GpuState,
    Matrix,
    MatrixIndex,
    changed_shards,
    joined,
    same,
    shard_count,
    shard_of,
    split,
    state_of,
    synced,
)
from hypertf.store import FORMAT, AgentRecord


def record(host: str, gpu: int, avail: list[int] | None = None) -> AgentRecord:
    return AgentRecord(
        host=host, mgmt_addr="192.168.0.1", data_addr="10.40.0.1", port=20000, gpu=gpu,
        gpu_avail_list=list(range(gpu)) if avail is None else avail,
    )


# --- JSON -----------------------------------------------------------------------------------


def test_json_round_trip_keeps_cells_ports_and_order():
    matrix = Matrix(
        gpus={"h2": [1, 0, "job-a"], "h1": ["job-b", 1]},
        ports={"h2": {"20001": "job-a"}, "h1": {"20005": "job-b"}},
    )
    back = Matrix.from_json(matrix.to_json())
    assert back == matrix
    assert list(back.gpus) == ["h2", "h1"]
    assert same(back, matrix)


def test_json_carries_the_format_number():
    payload = json.loads(Matrix(gpus={"h1": [1]}).to_json())
    assert payload["format"] == FORMAT == 1
    assert payload["gpus"] == {"h1": [1]}
    assert payload["ports"] == {}


# --- shards ---------------------------------------------------------------------------------


def test_a_hosts_shard_is_stable_and_spreads_hosts_evenly():
    hosts = [f"node{i:05d}" for i in range(10_000)]
    count = shard_count(len(hosts))
    assert count == 79 and shard_count(16) == MIN_SHARDS and shard_count(0) == MIN_SHARDS
    assert shard_of("node00042", count) == shard_of("node00042", count) == 1514081616 % count
    sizes = [len(part.gpus) for part in split(Matrix(gpus={h: [1] * 8 for h in hosts}), count)]
    assert sum(sizes) == len(hosts) and max(sizes) < 1.5 * HOSTS_PER_SHARD


def test_split_and_joined_give_back_the_whole():
    matrix = Matrix(gpus={f"h{i}": [1, f"k{i}"] for i in range(50)},
                    ports={f"h{i}": {"20000": f"k{i}"} for i in range(50)})
    parts = split(matrix, 7)
    assert len(parts) == 7 and joined(parts) == matrix
    for i, part in enumerate(parts):
        assert all(shard_of(host, 7) == i for host in [*part.gpus, *part.ports])


def test_only_the_shards_a_change_touches_are_written():
    matrix = Matrix(gpus={f"h{i}": [1, 1] for i in range(50)})
    taken = matrix.take("k", {"h3": [0]}, {"h3": [20000]})
    assert list(changed_shards(matrix, taken, 7)) == [shard_of("h3", 7)]
    assert changed_shards(matrix, matrix.copy(), 7) == {}
    part = changed_shards(matrix, taken, 7)[shard_of("h3", 7)]
    assert part.gpus["h3"] == ["k", 1] and part.ports == {"h3": {"20000": "k"}}


def test_changed_shards_agree_with_comparing_every_shard():
    """Finding the changed hosts first gives what splitting both matrices and comparing
    every shard gave: rows changed, added or removed, ports alone, equal copies."""
    old = Matrix(gpus={f"h{i}": [1, 1] for i in range(60)},
                 ports={"h1": {"20000": "a"}, "h2": {"20001": "b"}})
    new = old.copy()
    new.gpus["h4"] = [1, 0]  # a changed row (a new list)
    new.gpus["h70"] = [1]  # a new host
    del new.gpus["h9"]  # a host gone
    new.ports["h2"] = {}  # ports emptied
    new.ports["h5"] = {"20002": "c"}  # ports alone
    expected = {i: part for i, (was, part) in enumerate(zip(split(old, 7), split(new, 7),
                                                            strict=True))
                if not same(was, part)}
    assert changed_shards(old, new, 7) == expected
    assert changed_shards(new, new.copy(), 7) == {}


def test_take_copies_only_the_rows_it_changes():
    matrix = Matrix(gpus={"h1": [1, 1], "h2": [1, 1]}, ports={"h2": {"20000": "x"}})
    taken = matrix.take("job", {"h1": [0]}, {"h1": [20001]})
    assert taken.gpus["h2"] is matrix.gpus["h2"]  # shared: neither is changed in place
    assert taken.gpus["h1"] is not matrix.gpus["h1"] and matrix.gpus["h1"] == [1, 1]
    assert matrix.ports == {"h2": {"20000": "x"}}
    again = taken.take("other", {"h2": [1]}, {})
    assert matrix.gpus["h2"] == [1, 1] and taken.gpus["h2"] == [1, 1]
    assert again.gpus == {"h1": ["job", 1], "h2": [1, "other"]}


def test_drain_and_release_leave_the_original_as_it_was():
    """drain and release copy only the rows and ports they change (an idle row of 25,000
    is shared), and never change the matrix they were called on."""
    matrix = Matrix(gpus={"h1": ["a", 1], "h2": [1, 1], "h3": ["b", "a"]},
                    ports={"h1": {"20000": "a"}, "h3": {"20001": "b"}})
    before = matrix.copy()
    drained = matrix.drain({"a"})
    assert drained.gpus == {"h1": [DRAINING + "a", 1], "h2": [1, 1],
                            "h3": ["b", DRAINING + "a"]}
    assert drained.ports == {"h1": {"20000": DRAINING + "a"}, "h3": {"20001": "b"}}
    assert drained.gpus["h2"] is matrix.gpus["h2"]
    released = drained.release({"a"}, {}, hosts=["h1"])
    assert released.gpus["h1"] == [UNAVAILABLE, 1] and released.ports == {
        "h3": {"20001": "b"}}
    assert released.gpus["h3"] is drained.gpus["h3"]
    assert matrix == before and drained.gpus["h1"] == [DRAINING + "a", 1]


def test_the_index_names_its_shards_and_the_previous_layout_reads_as_none():
    assert MatrixIndex.from_json(MatrixIndex(79).to_json()) == MatrixIndex(79)
    assert json.loads(MatrixIndex(3).to_json()) == {"format": 2, "shards": 3}
    assert MatrixIndex.from_json(Matrix(gpus={"h1": [1]}).to_json()) is None  # one znode
    assert MatrixIndex.from_json(b"") is None
    with pytest.raises(ValueError):
        MatrixIndex.from_json(b'{"format": 2, "shards": 0}')
    with pytest.raises(StoreError):
        MatrixIndex.from_json(b'{"format": 3, "shards": 4}')


def test_empty_data_is_an_empty_matrix():
    assert Matrix.from_json(b"") == Matrix()


def test_a_missing_ports_key_reads_as_no_ports():
    matrix = Matrix.from_json(b'{"format": 1, "gpus": {"h1": [1, 0]}}')
    assert matrix.ports == {}
    assert matrix.free("h1") == [0]


@pytest.mark.parametrize("data, version", [
    (b'{"format": 2, "gpus": {}}', "2"),
    (b'{"gpus": {}}', "None"),
    (b'{"format": "1", "gpus": {}}', "'1'"),
])
def test_a_wrong_format_is_a_store_error_with_advice(data, version):
    with pytest.raises(StoreError) as err:
        Matrix.from_json(data)
    message = str(err.value)
    assert f"GPU matrix in format {version}" in message
    assert "this HyperTF reads format 1" in message
    assert "hypertf_zk_root" in message


@pytest.mark.parametrize("data", [b"{not json", b"\xff\xfe"])
def test_unreadable_bytes_are_a_store_error(data):
    with pytest.raises(StoreError, match="unreadable GPU matrix"):
        Matrix.from_json(data)


@pytest.mark.parametrize("data", [b"[]", b"null", b'"matrix"'])
def test_json_that_is_not_an_object_is_a_store_error(data):
    with pytest.raises(StoreError):
        Matrix.from_json(data)


def test_copy_is_deep():
    matrix = Matrix(gpus={"h1": [1, 1]}, ports={"h1": {"20000": "k"}})
    copy = matrix.copy()
    copy.gpus["h1"][0] = "x"
    copy.ports["h1"]["20001"] = "x"
    assert matrix == Matrix(gpus={"h1": [1, 1]}, ports={"h1": {"20000": "k"}})


# --- queries --------------------------------------------------------------------------------


def test_free_task_keys_held_by_and_reserved_ports():
    matrix = Matrix(
        gpus={"h1": [1, "a", 0, "b", 1], "h2": ["a", "a"]},
        ports={"h1": {"20000": "a", "20001": "c"}},
    )
    assert matrix.free("h1") == [0, 4]
    assert matrix.free("h2") == []
    assert matrix.free("unknown") == []
    assert matrix.task_keys() == {"a", "b", "c"}
    assert matrix.held_by("a") == {"h1": [1], "h2": [0, 1]}
    assert matrix.held_by("nobody") == {}
    assert matrix.reserved_ports("h1") == {20000, 20001}
    assert matrix.reserved_ports("h2") == set()


# --- take -----------------------------------------------------------------------------------


def test_take_marks_cells_and_ports_on_a_copy():
    matrix = Matrix(gpus={"h1": [1, 1, 0], "h2": [1]})
    taken = matrix.take("job", {"h1": [1], "h2": [0]}, {"h1": [20000], "h2": [20001]})
    assert taken.gpus == {"h1": [1, "job", 0], "h2": ["job"]}
    assert taken.ports == {"h1": {"20000": "job"}, "h2": {"20001": "job"}}
    assert matrix == Matrix(gpus={"h1": [1, 1, 0], "h2": [1]})  # untouched


@pytest.mark.parametrize("cell", [UNAVAILABLE, "other-job"])
def test_take_refuses_a_cell_that_is_not_free(cell):
    matrix = Matrix(gpus={"h1": [1, cell]})
    with pytest.raises(ValueError, match="GPU 1 of h1 is not free"):
        matrix.take("job", {"h1": [0, 1]}, {})
    assert matrix.gpus == {"h1": [1, cell]}


def test_take_refuses_the_same_cell_twice():
    matrix = Matrix(gpus={"h1": [1, 1]})
    with pytest.raises(ValueError, match="GPU 0 of h1 is not free"):
        matrix.take("job", {"h1": [0, 0]}, {})


def test_take_refuses_a_reserved_port():
    matrix = Matrix(gpus={"h1": [1]}, ports={"h1": {"20000": "other"}})
    with pytest.raises(ValueError, match="port 20000 of h1 is reserved"):
        matrix.take("job", {"h1": [0]}, {"h1": [20000]})


# --- release --------------------------------------------------------------------------------


def test_release_frees_only_the_given_task_keys():
    matrix = Matrix(
        gpus={"h1": ["a", "b", 1, 0], "h2": ["a", "c"]},
        ports={"h1": {"20000": "a", "20001": "b"}, "h2": {"20002": "a"}},
    )
    records = {"h1": record("h1", 4), "h2": record("h2", 2)}
    released = matrix.release({"a", "c"}, records)
    assert released.gpus == {"h1": [FREE, "b", 1, 0], "h2": [FREE, FREE]}
    assert released.ports == {"h1": {"20001": "b"}}  # h2 had only a's port: row dropped
    assert matrix.gpus["h1"][0] == "a"  # a copy


def test_release_follows_the_agents_gpu_avail_list():
    matrix = Matrix(gpus={"h1": ["a", "a", "a", "a"], "gone": ["a"]})
    records = {"h1": record("h1", 4, avail=[0, 2])}  # 1 and 3 busy with someone else's work
    released = matrix.release({"a"}, records)
    assert released.gpus["h1"] == [FREE, UNAVAILABLE, FREE, UNAVAILABLE]
    assert released.gpus["gone"] == [UNAVAILABLE]  # no agent record: nothing is known free


def test_release_of_nothing_changes_nothing():
    matrix = Matrix(gpus={"h1": ["a", 1]}, ports={"h1": {"20000": "a"}})
    assert matrix.release(set(), {"h1": record("h1", 2)}) == matrix


# --- synced ---------------------------------------------------------------------------------


def test_synced_host_without_agent_turns_unavailable_except_live_cells():
    matrix = Matrix(gpus={"h1": [1, "live", 1, 0]}, ports={"h1": {"20000": "live"}})
    result = synced(matrix, records={}, leases={"live"})
    assert result.gpus == {"h1": [UNAVAILABLE, "live", UNAVAILABLE, UNAVAILABLE]}
    assert result.ports == {"h1": {"20000": "live"}}


def test_synced_drains_cells_and_ports_of_a_task_without_lease():
    """A lease gone is not a process dead: the cells wait for the node's confirmation."""
    matrix = Matrix(
        gpus={"h1": ["dead", "live", "dead", 1], "h2": ["dead"]},
        ports={"h1": {"20000": "dead", "20001": "live"}, "h2": {"20002": "dead"}},
    )
    records = {"h1": record("h1", 4, avail=[0, 1, 3]), "h2": record("h2", 1)}
    result = synced(matrix, records, leases={"live"})
    drained = DRAINING + "dead"
    assert result.gpus == {"h1": [drained, "live", drained, FREE], "h2": [drained]}
    assert result.ports == {"h1": {"20000": drained, "20001": "live"}, "h2": {"20002": drained}}
    assert result.task_keys() == {"live"}
    assert result.free("h1") == [3]
    assert result.draining_on("h1") == {"dead"} == result.draining_on("h2")
    # draining cells survive a second sync and the host's agent going away
    assert synced(result, {"h1": records["h1"]}, leases={"live"}).gpus["h2"] == [drained]


def test_the_node_confirmation_frees_only_its_own_host():
    matrix = Matrix(gpus={"h1": [DRAINING + "k", "live"], "h2": [DRAINING + "k"]},
                    ports={"h1": {"20000": DRAINING + "k"}, "h2": {"20001": DRAINING + "k"}})
    records = {"h1": record("h1", 2, avail=[0]), "h2": record("h2", 1, avail=[])}
    freed = matrix.release({"k"}, records, hosts=["h1"])
    assert freed.gpus == {"h1": [FREE, "live"], "h2": [DRAINING + "k"]}
    assert freed.ports == {"h2": {"20001": DRAINING + "k"}}
    # busy with someone else's work now: freed to unavailable, not to free
    assert matrix.release({"k"}, records, hosts=["h2"]).gpus["h2"] == [UNAVAILABLE]


def test_drain_only_on_the_hosts_not_confirmed():
    matrix = Matrix(gpus={"h1": ["k", 1], "h2": ["k"]}, ports={"h1": {"20000": "k"}})
    released = matrix.release({"k"}, {"h1": record("h1", 2)}, hosts=["h1"]).drain({"k"})
    assert released.gpus == {"h1": [FREE, FREE], "h2": [DRAINING + "k"]}
    assert released.ports == {}
    assert released.task_keys() == set()


def test_synced_drains_a_dead_task_that_holds_only_ports():
    matrix = Matrix(gpus={"h1": [1]}, ports={"h1": {"20000": "dead"}})
    result = synced(matrix, {"h1": record("h1", 1)}, leases=set())
    assert result.ports == {"h1": {"20000": DRAINING + "dead"}}
    assert result.release({"dead"}, {}, hosts=["h1"]).ports == {}


def test_synced_follows_the_agents_availability_for_unheld_cells():
    matrix = Matrix(gpus={"h1": [1, 0, 1, 0]})
    result = synced(matrix, {"h1": record("h1", 4, avail=[1, 2])}, leases=set())
    assert result.gpus["h1"] == [UNAVAILABLE, FREE, FREE, UNAVAILABLE]


def test_synced_adds_new_hosts_as_rows_after_the_known_ones():
    matrix = Matrix(gpus={"h9": [1]})
    records = {"h9": record("h9", 1), "h3": record("h3", 2, avail=[1]), "h2": record("h2", 1)}
    result = synced(matrix, records, leases=set())
    assert list(result.gpus) == ["h9", "h2", "h3"]
    assert result.gpus["h3"] == [UNAVAILABLE, FREE]
    assert result.gpus["h2"] == [FREE]


def test_synced_grows_a_row_when_the_record_has_more_gpus():
    matrix = Matrix(gpus={"h1": ["live", 1]})
    result = synced(matrix, {"h1": record("h1", 4)}, leases={"live"})
    assert result.gpus["h1"] == ["live", FREE, FREE, FREE]


def test_synced_shrinks_a_row_but_never_below_a_held_cell():
    matrix = Matrix(gpus={"h1": [1, 1, 1, "live"]})
    result = synced(matrix, {"h1": record("h1", 2)}, leases={"live"})
    assert result.gpus["h1"] == [FREE, FREE, UNAVAILABLE, "live"]
    assert synced(Matrix(gpus={"h2": [1, 1, 1]}), {"h2": record("h2", 1)}, set()).gpus == {
        "h2": [FREE]
    }


def test_synced_is_pure_and_idempotent():
    matrix = Matrix(gpus={"h1": ["dead", 1]}, ports={"h1": {"20000": "dead"}})
    before = matrix.copy()
    records = {"h1": record("h1", 2), "h2": record("h2", 1)}
    once = synced(matrix, records, set())
    assert matrix == before
    assert same(synced(once, records, set()), once)


def test_same_ignores_key_order_but_not_content():
    a = Matrix(gpus={"h1": [1], "h2": [0]})
    b = Matrix(gpus={"h2": [0], "h1": [1]})
    assert same(a, b)
    assert not same(a, Matrix(gpus={"h1": [0], "h2": [0]}))


def test_ended_on_and_hosts_of_find_a_job_held_or_draining():
    matrix = Matrix(gpus={"h1": ["gone", "live", DRAINING + "old"], "h2": [1]},
                    ports={"h2": {"20000": "gone"}})
    assert matrix.ended_on("h1", leases={"live"}) == {"gone", "old"}
    assert matrix.ended_on("h2", leases={"live", "gone"}) == set()
    assert matrix.hosts_of("gone") == {"h1", "h2"} and matrix.hosts_of("old") == {"h1"}


def test_a_draining_cell_of_a_job_whose_lease_lives_is_not_ended():
    """Every member may write the matrix; a forged 'draining' cell must not make an agent
    stop a live job (only the owner or the admin can end one, by dropping its lease)."""
    matrix = Matrix(gpus={"h1": [DRAINING + "live", DRAINING + "old"]})
    assert matrix.ended_on("h1", leases={"live"}) == {"old"}


def test_synced_removes_the_row_of_a_host_not_registered_once_it_holds_nothing():
    """A forged host's row (its record deleted by the admin) leaves the matrix; a host that
    is registered keeps its row while its agent is down, and so does an unregistered row
    that a live job still holds (its job ends first)."""
    matrix = Matrix(gpus={"h1": [FREE, FREE], "h9": [FREE] * 64, "h8": ["live", FREE]},
                    ports={"h8": {"20000": "live"}})
    result = synced(matrix, records={}, leases={"live"}, registered=["h1"])
    assert result.gpus == {"h1": [UNAVAILABLE, UNAVAILABLE], "h8": ["live", UNAVAILABLE]}
    assert result.ports == {"h8": {"20000": "live"}}
    assert "h9" in synced(matrix, records={}, leases={"live"}).gpus  # without the list: kept


def test_state_of_reads_as_the_text_status_and_metrics_print():
    cells = [FREE, UNAVAILABLE, "job-1", f"{DRAINING}job-2", None]
    states = [state_of(cell) for cell in cells]
    assert states == ["free", "unavailable", "busy", "draining", "unavailable"]
    assert all(type(state) is GpuState for state in states)
    assert json.dumps(states) == '["free", "unavailable", "busy", "draining", "unavailable"]'
    assert [f"{state}" for state in GpuState] == ["free", "busy", "draining", "unavailable"]
