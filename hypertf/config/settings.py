"""HyperTF's ``hypertf_*`` inventory variables: how each is parsed, its default, and the
typed settings a node and the cluster end up with. The inventory reader (hypertf.config.inventory)
applies them; the hypertf_agent role asks ``hypertf inventory agent-settings`` which of them
a node's agent reads (one source, no copy in the role).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from hypertf.core import accounts, taskenv

DEFAULT_INVENTORY = "inventory/local.yml"


def _positive(kind: type) -> Callable[[str, Any], Any]:
    def parse(key: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{key} must be a positive number, not {value!r}")
        return kind(value)

    return parse


def _port(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError(f"{key} must be a port number 1-65535, not {value!r}")
    return value


def _port_or_off(key: str, value: Any) -> int:
    if value == 0 and not isinstance(value, bool):
        return 0
    return _port(key, value)


def _count(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be a whole number >= 0, not {value!r}")
    return value


def _days_or_off(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 3650:
        raise ValueError(f"{key} must be a number of days from 0 (off) to 3650, not {value!r}")
    return float(value)


def _seconds(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value <= 30 * 86400:
        raise ValueError(f"{key} must be a number of seconds from 0 to 2592000 (30 days), "
                         f"not {value!r}")
    return float(value)


def _percent(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise ValueError(f"{key} must be a percentage between 0 and 100, not {value!r}")
    return float(value)


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key} must be a non-empty string, not {value!r}")
    return value.strip()


def _optional_text(key: str, value: Any) -> str | None:
    return None if value is None else _text(key, value)


def _cgroup_root(key: str, value: Any) -> str:
    """A relative path of plain names under each cgroup mount (the agent mkdirs it)."""
    text = _text(key, value).strip("/")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*", text) or any(
            part in (".", "..") for part in text.split("/")):
        raise ValueError(f"{key} must be a relative path of plain names such as hypertf, "
                         f"not {value!r}")
    return text


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, not {value!r}")
    return value


class GpuSourceKind(StrEnum):
    """``hypertf_gpu_source``: where a node's agent reads its GPUs (hypertf.node.probes)."""

    NVML = "nvml"  # the driver's NVML
    STATIC = "static"  # fake GPUs from hypertf_static_gpus (labs, tests)
    NONE = "none"  # no GPU: CPU tasks only


class GpuEnforce(StrEnum):
    """``hypertf_gpu_enforce``: what an agent does with a trespass on its GPUs."""

    STOP = "stop"  # stop the trespasser's process group (and report it)
    REPORT = "report"  # report it only
    OFF = "off"  # do not look


class GpuConfine(StrEnum):
    """``hypertf_gpu_confine``: whether a node's tasks run in their job's cgroups
    (hypertf.node.confine, docs/gpu.md "Confinement")."""

    AUTO = "auto"  # where the node can; else the trespass detector only, with a notice
    REQUIRED = "required"  # a node that cannot gets no tasks (the keeper places none there)
    OFF = "off"


E = TypeVar("E", bound=StrEnum)


def _choice(kind: type[E]) -> Callable[[str, Any], E]:
    """A setting that is one of ``kind``'s values."""
    def parse(key: str, value: Any) -> E:
        if value not in tuple(kind):
            raise ValueError(f"{key} must be one of {', '.join(kind)}, not {value!r}")
        return kind(value)

    return parse


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by HyperTF for every task: a user value would break the job's wiring.
RESERVED_ENV = taskenv.RESERVED_ENV  # what the launcher sets for every task: one list


def check_env(name: str, value: Any, where: str) -> str:
    """One task environment variable: a shell-safe name, a string value, not one of ours."""
    if not isinstance(name, str) or not ENV_NAME.match(name):
        raise ValueError(f"{where}: {name!r} is not an environment variable name (letters, "
                         f"digits and '_', not starting with a digit)")
    if name in RESERVED_ENV:
        raise ValueError(f"{where}: {name} is set by HyperTF for every task; it cannot be "
                         f"overridden")
    if isinstance(value, (dict, list, tuple)) or value is None:
        raise ValueError(f"{where}: {name} must be a plain value, not {value!r}")
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if "\0" in text:
        raise ValueError(f"{where}: the value of {name} holds a NUL byte")
    return text


