"""The exported manifests run: each pod's container command, with its environment, as a
process on a lab host that answers to the pod's Service name (the host's own /etc/hosts),
without HyperTF's launcher. The image's WORKDIR is the build context 'export --to docker'
writes, so the Dockerfile's layout is checked on the way."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hypertf.config.inventory import load_inventory
from hypertf.export import ExportOptions, export
from hypertf.export.job import node_setup
from hypertf.launch.request import TrainRequest
from tests.conftest import on_host, wait_for
from tests.launcher.helpers import EXAMPLES

STEPS = ("--steps", "150")  # enough for the example's 0.90 accuracy bar


def operator_tf_config(tfjob: dict[str, Any], role: str, index: int) -> str:
    """What the training operator (v1.9 genTFConfigJSONStr) injects into a replica's pod."""
    name, namespace = tfjob["metadata"]["name"], tfjob["metadata"]["namespace"]
    cluster = {
        rtype.lower(): [f"{name}-{rtype.lower()}-{i}.{namespace}.svc:2222"
                        for i in range(spec["replicas"])]
        for rtype, spec in tfjob["spec"]["tfReplicaSpecs"].items()}
    return json.dumps({"cluster": cluster, "task": {"type": role, "index": index},
                       "environment": "cloud"})


def pods(target: str, text: str) -> list[tuple[str, list[str], dict[str, str]]]:
    """(Service name, command, environment) of every pod the manifest makes."""
    docs = list(yaml.safe_load_all(text))
    result = []
    if target == "k8s":
        for job in (d for d in docs if d["kind"] == "Job"):
            (container,) = job["spec"]["template"]["spec"]["containers"]
            env = {e["name"]: e["value"] for e in container["env"]}
            result.append((f"{job['metadata']['name']}.{job['metadata']['namespace']}.svc",
                           container["command"], env))
        return result
    (tfjob,) = [d for d in docs if d["kind"] == "TFJob"]
    for rtype, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        (container,) = spec["template"]["spec"]["containers"]
        for index in range(spec["replicas"]):
            env = {e["name"]: e["value"] for e in container["env"]}
            env["TF_CONFIG"] = operator_tf_config(tfjob, rtype.lower(), index)
            service = f"{tfjob['metadata']['name']}-{rtype.lower()}-{index}"
            result.append((f"{service}.{tfjob['metadata']['namespace']}.svc",
                           container["command"], env))
    return result


@pytest.mark.lab
@pytest.mark.tf
@pytest.mark.parametrize("target", ["k8s", "tfjob"])
def test_exported_pods_train_on_lab_hosts(lab, tmp_path, target):
    inv = load_inventory(lab.inventory)
    request = TrainRequest(script=str(EXAMPLES / "mirrored_strategy.py"), workers=2,
                           gpus_per_worker=0, args=STEPS)
    context = tmp_path / "context"
    export(request, ExportOptions("docker"), node_setup(inv), output=str(context))
    workdir = context / "app"  # the image's WORKDIR
    text, _notes = export(request, ExportOptions(target, image="digits:1", namespace="ml"),
                          node_setup(inv))
    tasks = pods(target, text)
    assert len(tasks) == 2
    hosts = [lab.host(name) for name in ("h1", "h2")]
    names = "".join(f"{host.address} {service}\n"
                    for host, (service, _, _) in zip(hosts, tasks, strict=True))
    hosts_files = [lab.dir / h.name / "hosts" for h in lab.hosts]
    saved = [path.read_text() for path in hosts_files]
    try:
        for path in hosts_files:  # in place: the file is bind-mounted on /etc/hosts
            with path.open("a") as hosts_file:
                hosts_file.write(names)
        for host, (service, command, env) in zip(hosts, tasks, strict=True):
            out = tmp_path / service
            variables = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                         "HOME": "/root", **env}
            run = " ".join(["exec", "env", "-i",
                            *(shlex.quote(f"{k}={v}") for k, v in variables.items()),
                            *map(shlex.quote, command)])
            inner = f"cd {shlex.quote(str(workdir))} && ({run}) > {out}.log 2>&1; " \
                    f"echo $? > {out}.rc"
            on_host(inv, host.name,
                    f"setsid sh -c {shlex.quote(inner)} < /dev/null > /dev/null 2>&1 &")
        rcs = [tmp_path / f"{service}.rc" for service, _, _ in tasks]
        wait_for(lambda: all(rc.exists() and rc.read_text().strip() for rc in rcs), 300,
                 "both workers to exit")
    finally:
        for path, text_before in zip(hosts_files, saved, strict=True):
            path.write_text(text_before)
    logs = {service: (tmp_path / f"{service}.log").read_text() for service, _, _ in tasks}
    for service, _, _ in tasks:
        assert (tmp_path / f"{service}.rc").read_text().strip() == "0", logs[service][-3000:]
    chief_log = logs[tasks[0][0]]
    assert "test_accuracy=" in chief_log, chief_log[-3000:]
