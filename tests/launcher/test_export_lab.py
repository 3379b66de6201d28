"""The exported manifests run: each pod's container command, with the environment its
operator and the kubelet give it, as a process on a lab host that answers to the pod's DNS
name (the host's own /etc/hosts), without HyperTF's launcher. The image's WORKDIR (/app) is
the build context 'export --to docker' writes, so the Dockerfile's layout is checked on the
way. For the JobSet, a small runner does what JobSet's controller does on a failure: it
deletes every pod of the set and starts them all again."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hypertf.config.inventory import load_inventory
from hypertf.export import ExportOptions, export
from hypertf.export.job import WORKDIR, node_setup
from hypertf.launch.request import TrainRequest
from tests.conftest import on_host, wait_for
from tests.launcher.helpers import EXAMPLES
from tests.unit.test_export import jobset_pods, volcano_pods

STEPS = ("--steps", "150")  # enough for the example's 0.90 accuracy bar
Pod = tuple[str, list[str], dict[str, str]]  # DNS name, command, environment


def operator_tf_config(tfjob: dict[str, Any], role: str, index: int) -> str:
    """What the training operator (v1.9 genTFConfigJSONStr) injects into a replica's pod."""
    name, namespace = tfjob["metadata"]["name"], tfjob["metadata"]["namespace"]
    cluster = {
        rtype.lower(): [f"{name}-{rtype.lower()}-{i}.{namespace}.svc:2222"
                        for i in range(spec["replicas"])]
        for rtype, spec in tfjob["spec"]["tfReplicaSpecs"].items()}
    return json.dumps({"cluster": cluster, "task": {"type": role, "index": index},
                       "environment": "cloud"})


def pods(target: str, text: str, attempt: int = 0) -> list[Pod]:
    """(DNS name, command, environment) of every pod the manifest makes."""
    docs = list(yaml.safe_load_all(text))
    result = []
    if target == "jobset":
        return jobset_pods(docs[-1], attempt)
    if target == "volcano":
        return volcano_pods(docs[-1])
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


@contextlib.contextmanager
def names_on_lab_hosts(lab: Any, names: dict[str, str]) -> Iterator[None]:
    """Every lab host's /etc/hosts answers ``names`` (DNS name -> lab host name)."""
    hosts_files = [lab.dir / h.name / "hosts" for h in lab.hosts]
    saved = [path.read_text() for path in hosts_files]
    lines = "".join(f"{lab.host(host).address} {name}\n" for name, host in names.items())
    try:
        for path in hosts_files:  # in place: the file is bind-mounted on /etc/hosts
            with path.open("a") as hosts_file:
                hosts_file.write(lines)
        yield
    finally:
        for path, text_before in zip(hosts_files, saved, strict=True):
            path.write_text(text_before)


def in_context(command: list[str], workdir: Path) -> list[str]:
    """The image's /app is the build context's app/ here; the manifests name the script by
    its absolute path in the image."""
    assert command[1].startswith(f"{WORKDIR}/"), command
    return [command[0], str(workdir / command[1][len(WORKDIR) + 1:]), *command[2:]]


def start_pod(inventory: Any, host: str, pod: Pod, workdir: Path, out: Path) -> None:
    """The pod's process on ``host``: env -i with the pod's environment, in WORKDIR; its pid,
    log and exit status beside ``out``."""
    _, command, env = pod
    variables = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": "/root", **env}
    run = " ".join(["exec", "env", "-i",
                    *(shlex.quote(f"{k}={v}") for k, v in variables.items()),
                    *map(shlex.quote, in_context(command, workdir))])
    child = f"echo $$ > {out}.pid; {run}"
    inner = f"cd {shlex.quote(str(workdir))} && sh -c {shlex.quote(child)} > {out}.log 2>&1; " \
            f"echo $? > {out}.rc"
    on_host(inventory, host, f"setsid sh -c {shlex.quote(inner)} < /dev/null > /dev/null 2>&1 &")


def exit_status(out: Path) -> int | None:
    rc = Path(f"{out}.rc")
    return int(rc.read_text()) if rc.exists() and rc.read_text().strip() else None


def build_context(lab: Any, tmp_path: Path, request: TrainRequest) -> Path:
    context = tmp_path / "context"
    export(request, ExportOptions("docker"), node_setup(load_inventory(lab.inventory)),
           output=str(context))
    return context / "app"


@pytest.mark.lab
@pytest.mark.tf
@pytest.mark.parametrize("target", ["jobset", "volcano", "k8s", "tfjob"])
def test_exported_pods_train_on_lab_hosts(lab, tmp_path, target):
    inv = load_inventory(lab.inventory)
    request = TrainRequest(script=str(EXAMPLES / "mirrored_strategy.py"), workers=2,
                           gpus_per_worker=0, args=STEPS)
    workdir = build_context(lab, tmp_path, request)
    text, _notes = export(request, ExportOptions(target, image="digits:1", namespace="ml"),
                          node_setup(inv))
    tasks = pods(target, text)
    assert len(tasks) == 2
    hosts = ["h1", "h2"]
    outs = [tmp_path / f"{service}" for service, _, _ in tasks]
    with names_on_lab_hosts(lab, {pod[0]: host for pod, host in zip(tasks, hosts, strict=True)}):
        for host, pod, out in zip(hosts, tasks, outs, strict=True):
            start_pod(inv, host, pod, workdir, out)
        wait_for(lambda: all(exit_status(out) is not None for out in outs), 300,
                 "both workers to exit")
    logs = {out.name: Path(f"{out}.log").read_text() for out in outs}
    for out in outs:
        assert exit_status(out) == 0, logs[out.name][-3000:]
    assert "test_accuracy=" in logs[outs[0].name], logs[outs[0].name][-3000:]


