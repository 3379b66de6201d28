"""The environment variables HyperTF sets for every task, listed once.

The launcher sets them over the user's (``--env``, the inventory's ``hypertf_task_env``), so a
user's value of one of them would be overwritten without a word: the same list refuses them
by name (``config.settings.check_env``) and checks what the launcher sets (``ours``).
"""

from __future__ import annotations

from collections.abc import Mapping

from hypertf.core.rendezvous import RENDEZVOUS_ENV

GPU_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HYPERTF_GPUS")  # spec.gpu_env
TASK_ENV = (
    "TF_CONFIG",
    "HYPERTF_TASK_KEY",  # the job's key: the agent finds a task's job by it
    "HYPERTF_TASK",  # worker:0
    "HYPERTF_ATTEMPT",  # 1 for the first try (restarts)
    "HYPERTF_CHECKPOINT_DIR",
    "HYPERTF_TENSORBOARD_DIR",
    "HYPERTF_METRICS_FILE",  # the reporting task only
    "HYPERTF_START_AFTER",  # host:port task.sh waits for (TF1: the workers after worker 0)
    "HYPERTF_PREEMPT_FILE",  # written before a preemption's SIGTERM (hypertf.core.preemptnotice)
)
# Set by the node ('tasknode start', hypertf.node.confine): the job's cgroups to join.
NODE_ENV = ("HYPERTF_CGROUP_PROCS", "HYPERTF_CGROUP_REQUIRED")
RESERVED_ENV = frozenset(GPU_ENV + TASK_ENV + RENDEZVOUS_ENV + NODE_ENV)  # + Keras 3, JAX...


def ours(values: Mapping[str, str]) -> dict[str, str]:
    """HyperTF's own variables for one task, each checked against the list: a name that
    is not there is a bug (a user's --env of it would be lost), so it fails loudly."""
    unknown = sorted(set(values) - RESERVED_ENV)
    assert not unknown, f"add {', '.join(unknown)} to hypertf.core.taskenv.TASK_ENV"
    return dict(values)
