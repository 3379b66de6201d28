"""JobSet (jobset.x-k8s.io/v1alpha2): the whole job as one object, as ``hypertf train`` runs it.

One replicated job per role (chief, worker, ps), each a single Indexed Job whose pod
``i`` is the role's task ``i``: JobSet names it '<jobset>-<role>-0-<i>' and makes a headless
Service '<jobset>', so it answers to '<jobset>-<role>-0-<i>.<jobset>' before it is ready
(``publishNotReadyAddresses``). One pod template serves a role, so TF_CONFIG's task index
comes from the pod's completion index (hypertf.export.roletemplate).

What ``train`` decides, JobSet does:
- a failed task fails its Job (``backoffLimit: 0``) and ``failurePolicy`` restarts every Job
  of the set, up to --max-restarts times (a lone restarted worker would hang its peers);
  a task's own error (exit 1-127) ends the set unless --restart-on-failure, as in ``train``;
  --timeout (``activeDeadlineSeconds``) ends it;
- ``successPolicy``: the set is done when the finishers are (the chief of a parameter-server
  job, else every worker; the chief too when there is one), and JobSet then deletes the
  servers' Jobs;
- Kueue admits the set as one workload (``kueue.x-k8s.io/queue-name`` on the JobSet).
"""

from __future__ import annotations

import math
from typing import Any

from hypertf.export import k8s, kueue, roletemplate
from hypertf.export.job import PORT, ExportJob
from hypertf.export.kueue import priority_class_name

API = "jobset.x-k8s.io/v1alpha2"
CONTAINER = roletemplate.CONTAINER
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
RESTART_ATTEMPT = "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"
OWN_FAILURES = list(range(1, 128))  # a task's own exit; 128+ is a signal: retried, as in train


def host(name: str, role: str, index: int) -> str:
    """The pod's stable DNS name: '<jobset>-<role>-<job index 0>-<pod index>.<subdomain>'."""
    return f"{name}-{role}-0-{index}.{name}"


def address(name: str, _namespace: str) -> Any:
    return lambda role, index: f"{host(name, role, index)}:{PORT}"


def suffix(index: int) -> str:
    """The longest part JobSet adds to the name of a pod (a DNS label of 63 at most)."""
    return f"-worker-0-{index}"


def finishers(job: ExportJob) -> list[str]:
    """The roles whose end is the job's end, as ``hypertf train`` decides it: the chief of a
    parameter-server job, every worker (and the chief) of a mirrored or legacy one."""
    roles = job.roles()
    if job.request.ps and "chief" in roles:
        return ["chief"]
    return [role for role in ("chief", "worker") if role in roles]


def replicated_job(job: ExportJob, role: str) -> dict[str, Any]:
    tasks = job.roles()[role]
    request = job.request
    pod = roletemplate.pod(job, role, COMPLETION_INDEX, RESTART_ATTEMPT)
    if request.priority and not job.options.queue:
        pod["priorityClassName"] = priority_class_name(request.priority)
    spec: dict[str, Any] = {
        "completionMode": "Indexed", "completions": len(tasks), "parallelism": len(tasks),
        "backoffLimit": 0,  # a failed pod fails the Job: the set restarts, not the pod
        "template": {"metadata": {"labels": k8s.labels(job)}, "spec": pod},
    }
    if not request.restart_on_failure:
        # A task's own error is final, as in train; JobSet's rule below ends the set.
        spec["podFailurePolicy"] = {"rules": [{
            "action": "FailJob",
            "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                            "values": OWN_FAILURES}}]}
    if request.timeout is not None:
        spec["activeDeadlineSeconds"] = math.ceil(request.timeout)
    return {"name": role, "replicas": 1,
            "template": {"metadata": {"labels": k8s.labels(job)}, "spec": spec}}


def failure_policy(job: ExportJob) -> dict[str, Any]:
    """Restart the whole set after a failure, up to --max-restarts; never past the deadline,
    nor (without --restart-on-failure) after a task's own error."""
    final = ["DeadlineExceeded"]
    if not job.request.restart_on_failure:
        final.append("PodFailurePolicy")
    return {
        "maxRestarts": job.request.max_restarts,
        # every Job gone before the new ones start: no task of the old attempt meets the new
        "restartStrategy": "BlockingRecreate",
        "rules": [{"name": "final", "action": "FailJobSet", "onJobFailureReasons": final}],
    }


def jobset(job: ExportJob) -> dict[str, Any]:
    request = job.request
    metadata_labels = {**k8s.labels(job), **kueue.labels(job.options.queue, request.priority)}
    return {
        "apiVersion": API, "kind": "JobSet",
        "metadata": {"name": job.name, "namespace": job.namespace, "labels": metadata_labels},
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "failurePolicy": failure_policy(job),
            "successPolicy": {"operator": "All", "targetReplicatedJobs": finishers(job)},
            "replicatedJobs": [replicated_job(job, role) for role in job.roles()],
        },
    }


def manifest(job: ExportJob) -> list[dict[str, Any]]:
    """The priority class (cluster-scoped, its own document) and the JobSet."""
    objects: list[dict[str, Any]] = []
    if job.request.priority:
        objects.append(kueue.workload_priority_class(job.request.priority) if job.options.queue
                       else k8s.priority_class(job.request.priority))
    return [*objects, jobset(job)]
