"""What each host is sent to start an attempt's tasks: per task its TF_CONFIG and place in
the TF1 start order, its environment (GPU pinning, the attempt, checkpoints, TensorBoard,
the user's), its argv (wrapped in the offload runner with --offload-hosts), and per host
the directories to make and the script that must be there.

Pure: a ``StartPlan`` reads the grant and the job, and sends nothing; ``Attempt``
(hypertf.launch.attempt) hands its ``hosts()`` to the fleet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from hypertf.config.inventory import Inventory, Node
from hypertf.core import spec as specs
from hypertf.core import taskenv
from hypertf.core.monitor import TaskState
from hypertf.core.offloadname import channel_name
from hypertf.core.placement import Grant
from hypertf.core.protocol import TaskStart
from hypertf.core.records import AgentRecord
from hypertf.core.rundir import RunDir, tensorboard_dir
from hypertf.launch.fleet import HostStart
from hypertf.launch.request import TrainRequest
from hypertf.offload.taskspec import OffloadHost
from hypertf.offload.taskspec import Spec as OffloadSpec
from hypertf.offload.taskspec import command as offload_command

__all__ = ["QUIET_ENV", "StartPlan", "StartingJob", "reporting_task"]

QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONUNBUFFERED": "1",
             "GRPC_FAIL_FAST": "use_caller"}


class StartingJob(Protocol):
    """What a start reads of its job (hypertf.launch.launcher.Job): the request, the
    inventory, the agents' records, and the job's own names and paths."""

    inventory: Inventory
    request: TrainRequest
    records: dict[str, AgentRecord]

    @property
    def job_id(self) -> str: ...

    def checkpoint_dir(self, host: str) -> str: ...

    def script_path(self) -> str: ...


def reporting_task(tasks: Mapping[str, TaskState]) -> str:
    """The task whose HYPERTF_METRICS_FILE is copied back: the chief, else worker 0."""
    return "chief:0" if "chief:0" in tasks else "worker:0"


class StartPlan:
    """One attempt's start (task key ``task_key``, try ``number``) on its grant."""

    def __init__(self, job: StartingJob, task_key: str, number: int, grant: Grant,
                 tasks: Mapping[str, TaskState]) -> None:
        self.job = job
        self.task_key = task_key
        self.number = number
        self.tasks = tasks
        self.offload_hosts = specs.offload_hosts(grant.placements)
        placements = specs.tasks_of(grant.placements)
        addresses = {p.name: f"{job.records[p.host].data_addr}:{grant.ports[p.name]}"
                     for p in placements}
        self.specs = sorted(specs.build(placements, addresses),
                            key=lambda s: specs.start_rank(s.placement))
        self.start_after = specs.start_after(placements, addresses)  # task -> address (TF1)

    def run_dir(self, host: str) -> RunDir:
        return RunDir.of(self.job.inventory.node(host).settings.workdir, self.task_key)

    def hosts(self, legacy_flags: bool) -> dict[str, HostStart]:
        """Per host, what it starts; ``legacy_flags``: pass them to the script."""
        job = self.job
        by_host: dict[str, list[specs.TaskSpec]] = {}
        for task_spec in self.specs:
            by_host.setdefault(task_spec.placement.host, []).append(task_spec)
        script = job.script_path()
        starts = {}
        for host, host_specs in by_host.items():
            node, run = job.inventory.node(host), self.run_dir(host)
            starts[host] = HostStart(
                run, tuple(self.task_requests(node, host_specs, legacy_flags)),
                make_dirs=(job.checkpoint_dir(host),) if job.request.makes_checkpoint_dir
                else (), sync_dir=job.request.sync_dir,
                script=job.request.script_on(node.settings.workdir, run, script))
        return starts

    def task_requests(self, node: Node, task_specs: Iterable[specs.TaskSpec],
                      legacy_flags: bool) -> list[TaskStart]:
        """What ``tasknode start`` gets for each task on ``node``: name, port, working dir,
        environment (TF_CONFIG, GPU pinning, attempt, checkpoints, the user's) and argv."""
        job, run = self.job, self.run_dir(node.name)
        script = job.request.script_on(node.settings.workdir, run, job.script_path())
        reporter = reporting_task(self.tasks)
        requests = []
        for task_spec in task_specs:
            task = self.tasks[task_spec.placement.name]
            extra = {"HYPERTF_METRICS_FILE": str(run.metrics)} if task.name == reporter else {}
            if task.name in self.start_after:
                extra["HYPERTF_START_AFTER"] = self.start_after[task.name]
            env = {**QUIET_ENV, **job.request.task_env(node), **taskenv.ours({
                "TF_CONFIG": task_spec.tf_config, **task_spec.rendezvous,
                **specs.gpu_env(task_spec.placement.gpus, job.records[node.name].gpus),
                "HYPERTF_TASK_KEY": self.task_key, "HYPERTF_TASK": task.name,
                "HYPERTF_ATTEMPT": str(self.number),
                "HYPERTF_CHECKPOINT_DIR": job.checkpoint_dir(node.name),
                "HYPERTF_TENSORBOARD_DIR": tensorboard_dir(node.settings.workdir, job.job_id),
                "HYPERTF_PREEMPT_FILE": str(run.preempt),  # this attempt's: per task key
                **extra})}
            argv = ["python", script, *(task_spec.flags if legacy_flags else ()),
                    *job.request.args]
            if self.offload_hosts:
                argv = offload_command(
                    self.offload_spec(node, task.file_name),
                    str(run.offload_dir(task.file_name)), str(run.offload(task.file_name)), argv)
            cwd = job.request.task_cwd(node.settings.workdir, run, task.file_name)
            requests.append(TaskStart(task.file_name, task.port, cwd, env, tuple(argv)))
        return requests

    def offload_spec(self, node: Node, file_name: str) -> OffloadSpec:
        """What the task's runner on ``node`` needs to start its world: the offload hosts
        as this node reaches them over SSH (with the cluster-internal key and the
        known_hosts the nodes share, both on the node where cluster.setup put them: never
        the controller's), and a channel name of the task's own (the node's agent can find
        it by the task key)."""
        job = self.job
        hosts = tuple(OffloadHost(address=n.address, port=n.port, user=n.user,
                                  python=f"{n.settings.venv}/bin/python")
                      for n in map(job.inventory.node, self.offload_hosts))
        record = job.records.get(node.name)
        return OffloadSpec(hosts=hosts, channel=channel_name(self.task_key, file_name),
                           local_address=record.data_addr if record else node.address,
                           known_hosts=node.settings.offload_known_hosts,
                           key_file=node.settings.offload_key,
                           min_flops=job.request.offload_min_flops,
                           start_timeout=min(60.0, job.request.start_timeout),
                           port_range=node.settings.offload_port_range)
