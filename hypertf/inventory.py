"""The inventory: an Ansible YAML inventory is the one source of truth for hosts and settings.

We read it with ansible-core's own parser (group_vars/host_vars, host ranges such as
``node[01:16]``, hosts in several groups, the usual variable precedence), so HyperTF and
``ansible-playbook`` always see the same cluster. Before handing the file to Ansible we load
it once with PyYAML to give precise messages (line and column, duplicate keys, misspelt
keys); Ansible's own messages for such mistakes are warnings that are easy to miss.
"""

from __future__ import annotations

import difflib
import errno
import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hypertf import yamlguard
from hypertf.errors import InventoryError

DEFAULT_INVENTORY = "inventory/local.yml"
GROUP_KEYS = ("hosts", "vars", "children")
ZOOKEEPER_GROUP = "zookeeper"
# Variables of the hypertf_agent Ansible role: they share the hypertf_ prefix and may sit in
# the inventory beside HyperTF's own settings (roles/hypertf_agent/defaults/main.yml).
ROLE_VARIABLES = frozenset(
    f"hypertf_agent_{name}"
    for name in ("venv", "workdir", "config", "service_manager", "service_name", "user",
                 "register_timeout", "purge")
)

# Ansible connection variables HyperTF reads or expects to see; used to catch typos.
ANSIBLE_KEYS = frozenset(
    {
        "ansible_host", "ansible_port", "ansible_user", "ansible_connection",
        "ansible_ssh_private_key_file", "ansible_private_key_file", "ansible_password",
        "ansible_ssh_pass", "ansible_ssh_common_args", "ansible_ssh_extra_args",
        "ansible_python_interpreter", "ansible_become", "ansible_become_user",
        "ansible_become_method", "ansible_become_password", "ansible_shell_type",
        "ansible_ssh_host", "ansible_ssh_port", "ansible_ssh_user", "ansible_timeout",
    }
)


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


def _gpu_source(key: str, value: Any) -> str:
    if value not in ("nvml", "static", "none"):
        raise ValueError(f"{key} must be one of nvml, static, none, not {value!r}")
    return value


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by HyperTF for every task: a user value would break the job's wiring.
RESERVED_ENV = frozenset({"TF_CONFIG", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
                          "HYPERTF_GPUS", "HYPERTF_TASK_KEY", "HYPERTF_TASK",
                          "HYPERTF_ATTEMPT", "HYPERTF_CHECKPOINT_DIR"})


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


def _port_range(key: str, value: Any) -> tuple[int, int]:
    try:
        low, high = (int(part) for part in str(value).split("-"))
    except ValueError:
        raise ValueError(f"{key} must look like 20000-20999, not {value!r}") from None
    if not 1024 <= low <= high <= 65535:
        raise ValueError(f"{key} must lie within 1024-65535 with low <= high, not {value!r}")
    return low, high


@dataclass(frozen=True)
class Setting:
    """One ``hypertf_*`` variable: how to parse it and its default."""

    parse: Callable[[str, Any], Any]
    default: Any


