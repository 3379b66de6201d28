"""The inventory: ansible-core's reading of it, and one clear InventoryError per mistake."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from hypertf.config.inventory import _ansible_hosts, load_inventory
from hypertf.config.settings import GpuEnforce, GpuSourceKind
from hypertf.core.errors import InventoryError

REPO = Path(__file__).resolve().parents[2]
HYPERTF = Path(sys.executable).parent / "hypertf"

ZK = 'hypertf_zookeeper_hosts: "zk.example:2181"'


def write(directory: Path, text: str, name: str = "cluster.yml") -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def one_node(extra: str = "", all_vars: str = ZK) -> str:
    """A one-node inventory; ``extra`` lines are added to the node's variables."""
    host_vars = "".join(f"\n          {line}" for line in extra.splitlines() if line)
    return f"""
all:
  vars:
    {all_vars}
  children:
    gpu_nodes:
      hosts:
        node1:
          ansible_host: 10.0.0.1{host_vars}
"""


def load_error(path: Path) -> str:
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    assert type(err.value) is InventoryError
    assert err.value.exit_code == 2
    return str(err.value)


# --- good inventories -----------------------------------------------------------------------


def test_shipped_local_inventory():
    inventory = load_inventory(REPO / "inventory" / "local.yml")
    assert list(inventory.nodes) == ["localhost"]
    node = inventory.node("localhost")
    assert node.local is True
    assert node.address == "127.0.0.1"
    assert node.port == 22
    assert node.groups == ("gpu_nodes",)
    assert node.settings.venv == str(REPO / ".venv")
    assert node.settings.workdir == str(REPO / ".hypertf" / "work")
    assert node.settings.gpu_source == "nvml"
    assert node.settings.agent_interval == 5.0
    assert node.settings.port_range == (20000, 20999)
    assert inventory.cluster.zookeeper_hosts == "127.0.0.1:2181"
    assert inventory.cluster.zk_root == "/hypertf"
    assert inventory.cluster.gpu_group == "gpu_nodes"
    assert inventory.zookeeper_nodes == ()


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """Three ranged nodes plus one, a host in two groups, group_vars/ and host_vars/."""
    path = write(tmp_path, """
        all:
          vars:
            hypertf_gpu_mem_max: 7
            hypertf_gpu_util_max: 1
            hypertf_zk_root: /team/
          children:
            gpu_nodes:
              vars:
                ansible_user: trainer
              hosts:
                node[01:03]:
                gpu9:
                  ansible_host: 10.0.0.9
                  ansible_port: 2222
                  hypertf_gpu_util_max: 60
            fast:
              hosts:
                node01:
            zookeeper:
              hosts:
                zk1:
                  ansible_host: 10.0.1.1
                zk2:
        """)
    write(tmp_path, "hypertf_gpu_util_max: 5\n", "group_vars/all.yml")
    write(tmp_path, "hypertf_gpu_util_max: 20\nhypertf_agent_interval: 2\n",
          "group_vars/gpu_nodes.yml")
    write(tmp_path, "hypertf_data_network: 10.40.0.0/16\n", "group_vars/fast.yml")
    for i in (1, 2, 3):
        write(tmp_path, f"ansible_host: 10.0.0.{i}\n", f"host_vars/node0{i}.yml")
    write(tmp_path, "ansible_host: 10.0.0.2\nhypertf_gpu_util_max: 40\n",
          "host_vars/node02.yml")
    write(tmp_path, "hypertf_zookeeper_port: 2182\n", "host_vars/zk2.yml")
    return path


def test_multi_node_hosts_ranges_and_groups(cluster):
    inventory = load_inventory(cluster)
    assert sorted(inventory.nodes) == ["gpu9", "node01", "node02", "node03"]
    assert {n.name: n.address for n in inventory.nodes.values()} == {
        "node01": "10.0.0.1", "node02": "10.0.0.2", "node03": "10.0.0.3", "gpu9": "10.0.0.9",
    }
    assert set(inventory.node("node01").groups) == {"gpu_nodes", "fast"}
    assert inventory.node("node02").groups == ("gpu_nodes",)
    assert all(n.user == "trainer" and not n.local for n in inventory.nodes.values())
    assert inventory.node("gpu9").port == 2222
    assert inventory.node("node01").port == 22
    assert "zk1" not in inventory.nodes  # only the GPU group's hosts run tasks


