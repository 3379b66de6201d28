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
from hypertf.export import docker, k8s, marathon, tfjob
from hypertf.export.job import ExportJob, ExportOptions, NodeSetup, plan, service_address
from hypertf.launch.request import Option, TrainRequest


@dataclass(frozen=True)
class Target:
    """One way out: task addresses, whether TF_CONFIG is ours to set, the documents."""

    address: Callable[[str, str], Callable[[str, int], str]]  # (name, namespace) -> address
    tf_config: bool
    render: Callable[[ExportJob], str]
    note: str | None = None


def _yaml(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, width=1000)


TARGETS: dict[str, Target] = {
    "k8s": Target(service_address, True, lambda job: _yaml(k8s.manifest(job))),
    "tfjob": Target(service_address, False, lambda job: _yaml(tfjob.manifest(job)), tfjob.NOTE),
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
    from hypertf.export.job import default_name

    name = options.name or default_name(request.script)
    job = plan(request, options, setup or NodeSetup(),
               address=target.address(name, options.namespace), tf_config=target.tf_config)
    notes = job.notes + ((target.note,) if target.note else ())
    return ExportJob(job.name, job.options, job.request, job.setup, job.legacy_flags,
                     job.tasks, notes)


def export(request: TrainRequest, options: ExportOptions, setup: NodeSetup | None = None,
           output: str | None = None) -> tuple[str, tuple[str, ...]]:
    """(what goes to stdout, notes for stderr); with ``output`` the files are written.
    docker writes a build context directory; the others one file."""
    job = job_for(request, options, setup)
    text = TARGETS[options.target].render(job)
    if output is None:
        return text, job.notes
    if options.target == "docker":
        docker.write_context(job, Path(output))
        return "", (*job.notes, f"hypertf: build context in {output}: docker build -t "
                    f"{job.image} {output}")
    Path(output).write_text(text)
    return "", job.notes


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
    Option("to", str, None, f"what to write: {', '.join(TARGETS)}", "TARGET", required=True),
    Option("image", str, None, "the container image (k8s, tfjob, marathon; the tag to build "
           "for docker)", "IMAGE"),
    Option("output", str, None, "write here instead of stdout (docker: a build context "
           "directory)", "PATH"),
    Option("name", str, None, "the job's name (a DNS-1123 label; default: the script's "
           "name)", "NAME"),
    Option("namespace", str, "default", "Kubernetes namespace (default 'default')", "NS"),
    Option("queue", str, None, "Kueue LocalQueue: label kueue.x-k8s.io/queue-name", "QUEUE"),
    Option("base_image", str, ExportOptions.base_image, "docker: the image to build FROM "
           f"(default {ExportOptions.base_image})", "IMAGE"),
    Option("tensorflow", str, None, "docker: the TensorFlow package (default "
           "tensorflow[and-cuda] with GPUs, else tensorflow-cpu)", "REQ"),
)
"""``export``'s own options, beside every train option (one declaration for both CLIs)."""


def export_options(values: Mapping[str, Any]) -> ExportOptions:
    """The ExportOptions of EXPORT_OPTIONS values (keyed by ``Option.name``)."""
    return ExportOptions(target=values["to"], image=values["image"], name=values["name"],
                         namespace=values["namespace"], queue=values["queue"],
                         base_image=values["base_image"], tensorflow=values["tensorflow"])
