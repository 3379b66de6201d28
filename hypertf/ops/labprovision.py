"""An inventory that provisions a lab's bare hosts with the real roles (cluster setup,
molecule): the lab's own inventory plus the provisioning variables, offline wheels, and the
ZooKeeper paths and JVM options that fit hosts sharing one small machine."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hypertf.core.errors import HyperTFError
from hypertf.ops.provision import WHEEL_DIR

LAB_ZOOKEEPER = {
    "zookeeper_conf_dir": "/srv/zookeeper/conf",
    "zookeeper_data_dir": "/srv/zookeeper/data",
    "zookeeper_log_dir": "/srv/zookeeper/log",
    "zookeeper_run_dir": "/srv/zookeeper/run",
    "zookeeper_heap": "128m",
    "zookeeper_tick_time": 500,
    # Hosts share /tmp (hsperfdata) and two cores: no perf data file, a small quick JVM.
    "zookeeper_jvm_opts": ["-XX:-UsePerfData", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"],
}


def lab_inventory(lab_dir: str | os.PathLike[str], *, name: str = "provision.yml",
                  zookeeper: Sequence[str] = ("h1",), venv: str | None = "/srv/hypertf/venv",
                  tensorflow: str = "tensorflow-cpu", extra_packages: Sequence[str] | None = None,
                  operator_dir: str | os.PathLike[str] | None = None,
                  wheel_dir: str | os.PathLike[str] = WHEEL_DIR,
                  hypertf_source: str | os.PathLike[str] | None = None,
                  host_vars: Mapping[str, Mapping[str, Any]] | None = None,
                  extra_vars: Mapping[str, Any] | None = None) -> Path:
    """Write an inventory that provisions the lab in ``lab_dir`` from bare hosts.

    ``zookeeper``: the lab hosts that run ZooKeeper (the lab's own ZooKeeper on the bridge is
    used when empty). ``venv``: the virtualenv on each host, None for the lab's shared one
    (then python_env must not run). ``tensorflow``: the package, "" for none.
    ``operator_dir``: a fresh operator key and known_hosts there (made and pinned by the
    ssh_access role) instead of the lab's own. ``hypertf_source``: the HyperTF tree to build
    the wheel from (default: this checkout).
    """
    lab_dir = Path(lab_dir)
    source = yaml.safe_load((lab_dir / "inventory.yml").read_text())
    variables: dict[str, Any] = dict(source["all"]["vars"])
    known_hosts = variables["hypertf_known_hosts"]
    if operator_dir is not None:
        operator = Path(operator_dir)
        operator.mkdir(mode=0o700, parents=True, exist_ok=True)
        known_hosts = str(operator / "known_hosts")
        variables["ansible_ssh_private_key_file"] = str(operator / "id_ed25519")
        variables["hypertf_known_hosts"] = known_hosts
    variables["ansible_ssh_common_args"] = (f"-o UserKnownHostsFile={known_hosts} "
                                            f"-o StrictHostKeyChecking=yes")
    if venv is not None:
        variables["hypertf_venv"] = venv
    packages = list(extra_packages if extra_packages is not None
                    else (["scikit-learn"] if tensorflow else []))
    variables.update(
        # The lab's sshd reads one authorized_keys file for every host (hypertf.ops.lab).
        ssh_access_authorized_keys_file=str(lab_dir / "authorized_keys"),
        python_env_wheel_dir=str(wheel_dir),
        python_env_offline=True,
        python_env_wheel_dir_shared=True,
        python_env_compile_bytecode=False,
        python_env_build_isolation=False,  # the dev extra's setuptools: no index reached
        python_env_tensorflow_package=tensorflow,
        python_env_extra_packages=packages,
        **LAB_ZOOKEEPER,
    )
    children: dict[str, Any] = {"gpu_nodes": source["all"]["children"]["gpu_nodes"]}
    addresses = {host: (values or {}).get("ansible_host")
                 for host, values in children["gpu_nodes"]["hosts"].items()}
    if zookeeper:
        unknown = [h for h in zookeeper if h not in addresses]
        if unknown:
            raise HyperTFError(f"no lab host {', '.join(unknown)} (hosts: {', '.join(addresses)})")
        variables.pop("hypertf_zookeeper_hosts", None)
        children["zookeeper"] = {"hosts": {h: {"ansible_host": addresses[h]} for h in zookeeper}}
    for host, values in (host_vars or {}).items():
        children["gpu_nodes"]["hosts"].setdefault(host, {}).update(values)
    if hypertf_source is not None:
        variables["python_env_hypertf_source"] = str(hypertf_source)
    variables.update(extra_vars or {})
    path = lab_dir / name
    header = ("# Provisioning inventory for the lab's bare hosts "
              "(hypertf.ops.labprovision.lab_inventory); removed with the lab.\n")
    path.write_text(header + yaml.safe_dump({"all": {"vars": variables, "children": children}},
                                            sort_keys=False))
    return path