def test_parsed_values_are_plain_python_types(cluster):
    """Ansible's tagged str/int subclasses are not kept: unpickling the cached inventory
    would import ansible-core's data tagging in every command."""
    node = load_inventory(cluster).node("node02")
    assert type(node.name) is str and type(node.user) is str
    assert all(type(group) is str for group in node.groups)
    assert type(node.settings.gpu_util_max) is float
    assert all(type(name) is str for name in load_inventory(cluster).nodes)


def test_variable_precedence_all_then_group_then_host(cluster):
    nodes = load_inventory(cluster).nodes
    # all (file) < group_vars/all < group (group_vars/gpu_nodes) < host (file, host_vars/)
    assert nodes["node01"].settings.gpu_util_max == 20.0
    assert nodes["node03"].settings.gpu_util_max == 20.0
    assert nodes["node02"].settings.gpu_util_max == 40.0
    assert nodes["gpu9"].settings.gpu_util_max == 60.0
    assert all(n.settings.gpu_mem_max == 7.0 for n in nodes.values())
    assert all(n.settings.agent_interval == 2.0 for n in nodes.values())
    # a variable of the second group reaches only its member
    assert nodes["node01"].settings.data_network == "10.40.0.0/16"
    assert nodes["node02"].settings.data_network is None


def test_zookeeper_group_gives_the_connection_string(cluster):
    inventory = load_inventory(cluster)
    assert inventory.zookeeper_nodes == ("zk1", "zk2")
    assert inventory.cluster.zookeeper_hosts == "10.0.1.1:2181,zk2:2182"
    assert inventory.cluster.zk_root == "/team"


def test_explicit_zookeeper_hosts_win_over_the_group(tmp_path):
    text = one_node(all_vars=ZK) + "    zookeeper:\n      hosts:\n        zk1:\n"
    inventory = load_inventory(write(tmp_path, text))
    assert inventory.cluster.zookeeper_hosts == "zk.example:2181"


def test_ip_host_name_needs_no_ansible_host(tmp_path):
    path = write(tmp_path, f"""
        all:
          vars:
            {ZK}
          children:
            gpu_nodes:
              hosts:
                10.1.2.3:
        """)
    assert load_inventory(path).node("10.1.2.3").address == "10.1.2.3"


def test_unknown_node_name_suggests_a_close_one(cluster):
    with pytest.raises(InventoryError, match=r"unknown host 'node1'.*Did you mean 'node01'"):
        load_inventory(cluster).node("node1")


# --- bad inventories ------------------------------------------------------------------------


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yml"
    message = load_error(path)
    assert message.startswith(f"inventory {path} not found")
    assert "-i/--inventory" in message


def test_empty_file(tmp_path):
    path = tmp_path / "empty.yml"
    path.write_text("")
    assert load_error(path) == f"{path}: the inventory is empty; see inventory/example.yml"


def test_comments_only_is_empty_too(tmp_path):
    path = write(tmp_path, "# nothing yet\n")
    assert "the inventory is empty" in load_error(path)


def test_non_utf8_bytes(tmp_path):
    path = tmp_path / "latin1.yml"
    path.write_bytes("all:\n  vars:\n    owner: Jos\xe9\n".encode("latin-1"))
    message = load_error(path)
    assert message == f"{path}: byte 27 is not UTF-8 text; save the inventory as UTF-8"


def test_malformed_yaml_gives_line_and_column(tmp_path):
    path = write(tmp_path, """
        all:
          children:
            gpu_nodes:
              hosts:
                node1: {ansible_host: 10.0.0.1
            other:
        """)
    message = load_error(path)
    assert message.startswith(f"{path}: malformed YAML at line 6, column 10: ")
    assert "expected ',' or '}'" in message


