"""hypertf: distributed TensorFlow on a static GPU cluster, every verb in one tree.

The verbs' code is in hypertf.commands, with typed arguments (Invoke's tasks.py calls it).

A HyperTFError becomes one message on stderr and its exit code; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from hypertf import commands
from hypertf.errors import HyperTFError
from hypertf.request import TrainRequest
from hypertf.settings import DEFAULT_INVENTORY

R = TrainRequest  # every default of a training job lives on the request, once


def default_inventory() -> str:
    """``$HYPERTF_INVENTORY``, else the embedded default (inventory/local.yml)."""
    return os.environ.get("HYPERTF_INVENTORY", DEFAULT_INVENTORY)


def train_request(args: argparse.Namespace) -> TrainRequest:
    return TrainRequest(
        script=args.script, workers=args.worker, ps=args.ps, chief=args.chief,
        policy=args.policy, gpus_per_worker=args.gpus_per_worker, gpus_per_ps=args.gpus_per_ps,
        sync_dir=args.sync, start_timeout=args.start_timeout, timeout=args.timeout,
        legacy_flags=args.legacy_flags, env=tuple(args.env), grace=args.grace,
        idle_timeout=args.idle_timeout or None, idle_fail=args.idle_fail,
        max_restarts=args.max_restarts, restart_on_failure=args.restart_on_failure,
        checkpoint_dir=args.checkpoint_dir, priority=args.priority, wait=args.wait,
        args=tuple(args.hyperparameters),
    )


def cmd_train(args: argparse.Namespace) -> int:
    return commands.train(args.inventory, train_request(args), detach=args.detach,
                          job_key=args.job_key)


def add_train_options(p: argparse.ArgumentParser) -> None:
    """The options of ``train``; everything else is passed to the script unchanged."""
    _inventory_option(p)
    p.add_argument("--script", required=True, help="training script (path on the nodes, "
                   "or inside --sync DIR)")
    p.add_argument("--worker", type=int, default=R.workers, help="number of workers (default 1)")
    p.add_argument("--ps", type=int, default=R.ps, help="parameter servers (0: mirrored job)")
    p.add_argument("--chief", action="store_true", help="add a chief (TF2 ParameterServer)")
    p.add_argument("--policy", default=R.policy, help="round_robin or pack")
    p.add_argument("--gpus-per-worker", type=int, default=R.gpus_per_worker,
                   help="GPUs per worker/chief")
    p.add_argument("--gpus-per-ps", type=int, default=R.gpus_per_ps,
                   help="GPUs per ps (default none)")
    p.add_argument("--sync", help="upload this directory into the job's run dir first")
    p.add_argument("--start-timeout", type=float, default=R.start_timeout,
                   help="seconds for every task to listen on its port (default 120)")
    p.add_argument("--timeout", type=float, default=R.timeout,
                   help="seconds for the whole job (default none)")
    p.add_argument("--grace", type=float, default=R.grace,
                   help="seconds between SIGTERM and SIGKILL when stopping tasks")
    p.add_argument("--idle-timeout", type=float, default=R.idle_timeout,
                   help="warn when every task listens and none has written a line for this "
                        "many seconds (default 300; 0: never)")
    p.add_argument("--idle-fail", action="store_true",
                   help="end the job (failed) at the idle timeout instead of warning")
    p.add_argument("--max-restarts", type=int, default=R.max_restarts, metavar="N",
                   help="after a retryable failure (a host lost, a task killed by a signal, "
                        "the start-up deadline) stop the whole job and start it again, up to "
                        "N times (default 0); tasks see HYPERTF_ATTEMPT")
    p.add_argument("--restart-on-failure", action="store_true",
                   help="with --max-restarts: also restart after a task's own non-zero exit")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="HYPERTF_CHECKPOINT_DIR for every task: an absolute path, the same "
                        "for every attempt (default <workdir>/checkpoints/<job> on each node; "
                        "multi-worker jobs want shared storage)")
    p.add_argument("--priority", type=int, default=R.priority, metavar="N",
                   help="place in the queue: higher first, first come first served within "
                        "a priority (default 0)")
    p.add_argument("--no-wait", dest="wait", action="store_false",
                   help="fail at once (exit 4) when the GPUs are busy instead of waiting in "
                        "the queue")
    p.add_argument("--detach", action="store_true",
                   help="print the job's key and return: a background launcher waits, runs "
                        "and cleans up (its output: runs/<key>/launcher.log); follow with "
                        "'hypertf logs KEY -f', end with 'hypertf cancel KEY'")
    p.add_argument("--job-key", help=argparse.SUPPRESS)  # the detached launcher's key
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable for every task (repeatable; over the "
                        "inventory's hypertf_task_env)")
    legacy = p.add_mutually_exclusive_group()
    legacy.add_argument("--legacy-flags", dest="legacy_flags", action="store_const", const="on",
                        default=R.legacy_flags,
                        help="always pass --ps_hosts/--worker_hosts/--job_name/--task_index "
                             "(default: only if the script reads them)")
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
    parser.add_argument("-i", "--inventory", default=default_inventory(),
                        help=f"inventory YAML (default $HYPERTF_INVENTORY or {DEFAULT_INVENTORY})")


def _verb(sub: argparse._SubParsersAction, name: str, func: Callable[..., int], help: str,
          inventory: bool = True) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help)
    if inventory:
        _inventory_option(p)
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hypertf", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = _verb(sub, "status", commands.status, "hosts x GPUs, agents and ZooKeeper health")
    p.add_argument("--json", dest="as_json", action="store_true", help="one JSON object")

    p = _verb(sub, "jobs", commands.jobs, "recent jobs, newest first")
    p.add_argument("--last", type=int, default=20, help="how many (default 20)")
    p.add_argument("--json", dest="as_json", action="store_true", help="the records as JSON")

    p = _verb(sub, "kill", commands.kill, "stop a running job from anywhere (by task key)")
    p.add_argument("task_key")

    p = _verb(sub, "cancel", commands.kill,
              "end a waiting or running job (owner or admin), by task key")
    p.add_argument("task_key")

    p = _verb(sub, "queue", commands.queue,
              "waiting jobs in admission order: position, priority, shape, waiting, reason")
    p.add_argument("--json", dest="as_json", action="store_true", help="the rows as JSON")

    p = _verb(sub, "hold", commands.hold, "keep a waiting job in the queue, not admitted")
    p.add_argument("task_key")
    p = _verb(sub, "unhold", commands.unhold, "let a held job be admitted again")
    p.add_argument("task_key")

    p = _verb(sub, "logs", commands.logs, "a job's task logs, read on the nodes over SSH")
    p.add_argument("task_key")
    p.add_argument("-f", "--follow", action="store_true",
                   help="follow until the tasks end (a waiting job: once it starts)")
    p.add_argument("--task", help="only this task, e.g. worker:1")

    p = _verb(sub, "agent", commands.agent, "run this node's resource agent in the foreground")
    p.add_argument("--host", required=True, help="this node's name in the inventory")
    p.add_argument("--once", action="store_true", help="publish one record, print it, exit")

    p = _verb(sub, "agent-ctl", commands.agent_ctl,
              "start/stop this node's agent in the background")
    p.add_argument("action", choices=("start", "stop", "status"))
    p.add_argument("--host", required=True, help="this node's name in the inventory")

    p = _verb(sub, "agents", commands.agents, "start/stop the agents of many nodes (over SSH)")
    p.add_argument("action", choices=("start", "stop"))
    p.add_argument("--host", help="only this node (default: every GPU node)")

    p = _verb(sub, "zk", commands.zk, "the local standalone ZooKeeper the inventory names")
    p.add_argument("action", choices=("start", "stop", "status"))

    p = _verb(sub, "auth", commands.auth,
              "credentials and the secured ZooKeeper root (the admin)")
    p.add_argument("action", choices=("init", "add-user"))
    p.add_argument("user", nargs="?", help="the user to register (add-user)")
    p.add_argument("--reset", action="store_true",
                   help="delete a root made without credentials, then secure it (init)")
    p.add_argument("--print-dir", action="store_true",
                   help="end with the credentials directory alone on a line (for Ansible)")

    sub.add_parser("train", help="run a distributed TensorFlow job (see hypertf train -h)",
                   add_help=False)
    sub.add_parser("sweep", add_help=False,
                   help="trials of one script over a grid or random search, through the queue "
                        "(hypertf sweep --script S --grid lr=0.1,0.01; sweep status|resume|"
                        "cancel|list)")

    cluster = sub.add_parser("cluster", help="provision or tear down the inventory's nodes")
    verbs = cluster.add_subparsers(dest="action", required=True)
    p = _verb(verbs, "setup", commands.cluster_setup,
              "provision every node with deploy.yml (keys, venv, ZooKeeper, agents)")
    p.add_argument("--ask-pass", action="store_true",
                   help="ask for the SSH password (first contact; needs sshpass)")
    p.add_argument("--check", action="store_true", help="dry run: change nothing")
    p = _verb(verbs, "teardown", commands.cluster_teardown,
              "stop the agents and remove what setup installed")
    p.add_argument("--zookeeper", action="store_true", help="also stop and remove ZooKeeper")
    p.add_argument("--purge", action="store_true",
                   help="also remove virtualenvs, work directories and ZooKeeper data")
    _verb(verbs, "local-packages", commands.local_packages,
          "install the inventory's hypertf_python_packages into this virtualenv")

    inventory = sub.add_parser("inventory", help="what HyperTF reads from an inventory")
    verbs = inventory.add_subparsers(dest="action", required=True)
    _verb(verbs, "agent-settings", commands.agent_settings,
          "the hypertf_* settings a node's agent reads (JSON; the agent role's list)",
          inventory=False)

    lab = sub.add_parser("lab", help="a multi-host test cluster of network namespaces")
    verbs = lab.add_subparsers(dest="action", required=True)
    p = _verb(verbs, "up", commands.lab_up, "create a lab", inventory=False)
    p.add_argument("--hosts", type=int, default=3, help="number of hosts")
    p.add_argument("--gpus", type=int, default=4, help="static GPUs per host")
    p.add_argument("--no-agents", dest="agents", action="store_false", help="bare hosts")
    p.add_argument("--zookeeper-members", type=int, default=1,
                   help="1: standalone ZooKeeper; 3 or 5: a quorum ensemble")
    p = _verb(verbs, "down", commands.lab_down, "remove labs", inventory=False)
    p.add_argument("--name", help="lab id to remove (default all)")
    _verb(verbs, "list", commands.lab_list, "the labs that are up", inventory=False)
    p = _verb(verbs, "inventory", commands.lab_inventory,
              "an inventory that provisions a lab's bare hosts; prints its path",
              inventory=False)
    p.add_argument("inventory", help="the lab's inventory.yml (printed by hypertf lab up)")
    p.add_argument("--zookeeper", default="h1",
                   help="lab hosts that run ZooKeeper, comma-separated ('' for the lab's own)")
    p.add_argument("--tensorflow", default="tensorflow-cpu", help="TensorFlow package, '' none")
    p.add_argument("--operator-dir", help="make a fresh operator key and known_hosts here")
    p.add_argument("--name", default="provision.yml", help="file name in the lab directory")
    return parser


def quiet_kazoo() -> None:
    """kazoo's connection warnings are noise for a one-shot command: our error says it."""
    kazoo_log = logging.getLogger("hypertf.kazoo")
    kazoo_log.addHandler(logging.NullHandler())
    kazoo_log.propagate = False


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
    if argv[:1] == ["sweep"]:
        from hypertf import sweepcli

        quiet_kazoo()
        return run(lambda: sweepcli.run(argv[1:], default_inventory()))
    args = parse_train(argv[1:]) if argv[:1] == ["train"] else build_parser().parse_args(argv)
    if args.command != "agent":
        quiet_kazoo()
    if args.command == "train":
        return run(lambda: args.func(args))
    kwargs = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    if args.command in ("cluster", "lab", "inventory"):
        kwargs.pop("action")  # the sub-verb, already chosen as func
    return run(lambda: args.func(**kwargs))


if __name__ == "__main__":
    sys.exit(main())