def _packages(key: str, value: Any) -> tuple[str, ...] | None:
    """pip requirements for the nodes' virtualenv (read by the python_env role)."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(
            isinstance(item, str) and item.strip() and "\0" not in item for item in value):
        raise ValueError(f"{key} must be a list of pip requirements such as "
                         f"[scikit-learn, 'tensorboard>=2.16'], not {value!r}")
    return tuple(value)


def _task_env(key: str, value: Any) -> tuple[tuple[str, str], ...]:
    if value in (None, ""):
        return ()
    if not isinstance(value, Mapping):
        raise ValueError(f"{key} must be a mapping of NAME: value, not {value!r}")
    return tuple((name, check_env(name, item, key)) for name, item in value.items())


def _static_gpus(key: str, value: Any) -> int | str | tuple[dict[str, Any], ...]:
    """A count of idle fake GPUs, a list of GPU mappings, or a JSON file path (probes)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 64:
        return value
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        return tuple(value)
    raise ValueError(
        f"{key} must be a GPU count (0-64), a list of GPU mappings or a JSON file, not {value!r}"
    )


def _hosts(key: str, value: Any) -> tuple[str, ...]:
    """Host names: a YAML list or a comma-separated string ("" or [] for none)."""
    if value in (None, "", []):
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(h, str) and h.strip()
                                                        for h in items):
        raise ValueError(f"{key} must be a list of inventory host names, not {value!r}")
    return tuple(h.strip() for h in items)