def test_tab_indentation_gives_line_and_column(tmp_path):
    path = tmp_path / "tabs.yml"
    path.write_text("all:\n\tchildren:\n")
    assert f"{path}: malformed YAML at line 2, column 1: " in load_error(path)


def test_top_level_list(tmp_path):
    path = write(tmp_path, "- node1\n- node2\n")
    message = load_error(path)
    assert message.startswith(f"{path}: the top level must be a mapping of groups")
    assert message.endswith("not a list")


def test_duplicate_host_key(tmp_path):
    path = write(tmp_path, """
        all:
          children:
            gpu_nodes:
              hosts:
                node1:
                  ansible_host: 10.0.0.1
                node1:
                  ansible_host: 10.0.0.2
        """)
    assert load_error(path) == (
        f"{path}: line 7, column 9: 'node1' appears twice in the same mapping; keep one"
    )


def test_yaml_merge_keys_as_ansible_inventories_use_them(tmp_path):
    """``<<: *defaults`` merges; keys written out override merged ones; the inventory is read
    by both our strict loader and ansible-core's parser."""
    path = write(tmp_path, """
        all:
          vars:
            hypertf_zookeeper_hosts: "zk.example:2181"
          children:
            gpu_nodes:
              vars: &defaults
                hypertf_gpu_source: static
                hypertf_static_gpus: 2
              hosts:
                node1:
                  <<: *defaults
                  ansible_host: 10.0.0.1
                node2:
                  <<: *defaults
                  ansible_host: 10.0.0.2
                  hypertf_static_gpus: 4
        """)
    inventory = load_inventory(path)
    assert inventory.node("node1").settings.static_gpus == 2
    assert inventory.node("node2").settings.static_gpus == 4
    assert inventory.node("node2").address == "10.0.0.2"


def test_a_key_twice_beside_a_merge_key_is_still_refused(tmp_path):
    path = write(tmp_path, """
        x: &d {a: 1}
        all:
          hosts:
            node1:
              <<: *d
              ansible_host: 10.0.0.1
              ansible_host: 10.0.0.2
        """)
    assert "'ansible_host' appears twice in the same mapping" in load_error(path)


def test_unhashable_key_is_an_inventory_error(tmp_path):
    path = write(tmp_path, """
        all:
          children:
            gpu_nodes:
              hosts:
                {[node1, node2]: {}}
        """)
    assert "line 5" in load_error(path)


def test_unreadable_file_is_an_inventory_error(tmp_path, monkeypatch):
    path = write(tmp_path, one_node())

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    assert str(path) in load_error(path)


def test_unknown_group_key_suggests_hosts(tmp_path):
    path = write(tmp_path, """
        all:
          children:
            gpu_nodes:
              hots:
                node1:
        """)
    assert load_error(path) == (
        f"{path}: unknown key 'hots' in group 'gpu_nodes': a group holds only hosts, vars "
        f"and children; did you mean 'hosts'?"
    )


def test_group_part_that_is_not_a_mapping(tmp_path):
    path = write(tmp_path, "all:\n  hosts:\n    - node1\n")
    assert load_error(path) == f"{path}: 'hosts' of group 'all' must be a mapping, not ['node1']"


def test_misspelt_hypertf_setting_suggests_the_right_one(tmp_path):
    path = write(tmp_path, one_node("hypertf_venvv: /opt/venv"))
    assert load_error(path) == (
        f"{path}: host 'node1': unknown setting 'hypertf_venvv'; did you mean 'hypertf_venv'?"
    )


def test_misspelt_ansible_variable_suggests_the_right_one(tmp_path):
    path = write(tmp_path, one_node("ansible_hots: 10.0.0.2"))
    assert load_error(path) == (
        f"{path}: host 'node1': unknown variable 'ansible_hots'; did you mean 'ansible_host'?"
    )


def test_host_without_address(tmp_path):
    path = write(tmp_path, f"""
        all:
          vars:
            {ZK}
          children:
            gpu_nodes:
              hosts:
                node1:
                  ansible_user: trainer
        """)
    message = load_error(path)
    assert message.startswith(f"{path}: host 'node1' has no address: set ansible_host")


