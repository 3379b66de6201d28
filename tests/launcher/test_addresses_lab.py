"""Addresses come from the admin (docs/zookeeper-layout.md, "Trust"): a stolen node
credential (``agent.h3``) that names another host's address as its own data address
redirects nobody's TensorFlow traffic; TF_CONFIG names the inventory's address of h3."""

from __future__ import annotations

import json
from pathlib import Path

from hypertf import store
from hypertf.config.inventory import load_inventory
from hypertf.core.layout import Layout
from tests.launcher.helpers import FAKE, hypertf


def test_an_agents_own_data_address_cannot_redirect_other_hosts_traffic(lab, tmp_path: Path):
    inventory = load_inventory(lab.inventory)
    h2, h3 = inventory.node("h2").address, inventory.node("h3").address
    thief = store.connect(inventory.cluster, identity="agent.h3")
    path = Layout(inventory.cluster.zk_root).resource("h3")
    honest, _ = thief.get(path)
    forged = {**json.loads(honest), "data_addr": h2}  # h2's task would get h3's traffic
    thief.set(path, json.dumps(forged).encode())
    try:
        run = hypertf("train", "-i", lab.inventory, "--script", FAKE, "--worker", "3",
                      cwd=tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
        said = run.stdout + run.stderr
        assert f"h3's agent reports the data address {h2}, not taken" in said, said
        clusters = {line[line.index("tf_cluster=") + len("tf_cluster="):]
                    for line in run.stdout.splitlines() if "tf_cluster=" in line}
        assert len(clusters) == 1, clusters  # every task was told the same cluster
        workers = json.loads(clusters.pop())["worker"]
        hosts = [address.rpartition(":")[0] for address in workers]
        assert sorted(hosts) == sorted({inventory.node(h).address for h in ("h1", "h2", "h3")})
        assert hosts.count(h2) == 1 and h3 in hosts
    finally:
        thief.set(path, honest)  # the agent's own record back
        store.close(thief)
