"""One pod template per role (JobSet, Volcano): what differs per task comes from the pod.

The operator knows each pod's index (an annotation); the downward API gives it to the
container as HYPERTF_TASK_INDEX, defined first, so Kubernetes' $(NAME) expansion puts it
into TF_CONFIG, HYPERTF_TASK and a legacy --task_index. HYPERTF_RESTART is the operator's
restart count (0 on the first run: train's HYPERTF_ATTEMPT less one; Kubernetes cannot add).
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypertf.export import k8s
from hypertf.export.job import ExportJob, ExportTask

INDEX_ENV = "HYPERTF_TASK_INDEX"
_MARKER = "__HYPERTF_INDEX__"


def tf_config(job: ExportJob, role: str) -> str:
    """The role's TF_CONFIG with '$(HYPERTF_TASK_INDEX)' for the task's index."""
    cluster = {r: [t.address for t in tasks] for r, tasks in job.roles().items()}
    text = json.dumps({"cluster": cluster, "task": {"type": role, "index": _MARKER}})
    return k8s.literal(text).replace(f'"{_MARKER}"', f"$({INDEX_ENV})")


# The rendezvous variables that differ between a role's tasks (docs/frameworks.md): a pod
# template has one value for all, so each is the pod's index where that is right.
PER_TASK = ("RANK", "KERAS_DISTRIBUTION_PROCESS_ID", "JAX_PROCESS_ID", "NODE_RANK")


def per_task_value(job: ExportJob, role: str, value: str, index: str | None) -> str | None:
    """A rank variable in a role's template: its one task's value when it has one task; the
    pod's ``index`` (an expression of the target) when the role's ranks start at 0 (the
    workers of a job without a chief: rank = index, one task per pod, so NODE_RANK too);
    else None, left out: a template cannot add an offset to an index."""
    if len(job.roles()[role]) == 1:
        return value
    return index if index is not None and value == "0" else None


def field(path: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": path}}


def environment(job: ExportJob, first: ExportTask, index_field: str,
                attempt_field: str) -> list[dict[str, Any]]:
    """The role's environment: the index and attempt first (Kubernetes expands $(NAME) only
    from variables defined before), TF_CONFIG when the task env has it."""
    env: list[dict[str, Any]] = [
        {"name": INDEX_ENV, "valueFrom": field(index_field)},
        {"name": "HYPERTF_RESTART", "valueFrom": field(attempt_field)},
    ]
    for name, value in first.env.items():
        if name == "HYPERTF_TASK":
            env.append({"name": name, "value": f"{first.role}:$({INDEX_ENV})"})
        elif name == "TF_CONFIG":
            env.append({"name": name, "value": tf_config(job, first.role)})
        elif name in PER_TASK:
            templated = per_task_value(job, first.role, value, f"$({INDEX_ENV})")
            if templated is not None:
                env.append({"name": name, "value": templated})
        else:
            env.append({"name": name, "value": k8s.literal(value)})
    return env


def command(job: ExportJob, first: ExportTask) -> list[str]:
    """The role's command; a legacy --task_index is the pod's own."""
    argv = [k8s.literal(a) for a in first.argv]
    if job.legacy_flags:
        argv = [f"--task_index=$({INDEX_ENV})" if a.startswith("--task_index=") else a
                for a in argv]
    return argv


CONTAINER = "tensorflow"


def pod(job: ExportJob, role: str, index_field: str, restart_field: str) -> dict[str, Any]:
    """A role's pod spec as JobSet and Volcano both run it: one container of the job's
    image with the role's environment and command, never restarted in place (the set or
    the job restarts as a whole), the launcher's grace as the termination grace; the caller
    adds what its controller needs."""
    first = job.roles()[role][0]
    main = k8s.container(job, first, CONTAINER, "tf", with_env=False)
    main["env"] = environment(job, first, index_field, restart_field)
    main["command"] = command(job, first)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": max(1, math.ceil(job.request.grace)),
        "containers": [main],
    }
    return spec
