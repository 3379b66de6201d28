"""Volcano (batch.volcano.sh/v1alpha1 Job): a gang-scheduled job whose plugins build TF_CONFIG.

Volcano schedules the job's pods together (``minAvailable``: every task, or none runs). Its
``svc`` plugin gives each pod the hostname '<job>-<task>-<index>' under a headless Service
'<job>', its ``env`` plugin the pod's index, and its ``tensorflow`` plugin writes TF_CONFIG
from those names (port 2222), so the manifest carries no TF_CONFIG; the legacy flags, when
passed, name the same addresses. The policies do what ``hypertf train`` does: a finisher's
end completes the job (Volcano then kills the servers), a task killed by a signal or an
evicted pod restarts the whole job (``maxRetry`` = --max-restarts), a task's own error ends it
(unless --restart-on-failure).
"""

from __future__ import annotations

import math
from typing import Any

from hypertf.export import k8s, roletemplate
from hypertf.export.job import PORT, ExportJob
from hypertf.export.kueue import priority_class_name

API = "batch.volcano.sh/v1alpha1"
CONTAINER = roletemplate.CONTAINER
TASK_INDEX = "metadata.annotations['volcano.sh/task-index']"
RETRY_COUNT = "metadata.annotations['volcano.sh/job-retry-count']"
SIGNALS = (137, 143)  # SIGKILL, SIGTERM: a lost node, an OOM kill, a preemption
NOTE = ("hypertf: the Volcano Job carries no TF_CONFIG: its tensorflow plugin writes it into "
        "each pod (with the names its svc plugin gives them)")


def address(name: str, _namespace: str) -> Any:
    """What Volcano's MakeDomainName gives a task: '<job>-<task>-<index>.<job>'."""
    return lambda role, index: f"{name}-{role}-{index}.{name}:{PORT}"


def finisher_roles(job: ExportJob) -> list[str]:
    """Roles whose completion completes the job when servers would run on forever."""
    if not job.request.ps:
        return []  # every task finishes: Volcano completes the job when all have
    return ["chief"] if "chief" in job.roles() else ["worker"]


def policies(job: ExportJob) -> list[dict[str, Any]]:
    """First match wins (Volcano's applyPolicies): signals, then any failure, evictions."""
    request = job.request
    if not request.max_restarts:
        return [{"event": "PodFailed", "action": "TerminateJob"},
                {"event": "PodEvicted", "action": "TerminateJob"}]
    result: list[dict[str, Any]] = [{"exitCode": code, "action": "RestartJob"}
                                    for code in SIGNALS]
    result.append({"event": "PodFailed",
                   "action": "RestartJob" if request.restart_on_failure else "TerminateJob"})
    result.append({"event": "PodEvicted", "action": "RestartJob"})
    return result


def task(job: ExportJob, role: str) -> dict[str, Any]:
    tasks = job.roles()[role]
    request = job.request
    pod = roletemplate.pod(job, role, TASK_INDEX, RETRY_COUNT)
    if request.timeout is not None:
        pod["activeDeadlineSeconds"] = math.ceil(request.timeout)
    result: dict[str, Any] = {
        "name": role, "replicas": len(tasks),
        "template": {"metadata": {"labels": k8s.labels(job)}, "spec": pod},
    }
    if role in finisher_roles(job):
        result["policies"] = [{"event": "TaskCompleted", "action": "CompleteJob"}]
    return result


def volcano_job(job: ExportJob) -> dict[str, Any]:
    request = job.request
    spec: dict[str, Any] = {
        "schedulerName": "volcano",
        "minAvailable": len(job.tasks),  # the gang: all tasks or none
        "plugins": {"tensorflow": [f"--port={PORT}"],
                    "svc": ["--publish-not-ready-addresses=true"], "env": []},
        "policies": policies(job),
        "tasks": [task(job, role) for role in job.roles()],
    }
    if request.max_restarts:
        spec["maxRetry"] = request.max_restarts  # 0 would be Volcano's default, 3
    if job.options.queue:
        spec["queue"] = job.options.queue
    if request.priority:
        spec["priorityClassName"] = priority_class_name(request.priority)
    return {"apiVersion": API, "kind": "Job",
            "metadata": {"name": job.name, "namespace": job.namespace,
                         "labels": k8s.labels(job)},
            "spec": spec}


def manifest(job: ExportJob) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    if job.request.priority:
        objects.append(k8s.priority_class(job.request.priority))
    return [*objects, volcano_job(job)]
