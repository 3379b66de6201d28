"""The pure rules behind the trust model: a waiting request read from its owner's record
(core/requestcheck), a node's trespass verdict (node/trespass.judge), the matrix's shape."""

from __future__ import annotations

import math

import pytest

from hypertf.core.matrix import Matrix
from hypertf.core.records import GpuInfo
from hypertf.core.requestcheck import InvalidRequest, waiting_from_record
from hypertf.node.trespass import Seen, judge

KEY = "20261125-120000-abcdef.mallory"


def record(**queue: object) -> dict:
    base = {"priority": 0, "hosts": ["n[01:04]"], "policy": "round_robin",
            "slots": [["worker", 0, 1]], "port_range": [20000, 20999], "port_ranges": {},
            "exclude_ports": {}, "held": False, "no_wait": False}
    return {"task_key": KEY, "state": "queued", "queue": {**base, **queue}}


def test_a_valid_request_is_read_with_bounded_ints():
    job = waiting_from_record(record(priority=3), 7, KEY)
    assert job.priority == 3 and job.order == 7 and job.request.hosts[-1] == "n04"
    assert job.request.gpus == 1


@pytest.mark.parametrize(("queue", "reason"), [
    ({"priority": math.inf}, "priority is Infinity"),
    ({"priority": 1.5}, "priority is 1.5"),
    ({"priority": True}, "priority is True"),
    ({"slots": [["worker", 0, "2"]]}, "GPU count is '2'"),
    ({"slots": [["worker", 0, -1]]}, "GPU count -1 is outside"),
    ({"slots": [["worker", 0, 1], ["worker", 0, 1]]}, "appears twice"),
    ({"slots": [["root", 0, 1]]}, "task role 'root'"),
    ({"slots": []}, "non-empty list"),
    ({"hosts": ["n[00000000:99999999]"]}, "more than"),
    ({"hosts": ["a b"]}, "not a host name"),
    ({"policy": "mine-first"}, "policy 'mine-first'"),
    ({"port_range": [0, 70000]}, "outside"),
    ({"held": "yes"}, "true or false"),
    ({"grant": [1]}, "unknown request field(s) grant"),
])
def test_a_hostile_request_is_refused_with_its_reason(queue, reason):
    with pytest.raises(InvalidRequest) as caught:
        waiting_from_record(record(**queue), 0, KEY)
    assert reason in str(caught.value)


def test_a_record_naming_another_key_is_refused():
    with pytest.raises(InvalidRequest, match="not the key it is stored under"):
        waiting_from_record(record(), 0, "20261125-120000-abcdef.alice")


GPUS = [GpuInfo(i, "g", f"GPU-{i}", 0.0, 0, 1, True) for i in range(3)]


def seen(claims: str, *gpus: int) -> Seen:
    return Seen(pid=100 + len(claims), pgid=100, claims=claims, gpus={g: "env" for g in gpus})


def test_trespass_is_another_jobs_gpu_or_a_held_gpu_without_a_job():
    row = ["a.alice", "draining:b.bob", 1]
    assert judge([seen("a.alice", 0)], row, GPUS) == []  # its own GPU
    assert judge([seen("b.bob", 1)], row, GPUS) == []  # its own, while it drains
    assert judge([seen("", 2)], row, GPUS) == []  # foreign work on a free GPU: unavailable
    found = judge([seen("b.bob", 0), seen("", 0), seen("a.alice", 2)], row, GPUS)
    assert [(t.claims, t.gpu, t.holder) for t in found] == [
        ("b.bob", 0, "a.alice"), ("", 0, "a.alice"), ("a.alice", 2, "")]
    assert {t.uuid for t in found} == {"GPU-0", "GPU-2"}


@pytest.mark.parametrize("data", [b'{"format":1,"gpus":{"n1":"x"}}',
                                  b'{"format":1,"gpus":{"n1":[1,[2]]}}',
                                  b'{"format":1,"gpus":{},"ports":{"n1":{"1":7}}}',
                                  b'{"format":1,"gpus":[]}'])
def test_a_matrix_shard_of_the_wrong_shape_is_refused(data):
    with pytest.raises(ValueError):
        Matrix.from_json(data)
