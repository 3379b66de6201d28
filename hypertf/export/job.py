"""One training request as the tasks an exported manifest runs: pure, no cluster needed.

``hypertf train`` places tasks on hosts it knows; an export cannot, so every task is
addressed by a stable name the target's service discovery resolves (a Kubernetes Service,
a Mesos-DNS name). The rest is what ``hypertf train`` gives a task: TF_CONFIG from
hypertf.core.spec, the legacy flags when ``train`` would pass them, the inventory's
``hypertf_task_env`` under ``--env``, and the script's arguments verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hypertf.config.inventory import Inventory
from hypertf.core.errors import UsageError
from hypertf.core.scheduler import Placement
from hypertf.core.spec import build as build_spec
from hypertf.launch.request import TrainRequest

TARGETS = ("k8s", "tfjob", "marathon", "docker")
CONTAINER_TARGETS = ("k8s", "tfjob", "marathon")  # they run an image: --image is required
PORT = 2222  # TensorFlow's customary port; the TFJob operator's default (tfjob-port)
MAX_LABEL = 63  # RFC 1123 label: a Service name, a pod's hostname, a DNS label
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Kept equal to hypertf.launch.attempt.QUIET_ENV (a test checks): that module pulls in fabric.
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONUNBUFFERED": "1",
             "GRPC_FAIL_FAST": "use_caller"}
DEFAULT_PACKAGES = ("scikit-learn",)  # the python_env role's default for the examples


@dataclass(frozen=True)
class NodeSetup:
    """What the inventory says every node has: the task environment and the packages the
    python_env role installs (None: the role's default)."""

    task_env: tuple[tuple[str, str], ...] = ()
    python_packages: tuple[str, ...] | None = None
    python_packages_no_deps: tuple[str, ...] | None = None

    @property
    def packages(self) -> tuple[str, ...]:
        return DEFAULT_PACKAGES if self.python_packages is None else self.python_packages


def node_setup(inventory: Inventory) -> NodeSetup:
    """What the GPU nodes share; an image or a pod template has one setup, so nodes that
    differ are a usage error (set the value for the group instead)."""
    found = {NodeSetup(n.settings.task_env, n.settings.python_packages,
                       n.settings.python_packages_no_deps) for n in inventory.nodes.values()}
    if len(found) > 1:
        raise UsageError(f"{inventory.path}: the nodes differ in hypertf_task_env or "
                         f"hypertf_python_packages(_no_deps); an exported job has one "
                         f"environment and one image: set them for the whole group")
    return found.pop() if found else NodeSetup()


@dataclass(frozen=True)
class ExportOptions:
    """The export's own options, beside the train options."""

    target: str
    image: str | None = None
    name: str | None = None  # default: from the script's name
    namespace: str = "default"
    queue: str | None = None  # a Kueue LocalQueue (kueue.x-k8s.io/queue-name)
    base_image: str = "python:3.11-slim"
    tensorflow: str | None = None  # default: tensorflow[and-cuda] with GPUs, else -cpu


@dataclass(frozen=True)
class ExportTask:
    """One task as the target runs it: its environment and its command."""

    role: str
    index: int
    gpus: int
    address: str  # host:port that TF_CONFIG and the legacy flags name
    env: Mapping[str, str]
    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"

    @property
    def slug(self) -> str:
        return f"{self.role}-{self.index}"


@dataclass(frozen=True)
class ExportJob:
    """The whole job for one target."""

    name: str
    options: ExportOptions
    request: TrainRequest
    setup: NodeSetup
    legacy_flags: bool
    tasks: tuple[ExportTask, ...] = field(default=())
    notes: tuple[str, ...] = ()  # said on stderr: what the user must know

    @property
    def image(self) -> str:
        return self.options.image or f"{self.name}:latest"

    @property
    def namespace(self) -> str:
        return self.options.namespace

    def roles(self) -> dict[str, list[ExportTask]]:
        """Tasks by role, in TF_CONFIG's order (chief, worker, ps)."""
        result: dict[str, list[ExportTask]] = {}
        for task in self.tasks:
            result.setdefault(task.role, []).append(task)
        return result


def check_label(value: str, what: str, longest: int = MAX_LABEL) -> str:
    """Kubernetes names a Service (and so a DNS name) with an RFC 1123 label; say the rule."""
    if not DNS_LABEL.match(value) or len(value) > longest:
        raise UsageError(
            f"{what} {value!r} would be rejected by Kubernetes: it must be a DNS-1123 label of "
            f"at most {longest} characters here (lowercase letters, digits and '-', starting "
            f"with a letter and ending with a letter or digit)")
    return value


def default_name(script: str) -> str:
    """The script's stem made a DNS label: 'mirrored_strategy.py' -> 'mirrored-strategy'."""
    stem = re.sub(r"[^a-z0-9]+", "-", Path(script).stem.lower()).strip("-")
    stem = stem.lstrip("0123456789-") or "tf"
    return stem[:40].rstrip("-")


def service_address(name: str, namespace: str) -> Callable[[str, int], str]:
    """Kubernetes: the headless Service '<name>-<role>-<index>' in the namespace, as the
    TFJob operator names them too (so TF_CONFIG and the legacy flags agree with it)."""
    return lambda role, index: f"{name}-{role}-{index}.{namespace}.svc:{PORT}"


def script_reads_flags(request: TrainRequest) -> bool:
    """Does the script read the legacy flags? Only what is on this machine can be read."""
    from hypertf.core import diagnose

    path = Path(request.sync_dir or ".") / request.script
    return diagnose.files_read_legacy_flags([path])


def script_in_image(request: TrainRequest) -> str:
    """The script as the image's WORKDIR holds it: its path inside --sync DIR, else its name
    (hypertf.export.docker copies it there)."""
    return request.script if request.sync_dir else Path(request.script).name


def plan(request: TrainRequest, options: ExportOptions, setup: NodeSetup,
         address: Callable[[str, int], str] | None = None,
         tf_config: bool = True) -> ExportJob:
    """The job's tasks with the environment and command ``hypertf train`` would give them;
    ``address(role, index)`` is the name the target resolves for a task."""
    request.validate()
    if request.offload_hosts:
        raise UsageError("--offload-hosts is not exported: its MPI world runs over the static "
                         "cluster's SSH, which a cluster manager's pods and containers do not "
                         "have; export the job without it")
    if options.target not in TARGETS:
        raise UsageError(f"unknown export target {options.target!r}; choose one of "
                         f"{', '.join(TARGETS)}")
    if options.target in CONTAINER_TARGETS and not options.image:
        raise UsageError(f"--to {options.target} runs a container: give --image IMAGE (e.g. "
                         f"one built from 'hypertf export --to docker -o DIR')")
    name = options.name or default_name(request.script)
    longest = len(f"-worker-{request.workers + request.ps}")
    check_label(name, "--name", MAX_LABEL - longest)
    check_label(options.namespace, "--namespace")
    if options.queue is not None:
        check_label(options.queue, "--queue")
    address = address or service_address(name, options.namespace)
    slots = request.slots(cpu_only=False)
    placements = [Placement(s.role, s.index, address(s.role, s.index), ()) for s in slots]
    addresses = {p.name: p.host for p in placements}
    specs = build_spec(placements, addresses)
    legacy = request.passes_legacy_flags(script_reads_flags(request))
    env_common = {**QUIET_ENV, **dict(setup.task_env), **request.env_vars()}
    if request.checkpoint_dir:
        env_common["HYPERTF_CHECKPOINT_DIR"] = request.checkpoint_dir
    script = script_in_image(request)
    tasks = []
    for slot, spec in zip(slots, specs, strict=True):
        env = {**env_common, "HYPERTF_TASK_KEY": name, "HYPERTF_TASK": slot.name}
        if tf_config:
            env["TF_CONFIG"] = spec.tf_config
        argv = ("python", script, *(spec.flags if legacy else ()), *request.args)
        tasks.append(ExportTask(slot.role, slot.index, slot.gpus,
                                addresses[slot.name], env, argv))
    notes = [f"hypertf: {request.legacy_flags_note(legacy)}"]
    notice = request.topology_notice()
    if notice:
        notes.append(f"hypertf: {notice}")
    return ExportJob(name, options, request, setup, legacy, tuple(tasks), tuple(notes))