@pytest.mark.parametrize("children", [
    "    gpu_nodes:\n",
    "    gpu_nodes:\n      hosts:\n",
    "    workers:\n      hosts:\n        node1:\n          ansible_host: 10.0.0.1\n",
], ids=["empty-group", "empty-hosts", "missing-group"])
def test_gpu_group_without_hosts(tmp_path, children):
    path = write(tmp_path, f"all:\n  vars:\n    {ZK}\n  children:\n{children}")
    message = load_error(path)
    assert message.startswith(f"{path}: group 'gpu_nodes' has no hosts")
    assert "all.children.gpu_nodes.hosts" in message


@pytest.mark.parametrize("line, expected", [
    ('hypertf_gpu_util_max: "high"',
     "hypertf_gpu_util_max must be a percentage between 0 and 100, not 'high'"),
    ("hypertf_gpu_mem_max: 150", "hypertf_gpu_mem_max must be a percentage"),
    ('hypertf_port_range: "9-5"',
     "hypertf_port_range must lie within 1024-65535 with low <= high, not '9-5'"),
    ('hypertf_port_range: "ports"', "hypertf_port_range must look like 20000-20999"),
    ("ansible_port: abc", "ansible_port must be 1-65535, not 'abc'"),
    ("ansible_port: 70000", "ansible_port must be 1-65535, not 70000"),
    ("hypertf_gpu_source: cuda", "hypertf_gpu_source must be one of nvml, static, none"),
    ("hypertf_agent_interval: 0", "hypertf_agent_interval must be a positive number"),
    ("hypertf_static_gpus: 65", "hypertf_static_gpus must be a GPU count (0-64)"),
    ("hypertf_venv: 5", "hypertf_venv must be a non-empty string, not 5"),
])
def test_wrong_types_name_file_host_and_key(tmp_path, line, expected):
    path = write(tmp_path, one_node(line))
    message = load_error(path)
    assert message.startswith(f"{path}: host 'node1': ")
    assert expected in message


@pytest.mark.parametrize("line, expected", [
    ("hypertf_gpu_source: cuda",
     "hypertf_gpu_source must be one of nvml, static, none, not 'cuda'"),
    ("hypertf_gpu_source: [nvml]",
     "hypertf_gpu_source must be one of nvml, static, none, not ['nvml']"),
    ("hypertf_gpu_enforce: kill",
     "hypertf_gpu_enforce must be one of stop, report, off, not 'kill'"),
    ("hypertf_gpu_enforce: false",
     "hypertf_gpu_enforce must be one of stop, report, off, not False"),
])
def test_a_choice_setting_names_its_values(tmp_path, line, expected):
    assert expected in load_error(write(tmp_path, one_node(line)))


def test_choice_settings_are_their_enums_parsed_and_cached(tmp_path):
    path = write(tmp_path, one_node("hypertf_gpu_source: static\nhypertf_gpu_enforce: report"))
    for _ in range(2):  # parsed, then from the inventory cache
        settings = load_inventory(path).node("node1").settings
        assert settings.gpu_source is GpuSourceKind.STATIC and settings.gpu_source == "static"
        assert settings.gpu_enforce is GpuEnforce.REPORT
    default = load_inventory(write(tmp_path, one_node(), "other.yml")).node("node1").settings
    assert (default.gpu_source, default.gpu_enforce) == (GpuSourceKind.NVML, GpuEnforce.STOP)
    assert type(default.gpu_source) is GpuSourceKind


def test_quoted_ansible_port_is_read_like_ansible_does(tmp_path):
    path = write(tmp_path, one_node('ansible_port: "2222"'))
    assert load_inventory(path).node("node1").port == 2222


@pytest.mark.parametrize("port", ["99999", "2181.5"])
def test_zookeeper_port_must_be_a_port_number(tmp_path, port):
    path = write(tmp_path, f"""
        all:
          children:
            gpu_nodes:
              hosts:
                node1:
                  ansible_host: 10.0.0.1
            zookeeper:
              hosts:
                zk1:
                  hypertf_zookeeper_port: {port}
        """)
    assert "hypertf_zookeeper_port" in load_error(path)


