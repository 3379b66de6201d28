"""The inventory: an Ansible YAML inventory is the one source of truth for hosts and settings.

We read it with ansible-core's own parser (group_vars/host_vars, host ranges such as
``node[01:16]``, hosts in several groups, the usual variable precedence), so HyperTF and
``ansible-playbook`` always see the same cluster. Before handing the file to Ansible we load
it once with PyYAML to give precise messages (line and column, duplicate keys, misspelt
keys); Ansible's own messages for such mistakes are warnings that are easy to miss.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from hypertf.config import inventorycache, yamlguard
from hypertf.config.settings import (
    CLUSTER_KEYS,
    DEFAULT_INVENTORY,
    NODE_KEYS,
    SETTINGS,
    ClusterSettings,
    NodeSettings,
    field_of,
)
from hypertf.core.errors import InventoryError

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

    @property
    def keeper_hosts(self) -> tuple[str, ...]:
        """The hosts whose agent may keep the matrix (they alone get ``keeper.yml``): the
        admin's ``hypertf_keeper_hosts``, else the GPU nodes that run ZooKeeper (the admin
        chose them to hold the cluster's state already), else the first three nodes."""
        if self.cluster.keeper_hosts:
            return tuple(h for h in self.cluster.keeper_hosts if h in self.nodes)
        zookeeper = tuple(h for h in self.nodes if h in self.zookeeper_nodes)
        return zookeeper or tuple(self.nodes)[:3]

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
        if isinstance(key, str) and (problem := _key_problem(key)):
            raise InventoryError(f"{path}: host {host!r}: {problem}")


@functools.lru_cache(maxsize=4096)
def _key_problem(key: str) -> str | None:
    """What is wrong with a variable's name, or None; every host has the same few names,
    and a close-match search per host and name was 0.6 s of 1,000 hosts' parse."""
    if key in ROLE_VARIABLES:
        return None
    if key.startswith("hypertf_") and key not in SETTINGS:
        hint = difflib.get_close_matches(key, SETTINGS, n=1)
        guess = f"; did you mean {hint[0]!r}?" if hint else f"; known: {', '.join(SETTINGS)}"
        return f"unknown setting {key!r}{guess}"
    if key.startswith("ansible_") and key not in ANSIBLE_KEYS:
        hint = difflib.get_close_matches(key, ANSIBLE_KEYS, n=1, cutoff=0.85)
        if hint:
            return f"unknown variable {key!r}; did you mean {hint[0]!r}?"
    return None


def _parse_settings(path: Path, host: str, variables: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, setting in SETTINGS.items():
        raw = variables.get(key, setting.default)
        try:
            values[key] = setting.parse(key, raw)
        except ValueError as err:
            raise InventoryError(f"{path}: host {host!r}: {err}") from err
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
        # Ansible's own variables, the same for every host: not the inventory's to check,
        # and one of them ('groups') names every host, which made the checks of each host
        # O(hosts): 10,000 hosts took 70 s to parse instead of ~6 s
        magic = set(variables.get_vars())
        hosts = {}
        for host in manager.get_hosts():
            merged = variables.get_vars(host=host)
            groups = tuple(g.name for g in host.get_groups() if g.name != "all")
            hosts[host.name] = ({k: v for k, v in merged.items() if k not in magic}, groups)
    except AnsibleError as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
        raise InventoryError(f"{path}: Ansible cannot read this inventory: {first_line}") from err
    return hosts


def load_inventory(path: str | os.PathLike[str] = DEFAULT_INVENTORY) -> Inventory:
    """Read and validate an inventory; every mistake raises one InventoryError naming it.
    An unchanged inventory comes from the cache (hypertf.config.inventorycache)."""
    path = Path(path).expanduser()
    files = yamlguard.source_files(path)
    return inventorycache.cached(path, files, lambda: _parse(path, files))


def _parse(path: Path, files: list[Path]) -> Inventory:
    yamlguard.check_files(files)  # limits before anything parses or expands them
    for source, raw in yamlguard.yaml_inventories(path, files):
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
            settings=NodeSettings(**{  # every node setting, by the table (hypertf.config.settings)
                **{field_of(key): values[key] for key in NODE_KEYS},
                "venv": _resolve_local_path(path, "hypertf_venv", host,
                                            values["hypertf_venv"], local),
                "workdir": _resolve_local_path(path, "hypertf_workdir", host,
                                               values["hypertf_workdir"], local),
            }),
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
    return cast(Inventory, _plain(Inventory(  # _plain keeps each value's type
        path=path,
        nodes=nodes,
        cluster=ClusterSettings(**{  # every cluster setting, by the table
            **{field_of(key): first[key] for key in CLUSTER_KEYS},
            "gpu_group": gpu_group,
            "zookeeper_hosts": zookeeper_hosts,
            "zk_root": first["hypertf_zk_root"].rstrip("/") or "/hypertf",
            "known_hosts": known_hosts,
            "zk_credentials": _beside(path, first["hypertf_zk_credentials"]),
            "zk_tls_ca": _beside(path, first["hypertf_zk_tls_ca"]),
        }),
        zookeeper_nodes=zk_members,
    )))


def _plain(value: Any) -> Any:
    """``value`` with Ansible's tagged strings and numbers (subclasses of str and int that
    carry their origin) made plain, through dataclasses, dicts, lists and tuples. The cached
    inventory is unpickled by every command: a tagged value in it imported ansible-core's
    data tagging (~30 ms) before any job could start. A setting's enum member (a str too)
    stays one."""
    if isinstance(value, (bool, enum.Enum)) or value is None:
        return value
    for kind in (str, int, float):
        if isinstance(value, kind):
            return value if type(value) is kind else kind(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        return type(value)(*map(_plain, value))
    if isinstance(value, (list, tuple)):
        return (list if isinstance(value, list) else tuple)(map(_plain, value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _plain(getattr(value, f.name))
                                            for f in dataclasses.fields(value) if f.init})
    return value
