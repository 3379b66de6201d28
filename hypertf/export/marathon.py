"""Marathon (Mesos): an app group with one sub-group per role, one app per task. Legacy:
Apache Mesos and Marathon moved to the Apache Attic in 2025; kept for clusters that run them.

Like tensorflow/ecosystem's Marathon template, each task is its own app: Marathon gives an
app's instances no index, and TF_CONFIG needs one. The app '/<job>/worker/0' answers to
Mesos-DNS as '0-worker-<job>.marathon.mesos'; it runs on the host network on port 2222
(``requirePorts``), so two tasks of a job never share an agent.
"""

from __future__ import annotations

import math
from typing import Any

from hypertf.export.job import PORT, ExportJob, ExportTask

NOTE = ("hypertf: Marathon restarts tasks that exit (it runs services): remove the group "
        "when the job is done ('dcos marathon group remove'); --max-restarts, --timeout and "
        "--priority have no Marathon equivalent. Marathon is legacy (Apache Attic, 2025)")


def mesos_dns_address(name: str) -> Any:
    """'/<name>/<role>/<index>' is '<index>-<role>-<name>.marathon.mesos' in Mesos-DNS."""
    return lambda role, index: f"{index}-{role}-{name}.marathon.mesos:{PORT}"


def app(job: ExportJob, task: ExportTask) -> dict[str, Any]:
    result: dict[str, Any] = {
        "id": str(task.index),
        "args": list(task.argv),
        "instances": 1,
        "cpus": 1, "mem": 2048, "disk": 0,
        "env": dict(task.env),
        # The Mesos containerizer runs the Docker image and is the one that hands out GPUs.
        "container": {"type": "MESOS", "docker": {"image": job.image}},
        "networks": [{"mode": "host"}],
        "portDefinitions": [{"port": PORT, "name": "tf", "protocol": "tcp"}],
        "requirePorts": True,
        "constraints": [["hostname", "UNIQUE"]],
        "taskKillGracePeriodSeconds": max(1, math.ceil(job.request.grace)),
        "labels": {"hypertf_job": job.name, "hypertf_task": task.name},
    }
    if task.gpus:
        result["gpus"] = task.gpus
    return result


def manifest(job: ExportJob) -> dict[str, Any]:
    return {
        "id": f"/{job.name}",
        "groups": [{"id": role, "apps": [app(job, task) for task in tasks]}
                   for role, tasks in job.roles().items()],
    }