def test_no_zookeeper_at_all(tmp_path):
    path = write(tmp_path, one_node(all_vars="hypertf_zk_root: /x"))
    assert load_error(path) == (
        f"{path}: no ZooKeeper: add a 'zookeeper' group or set hypertf_zookeeper_hosts "
        f"under all.vars"
    )


def test_hosts_disagreeing_on_a_cluster_setting(tmp_path):
    path = write(tmp_path, f"""
        all:
          vars:
            {ZK}
          children:
            gpu_nodes:
              hosts:
                node1:
                  ansible_host: 10.0.0.1
                  hypertf_zk_root: /a
                node2:
                  ansible_host: 10.0.0.2
                  hypertf_zk_root: /b
        """)
    assert load_error(path) == (
        f"{path}: hosts 'node1' and 'node2' disagree on hypertf_zk_root ('/a' vs '/b'); "
        f"set it once under all.vars"
    )


# --- the CLI turns every one of these into one line and exit code 2 --------------------------

CLI_CASES = {
    "missing": None,
    "empty": "",
    "malformed": "all:\n  children: [\n",
    "top-list": "- node1\n",
    "duplicate": "all:\n  hosts:\n    a:\n    a:\n",
    "hots": "all:\n  children:\n    gpu_nodes:\n      hots:\n        a:\n",
    "venvv": one_node("hypertf_venvv: /x"),
    "no-address": f"all:\n  vars:\n    {ZK}\n  children:\n    gpu_nodes:\n      hosts:\n"
                  "        node1:\n",
    "port-range": one_node('hypertf_port_range: "9-5"'),
    "no-zookeeper": one_node(all_vars="hypertf_zk_root: /x"),
}


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """Run every case at once (each start imports ansible-core, about a second)."""
    directory = tmp_path_factory.mktemp("cli")
    env = {**os.environ, "ANSIBLE_LOCAL_TEMP": str(directory / "ansible-tmp"),
           "ANSIBLE_HOME": str(directory / "ansible-home")}
    procs = {}
    for name, text in CLI_CASES.items():
        path = directory / f"{name}.yml"
        if text is not None:
            path.write_text(textwrap.dedent(text))
        procs[name] = (path, subprocess.Popen(
            [str(HYPERTF), "status", "-i", str(path)], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env, cwd=directory,
        ))
    results = {}
    for name, (path, proc) in procs.items():
        out, err = proc.communicate(timeout=60)
        results[name] = (path, proc.returncode, out, err)
    return results


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_reports_a_bad_inventory_in_one_line(cli_results, case):
    path, code, out, err = cli_results[case]
    assert code == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hypertf: error: ")
    assert str(path) in lines[0]
    assert "Traceback" not in out + err


def test_an_alias_bomb_in_group_vars_beside_the_file_is_refused(tmp_path):
    """Ansible reads group_vars/ beside a file inventory: it is checked before, too."""
    from hypertf.config.inventory import load_inventory
    from hypertf.core.errors import InventoryError

    (tmp_path / "group_vars").mkdir()
    levels = ["a: &a [" + ", ".join(["lol"] * 9) + "]"]
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        levels.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    (tmp_path / "group_vars" / "all.yml").write_text("\n".join(levels) + "\n")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  vars: {hypertf_zookeeper_hosts: '127.0.0.1:1'}\n  children:\n"
                         "    gpu_nodes:\n      hosts: {a: {ansible_host: 10.0.0.1}}\n")
    with pytest.raises(InventoryError, match="alias bomb"):
        load_inventory(inventory)


