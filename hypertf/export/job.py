"""One training request as the tasks an exported manifest runs: pure, no cluster needed.

``hypertf train`` places tasks on hosts it knows; an export cannot, so every task is
addressed by a stable name the target's service discovery resolves (a Kubernetes Service,
a Mesos-DNS name). The rest is what ``hypertf train`` gives a task: TF_CONFIG from
hypertf.core.spec, the legacy flags when ``train`` would pass them, the inventory's
``hypertf_task_env`` under ``--env``, and the script's arguments verbatim.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hypertf.config.inventory import Inventory
from hypertf.core import diagnose
from hypertf.core.diagnose import ScriptScan
from hypertf.core.errors import UsageError
from hypertf.core.scheduler import Placement
from hypertf.core.spec import build as build_spec
from hypertf.export.names import TARGETS
from hypertf.launch.request import TrainRequest

CONTAINER_TARGETS = ("jobset", "volcano", "k8s", "tfjob", "marathon")  # --image is required
WORKDIR = "/app"  # the image's working directory: the code --to docker copies, every manifest

PORT = 2222  # TensorFlow's customary port; the TFJob operator's default (tfjob-port)
MAX_LABEL = 63  # RFC 1123 label: a Service name, a pod's hostname, a DNS label
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Kept equal to hypertf.launch.attempt.QUIET_ENV (a test checks): that module pulls in fabric.
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONUNBUFFERED": "1",
             "GRPC_FAIL_FAST": "use_caller"}
# The python_env role's defaults (roles/python_env/defaults/main.yml): the examples need
# scikit-learn; TensorBoard callbacks and tf.summary need tensorboard.
DEFAULT_PACKAGES = ("scikit-learn", "tensorboard")
TENSORFLOW_VARIABLE = "python_env_tensorflow_package"


@dataclass(frozen=True)
class NodeSetup:
    """What the inventory says every node has: the task environment and the packages the
    python_env role installs (None: the role's default)."""

    task_env: tuple[tuple[str, str], ...] = ()
    python_packages: tuple[str, ...] | None = None
    python_packages_no_deps: tuple[str, ...] | None = None
    tensorflow: str | None = None  # the inventory's python_env_tensorflow_package, if set

    @property
    def packages(self) -> tuple[str, ...]:
        return DEFAULT_PACKAGES if self.python_packages is None else self.python_packages


def node_setup(inventory: Inventory) -> NodeSetup:
    """What the GPU nodes share; an image or a pod template has one setup, so nodes that
    differ are a usage error (set the value for the group instead)."""
    tensorflow = tensorflow_packages(inventory)
    found = {NodeSetup(n.settings.task_env, n.settings.python_packages,
                       n.settings.python_packages_no_deps, tensorflow.get(n.name))
             for n in inventory.nodes.values()}
    if len(found) > 1:
        raise UsageError(f"{inventory.path}: the nodes differ in hypertf_task_env, "
                         f"hypertf_python_packages(_no_deps) or {TENSORFLOW_VARIABLE}; an "
                         f"exported job has one environment and one image: set them for the "
                         f"whole group")
    return found.pop() if found else NodeSetup()


def tensorflow_packages(inventory: Inventory) -> dict[str, str]:
    """Each node's python_env_tensorflow_package where the inventory sets it (a role
    variable, not a HyperTF setting: read with Ansible's own variable resolution)."""
    from hypertf.config import inventory as inventory_module

    hosts = inventory_module._ansible_hosts(inventory.path.resolve())
    result = {}
    for name in inventory.nodes:
        value = hosts.get(name, ({}, ()))[0].get(TENSORFLOW_VARIABLE)
        if isinstance(value, str) and value.strip() and "{{" not in value:
            result[name] = value.strip()
    return result


@dataclass(frozen=True)
class ExportOptions:
    """The export's own options, beside the train options."""

    target: str
    image: str | None = None
    name: str | None = None  # default: <script>-<user>-<hash of the job>
    namespace: str = "default"
    queue: str | None = None  # a Kueue LocalQueue (kueue.x-k8s.io/queue-name)
    base_image: str = "python:3.11-slim"
    tensorflow: str | None = None  # default: the nodes' (see hypertf.export.docker)
    cpu: str | None = None  # requests.cpu of every task's container
    memory: str | None = None  # requests.memory of every task's container


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


def _label_part(text: str, longest: int) -> str:
    part = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return part[:longest].strip("-")


def default_name(request: TrainRequest, options: ExportOptions) -> str:
    """'<script>-<user>-<hash>': 'main.py' alone names half the jobs of a namespace. The
    hash is of the job (request and options), so exporting it again gives the same name."""
    stem = _label_part(Path(request.script).stem, 20).lstrip("0123456789-") or "tf"
    user = _label_part(getpass.getuser(), 12)
    shape = json.dumps([request.without_env_values().to_json(), options.namespace],
                       sort_keys=True)
    digest = hashlib.sha256(shape.encode()).hexdigest()[:6]
    return "-".join(part for part in (stem, user, digest) if part)


def name_of(request: TrainRequest, options: ExportOptions) -> str:
    """--name, or the default name."""
    return options.name or default_name(request, options)


def service_address(name: str, namespace: str) -> Callable[[str, int], str]:
    """Kubernetes: the headless Service '<name>-<role>-<index>' in the namespace, as the
    TFJob operator names them too (so TF_CONFIG and the legacy flags agree with it)."""
    return lambda role, index: f"{name}-{role}-{index}.{namespace}.svc:{PORT}"


def script_scan(request: TrainRequest) -> ScriptScan | None:
    """What the script and the modules beside it that it imports say (legacy flags,
    ParameterServerStrategy); only what is on this machine can be read (None: not here)."""
    path = Path(request.sync_dir or ".") / request.script
    return diagnose.scan_script(path) if path.is_file() else None


def script_in_image(request: TrainRequest) -> str:
    """The script's absolute path in the image: hypertf.export.docker copies --sync DIR, or
    the script's directory, to WORKDIR. Absolute, so a pod runs it whatever working
    directory its image has."""
    inside = request.script if request.sync_dir else Path(request.script).name
    return f"{WORKDIR}/{inside}"


def servers_without_timeout(request: TrainRequest) -> str | None:
    """Parameter servers (and a TF2 coordinator's workers) never exit by themselves: a target
    that cannot stop them at the end runs them until a deadline."""
    if request.ps and request.timeout is None:
        return ("hypertf: this job's parameter servers never exit by themselves: its "
                "Jobs end only at a deadline; give --timeout S (or export --to jobset, "
                "whose success policy stops them)")
    return None


def plan(request: TrainRequest, options: ExportOptions, setup: NodeSetup,
         address: Callable[[str, int], str] | None = None,
         tf_config: bool = True, suffix: Callable[[int], str] | None = None) -> ExportJob:
    """The job's tasks with the environment and command ``hypertf train`` would give them;
    ``address(role, index)`` is the name the target resolves for a task, ``suffix(index)``
    the longest name the target adds to the job's (for the length check)."""
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
    name = name_of(request, options)
    last = max(request.workers, request.ps)
    longest = len(suffix(last) if suffix else f"-worker-{last}")
    check_label(name, "--name", MAX_LABEL - longest)
    check_label(options.namespace, "--namespace")
    if options.queue is not None:
        check_label(options.queue, "--queue")
    address = address or service_address(name, options.namespace)
    slots = request.slots(cpu_only=False)
    placements = [Placement(s.role, s.index, address(s.role, s.index), ()) for s in slots]
    addresses = {p.name: p.host for p in placements}
    specs = build_spec(placements, addresses)
    scan = script_scan(request)
    legacy = request.passes_legacy_flags(scan is not None and scan.legacy_flags)
    env_common = {**QUIET_ENV, **dict(setup.task_env), **request.env_vars()}
    if request.checkpoint_dir:
        env_common["HYPERTF_CHECKPOINT_DIR"] = request.checkpoint_dir
    script = script_in_image(request)
    tasks = []
    for slot, spec in zip(slots, specs, strict=True):
        env = {**env_common, "HYPERTF_TASK_KEY": name, "HYPERTF_TASK": slot.name}
        if tf_config:
            env["TF_CONFIG"] = spec.tf_config
        env.update(spec.rendezvous)  # Keras 3, JAX, torchrun: from the same names
        argv = ("python", script, *(spec.flags if legacy else ()), *request.args)
        tasks.append(ExportTask(slot.role, slot.index, slot.gpus,
                                addresses[slot.name], env, argv))
    notes = [f"hypertf: {request.legacy_flags_note(legacy)}"]
    notice = request.topology_notice(scan.ps_strategy if scan else None)
    if notice:
        notes.append(f"hypertf: {notice}")
    if not options.name:
        notes.append(f"hypertf: the job is named {name} (--name NAME to choose)")
    return ExportJob(name, options, request, setup, legacy, tuple(tasks), tuple(notes))
