"""``--chief`` and ``--gpus-per-chief``: a chief for mirrored jobs too, with a GPU count of
its own, read by ``hypertf train`` and ``invoke train`` alike and refused where meaningless.

Real parsers; no ZooKeeper, no network.
"""

from __future__ import annotations

import pytest

from hypertf.cli import main as cli
from hypertf.core.errors import UsageError
from hypertf.launch.request import TRAIN_OPTIONS, TrainRequest
from tests.unit.test_options import invoke_parse


def test_the_chief_help_says_it_also_serves_mirrored_jobs() -> None:
    (chief,) = [o for o in TRAIN_OPTIONS if o.name == "chief"]
    assert "ParameterServerStrategy" in chief.help and "mirrored" in chief.help


@pytest.mark.parametrize("argv, worker_gpus, chief_gpus", [
    (["--chief"], 1, 1),  # by default as many as a worker: today's behaviour
    (["--chief", "--gpus-per-worker", "2"], 2, 2),
    (["--chief", "--gpus-per-chief", "0"], 1, 0),  # a coordinator that needs no GPU
    (["--chief", "--gpus-per-chief", "4", "--gpus-per-worker", "2"], 2, 4),
])
def test_gpus_per_chief_gives_the_chief_its_own_count(argv: list[str], worker_gpus: int,
                                                       chief_gpus: int) -> None:
    request = cli.train_request(cli.parse_train(["--script", "t.py", "--worker", "2", *argv]))
    slots = {slot.name: slot.gpus for slot in request.slots(cpu_only=False)}
    assert slots == {"chief:0": chief_gpus, "worker:0": worker_gpus, "worker:1": worker_gpus}
    assert {slot.gpus for slot in request.slots(cpu_only=True)} == {0}


def test_invoke_train_reads_gpus_per_chief_too() -> None:
    parsed = invoke_parse(["train", "--script", "t.py", "--chief", "--gpus-per-chief", "3"])
    assert parsed[0].args["gpus_per_chief"].value == 3


def test_a_negative_gpus_per_chief_is_refused_by_name() -> None:
    with pytest.raises(UsageError, match="GPU counts"):
        TrainRequest(script="t.py", chief=True, gpus_per_chief=-1).validate()


def test_gpus_per_chief_without_a_chief_is_refused() -> None:
    """It would be ignored silently: say so instead."""
    with pytest.raises(UsageError, match=r"--gpus-per-chief.*--chief"):
        TrainRequest(script="t.py", gpus_per_chief=2).validate()