SETTINGS: dict[str, Setting] = {
    "hypertf_venv": Setting(_text, "/opt/hypertf/venv"),
    "hypertf_workdir": Setting(_text, "/var/lib/hypertf"),
    "hypertf_gpu_group": Setting(_text, "gpu_nodes"),
    "hypertf_zookeeper_hosts": Setting(_optional_text, None),
    "hypertf_zookeeper_port": Setting(_port, 2181),
    "hypertf_zk_root": Setting(_text, "/hypertf"),
    "hypertf_zk_session_timeout": Setting(_positive(float), 10.0),
    "hypertf_data_network": Setting(_optional_text, None),
    "hypertf_mgmt_network": Setting(_optional_text, None),
    "hypertf_gpu_source": Setting(_gpu_source, "nvml"),
    "hypertf_static_gpus": Setting(_static_gpus, 0),
    "hypertf_gpu_util_max": Setting(_percent, 10.0),
    "hypertf_gpu_mem_max": Setting(_percent, 10.0),
    "hypertf_port_range": Setting(_port_range, "20000-20999"),
    "hypertf_agent_interval": Setting(_positive(float), 5.0),
    # The agent's Prometheus /metrics, on the management address (0: none). 9400 is the
    # port of NVIDIA's DCGM exporter, which ops teams already scrape.
    "hypertf_agent_metrics_port": Setting(_port_or_off, 9400),
    "hypertf_known_hosts": Setting(_text, "~/.ssh/known_hosts"),
    "hypertf_ssh_timeout": Setting(_positive(float), 10.0),
    # Finished job records older than this, or beyond the newest N, are pruned by the keeper.
    "hypertf_job_retention_days": Setting(_positive(float), 30.0),
    "hypertf_job_records_max": Setting(_positive(int), 10000),
    # Packages for the training scripts in the nodes' virtualenv (python_env role,
    # cluster.setup; ./dev.sh up for this machine): the default is scikit-learn (examples).
    "hypertf_python_packages": Setting(_packages, None),
    # ... installed without their dependencies (tf-keras: its 'tensorflow' dependency would
    # pull the full TensorFlow wheel over tensorflow-cpu).
    "hypertf_python_packages_no_deps": Setting(_packages, None),
    # Environment variables for every task on the node (group and host vars merge as usual).
    "hypertf_task_env": Setting(_task_env, None),
    # The directory of ZooKeeper credential files on the machine that runs the command
    # (default $HYPERTF_HOME/credentials/<zookeeper>_<root>); relative to the inventory.
    "hypertf_zk_credentials": Setting(_optional_text, None),
    # A CA certificate (PEM): talk TLS to ZooKeeper's secure client port and verify it.
    "hypertf_zk_tls_ca": Setting(_optional_text, None),
}
# Settings that describe the whole cluster: every host must agree on them.
CLUSTER_KEYS = (
    "hypertf_gpu_group", "hypertf_zookeeper_hosts", "hypertf_zk_root",
    "hypertf_zk_session_timeout", "hypertf_known_hosts", "hypertf_ssh_timeout",
    "hypertf_job_retention_days", "hypertf_job_records_max", "hypertf_zk_credentials",
    "hypertf_zk_tls_ca",
)


@dataclass(frozen=True)
class NodeSettings:
    """What the agent and the launcher need to know about one node."""

    venv: str
    workdir: str
    data_network: str | None
    mgmt_network: str | None
    gpu_source: str
    static_gpus: int | str | tuple[dict[str, Any], ...]
    gpu_util_max: float
    gpu_mem_max: float
    port_range: tuple[int, int]
    agent_interval: float
    metrics_port: int = 0  # 0: no /metrics
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
    zk_credentials: str | None = None  # directory of credential files; None: the default
    zk_tls_ca: str | None = None  # CA certificate: TLS to ZooKeeper


@dataclass(frozen=True)
class Node:
    """A host of the GPU-node group, with its connection details and settings."""

    name: str
    address: str
    user: str | None
    port: int
    key_file: str | None
    local: bool
    groups: tuple[str, ...]
    settings: NodeSettings


