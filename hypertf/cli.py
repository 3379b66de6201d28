"""The ``hypertf`` command. Invoke's tasks.py calls the same functions.

A HyperTFError becomes one message on stderr and its exit code; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from hypertf.errors import HyperTFError, UsageError
from hypertf.inventory import DEFAULT_INVENTORY, load_inventory


def cmd_status(args: argparse.Namespace) -> int:
    from hypertf import status, store

    inventory = load_inventory(args.inventory)
    client = store.connect(inventory.cluster)
    try:
        report = status.collect(client, inventory)
    finally:
        store.close(client)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        status.render(report)
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    from hypertf import store
    from hypertf.allocation import list_jobs

    inventory = load_inventory(args.inventory)
    client = store.connect(inventory.cluster)
    try:
        jobs = list_jobs(client, store.Layout(inventory.cluster.zk_root))[: args.last]
    finally:
        store.close(client)
    if args.json:
        print(json.dumps(jobs, indent=2))
        return 0
    for job in jobs:
        owner = job.get("owner", {})
        tasks = ", ".join(f"{p['role']}:{p['index']}@{p['host']}"
                          for p in job.get("placements", []))
        state = "running" if job["alive"] else job.get("state", "?")
        ended = ""
        if state == "killed" and job.get("killed_by"):
            by = job["killed_by"]
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.get("killed", 0)))
            who = by.get("identity") or by.get("user", "?")
            ended = f"  (killed by {who} from {by.get('host', '?')} at {when})"
        attempt = (f"  attempt {job['attempt']} of {job['job_id']}"
                   if job.get("attempt", 1) > 1 else "")
        print(f"{job['task_key']}  {state:<11} {owner.get('user', '?')}@{owner.get('host', '?')}"
              f"  {job.get('script', '')}  {tasks}{ended}{attempt}")
    if not jobs:
        print("no jobs")
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    from hypertf import store
    from hypertf.allocation import kill

    inventory = load_inventory(args.inventory)
    client = store.connect(inventory.cluster)
    try:
        killed = kill(client, store.Layout(inventory.cluster.zk_root), args.task_key)
    finally:
        store.close(client)
    print(f"job {args.task_key}: " + ("lease dropped; its GPUs drain until the agents have "
                                      "stopped its tasks" if killed else "was not running"))
    return 0


def cmd_agent(args: argparse.Namespace) -> int:
    from hypertf import agent

    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hypertf.kazoo").setLevel(logging.WARNING)
    inventory = load_inventory(args.inventory)
    inventory.node(args.host)
    if args.once:
        record = agent.Agent(inventory, args.host).run(once=True)
        print(record.to_json().decode() if record else "")
        return 0
    agent.serve(inventory, args.host)
    return 0


def cmd_agent_ctl(args: argparse.Namespace) -> int:
    from hypertf import agentctl

    inventory = load_inventory(args.inventory)
    workdir = inventory.node(args.host).settings.workdir
    if args.action == "start":
        pid, started = agentctl.local_start(args.inventory, args.host, workdir)
        print(f"agent {args.host} {'started' if started else 'already running'} (pid {pid})")
    elif args.action == "stop":
        stopped = agentctl.local_stop(workdir)
        print(f"agent {args.host} {'stopped' if stopped else 'was not running'}")
    else:
        pid = agentctl.running_pid(workdir)
        print(f"agent {args.host} {f'running (pid {pid})' if pid else 'not running'}")
        return 0 if pid else 1
    return 0


def cmd_agents(args: argparse.Namespace) -> int:
    from hypertf import agentctl

    inventory = load_inventory(args.inventory)
    names = [args.host] if args.host else None
    act = agentctl.start_agents if args.action == "start" else agentctl.stop_agents
    for name, result in act(inventory, names).items():
        print(f"{name}: {result.stdout.strip()}")
    return 0


def _local_zk(args: argparse.Namespace):  # -> ZooKeeperServer
    from hypertf.paths import state_home
    from hypertf.zkserver import local_server

    inventory = load_inventory(args.inventory)
    return local_server(inventory.cluster.zookeeper_hosts, state_home())


def cmd_zk(args: argparse.Namespace) -> int:
    server = _local_zk(args)
    if args.action == "start":
        from hypertf import auth

        pid = server.start()
        inventory = load_inventory(args.inventory)
        directory = auth.initialize(inventory.cluster, list(inventory.nodes))
        print(f"ZooKeeper {server.mode()} on {server.hosts} (pid {pid}, data {server.directory}); "
              f"root {inventory.cluster.zk_root} secured, credentials in {directory}")
    elif args.action == "stop":
        print(f"ZooKeeper on {server.hosts} {'stopped' if server.stop() else 'was not running'}")
    else:
        mode = server.mode()
        print(f"ZooKeeper on {server.hosts}: {mode or 'not serving'}")
        return 0 if mode else 1
    return 0


def cmd_auth(args: argparse.Namespace) -> int:
    from hypertf import auth

    inventory = load_inventory(args.inventory)
    if args.action == "add-user" and not args.user:
        raise UsageError("hypertf auth add-user NAME: name the user")
    users = [auth.check_name("user", args.user)] if args.action == "add-user" else []
    directory = auth.initialize(inventory.cluster, list(inventory.nodes), users,
                                reset=args.reset)
    if args.action == "add-user":
        path = directory / f"user.{args.user}.yml"
        print(f"{path}: give this file to {args.user} (mode 0600, in their "
              f"hypertf_zk_credentials directory, by default "
              f"~/.hypertf/credentials/{directory.name}/)")
    else:
        print(f"ZooKeeper root {inventory.cluster.zk_root} secured; credentials in {directory}")
    if args.print_dir:
        print(directory)
    return 0


def cmd_lab(args: argparse.Namespace) -> int:
    from hypertf import lab

    if args.action == "up":
        built = lab.up(hosts=args.hosts, gpus=args.gpus, agents=not args.no_agents,
                       zookeeper_members=args.zookeeper_members)
        for host in built.hosts:
            print(f"{host.name} {host.address} (namespace {host.namespace})")
        print(f"ZooKeeper {built.zookeeper_hosts}" if built.zookeeper else "no ZooKeeper")
        print(built.inventory)
    elif args.action == "down":
        labs = lab.find(args.name)
        for each in labs:
            lab.down(each)
            print(f"lab {each.lab_id} removed")
        if not labs:
            print("no lab to remove")
    else:
        for each in lab.find(None):
            print(f"{each.lab_id} {len(each.hosts)} hosts {each.inventory}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from hypertf.launcher import TrainRequest, train

    inventory = load_inventory(args.inventory)
    request = TrainRequest(
        script=args.script, workers=args.worker, ps=args.ps, chief=args.chief,
        policy=args.policy, gpus_per_worker=args.gpus_per_worker, gpus_per_ps=args.gpus_per_ps,
        sync_dir=args.sync, start_timeout=args.start_timeout, timeout=args.timeout,
        legacy_flags=args.legacy_flags, env=tuple(args.env), grace=args.grace,
        idle_timeout=args.idle_timeout or None, idle_fail=args.idle_fail,
        max_restarts=args.max_restarts, restart_on_failure=args.restart_on_failure,
        checkpoint_dir=args.checkpoint_dir, args=tuple(args.hyperparameters),
    )
    train(inventory, request, say=lambda line: print(line, flush=True))
    return 0


def add_train_options(p: argparse.ArgumentParser) -> None:
    """The options of ``train``; everything else is passed to the script unchanged."""
    _inventory_option(p)
    p.add_argument("--script", required=True, help="training script (path on the nodes, "
                   "or inside --sync DIR)")
    p.add_argument("--worker", type=int, default=1, help="number of workers (default 1)")
    p.add_argument("--ps", type=int, default=0, help="parameter servers (0: mirrored job)")
    p.add_argument("--chief", action="store_true", help="add a chief (TF2 ParameterServer)")
    p.add_argument("--policy", default="round_robin", help="round_robin or pack")
    p.add_argument("--gpus-per-worker", type=int, default=1, help="GPUs per worker/chief")
    p.add_argument("--gpus-per-ps", type=int, default=0, help="GPUs per ps (default none)")
    p.add_argument("--sync", help="upload this directory into the job's run dir first")
    p.add_argument("--start-timeout", type=float, default=120.0,
                   help="seconds for every task to listen on its port (default 120)")
    p.add_argument("--timeout", type=float, help="seconds for the whole job (default none)")
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL when stopping tasks")
    p.add_argument("--idle-timeout", type=float, default=300.0,
                   help="warn when every task listens and none has written a line for this "
                        "many seconds (default 300; 0: never)")
    p.add_argument("--idle-fail", action="store_true",
                   help="end the job (failed) at the idle timeout instead of warning")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="after a retryable failure (a host lost, a task killed by a signal, "
                        "the start-up deadline) stop the whole job and start it again, up to "
                        "N times (default 0); tasks see HYPERTF_ATTEMPT")
    p.add_argument("--restart-on-failure", action="store_true",
                   help="with --max-restarts: also restart after a task's own non-zero exit")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="HYPERTF_CHECKPOINT_DIR for every task: an absolute path, the same "
                        "for every attempt (default <workdir>/checkpoints/<job> on each node; "
                        "multi-worker jobs want shared storage)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable for every task (repeatable; over the "
                        "inventory's hypertf_task_env)")
    legacy = p.add_mutually_exclusive_group()
    legacy.add_argument("--legacy-flags", dest="legacy_flags", action="store_const", const="on",
                        default="auto", help="always pass --ps_hosts/--worker_hosts/--job_name/"
                        "--task_index (default: only if the script reads them)")
    legacy.add_argument("--no-legacy-flags", dest="legacy_flags", action="store_const",
                        const="off", help="never pass the legacy flags")


def parse_train(argv: Sequence[str]) -> argparse.Namespace:
    """``--`` or any unknown option starts the hyperparameters, kept verbatim."""
    argv = list(argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="hypertf train", allow_abbrev=False)
    add_train_options(parser)
    args, unknown = parser.parse_known_args(argv)
    args.hyperparameters = unknown + extra
    args.func = cmd_train
    args.command = "train"
    return args


def _inventory_option(parser: argparse.ArgumentParser) -> None:
    default = os.environ.get("HYPERTF_INVENTORY", DEFAULT_INVENTORY)
    parser.add_argument("-i", "--inventory", default=default,
                        help=f"inventory YAML (default $HYPERTF_INVENTORY or {DEFAULT_INVENTORY})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hypertf", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("status", help="hosts x GPUs, agents and ZooKeeper health")
    _inventory_option(p)
    p.add_argument("--json", action="store_true", help="one JSON object for scripts")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("jobs", help="recent jobs, newest first")
    _inventory_option(p)
    p.add_argument("--last", type=int, default=20, help="how many (default 20)")
    p.add_argument("--json", action="store_true", help="the job records as JSON")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("kill", help="stop a running job from anywhere (by task key)")
    _inventory_option(p)
    p.add_argument("task_key")
    p.set_defaults(func=cmd_kill)

    p = sub.add_parser("agent", help="run this node's resource agent in the foreground")
    _inventory_option(p)
    p.add_argument("--host", required=True, help="this node's name in the inventory")
    p.add_argument("--once", action="store_true", help="publish one record, print it, exit")
    p.set_defaults(func=cmd_agent)

    p = sub.add_parser("agent-ctl", help="start/stop this node's agent in the background")
    p.add_argument("action", choices=("start", "stop", "status"))
    _inventory_option(p)
    p.add_argument("--host", required=True, help="this node's name in the inventory")
    p.set_defaults(func=cmd_agent_ctl)

    p = sub.add_parser("agents", help="start/stop the agents of many nodes (over SSH)")
    p.add_argument("action", choices=("start", "stop"))
    _inventory_option(p)
    p.add_argument("--host", help="only this node (default: every GPU node)")
    p.set_defaults(func=cmd_agents)

    p = sub.add_parser("zk", help="the local standalone ZooKeeper the inventory names")
    p.add_argument("action", choices=("start", "stop", "status"))
    _inventory_option(p)
    p.set_defaults(func=cmd_zk)

    p = sub.add_parser("auth", help="credentials and the secured ZooKeeper root (the admin)")
    p.add_argument("action", choices=("init", "add-user"))
    p.add_argument("user", nargs="?", help="the user to register (add-user)")
    _inventory_option(p)
    p.add_argument("--reset", action="store_true",
                   help="delete a root made without credentials, then secure it (init)")
    p.add_argument("--print-dir", action="store_true",
                   help="end with the credentials directory alone on a line (for Ansible)")
    p.set_defaults(func=cmd_auth)

    sub.add_parser("train", help="run a distributed TensorFlow job (see hypertf train -h)",
                   add_help=False)

    p = sub.add_parser("lab", help="a multi-host test cluster of network namespaces")
    p.add_argument("action", choices=("up", "down", "list"))
    p.add_argument("--hosts", type=int, default=3, help="number of hosts (up)")
    p.add_argument("--gpus", type=int, default=4, help="static GPUs per host (up)")
    p.add_argument("--no-agents", action="store_true", help="bare hosts, no agents (up)")
    p.add_argument("--zookeeper-members", type=int, default=1,
                   help="1: standalone ZooKeeper; 3 or 5: a quorum ensemble (up)")
    p.add_argument("--name", help="lab id to remove (down; default all)")
    p.set_defaults(func=cmd_lab)
    return parser


def run(func: Callable[[], int]) -> int:
    """Turn HyperTFError into a message and its exit code."""
    try:
        return func()
    except HyperTFError as err:
        print(f"hypertf: error: {err}", file=sys.stderr)
        return err.exit_code
    except (KazooException, KazooTimeoutError) as err:  # an outage, not a bug
        print(f"hypertf: error: ZooKeeper failed ({type(err).__name__}: {err or 'no detail'}); "
              f"check 'hypertf status' and the ZooKeeper servers", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("hypertf: interrupted", file=sys.stderr)
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_train(argv[1:]) if argv[:1] == ["train"] else build_parser().parse_args(argv)
    if args.command != "agent":
        # kazoo's connection warnings are noise for a one-shot command: our error says it.
        kazoo_log = logging.getLogger("hypertf.kazoo")
        kazoo_log.addHandler(logging.NullHandler())
        kazoo_log.propagate = False
    return run(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
