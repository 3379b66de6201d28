"""One list of the environment HyperTF sets for every task: each of its names is refused by
name in ``--env``, and the settings and the launcher read the same list."""

from __future__ import annotations

import pytest

from hypertf.config.settings import RESERVED_ENV, check_env
from hypertf.core.errors import UsageError
from hypertf.launch.request import TrainRequest

# What the launcher sets for every task (launch/taskstart.py's StartPlan.task_requests,
# spec.gpu_env).
SET_BY_HYPERTF = ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HYPERTF_GPUS",
                  "HYPERTF_TASK_KEY", "HYPERTF_TASK", "HYPERTF_ATTEMPT",
                  "HYPERTF_CHECKPOINT_DIR", "HYPERTF_TENSORBOARD_DIR", "HYPERTF_METRICS_FILE",
                  "HYPERTF_START_AFTER")


@pytest.mark.parametrize("name", SET_BY_HYPERTF)
def test_every_variable_hypertf_sets_is_refused_by_name_in_env(name: str) -> None:
    with pytest.raises(UsageError, match=f"{name} is set by HyperTF"):
        TrainRequest(script="t.py", env=(f"{name}=/mine",)).validate()


def test_the_tensorboard_dir_is_reserved() -> None:
    """A user's --env HYPERTF_TENSORBOARD_DIR=... was silently overwritten."""
    with pytest.raises(ValueError, match="HYPERTF_TENSORBOARD_DIR is set by HyperTF"):
        check_env("HYPERTF_TENSORBOARD_DIR", "/x", "--env")


def test_the_settings_and_the_launcher_read_the_same_list() -> None:
    from hypertf.core import taskenv

    assert RESERVED_ENV is taskenv.RESERVED_ENV


def test_a_variable_hypertf_sets_outside_the_list_is_a_bug() -> None:
    """The launcher's values go through taskenv.ours: a new name must join the list, else
    a user's --env of it would be overwritten without a word."""
    from hypertf.core import taskenv

    assert taskenv.ours({"TF_CONFIG": "{}", "HYPERTF_TASK": "worker:0"}) == {
        "TF_CONFIG": "{}", "HYPERTF_TASK": "worker:0"}
    with pytest.raises(AssertionError, match="HYPERTF_NEW"):
        taskenv.ours({"HYPERTF_NEW": "1"})
