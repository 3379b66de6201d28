"""Kubernetes without operators: a headless Service and a Job per task.

Each task's pod answers to its Service's DNS name ('<job>-worker-0.<namespace>.svc'), so
TF_CONFIG can name it before the pod exists. ``publishNotReadyAddresses`` lets peers
resolve a pod that has not yet passed a readiness check: TensorFlow dials its peers while
starting. A Job restarts only its own pod (``backoffLimit`` = --max-restarts), where
``hypertf train`` restarts the whole job; a mirrored job's survivors fail and restart too.
Kueue admits each Job alone. hypertf.export.jobset is the target that keeps a job whole.
"""

from __future__ import annotations

import math
from typing import Any

from hypertf.export.job import PORT, ExportJob, ExportTask
from hypertf.export.kueue import QUEUE as KUEUE_QUEUE
from hypertf.export.kueue import priority_class_name

LABEL_JOB = "hypertf.io/job"
LABEL_TASK = "hypertf.io/task"
GPU = "nvidia.com/gpu"
CLUSTER_SCOPED = ("PriorityClass", "WorkloadPriorityClass")  # not in any namespace
NOTE = ("hypertf: plain Jobs restart their own pod only (a mirrored or parameter-server job "
        "needs the whole job restarted) and Kueue admits each Job alone: --to jobset keeps "
        "the job whole")


def literal(value: str) -> str:
    """A value Kubernetes leaves as it is: it expands $(NAME) in env values, command and
    args, and '$$' is its escape."""
    return value.replace("$", "$$")


def priority_class(priority: int) -> dict[str, Any]:
    """HyperTF's queue orders by priority and never preempts: so does this class."""
    return {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": priority_class_name(priority)},
        "value": priority, "preemptionPolicy": "Never", "globalDefault": False,
        "description": f"hypertf --priority {priority}: queue order, no preemption",
    }


def container(job: ExportJob, task: ExportTask, name: str, port_name: str,
              with_env: bool = True) -> dict[str, Any]:
    """The task's container: its command, environment, port and GPU limit."""
    result: dict[str, Any] = {
        "name": name, "image": job.image, "command": [literal(a) for a in task.argv],
        "ports": [{"name": port_name, "containerPort": PORT, "protocol": "TCP"}],
    }
    if with_env:
        result["env"] = [{"name": k, "value": literal(v)} for k, v in task.env.items()]
    wanted = resources(job, task)
    if wanted:
        result["resources"] = wanted
    return result


def resources(job: ExportJob, task: ExportTask) -> dict[str, Any]:
    """GPUs as a limit (the device plugin hands out whole GPUs), --cpu/--memory as requests."""
    result: dict[str, Any] = {}
    if task.gpus:
        result["limits"] = {GPU: task.gpus}
    requests = {k: v for k, v in (("cpu", job.options.cpu), ("memory", job.options.memory)) if v}
    if requests:
        result["requests"] = requests
    return result


def labels(job: ExportJob, task: ExportTask | None = None) -> dict[str, str]:
    result = {LABEL_JOB: job.name}
    if task is not None:
        result[LABEL_TASK] = task.slug
    return result


def service(job: ExportJob, task: ExportTask) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{job.name}-{task.slug}", "namespace": job.namespace,
                     "labels": labels(job, task)},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": labels(job, task),
                 "ports": [{"name": "tf", "port": PORT, "targetPort": PORT,
                            "protocol": "TCP"}]},
    }


def batch_job(job: ExportJob, task: ExportTask) -> dict[str, Any]:
    request = job.request
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": max(1, math.ceil(request.grace)),
        "containers": [container(job, task, "tensorflow", "tf")],
    }
    if request.priority:
        pod["priorityClassName"] = priority_class_name(request.priority)
    spec: dict[str, Any] = {
        "backoffLimit": request.max_restarts,
        "template": {"metadata": {"labels": labels(job, task)}, "spec": pod},
    }
    if request.timeout is not None:
        spec["activeDeadlineSeconds"] = math.ceil(request.timeout)
    meta_labels = labels(job, task)
    if job.options.queue:
        meta_labels[KUEUE_QUEUE] = job.options.queue
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{job.name}-{task.slug}", "namespace": job.namespace,
                     "labels": meta_labels},
        "spec": spec,
    }


def manifest(job: ExportJob) -> list[dict[str, Any]]:
    """Every object, in the order to apply them: PriorityClass, Services, Jobs."""
    objects: list[dict[str, Any]] = []
    if job.request.priority:
        objects.append(priority_class(job.request.priority))
    objects += [service(job, task) for task in job.tasks]
    objects += [batch_job(job, task) for task in job.tasks]
    return objects
