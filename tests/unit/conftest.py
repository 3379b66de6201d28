"""Fixtures the unit tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from hypertf.config.inventory import Inventory, load_inventory


@pytest.fixture
def inventory(tmp_path: Path) -> Inventory:
    """A one-host inventory (h1) that names a ZooKeeper no test reaches; a test file
    with an inventory of its own overrides it."""
    path = tmp_path / "cluster.yml"
    path.write_text("all:\n  vars:\n    hypertf_zookeeper_hosts: 'zk.example:2181'\n"
                    "  children:\n    gpu_nodes:\n      hosts:\n"
                    "        h1: {ansible_host: 10.0.0.1}\n")
    return load_inventory(path)
