"""The keeper's screen before a pass (hypertf.keeper.screen.Screen): whether a waiting
request could ever fit the cluster is decided once per shape, so a queue of 1,000 jobs
that ask the same of a large cluster costs one scan of its hosts."""

from __future__ import annotations

import pytest

from hypertf.core.admission import Waiting
from hypertf.core.limits import UserLimits
from hypertf.core.matrix import FREE, Matrix
from hypertf.core.placement import Request
from hypertf.core.scheduler import TaskSlot
from hypertf.keeper import screen as screening

HOSTS = tuple(f"h{i}" for i in range(600))  # more than the exact check's 512


def waiting(n: int, workers: int, gpus: int = 1) -> Waiting:
    slots = tuple(TaskSlot("worker", i, gpus) for i in range(workers))
    return Waiting(f"20261125-2200{n:02d}-aaaaaa.alice", Request(slots, tuple(HOSTS)), order=n)


def test_same_shaped_requests_are_judged_once_and_those_that_never_fit_are_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    matrix = Matrix(gpus={h: [FREE] * 2 for h in HOSTS}, ports={})
    judged: list[Request] = []
    real = screening._could_ever_fit

    def counting(request: Request, matrix: Matrix) -> bool:
        judged.append(request)
        return real(request, matrix)

    monkeypatch.setattr(screening, "_could_ever_fit", counting)
    jobs = [waiting(i, workers=8) for i in range(50)] + [waiting(50, workers=1, gpus=3)]
    kept, refused = screening.Screen()(jobs, {}, matrix, UserLimits())
    assert len(kept) == 50 and list(refused) == [jobs[-1].task_key]
    assert "more than the cluster's hosts can ever hold" in refused[jobs[-1].task_key]
    assert len(judged) == 2, "one scan per shape, not one per job"


def test_a_host_that_gains_gpus_lets_a_refused_shape_fit() -> None:
    screen = screening.Screen()
    small = Matrix(gpus={h: [FREE] * 2 for h in HOSTS}, ports={})
    _, refused = screen([waiting(1, workers=1, gpus=3)], {}, small, UserLimits())
    assert refused, "3 GPUs on one host: no host has 3"
    grown = Matrix(gpus={**small.gpus, "h0": [FREE] * 4}, ports={})
    kept, refused = screen([waiting(2, workers=1, gpus=3)], {}, grown, UserLimits())
    assert len(kept) == 1 and not refused, "the same shape, judged again on the new sizes"
