"""The export targets in one table: how each addresses its tasks, renders and writes.

``export(request, options, setup)`` is what ``hypertf export`` and ``invoke export`` call;
it returns the text for stdout (or writes ``-o``) and the notes for stderr.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hypertf.core.errors import UsageError
from hypertf.export import docker, jobset, k8s, marathon, tfjob, volcano
from hypertf.export.job import (
    ExportJob,
    ExportOptions,
    NodeSetup,
    name_of,
    plan,
    servers_without_timeout,
    service_address,
)
from hypertf.export.names import RECOMMENDED
from hypertf.launch.request import TRAIN_OPTIONS, Option, TrainRequest

Objects = Callable[[ExportJob], list[dict[str, Any]]]


@dataclass(frozen=True)
class Target:
    """One way out: task addresses, whether TF_CONFIG is ours to set, the documents (a list
    of Kubernetes objects, or text), what to say on stderr, how long a pod's name grows."""

    address: Callable[[str, str], Callable[[str, int], str]]  # (name, namespace) -> address
    tf_config: bool
    render: Callable[[ExportJob], str]
    note: str | None = None
    objects: Objects | None = None  # Kubernetes targets: -o DIR writes a file per kind
    suffix: Callable[[int], str] | None = None
    notes: Callable[[ExportJob], tuple[str, ...]] | None = None


def _yaml(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, width=1000)


def _kubernetes(address: Callable[[str, str], Callable[[str, int], str]], tf_config: bool,
                objects: Objects, note: str | None = None,
                suffix: Callable[[int], str] | None = None,
                notes: Callable[[ExportJob], tuple[str, ...]] | None = None) -> Target:
    return Target(address, tf_config, lambda job: _yaml(objects(job)), note, objects, suffix,
                  notes)


def _plain_job_notes(job: ExportJob) -> tuple[str, ...]:
    servers = servers_without_timeout(job.request)
    return (k8s.NOTE, *((servers,) if servers else ()))


def _tfjob_notes(job: ExportJob) -> tuple[str, ...]:
    if job.request.chief and not job.request.ps and len(job.tasks) > 1:
        return ("hypertf: a TFJob with a chief succeeds when the chief does and then deletes "
                "the workers still running (cleanPodPolicy Running); --to jobset waits for "
                "every worker, as train does",)
    return ()


TARGETS: dict[str, Target] = {
    "jobset": _kubernetes(jobset.address, True, jobset.manifest, suffix=jobset.suffix),
    "volcano": _kubernetes(volcano.address, False, volcano.manifest, volcano.NOTE),
    "k8s": _kubernetes(service_address, True, k8s.manifest, notes=_plain_job_notes),
    "tfjob": _kubernetes(service_address, False, tfjob.manifest, tfjob.NOTE,
                         notes=_tfjob_notes),
    "marathon": Target(lambda name, _ns: marathon.mesos_dns_address(name), True,
                       lambda job: json.dumps(marathon.manifest(job), indent=2) + "\n",
                       marathon.NOTE),
    "docker": Target(service_address, True, docker.dockerfile),
}




def job_for(request: TrainRequest, options: ExportOptions,
            setup: NodeSetup | None = None) -> ExportJob:
    """The planned job for ``options.target`` (a UsageError for bad input)."""
    target = TARGETS.get(options.target)
    if target is None:
        raise UsageError(f"unknown export target {options.target!r}; choose one of "
                         f"{', '.join(TARGETS)}")
    if options.target == "docker" and not request.sync_dir and \
            not Path(request.script).is_file():
        raise UsageError(f"--to docker copies the script into the image: {request.script} "
                         f"is not a file here")
    name = name_of(request, options)
    job = plan(request, options, setup or NodeSetup(),
               address=target.address(name, options.namespace), tf_config=target.tf_config,
               suffix=target.suffix)
    notes = job.notes + ((target.note,) if target.note else ())
    notes += target.notes(job) if target.notes else ()
    if options.target == "docker":
        notes += docker.notes(job)
    return ExportJob(job.name, job.options, job.request, job.setup, job.legacy_flags,
                     job.tasks, notes)


def export(request: TrainRequest, options: ExportOptions, setup: NodeSetup | None = None,
           output: str | None = None) -> tuple[str, tuple[str, ...]]:
    """(what goes to stdout, notes for stderr); with ``output`` the files are written.
    docker writes a build context directory; a Kubernetes target given a directory (an
    existing one, or a path ending in '/') one file per kind of object; else one file."""
    job = job_for(request, options, setup)
    target = TARGETS[options.target]
    text = target.render(job)
    notes = job.notes + cluster_scoped_note(job, target)
    if output is None:
        return text, notes
    if options.target == "docker":
        notes += docker.write_context(job, Path(output))
        return "", (*notes, f"hypertf: build context in {output}: docker build -t "
                    f"{job.image} {output}")
    if target.objects and (output.endswith("/") or Path(output).is_dir()):
        written = write_by_kind(target.objects(job), Path(output))
        return "", (*notes, f"hypertf: wrote {', '.join(p.name for p in written)} in "
                    f"{output}: kubectl apply -f {output}")
    Path(output).write_text(text)
    return "", notes