@dataclass(frozen=True)
class Inventory:
    """The cluster as the inventory file describes it."""

    path: Path
    nodes: dict[str, Node]
    cluster: ClusterSettings
    zookeeper_nodes: tuple[str, ...] = field(default=())

    def node(self, name: str) -> Node:
        """The node called ``name``, or a message listing the known ones."""
        if name not in self.nodes:
            known = ", ".join(self.nodes) or "none"
            hint = difflib.get_close_matches(name, self.nodes, n=1)
            guess = f" Did you mean {hint[0]!r}?" if hint else ""
            raise InventoryError(
                f"{self.path}: unknown host {name!r} (hosts of group "
                f"{self.cluster.gpu_group!r}: {known}).{guess}"
            )
        return self.nodes[name]


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; a duplicated host is a mistake."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                mark = key_node.start_mark
                raise InventoryError(
                    f"line {mark.line + 1}, column {mark.column + 1}: a mapping key must be "
                    f"a plain value, not {key!r}"
                ) from None
            if key in seen:
                mark = key_node.start_mark
                raise InventoryError(
                    f"line {mark.line + 1}, column {mark.column + 1}: "
                    f"{key!r} appears twice in the same mapping; keep one"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


YAML_SUFFIXES = (".yml", ".yaml", ".json")


def _source_files(path: Path) -> list[Path]:
    """The inventory's files (the file, or every file of an inventory directory), each
    checked for size, NUL bytes and YAML expansion limits before anything parses it."""
    try:
        path.stat()
    except FileNotFoundError:
        raise InventoryError(
            f"inventory {path} not found: pass an existing file or directory with "
            f"-i/--inventory (the default is {DEFAULT_INVENTORY})"
        ) from None
    except OSError as err:
        why = "a symlink loop" if err.errno == errno.ELOOP else err.strerror
        raise InventoryError(f"inventory {path} cannot be read: {why}") from None
    if path.is_dir():
        files = []
        for folder, dirs, names in os.walk(path):  # symlinked folders are not followed
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files += [Path(folder) / n for n in sorted(names) if not n.startswith(".")]
            if len(files) > yamlguard.MAX_FILES:
                raise InventoryError(
                    f"inventory directory {path} has more than {yamlguard.MAX_FILES} files"
                )
    elif path.is_file():
        files = [path]  # and the group_vars/host_vars Ansible reads beside it
        for folder in (path.parent / "group_vars", path.parent / "host_vars"):
            if folder.is_dir():
                files += [f for f in sorted(folder.rglob("*")) if not f.name.startswith(".")]
        if len(files) > yamlguard.MAX_FILES:
            raise InventoryError(f"inventory {path}: more than {yamlguard.MAX_FILES} files "
                                 f"in its group_vars and host_vars")
    else:
        raise InventoryError(f"inventory {path} is neither a file nor a directory")
    for file in files:
        try:
            if not file.is_file():
                continue
            yamlguard.check_size(str(file), file.stat().st_size)
            yamlguard.check_text(str(file), file.read_bytes().decode("utf-8", "replace"))
        except OSError as err:
            why = "a symlink loop" if err.errno == errno.ELOOP else err.strerror
            raise InventoryError(f"inventory file {file} cannot be read: {why}") from None
    return files


def _yaml_inventories(path: Path, files: list[Path]) -> list[tuple[Path, Any]]:
    """The YAML inventories among the files, read strictly (line and column, duplicate
    keys). Other files (INI inventories, files of unknown type) are left to Ansible."""
    if path.is_file():
        candidates = [path]
    else:  # Ansible reads the directory's own files; group_vars/host_vars are variables
        candidates = [f for f in files if f.parent == path and f.suffix in YAML_SUFFIXES]
    found = []
    for file in candidates:
        if file.suffix in YAML_SUFFIXES:
            found.append((file, _read_yaml(file)))
            continue
        try:  # no YAML suffix: YAML if it reads as a mapping, else (INI) Ansible's
            found.append((file, _read_yaml(file)))
        except InventoryError:
            continue
    return found


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise InventoryError(
            f"{path}: byte {err.start} is not UTF-8 text; save the inventory as UTF-8"
        ) from None
    except OSError as err:
        raise InventoryError(f"inventory {path} cannot be read: {err.strerror}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except InventoryError as err:
        raise InventoryError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise InventoryError(f"{path}: malformed YAML at {where}{problem}") from None
    if data is None:
        raise InventoryError(f"{path}: the inventory is empty; see inventory/example.yml")
    if not isinstance(data, dict):
        raise InventoryError(
            f"{path}: the top level must be a mapping of groups (usually 'all:'), "
            f"not a {type(data).__name__}"
        )
    return data


def _check_group(path: Path, name: str, group: Any) -> None:
    """Walk one group of the raw YAML: only hosts/vars/children, each a mapping."""
    if group is None:
        return
    if not isinstance(group, dict):
        raise InventoryError(
            f"{path}: group {name!r} must be a mapping with hosts, vars or children, "
            f"not {group!r}"
        )
    for key, value in group.items():
        if key not in GROUP_KEYS:
            hint = difflib.get_close_matches(str(key), GROUP_KEYS, n=1)
            guess = f"; did you mean {hint[0]!r}?" if hint else ""
            raise InventoryError(
                f"{path}: unknown key {key!r} in group {name!r}: a group holds only "
                f"hosts, vars and children{guess}"
            )
        if value is not None and not isinstance(value, dict):
            raise InventoryError(
                f"{path}: '{key}' of group {name!r} must be a mapping, not {value!r}"
            )
    for host, host_vars in (group.get("hosts") or {}).items():
        if host_vars is not None and not isinstance(host_vars, dict):
            raise InventoryError(
                f"{path}: host {host!r} in group {name!r} must map to its variables "
                f"(or nothing), not {host_vars!r}"
            )
    for child, child_group in (group.get("children") or {}).items():
        _check_group(path, str(child), child_group)


def _check_keys(path: Path, host: str, variables: Mapping[str, Any]) -> None:
    for key in variables:
        if not isinstance(key, str):
            continue
        if key in ROLE_VARIABLES:
            continue
        if key.startswith("hypertf_") and key not in SETTINGS:
            hint = difflib.get_close_matches(key, SETTINGS, n=1)
            guess = f"; did you mean {hint[0]!r}?" if hint else f"; known: {', '.join(SETTINGS)}"
            raise InventoryError(f"{path}: host {host!r}: unknown setting {key!r}{guess}")
        if key.startswith("ansible_") and key not in ANSIBLE_KEYS:
            hint = difflib.get_close_matches(key, ANSIBLE_KEYS, n=1, cutoff=0.85)
            if hint:
                raise InventoryError(
                    f"{path}: host {host!r}: unknown variable {key!r}; did you mean {hint[0]!r}?"
                )


def _parse_settings(path: Path, host: str, variables: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, setting in SETTINGS.items():
        raw = variables.get(key, setting.default)
        try:
            values[key] = setting.parse(key, raw)
        except ValueError as err:
            raise InventoryError(f"{path}: host {host!r}: {err}") from None
    return values


def _check_host_name(path: Path, host: str) -> None:
    """Ansible's rules for a host name (a network host name or an address): anything else
    (``h1;x``, spaces) would be a different host to ssh, to Ansible and to HyperTF."""
    from ansible.errors import AnsibleError
    from ansible.parsing.utils.addresses import parse_address

    try:
        name, port = parse_address(host)
    except AnsibleError:
        name, port = None, None
    if name != host or port is not None or len(host) > 253:
        raise InventoryError(
            f"{path}: {host[:80]!r} is not a valid host name (letters, digits, '-', '_' and "
            f"'.', or an IP address); name the host plainly and put its address in "
            f"ansible_host"
        )


def _check_no_nul(path: Path, host: str, variables: Mapping[str, Any]) -> None:
    def walk(value: Any, where: str) -> None:
        if isinstance(value, str) and "\0" in value:
            raise InventoryError(f"{path}: host {host!r}: {where} holds a NUL byte; remove it")
        if isinstance(value, Mapping):
            for key, item in value.items():
                walk(key, where)
                walk(item, f"{where}.{key}" if where else str(key))
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item, where)

    walk(dict(variables), "")


def _resolve_local_path(path: Path, key: str, host: str, value: str, local: bool) -> str:
    """venv and work dir as absolute paths: a local host's relative paths are relative to
    the inventory file; a remote host's must be absolute (no shell or template expands
    them on the node)."""
    if "{{" in value or "{%" in value:
        raise InventoryError(
            f"{path}: host {host!r}: {key} {value!r} is a template; HyperTF reads the "
            f"inventory without Ansible's templating: write the path out"
        )
    if local:
        expanded = os.path.expanduser(value)
        base = path if path.is_dir() else path.parent
        return str((base / expanded).resolve()) if not os.path.isabs(expanded) \
            else expanded
    if not os.path.isabs(value):
        raise InventoryError(
            f"{path}: host {host!r}: {key} must be an absolute path on the node, not "
            f"{value!r}"
        )
    return value


def _beside(path: Path, value: str | None) -> str | None:
    """A local path setting: ``~`` expanded, relative to the inventory file."""
    if value is None:
        return None
    base = path if path.is_dir() else path.parent
    return str((base / os.path.expanduser(value)).resolve())


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _ansible_hosts(path: Path) -> dict[str, tuple[dict[str, Any], tuple[str, ...]]]:
    """Every host with its merged variables and groups, as ansible-core resolves them."""
    os.environ.setdefault("ANSIBLE_INVENTORY_ENABLED", "yaml,ini")
    os.environ.setdefault("ANSIBLE_INVENTORY_UNPARSED_FAILED", "True")
    os.environ.setdefault("ANSIBLE_LOCALHOST_WARNING", "False")
    os.environ.setdefault("ANSIBLE_DEPRECATION_WARNINGS", "False")
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    try:
        manager = InventoryManager(loader=loader, sources=[str(path)])
        variables = VariableManager(loader=loader, inventory=manager)
        hosts = {}
        for host in manager.get_hosts():
            merged = variables.get_vars(host=host)
            groups = tuple(g.name for g in host.get_groups() if g.name != "all")
            hosts[host.name] = (dict(merged), groups)
    except AnsibleError as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
        raise InventoryError(f"{path}: Ansible cannot read this inventory: {first_line}") from None
    return hosts


def load_inventory(path: str | os.PathLike[str] = DEFAULT_INVENTORY) -> Inventory:
    """Read and validate an inventory; every mistake raises one InventoryError naming it."""
    path = Path(path).expanduser()
    files = _source_files(path)
    for source, raw in _yaml_inventories(path, files):
        for name, group in raw.items():
            _check_group(source, str(name), group)
    hosts = _ansible_hosts(path.resolve())

    per_host: dict[str, dict[str, Any]] = {}
    for host, (variables, _) in hosts.items():
        _check_host_name(path, host)
        _check_no_nul(path, host, variables)
        _check_keys(path, host, variables)
        per_host[host] = _parse_settings(path, host, variables)

    gpu_group = per_host[next(iter(per_host))]["hypertf_gpu_group"] if per_host else "gpu_nodes"
    members = [h for h, (_, groups) in hosts.items() if gpu_group in groups]
    if not members:
        raise InventoryError(
            f"{path}: group {gpu_group!r} has no hosts: list the nodes that run tasks "
            f"under all.children.{gpu_group}.hosts (see inventory/example.yml)"
        )

    nodes: dict[str, Node] = {}
    for host in members:
        variables, groups = hosts[host]
        values = per_host[host]
        local = variables.get("ansible_connection") == "local"
        address = variables.get("ansible_host") or variables.get("ansible_ssh_host")
        if not address:
            if local:
                address = "127.0.0.1"
            elif _is_ip(host):
                address = host
            else:
                raise InventoryError(
                    f"{path}: host {host!r} has no address: set ansible_host "
                    f"(or ansible_connection: local for this machine)"
                )
        port = variables.get("ansible_port", variables.get("ansible_ssh_port", 22))
        if isinstance(port, str) and port.strip().isdigit():
            port = int(port)  # Ansible converts quoted numbers too
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise InventoryError(
                f"{path}: host {host!r}: ansible_port must be 1-65535, not {port!r}"
            )
        key_file = variables.get("ansible_ssh_private_key_file") or variables.get(
            "ansible_private_key_file"
        )
        nodes[host] = Node(
            name=host,
            address=str(address),
            user=variables.get("ansible_user") or variables.get("ansible_ssh_user"),
            port=port,
            key_file=str(Path(key_file).expanduser()) if key_file else None,
            local=local,
            groups=groups,
            settings=NodeSettings(
                venv=_resolve_local_path(path, "hypertf_venv", host, values["hypertf_venv"],
                                         local),
                workdir=_resolve_local_path(path, "hypertf_workdir", host,
                                            values["hypertf_workdir"], local),
                data_network=values["hypertf_data_network"],
                mgmt_network=values["hypertf_mgmt_network"],
                gpu_source=values["hypertf_gpu_source"],
                static_gpus=values["hypertf_static_gpus"],
                gpu_util_max=values["hypertf_gpu_util_max"],
                gpu_mem_max=values["hypertf_gpu_mem_max"],
                port_range=values["hypertf_port_range"],
                agent_interval=values["hypertf_agent_interval"],
                metrics_port=values["hypertf_agent_metrics_port"],
                task_env=values["hypertf_task_env"],
                python_packages=values["hypertf_python_packages"],
                python_packages_no_deps=values["hypertf_python_packages_no_deps"],
            ),
        )

    seen: dict[tuple[str, int], str] = {}
    for node in nodes.values():
        other = seen.setdefault((node.address, node.port), node.name)
        if other != node.name and not node.local:
            raise InventoryError(
                f"{path}: hosts {other!r} and {node.name!r} are the same node "
                f"({node.address}:{node.port}); its GPUs would be counted twice: keep one"
            )

    first = per_host[members[0]]
    for host in members[1:]:
        for key in CLUSTER_KEYS:
            if per_host[host][key] != first[key]:
                raise InventoryError(
                    f"{path}: hosts {members[0]!r} and {host!r} disagree on {key} "
                    f"({first[key]!r} vs {per_host[host][key]!r}); set it once under all.vars"
                )

    zk_members = tuple(h for h, (_, groups) in hosts.items() if ZOOKEEPER_GROUP in groups)
    zookeeper_hosts = first["hypertf_zookeeper_hosts"]
    if zookeeper_hosts is None:
        if not zk_members:
            raise InventoryError(
                f"{path}: no ZooKeeper: add a {ZOOKEEPER_GROUP!r} group "
                f"or set hypertf_zookeeper_hosts under all.vars"
            )
        parts = []
        for host in zk_members:
            variables = hosts[host][0]
            address = variables.get("ansible_host") or host
            parts.append(f"{address}:{per_host[host]['hypertf_zookeeper_port']}")
        zookeeper_hosts = ",".join(parts)

    known_hosts = str(Path(first["hypertf_known_hosts"]).expanduser())
    return Inventory(
        path=path,
        nodes=nodes,
        cluster=ClusterSettings(
            gpu_group=gpu_group,
            zookeeper_hosts=zookeeper_hosts,
            zk_root=first["hypertf_zk_root"].rstrip("/") or "/hypertf",
            zk_session_timeout=first["hypertf_zk_session_timeout"],
            known_hosts=known_hosts,
            ssh_timeout=first["hypertf_ssh_timeout"],
            job_retention_days=first["hypertf_job_retention_days"],
            job_records_max=first["hypertf_job_records_max"],
            zk_credentials=_beside(path, first["hypertf_zk_credentials"]),
            zk_tls_ca=_beside(path, first["hypertf_zk_tls_ca"]),
        ),
        zookeeper_nodes=zk_members,
    )
