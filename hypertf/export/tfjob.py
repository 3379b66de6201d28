"""Kubeflow's TFJob (kubeflow.org/v1): Chief, PS and Worker replica specs. Legacy: Kubeflow
Trainer v2 (TrainJob) replaced the training operator and has no TensorFlow runtime; the
training operator v1.9 still runs TFJobs. --to jobset is the current target.

The training operator makes the headless Services and injects TF_CONFIG into every pod
(addresses '<job>-<role>-<index>.<namespace>.svc:2222', as hypertf.export.job names them
too), so the manifest carries no TF_CONFIG; the legacy flags, when passed, name the same
addresses. One pod template serves every replica of a role, so nothing per task is set.
"""

from __future__ import annotations

import math
from typing import Any

from hypertf.export import roletemplate
from hypertf.export.job import ExportJob
from hypertf.export.k8s import container, literal, priority_class
from hypertf.export.kueue import QUEUE as KUEUE_QUEUE
from hypertf.export.kueue import priority_class_name

REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS"}
CONTAINER = "tensorflow"  # the operator finds the container by this name...
PORT_NAME = "tfjob-port"  # ... and the port by this one
NOTE = ("hypertf: the TFJob carries no TF_CONFIG: the training operator injects it into "
        "each pod (with the same Service names the legacy flags use). TFJob is legacy "
        "(Kubeflow Trainer v2 dropped TensorFlow): --to jobset is the current target")


def replica_spec(job: ExportJob, role: str) -> dict[str, Any]:
    tasks = job.roles()[role]
    first = tasks[0]
    # no index variable here: a rank variable only for a role of one task
    env = [{"name": k, "value": literal(v)} for k, v in first.env.items()
           if k != "HYPERTF_TASK" and (k not in roletemplate.PER_TASK
                                       or roletemplate.per_task_value(job, role, v, None))]
    main = container(job, first, CONTAINER, PORT_NAME, with_env=False)
    main["env"] = env
    # the per-task flags differ: the job name and index come from the pod's TF_CONFIG.
    if job.legacy_flags:
        main["command"] = shell_command(job, role)
    pod: dict[str, Any] = {"containers": [main]}
    if job.request.priority:
        pod["priorityClassName"] = priority_class_name(job.request.priority)
    return {"replicas": len(tasks), "restartPolicy": restart_policy(job),
            "template": {"spec": pod}}


def restart_policy(job: ExportJob) -> str:
    """--max-restarts restarts after a signal or a lost host (the operator's ExitCode:
    128+ is retried, 1-127 is final); --restart-on-failure after any exit."""
    if not job.request.max_restarts:
        return "Never"
    return "OnFailure" if job.request.restart_on_failure else "ExitCode"


def shell_command(job: ExportJob, role: str) -> list[str]:
    """With legacy flags: take --task_index from the pod's TF_CONFIG (the operator's)."""
    import shlex

    task = job.roles()[role][0]
    argv = list(task.argv)
    flags = [a for a in argv if a.startswith("--task_index=")]
    index = argv.index(flags[0])
    read = ("python -c 'import json, os; "
            "print(json.loads(os.environ[\"TF_CONFIG\"])[\"task\"][\"index\"])'")
    before = " ".join(shlex.quote(a) for a in argv[:index])
    after = " ".join(shlex.quote(a) for a in argv[index + 1:])
    # '$$' is Kubernetes' escape of '$' (it expands $(NAME) in commands).
    script = literal(f'exec {before} --task_index="$({read})" {after}'.rstrip())
    return ["sh", "-c", script]


def manifest(job: ExportJob) -> list[dict[str, Any]]:
    request = job.request
    run_policy: dict[str, Any] = {"cleanPodPolicy": "Running",
                                  "backoffLimit": request.max_restarts}
    if request.timeout is not None:
        run_policy["activeDeadlineSeconds"] = math.ceil(request.timeout)
    if request.priority:
        run_policy["schedulingPolicy"] = {"priorityClass": priority_class_name(request.priority)}
    if job.options.queue:
        run_policy.setdefault("schedulingPolicy", {})["queue"] = job.options.queue
    metadata: dict[str, Any] = {"name": job.name, "namespace": job.namespace}
    if job.options.queue:
        metadata["labels"] = {KUEUE_QUEUE: job.options.queue}
    tfjob: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": metadata,
        "spec": {"runPolicy": run_policy,
                 "tfReplicaSpecs": {REPLICA_TYPES[role]: replica_spec(job, role)
                                    for role in job.roles()}},
    }
    if not (request.ps and request.chief):
        # Legacy between-graph: the workers finish, the ps serve forever. Mirrored: every
        # worker is a finisher, as in train; the default policy (the chief or worker 0)
        # with cleanPodPolicy Running would delete workers still training.
        tfjob["spec"]["successPolicy"] = "AllWorkers"
    objects: list[dict[str, Any]] = []
    if request.priority:
        objects.append(priority_class(request.priority))
    return [*objects, tfjob]