def cluster_scoped_note(job: ExportJob, target: Target) -> tuple[str, ...]:
    """Say which objects are the cluster's, not the namespace's: another person may have to
    apply them, once for every job of that priority."""
    if not target.objects:
        return ()
    kinds = [o["kind"] for o in target.objects(job) if o["kind"] in k8s.CLUSTER_SCOPED]
    if not kinds:
        return ()
    return (f"hypertf: {', '.join(kinds)} is cluster-scoped (its own document; with -o DIR "
            f"its own file): applying it needs cluster rights, once for all jobs",)


def write_by_kind(objects: list[dict[str, Any]], directory: Path) -> list[Path]:
    """'<n>-<kind>.yaml' in the order to apply them (kubectl apply -f DIR goes by name):
    cluster-scoped first, each kind in its own file."""
    directory.mkdir(parents=True, exist_ok=True)
    kinds: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        kinds.setdefault(obj["kind"], []).append(obj)
    written = []
    for number, (kind, items) in enumerate(kinds.items()):
        path = directory / f"{number:02d}-{kind.lower()}.yaml"
        path.write_text(_yaml(items))
        written.append(path)
    return written


def command(inventory: str | None, request: TrainRequest, options: ExportOptions,
            output: str | None = None) -> int:
    """``hypertf export`` / ``invoke export``: the inventory's node setup when the inventory
    exists (it is optional: a manifest needs no cluster), notes on stderr, 0."""
    import os
    import sys

    from hypertf.config.inventory import load_inventory
    from hypertf.export.job import node_setup

    setup = node_setup(load_inventory(inventory)) if inventory and os.path.exists(inventory) \
        else NodeSetup()
    text, notes = export(request, options, setup, output)
    for note in notes:
        print(note, file=sys.stderr)
    sys.stdout.write(text)
    return 0


EXPORT_OPTIONS: tuple[Option, ...] = (
    Option("to", str, None, f"what to write: {', '.join(TARGETS)} ({RECOMMENDED}: the "
           "Kubernetes target; tfjob and marathon are legacy)", "TARGET", required=True),
    Option("image", str, None, "the container image (every target but docker; the tag to "
           "build for docker)", "IMAGE"),
    Option("output", str, None, "write here instead of stdout (a directory: one file per kind "
           "of object; docker: the build context)", "PATH"),
    Option("name", str, None, "the job's name (a DNS-1123 label; default "
           "<script>-<user>-<hash>)", "NAME"),
    Option("namespace", str, "default", "Kubernetes namespace (default 'default')", "NS"),
    Option("queue", str, None, "Kueue LocalQueue (label kueue.x-k8s.io/queue-name; volcano: "
           "the Volcano queue)", "QUEUE"),
    Option("cpu", str, None, "CPU request of each task's container (e.g. 4 or 500m)", "Q"),
    Option("memory", str, None, "memory request of each task's container (e.g. 16Gi)", "Q"),
    Option("base_image", str, ExportOptions.base_image, "docker: the image to build FROM "
           f"(default {ExportOptions.base_image})", "IMAGE"),
    Option("tensorflow", str, None, "docker: the TensorFlow requirement (default: the "
           "inventory's python_env_tensorflow_package, else pinned to this machine's "
           "TensorFlow)", "REQ"),
)
"""``export``'s own options, beside the train options it maps (one declaration for both CLIs)."""

EXPORTED_TRAIN_OPTIONS = frozenset({
    "script", "worker", "ps", "chief", "gpus_per_worker", "gpus_per_chief", "gpus_per_ps",
    "sync", "timeout", "grace", "legacy_flags", "no_legacy_flags", "env", "max_restarts",
    "restart_on_failure", "checkpoint_dir", "priority",
})
"""The train options that mean something in an exported job; the others are refused by
name (--offload-hosts among them: its MPI world runs over the static cluster's SSH)."""

TRAIN_ONLY = tuple(o for o in TRAIN_OPTIONS if o.name not in EXPORTED_TRAIN_OPTIONS)


def refuse_train_only(values: Mapping[str, Any]) -> None:
    """A train-only option given to export is refused, not dropped: a job that was asked to
    --idle-fail would silently run without it."""
    given = [o.flag for o in TRAIN_ONLY if values.get(o.name, o.default) not in
             (o.default, None, False)]
    if given:
        raise UsageError(f"export: {', '.join(given)} "
                         f"{'apply' if len(given) > 1 else 'applies'} only to 'hypertf train' "
                         f"(the target's scheduler does that part): leave "
                         f"{'them' if len(given) > 1 else 'it'} out (docs/kubernetes.md)")


def export_options(values: Mapping[str, Any]) -> ExportOptions:
    """The ExportOptions of EXPORT_OPTIONS values (keyed by ``Option.name``); train-only
    options among ``values`` are refused."""
    refuse_train_only(values)
    return ExportOptions(target=values["to"], image=values["image"], name=values["name"],
                         namespace=values["namespace"], queue=values["queue"],
                         base_image=values["base_image"], tensorflow=values["tensorflow"],
                         cpu=values.get("cpu"), memory=values.get("memory"))