class JobSetRunner:
    """What JobSet's controller does with the set's pods, as processes on lab hosts: all
    start; the set succeeds when its successPolicy's jobs have; a failed pod fails its Job
    (backoffLimit 0), and a failure no rule makes final restarts the whole set
    (BlockingRecreate: every old pod gone first), up to failurePolicy.maxRestarts."""

    def __init__(self, lab: Any, text: str, hosts: list[str], workdir: Path, tmp: Path):
        self.lab, self.text, self.hosts, self.workdir, self.tmp = lab, text, hosts, workdir, tmp
        self.jobset = list(yaml.safe_load_all(text))[-1]
        self.inventory = load_inventory(lab.inventory)

    def outs(self, attempt: int) -> list[Path]:
        return [self.tmp / f"a{attempt}-{pod[0]}" for pod in pods("jobset", self.text, attempt)]

    def start(self, attempt: int) -> None:
        for host, pod, out in zip(self.hosts, pods("jobset", self.text, attempt),
                                  self.outs(attempt), strict=True):
            start_pod(self.inventory, host, pod, self.workdir, out)

    def stop(self, attempt: int) -> None:
        for host, out in zip(self.hosts, self.outs(attempt), strict=True):
            if exit_status(out) is None and Path(f"{out}.pid").exists():
                on_host(self.inventory, host,
                        f"kill -KILL {Path(f'{out}.pid').read_text().strip()} || true")
        wait_for(lambda: all(exit_status(o) is not None for o in self.outs(attempt)), 60,
                 "the old pods to be gone")

    def finished(self, attempt: int) -> tuple[str, Path | None] | None:
        """('succeeded', None), ('failed', first failed pod's out) or None (running)."""
        outs = self.outs(attempt)
        failed = [o for o in outs if exit_status(o) not in (None, 0)]
        if failed:
            return "failed", min(failed, key=lambda o: Path(f"{o}.rc").stat().st_mtime)
        targets = self.jobset["spec"]["successPolicy"]["targetReplicatedJobs"]
        finishers = [o for o in outs if any(f"-{role}-0-" in o.name for role in targets)]
        if all(exit_status(o) == 0 for o in finishers):
            return "succeeded", None
        return None

    def run(self, on_start: Any = None, timeout: float = 400) -> tuple[str, int]:
        """(result, restarts)."""
        policy = self.jobset["spec"]["failurePolicy"]
        attempt = 0
        deadline = time.monotonic() + timeout
        self.start(attempt)
        if on_start:
            on_start(self, attempt)
        while True:
            state = wait_for(lambda a=attempt: self.finished(a), deadline - time.monotonic(),
                             "the set to finish")
            self.stop(attempt)
            result, first = state
            if result == "succeeded":
                return result, attempt
            code = exit_status(first)
            final = "PodFailurePolicy" in policy["rules"][0]["onJobFailureReasons"] and \
                1 <= code <= 127
            if final or attempt >= policy["maxRestarts"]:
                return "failed", attempt
            attempt += 1
            self.start(attempt)


@pytest.mark.lab
@pytest.mark.tf
def test_a_killed_jobset_worker_restarts_the_whole_set_from_its_checkpoint(lab, tmp_path):
    """SIGKILL one worker of the running JobSet: the set's failure policy (as JobSet runs it)
    deletes every pod and starts the set again; the new pods see HYPERTF_RESTART=1, resume
    from the shared checkpoint (not step 0) and train to the example's accuracy."""
    shared = tmp_path / "checkpoints"  # the lab's hosts share this machine's /tmp
    request = TrainRequest(script=str(EXAMPLES / "checkpointed.py"), workers=2,
                           gpus_per_worker=0, max_restarts=1, checkpoint_dir=str(shared),
                           args=("--steps", "300", "--save_every", "50",
                                 "--step_delay", "0.05"))
    workdir = build_context(lab, tmp_path, request)
    assert (workdir / "mirrored_strategy.py").is_file()  # the module beside the script
    text, _notes = export(request, ExportOptions("jobset", image="digits:1", name="ckpt"),
                          node_setup(load_inventory(lab.inventory)))
    runner = JobSetRunner(lab, text, ["h1", "h2"], workdir, tmp_path)

    def kill_worker_1(runner: JobSetRunner, attempt: int) -> None:
        worker0, worker1 = runner.outs(attempt)
        wait_for(lambda: Path(f"{worker0}.log").exists() and "checkpoint saved at step 100"
                 in Path(f"{worker0}.log").read_text(), 300, "a checkpoint at step 100")
        on_host(runner.inventory, "h2", f"kill -KILL {Path(f'{worker1}.pid').read_text()}")

    names = {pod[0]: host for pod, host in zip(pods("jobset", text), runner.hosts, strict=True)}
    with names_on_lab_hosts(lab, names):
        result, restarts = runner.run(on_start=kill_worker_1)
    second = Path(f"{runner.outs(1)[0]}.log").read_text() if restarts else ""
    assert (result, restarts) == ("succeeded", 1), second[-3000:]
    assert exit_status(runner.outs(0)[1]) == 137
    assert pods("jobset", text, 1)[0][2]["HYPERTF_RESTART"] == "1"
    resumed = [int(n) for n in re.findall(r"resumed from step (\d+)", second)]
    assert resumed and min(resumed) >= 100, second[-3000:]
    accuracy = float(re.findall(r"test_accuracy=([0-9.]+)", second)[-1])
    assert accuracy >= 0.90