def test_task_env_merges_and_checks_names(tmp_path):
    path = write(tmp_path, one_node(extra="hypertf_task_env: {NCCL_SOCKET_IFNAME: eth1, X: 1}"))
    assert load_inventory(path).node("node1").settings.task_env == (
        ("NCCL_SOCKET_IFNAME", "eth1"), ("X", "1"))
    for bad, message in (("{1X: a}", "is not an environment variable name"),
                         ("{TF_CONFIG: a}", "is set by HyperTF"),
                         ("[A, B]", "must be a mapping")):
        path = write(tmp_path, one_node(extra=f"hypertf_task_env: {bad}"))
        with pytest.raises(InventoryError, match=message):
            load_inventory(path)


def zk_root_in_a_new_process(path: Path) -> str:
    """Ansible caches group_vars files within a process: a new one reads them afresh, as
    every HyperTF command does."""
    done = subprocess.run([sys.executable, "-c", "import sys; from hypertf.config.inventory import "
                           "load_inventory; print(load_inventory(sys.argv[1]).cluster.zk_root)",
                           str(path)], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_an_unchanged_inventory_comes_from_the_cache_and_any_change_is_read(tmp_path):
    """The parse is cached by the files' content: a rewrite of the same size within the same
    clock tick, and a change in group_vars, are both seen; the entry is a private file."""
    from hypertf.config.inventorycache import cache_dir

    path = write(tmp_path, one_node(all_vars=f'{ZK}\n    hypertf_zk_root: "/aaaa"'))
    assert load_inventory(path).cluster.zk_root == "/aaaa"
    entries = list(cache_dir().glob("*.pickle"))
    assert entries and all((e.stat().st_mode & 0o777) == 0o600 for e in entries)
    assert load_inventory(path).cluster.zk_root == "/aaaa"  # from the cache
    path.write_text(path.read_text().replace("/aaaa", "/bbbb"))  # same size, same tick
    assert load_inventory(path).cluster.zk_root == "/bbbb"

    path.write_text(path.read_text().replace('    hypertf_zk_root: "/bbbb"\n', ""))
    write(tmp_path, "hypertf_zk_root: /from-group-vars\n", name="group_vars/gpu_nodes.yml")
    assert zk_root_in_a_new_process(path) == "/from-group-vars"
    (tmp_path / "group_vars" / "gpu_nodes.yml").write_text("hypertf_zk_root: /changed-again\n")
    assert zk_root_in_a_new_process(path) == "/changed-again"
    for entry in cache_dir().glob("*.pickle"):
        entry.write_bytes(b"not a pickle")
    assert zk_root_in_a_new_process(path) == "/changed-again"  # damaged: parsed again


def test_every_setting_is_declared_once_and_fills_exactly_one_field():
    """SETTINGS is the one table: its node and cluster settings are exactly the fields of
    NodeSettings and ClusterSettings, and an inventory that sets every one of them reaches
    every field with its value."""
    import dataclasses

    from hypertf.config.settings import (
        CLUSTER_KEYS,
        NODE_KEYS,
        SETTINGS,
        ClusterSettings,
        NodeSettings,
        field_of,
    )

    assert {field_of(k) for k in NODE_KEYS} == {f.name for f in dataclasses.fields(NodeSettings)}
    assert {field_of(k) for k in CLUSTER_KEYS} == {
        f.name for f in dataclasses.fields(ClusterSettings)}
    assert all(s.scope in ("node", "cluster", "") for s in SETTINGS.values())


def test_ansible_own_variables_are_not_checked_as_each_hosts(tmp_path):
    """Ansible's magic variables are the same for every host, and 'groups' names every host:
    checked per host, 10,000 hosts took 70 s to parse. A host's own ones stay."""
    path = tmp_path / "cluster.yml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": "zk.example:2181"},
        "children": {"gpu_nodes": {"hosts": {
            f"node{i}": {"ansible_host": f"10.0.0.{i}"} for i in range(1, 4)}}}}}))
    variables, groups = _ansible_hosts(path)["node2"]
    assert groups == ("gpu_nodes",)
    assert variables["ansible_host"] == "10.0.0.2" and variables["inventory_hostname"] == "node2"
    assert not {"groups", "playbook_dir", "ansible_playbook_python"} & set(variables)
    assert len(load_inventory(path).nodes) == 3