def _prefix(key: str, value: Any) -> str:
    """An account-name prefix ("" for none): what useradd takes at the start of a name."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or not re.fullmatch(r"[a-z_][a-z0-9_-]{0,15}", value):
        raise ValueError(f"{key} must be a short account-name prefix (lower-case letters, "
                         f"digits, '_' and '-'), not {value!r}")
    return value


def _account_names(key: str, value: Any) -> tuple[tuple[str, str], ...]:
    """HyperTF user -> Unix account, for users whose account is not prefix + name."""
    if value in (None, "", {}, ()):
        return ()
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and accounts.ACCOUNT.match(v)
            for k, v in value.items()):
        raise ValueError(f"{key} must map HyperTF user names to Unix account names "
                         f"({{alice: asmith}}), not {value!r}")
    return tuple((str(k), str(v)) for k, v in value.items())


def _port_range(key: str, value: Any) -> tuple[int, int]:
    try:
        low, high = (int(part) for part in str(value).split("-"))
    except ValueError as err:
        raise ValueError(f"{key} must look like 20000-20999, not {value!r}") from err
    if not 1024 <= low <= high <= 65535:
        raise ValueError(f"{key} must lie within 1024-65535 with low <= high, not {value!r}")
    return low, high


@dataclass(frozen=True)
class Setting:
    """One ``hypertf_*`` variable, declared once: how to parse it, its default, whether a
    node's agent reads it (the agent role copies exactly those into the node's agent
    inventory), and where it lands: ``scope`` "node" (a NodeSettings field), "cluster" (a
    ClusterSettings field; every host must agree) or "" (read while building the others),
    under ``field`` (default: the name without ``hypertf_``)."""

    parse: Callable[[str, Any], Any]
    default: Any
    agent: bool = True
    scope: str = "node"
    field: str = ""


SETTINGS: dict[str, Setting] = {
    "hypertf_venv": Setting(_text, "/opt/hypertf/venv"),
    "hypertf_workdir": Setting(_text, "/var/lib/hypertf"),
    "hypertf_gpu_group": Setting(_text, "gpu_nodes", scope="cluster"),
    "hypertf_zookeeper_hosts": Setting(_optional_text, None, scope="cluster"),
    "hypertf_zookeeper_port": Setting(_port, 2181, scope=""),  # of the zookeeper group
    "hypertf_zk_root": Setting(_text, "/hypertf", scope="cluster"),
    "hypertf_zk_session_timeout": Setting(_positive(float), 10.0, scope="cluster"),
    "hypertf_data_network": Setting(_optional_text, None),
    "hypertf_mgmt_network": Setting(_optional_text, None),
    "hypertf_gpu_source": Setting(_choice(GpuSourceKind), GpuSourceKind.NVML),
    "hypertf_static_gpus": Setting(_static_gpus, 0),
    "hypertf_gpu_util_max": Setting(_percent, 10.0),
    "hypertf_gpu_mem_max": Setting(_percent, 10.0),
    "hypertf_port_range": Setting(_port_range, "20000-20999"),
    # The control port of each task's offload world (--offload-hosts): MPICH's mpiexec
    # (hydra) takes it from MPIEXEC_PORT_RANGE and binds it on every address whatever it is
    # told, so it is kept to this range (firewall it to the data network); every other
    # offload process binds the task's data address.
    "hypertf_offload_port_range": Setting(_port_range, "21000-21999", agent=False),
    # This node takes part in matrix offload (docs/offload.md, "Node-to-node trust"):
    # cluster.setup installs MPICH and hypertf[offload] and the cluster-internal SSH key;
    # the key and the known_hosts every such node shares lie at these paths on the node
    # ("~" is the login user's home there).
    "hypertf_offload": Setting(_flag, False, agent=False),
    "hypertf_offload_key": Setting(_text, "~/.ssh/hypertf_offload_ed25519", agent=False),
    "hypertf_offload_known_hosts": Setting(_text, "~/.ssh/hypertf_offload_known_hosts",
                                           agent=False),
    "hypertf_agent_interval": Setting(_positive(float), 5.0),
    # NVIDIA dcgm-exporter's --hpc-job-mapping-dir: the agent writes one file per GPU naming
    # the task key that holds it, so every DCGM_FI_* series carries it (docs/gpu.md).
    "hypertf_dcgm_job_mapping_dir": Setting(_optional_text, None),
    # The agent's Prometheus /metrics, on the management address (0: none). Not 9400: that
    # is NVIDIA's dcgm-exporter's default, which ops teams already run on the same nodes
    # (both at once: one of them would fail to bind); 9401 sits beside it.
    "hypertf_agent_metrics_port": Setting(_port_or_off, 9401, field="metrics_port"),
    "hypertf_known_hosts": Setting(_text, "~/.ssh/known_hosts", agent=False, scope="cluster"),
    "hypertf_ssh_timeout": Setting(_positive(float), 10.0, agent=False, scope="cluster"),
    # The keeper prunes a finished job record nobody wrote for this many days, and each
    # user's finished records beyond that user's newest N (per user: one user's excess
    # prunes only their own). Both by when ZooKeeper last wrote the record (the znode's
    # mtime), never by a date inside it, which its owner writes (hypertf.keeper.prune).
    "hypertf_job_retention_days": Setting(_positive(float), 30.0, scope="cluster"),
    "hypertf_job_records_max": Setting(_positive(int), 10000, scope="cluster"),
    # The data one user's job records may hold in ZooKeeper (MiB): the quota on
    # jobs/<user> that HyperTF's server provider holds the user to; the keeper prunes the
    # oldest finished records past three quarters of it (docs/zookeeper-layout.md, "Bounds").
    "hypertf_user_records_mb": Setting(_positive(int), 16, scope="cluster"),
    # How many users the admin expects: the zookeeper role sizes the server's heap by it
    # (docs/zookeeper-layout.md, "Bounds"); read by the role, not by HyperTF.
    "hypertf_expected_users": Setting(_positive(int), 24, agent=False, scope=""),
    # How often the keeper looks for records to prune (seconds; tests shorten it).
    "hypertf_keeper_prune_interval": Setting(_positive(float), 60.0, scope="cluster"),
    # GPUs one user's running jobs may hold at once (0: no limit); the queue keeps the rest
    # of their jobs waiting (reason UserLimit). Read by the keeper agent and the launcher.
    "hypertf_user_gpu_limit": Setting(_count, 0, scope="cluster"),
    # Jobs one user may have waiting at once (0: no limit); the keeper refuses the newest
    # past it, so one user's flood cannot slow everyone's admissions.
    "hypertf_user_queue_limit": Setting(_count, 200, scope="cluster"),
    # Fair share's half-life in days (docs/queue.md, "Fair share"): a GPU-second of usage
    # counts half after it, in the order of a priority tier. 0: no fair share (priority,
    # then first come first served). Read by the keeper agent and hypertf queue.
    "hypertf_fairshare_half_life": Setting(_days_or_off, 7.0, scope="cluster"),
    # Preemption (docs/queue.md, "Preemption"): off unless true. A waiting job then takes
    # the GPUs of running jobs of a strictly lower priority (or, in its tier, of users above
    # their fair share): SIGTERM, SIGKILL after the grace (seconds), and the victim waits
    # again at its old place; a job younger than the minimum runtime (seconds, doubled for
    # each earlier preemption of it) is never a victim. Read by the keeper agent.
    "hypertf_preempt": Setting(_flag, False, scope="cluster"),
    "hypertf_preempt_grace_s": Setting(_seconds, 120.0, scope="cluster"),
    "hypertf_preempt_min_runtime_s": Setting(_seconds, 600.0, scope="cluster"),
    # The most GPUs the keeper believes one host's agent reports: a record claiming more
    # counts its host down (a stolen node credential must not draw large jobs, and their
    # data, to its host). Set it to your largest node's GPU count.
    "hypertf_host_gpus_max": Setting(_positive(int), 16, scope="cluster"),
    # The hosts whose agent may keep the matrix: only they get the keeper's credential
    # (keeper.yml). Default: the gpu nodes in the zookeeper group, else the first three.
    "hypertf_keeper_hosts": Setting(_hosts, (), scope="cluster"),
    # What an agent does with a process on a GPU of its host that is not granted to that
    # process's job (docs/gpu.md, "Trespasses"): stop its process group, report it, or off.
    "hypertf_gpu_enforce": Setting(_choice(GpuEnforce), GpuEnforce.STOP),
    # Each job's tasks in cgroups the agent makes from its grant: only the granted GPUs
    # openable, nothing a task starts outlives the job (docs/gpu.md, "Confinement").
    "hypertf_gpu_confine": Setting(_choice(GpuConfine), GpuConfine.AUTO),
    # The agent's subtree in each cgroup hierarchy: <mount>/<this>/<host>/<task key>.
    "hypertf_cgroup_root": Setting(_cgroup_root, "hypertf"),
    # Packages for the training scripts in the nodes' virtualenv (python_env role,
    # cluster.setup; ./dev.sh up for this machine): the default is scikit-learn (examples).
    "hypertf_python_packages": Setting(_packages, None, agent=False),
    # ... installed without their dependencies (tf-keras: its 'tensorflow' dependency would
    # pull the full TensorFlow wheel over tensorflow-cpu).
    "hypertf_python_packages_no_deps": Setting(_packages, None, agent=False),
    # Environment variables for every task on the node (group and host vars merge as usual).
    "hypertf_task_env": Setting(_task_env, None, agent=False),
    # The directory of ZooKeeper credential files on the machine that runs the command
    # (default $HYPERTF_HOME/credentials/<zookeeper>_<root>); relative to the inventory.
    "hypertf_zk_credentials": Setting(_optional_text, None, scope="cluster"),
    # A CA certificate (PEM): talk TLS to ZooKeeper's secure client port and verify it.
    "hypertf_zk_tls_ca": Setting(_optional_text, None, scope="cluster"),
    # Whose Unix account runs a user's tasks (hypertf.core.accounts, docs/provisioning.md
    # "Accounts"): shared (every user as ansible_user: the old way, with a notice), managed
    # (the roles make one account per HyperTF user, one uid on every node) or existing (the
    # site's LDAP/SSSD accounts, checked only). The account is prefix + user name, unless
    # hypertf_account_names maps the user; the agent writes the mapping for its tasknode.
    "hypertf_user_accounts": Setting(_choice(accounts.AccountMode), accounts.AccountMode.SHARED,
                                     scope="cluster"),
    "hypertf_account_prefix": Setting(_prefix, "", scope="cluster"),
    "hypertf_account_names": Setting(_account_names, (), scope="cluster"),
    # Users whose tasks may run as root (their account maps to root): nobody by default.
    "hypertf_root_task_users": Setting(_hosts, (), scope="cluster"),
    # The user's own SSH key for logging in to the nodes as their account, on the machine
    # that runs the launcher ("~" is that user's home; {user} is the HyperTF user name).
    "hypertf_user_ssh_key": Setting(_text, "~/.ssh/id_ed25519", agent=False, scope="cluster"),
}
# What a node's agent reads: the hypertf_agent role asks for this list
# ('hypertf inventory agent-settings') instead of keeping a copy.
AGENT_SETTINGS = tuple(key for key, setting in SETTINGS.items() if setting.agent)
# Settings that describe the whole cluster: every host must agree on them.
CLUSTER_KEYS = tuple(key for key, setting in SETTINGS.items() if setting.scope == "cluster")
NODE_KEYS = tuple(key for key, setting in SETTINGS.items() if setting.scope == "node")


def field_of(key: str) -> str:
    """The NodeSettings or ClusterSettings attribute a setting fills."""
    return SETTINGS[key].field or key.removeprefix("hypertf_")


@dataclass(frozen=True)
class NodeSettings:
    """What the agent and the launcher need to know about one node."""

    venv: str
    workdir: str
    data_network: str | None
    mgmt_network: str | None
    gpu_source: GpuSourceKind
    static_gpus: int | str | tuple[dict[str, Any], ...]
    gpu_util_max: float
    gpu_mem_max: float
    port_range: tuple[int, int]
    agent_interval: float
    offload_port_range: tuple[int, int] = (21000, 21999)  # mpiexec's control port
    offload: bool = False  # takes part in matrix offload (cluster.setup gives it the key)
    offload_key: str = "~/.ssh/hypertf_offload_ed25519"  # the cluster-internal key, on the node
    offload_known_hosts: str = "~/.ssh/hypertf_offload_known_hosts"  # nodes' pinned host keys
    metrics_port: int = 0  # 0: no /metrics
    gpu_enforce: GpuEnforce = GpuEnforce.STOP  # trespasses on this node's GPUs
    gpu_confine: GpuConfine = GpuConfine.AUTO  # the job's cgroups (hypertf.node.confine)
    cgroup_root: str = "hypertf"  # the agent's subtree in each cgroup hierarchy
    dcgm_job_mapping_dir: str | None = None  # dcgm-exporter's HPC job mapping directory
    task_env: tuple[tuple[str, str], ...] = ()
    python_packages: tuple[str, ...] | None = None  # None: the role's default
    python_packages_no_deps: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ClusterSettings:
    """Settings shared by every node (ZooKeeper, SSH trust)."""

    gpu_group: str
    zookeeper_hosts: str
    zk_root: str
    zk_session_timeout: float
    known_hosts: str
    ssh_timeout: float
    job_retention_days: float = 30.0
    job_records_max: int = 10000
    user_records_mb: int = 16  # the data of one user's job records (its quota)
    keeper_prune_interval: float = 60.0
    user_gpu_limit: int = 0  # 0: none
    user_queue_limit: int = 200  # waiting jobs per user (0: none)
    fairshare_half_life: float = 7.0  # days (0: fair share off)
    preempt: bool = False  # the keeper preempts for waiting jobs (docs/queue.md)
    preempt_grace_s: float = 120.0  # SIGTERM to SIGKILL
    preempt_min_runtime_s: float = 600.0  # younger jobs are never victims
    host_gpus_max: int = 16  # GPUs a host's record may claim (the keeper's bound)
    keeper_hosts: tuple[str, ...] = ()  # () : the default (keeper_hosts_of)
    zk_credentials: str | None = None  # directory of credential files; None: the default
    zk_tls_ca: str | None = None  # CA certificate: TLS to ZooKeeper
    user_accounts: accounts.AccountMode = accounts.AccountMode.SHARED  # tasks' accounts
    account_prefix: str = ""
    account_names: tuple[tuple[str, str], ...] = ()
    root_task_users: tuple[str, ...] = ()
    user_ssh_key: str = "~/.ssh/id_ed25519"  # the launching user's key to their account

    @property
    def account_policy(self) -> accounts.AccountPolicy:
        """The admin's mapping of HyperTF users to Unix accounts (hypertf.core.accounts)."""
        return accounts.AccountPolicy(self.user_accounts, self.account_prefix,
                                      dict(self.account_names), self.root_task_users)
