"""The cluster's verbs of ``hypertf``, typed as in hypertf.cli.commands: status, the
dashboard, a node's agent (agent, agent-ctl), the agents of many nodes, the local ZooKeeper,
cluster setup/teardown/local-packages, and what the inventory says (agent-settings,
keeper-hosts)."""

from __future__ import annotations

import json
import logging
import sys

from hypertf.config.inventory import load_inventory


def status(inventory: str, as_json: bool = False, direct: bool = False) -> int:
    from hypertf import store
    from hypertf.cli import statustable
    from hypertf.store import status as cluster_status

    inv = load_inventory(inventory)
    client = store.connect(inv.cluster)
    try:
        compact = not as_json and len(inv.nodes) > statustable.COMPACT_FROM_HOSTS
        # a large cluster's compact view from the keeper's view, when it is whole
        report = cluster_status.collect_view(client, inv) if compact and not direct else None
        if report is None:
            report = cluster_status.collect(client, inv, gpu_details=not compact)
    finally:
        store.close(client)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        statustable.render(report)
    return 0


def dashboard(inventory: str, port: int = 8470, bind: str | None = None) -> int:
    """Serve the read-only dashboard until interrupted, reading with the user's credential;
    127.0.0.1 unless ``bind`` names another address (then requests need its token)."""
    from hypertf import store
    from hypertf.dashboard import ClusterSource, serve

    inv = load_inventory(inventory)
    with store.opened(inv.cluster, long_lived=True,
                      on_pause=lambda msg: print(f"hypertf: {msg}", file=sys.stderr)) as zk:
        serve(ClusterSource(inv, zk), port=port, bind=bind)
    return 0


def agent(inventory: str, host: str, once: bool = False) -> int:
    from hypertf.node import agent as resource_agent

    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hypertf.kazoo").setLevel(logging.WARNING)
    inv = load_inventory(inventory)
    inv.node(host)
    if once:
        record = resource_agent.NodeAgent(inv, host).run(once=True)
        print(record.to_json().decode() if record else "")
        return 0
    resource_agent.serve(inv, host)
    return 0


def agent_ctl(inventory: str, host: str, action: str) -> int:
    from hypertf.node import service as agentctl

    workdir = load_inventory(inventory).node(host).settings.workdir
    if action == "start":
        pid, started = agentctl.local_start(inventory, host, workdir)
        print(f"agent {host} {'started' if started else 'already running'} (pid {pid})")
    elif action == "stop":
        stopped = agentctl.local_stop(workdir)
        print(f"agent {host} {'stopped' if stopped else 'was not running'}")
    else:
        running = agentctl.running_pid(workdir)
        print(f"agent {host} {f'running (pid {running})' if running else 'not running'}")
        return 0 if running else 1
    return 0


def agents(inventory: str, action: str, host: str | None = None) -> int:
    from hypertf.ops import agentctl

    act = agentctl.start_agents if action == "start" else agentctl.stop_agents
    for name, result in act(load_inventory(inventory), [host] if host else None).items():
        print(f"{name}: {result.stdout.strip()}")
    return 0


def zk(inventory: str, action: str) -> int:
    from hypertf import store
    from hypertf.config.paths import state_home
    from hypertf.ops.zkserver import local_server

    inv = load_inventory(inventory)
    server = local_server(inv.cluster.zookeeper_hosts, state_home())
    if action == "start":
        pid = server.start()
        directory = store.secure_cluster(inv.cluster, list(inv.nodes), own_server=True)
        print(f"ZooKeeper {server.mode()} on {server.hosts} (pid {pid}, data {server.directory}); "
              f"root {inv.cluster.zk_root} secured, credentials in {directory}")
    elif action == "stop":
        print(f"ZooKeeper on {server.hosts} {'stopped' if server.stop() else 'was not running'}")
    else:
        mode = server.mode()
        print(f"ZooKeeper on {server.hosts}: {mode or 'not serving'}")
        return 0 if mode else 1
    return 0


def cluster_setup(inventory: str, ask_pass: bool = False, check: bool = False) -> int:
    from hypertf.cli import statustable
    from hypertf.ops import provision

    provision.setup(inventory, ask_pass=ask_pass, check=check, show=statustable.render)
    return 0


def cluster_teardown(inventory: str, zookeeper: bool = False, purge: bool = False) -> int:
    from hypertf.ops import provision

    provision.teardown(inventory, zookeeper=zookeeper, purge=purge)
    return 0


def local_packages(inventory: str) -> int:
    """The inventory's hypertf_python_packages in this virtualenv (as python_env does on
    nodes): ./dev.sh up uses it for the embedded default."""
    from hypertf.ops.provision import install_local_packages

    return install_local_packages(inventory)


def agent_settings() -> int:
    """The hypertf_* settings a node's agent reads, as JSON: the hypertf_agent role copies
    exactly these from the inventory into the node's agent inventory (one source)."""
    from hypertf.config.settings import AGENT_SETTINGS

    print(json.dumps(list(AGENT_SETTINGS)))
    return 0


def keeper_hosts(inventory: str) -> int:
    """The hosts whose agent may keep the matrix, as JSON: the hypertf_agent role copies
    keeper.yml to these alone (docs/zookeeper-layout.md, "Trust")."""
    print(json.dumps(list(load_inventory(inventory).keeper_hosts)))
    return 0
