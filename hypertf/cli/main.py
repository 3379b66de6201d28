"""hypertf: distributed TensorFlow on a static GPU cluster, every verb in one tree.

The verbs' code is in hypertf.cli.commands (the job's verbs), clusterverbs, authverbs and
labverbs, with typed arguments (Invoke's tasks.py calls them).

A HyperTFError becomes one message on stderr and its exit code; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from hypertf.cli import authverbs, clusterverbs, commands, labverbs, trainargs
from hypertf.cli.options import VERB_OPTIONS, add_arguments
from hypertf.cli.trainargs import (
    add_train_options,
    default_inventory,
    inventory_option,
    script_args_note,
    train_request,
)
from hypertf.config import environment
from hypertf.core import gctune
from hypertf.launch.exits import SIGPIPE_EXIT as SIGPIPE_EXIT  # re-exported for Invoke's tasks
from hypertf.launch.exits import quiet_kazoo, reader_gone, run


def parse_train(argv: Sequence[str]) -> argparse.Namespace:
    """trainargs.parse_train, bound to the train verb."""
    args = trainargs.parse_train(argv)
    args.func = cmd_train
    return args


def cmd_train(args: argparse.Namespace) -> int:
    return commands.train(args.inventory, train_request(args), detach=args.detach)


def cmd_export(args: argparse.Namespace) -> int:
    from hypertf import export

    return export.command(args.inventory, train_request(args), export.export_options(vars(args)),
                          args.output)


def parse_export(argv: Sequence[str]) -> argparse.Namespace:
    """``export`` takes every train option (parse_train's rules for the script's arguments)
    and its own (export.EXPORT_OPTIONS)."""
    from hypertf.export import EXPORT_OPTIONS
    from hypertf.export.names import target_names
    from hypertf.export.targets import TRAIN_ONLY

    argv = list(argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="hypertf export", allow_abbrev=False,
                                     description=f"write a train command as {target_names()} "
                                                 "files (docs/kubernetes.md)")
    add_train_options(parser)
    train_only = {option.name for option in TRAIN_ONLY}  # parsed to be refused, not listed
    for action in parser._actions:
        if action.dest in train_only:
            action.help = argparse.SUPPRESS
    for option in EXPORT_OPTIONS:
        names = [option.flag, "-o"] if option.name == "output" else [option.flag]
        parser.add_argument(*names, type=option.kind, default=option.default,
                            required=option.required, metavar=option.metavar, help=option.help)
    args, unknown = parser.parse_known_args(argv)
    note = script_args_note(unknown)
    if note:
        print(note, file=sys.stderr)
    args.hyperparameters = unknown + extra
    args.func = cmd_export
    args.command = "export"
    return args




def _verb(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
          func: Callable[..., int], help: str, inventory: bool = True,
          words: str | None = None) -> argparse.ArgumentParser:
    """A verb's parser: ``-i/--inventory`` and its options in VERB_OPTIONS (by ``words``,
    default ``name`` for a top-level verb), shared with Invoke's tasks, if it has any there."""
    p = sub.add_parser(name, help=help)
    if inventory:
        inventory_option(p)
    add_arguments(p, VERB_OPTIONS.get(words or name, ()))
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hypertf", description=__doc__.splitlines()[0],
        epilog="hypertf warm {status,stop}: this user's warm launchers, which "
               f"{environment.WARM_S.name}=<idle seconds> turns on for 'hypertf train' "
               "(README, 'A warm launcher')")
    sub = parser.add_subparsers(dest="command", required=True)

    _verb(sub, "status", clusterverbs.status, "hosts x GPUs, agents and ZooKeeper health")
    _verb(sub, "jobs", commands.jobs, "recent jobs, newest first")
    _verb(sub, "kill", commands.kill, "stop a running job from anywhere (by task key)")
    _verb(sub, "cancel", commands.cancel,
          "end a waiting or running job (owner or admin), by task key")
    _verb(sub, "queue", commands.queue,
          "waiting jobs in admission order: position, priority, shape, waiting, reason")
    _verb(sub, "usage", commands.usage,
          "GPU-hours per user, day or GPU model from the keeper's ledger (--json, --csv)")
    _verb(sub, "dashboard", clusterverbs.dashboard,
          "a read-only web page of the matrix, queue, jobs, logs and sweeps")
    _verb(sub, "hold", commands.hold, "keep a waiting job in the queue, not admitted")
    _verb(sub, "unhold", commands.unhold, "let a held job be admitted again")
    _verb(sub, "logs", commands.logs, "a job's task logs, read on the nodes over SSH")

    p = _verb(sub, "agent", clusterverbs.agent, "run this node's resource agent in the foreground")
    p.add_argument("--host", required=True, help="this node's name in the inventory")
    p.add_argument("--once", action="store_true", help="publish one record, print it, exit")

    p = _verb(sub, "agent-ctl", clusterverbs.agent_ctl,
              "start/stop this node's agent in the background")
    p.add_argument("action", choices=("start", "stop", "status"))
    p.add_argument("--host", required=True, help="this node's name in the inventory")

    p = _verb(sub, "agents", clusterverbs.agents, "start/stop the agents of many nodes (over SSH)")
    p.add_argument("action", choices=("start", "stop"))

    p = _verb(sub, "zk", clusterverbs.zk, "the local standalone ZooKeeper the inventory names")
    p.add_argument("action", choices=("start", "stop", "status"))

    auth = sub.add_parser("auth", help="credentials and the secured ZooKeeper root (the admin)")
    verbs = auth.add_subparsers(dest="action", required=True)
    _verb(verbs, "init", authverbs.auth, "make the cluster's credentials and secure its root",
          words="auth init")
    _verb(verbs, "add-user", authverbs.auth,
          "register a user and write the credential file to hand them", words="auth add-user")
    _verb(verbs, "accounts", authverbs.auth,
          "each user's node account (name, uid, SSH key) as the admin registered it",
          words="auth accounts")
    _verb(verbs, "limits", authverbs.auth,
          "a user's maximum priority, GPU limit, fair share, monthly budget and "
          "preemption exemption, which the keeper enforces",
          words="auth limits")
    _verb(verbs, "footprint", authverbs.auth,
          "what each user's folders make ZooKeeper hold (znodes, bytes, junk names); "
          "--delete-junk USER deletes that user's junk", words="auth footprint")

    sub.add_parser("train", help="run a distributed TensorFlow job (see hypertf train -h)",
                   add_help=False)
    from hypertf.export.names import RECOMMENDED, target_names

    sub.add_parser("export", add_help=False,
                   help=f"a train command as {target_names()} files (hypertf export --to "
                        f"{RECOMMENDED} --image IMAGE --script S ...)")
    sub.add_parser("sweep", add_help=False,
                   help="trials of one script over a grid or random search, through the queue "
                        "(hypertf sweep --script S --grid lr=0.1,0.01; sweep status|resume|"
                        "cancel|list; see hypertf sweep -h)")

    cluster = sub.add_parser("cluster", help="provision or tear down the inventory's nodes")
    verbs = cluster.add_subparsers(dest="action", required=True)
    _verb(verbs, "setup", clusterverbs.cluster_setup,
          "provision every node with deploy.yml (keys, venv, ZooKeeper, agents)",
          words="cluster setup")
    _verb(verbs, "teardown", clusterverbs.cluster_teardown,
          "stop the agents and remove what setup installed", words="cluster teardown")
    _verb(verbs, "local-packages", clusterverbs.local_packages,
          "install the inventory's hypertf_python_packages into this virtualenv")

    inventory = sub.add_parser("inventory", help="what HyperTF reads from an inventory")
    verbs = inventory.add_subparsers(dest="action", required=True)
    _verb(verbs, "agent-settings", clusterverbs.agent_settings,
          "the hypertf_* settings a node's agent reads (JSON; the agent role's list)",
          inventory=False)
    _verb(verbs, "keeper-hosts", clusterverbs.keeper_hosts,
          "the hosts that get the keeper's credential (JSON; hypertf_keeper_hosts)")

    lab = sub.add_parser("lab", help="a multi-host test cluster of network namespaces")
    verbs = lab.add_subparsers(dest="action", required=True)
    _verb(verbs, "up", labverbs.lab_up, "create a lab", inventory=False, words="lab up")
    _verb(verbs, "down", labverbs.lab_down, "remove labs", inventory=False, words="lab down")
    _verb(verbs, "list", labverbs.lab_list, "the labs that are up", inventory=False,
          words="lab list")
    p = _verb(verbs, "inventory", labverbs.lab_inventory,
              "an inventory that provisions a lab's bare hosts; prints its path",
              inventory=False)
    p.add_argument("inventory", help="the lab's inventory.yml (printed by hypertf lab up)")
    p.add_argument("--zookeeper", default="h1",
                   help="lab hosts that run ZooKeeper, comma-separated ('' for the lab's own)")
    p.add_argument("--tensorflow", default="tensorflow-cpu", help="TensorFlow package, '' none")
    p.add_argument("--operator-dir", help="make a fresh operator key and known_hosts here")
    p.add_argument("--name", default="provision.yml", help="file name in the lab directory")
    return parser










def verb_parser(root: argparse.ArgumentParser, words: str,
                ) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser of ``hypertf WORDS`` in hypertf's tree (``root``: build_parser()) and the
    words left after its verb (the action of ``zk start``): tasks.py builds its tasks by it."""
    parser, left = root, words.split()
    while left:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or left[0] not in subs[0].choices:
            break
        parser = subs[0].choices[left.pop(0)]
    return parser, left


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its output flushed here so that a closed pipe is caught here."""
    gctune.tune()
    try:
        try:
            code = _dispatch(list(sys.argv[1:] if argv is None else argv))
        finally:  # also after argparse's --help, which exits
            sys.stdout.flush()
    except BrokenPipeError:
        return reader_gone()
    if argv is None and sys.argv[1:2] == ["train"]:
        leave(code)
    return code


def leave(code: int) -> NoReturn:
    """End this process now, with ``code``: what ``hypertf train`` started is stopped and
    released and its output written by then, and tearing the interpreter down (kazoo,
    paramiko, cryptography, Ansible's modules...) took another 0.05-0.07 s of every job.
    Only for a command line (``main()`` without ``argv``: tests and callers that pass one
    keep their process)."""
    flush_output()
    os._exit(code)


def flush_output() -> None:
    """Everything the command wrote, out: logging's handlers and stdout/stderr (before an
    ``os._exit``, which skips the interpreter's own flushing)."""
    logging.shutdown()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["sweep"]:
        from hypertf.cli import sweep as sweepcli

        quiet_kazoo()
        return run(lambda: sweepcli.run(argv[1:], default_inventory()))
    parse = {"train": parse_train, "export": parse_export}.get(argv[0] if argv else "")
    args = parse(argv[1:]) if parse else build_parser().parse_args(argv)
    if args.command != "agent":
        quiet_kazoo()
    if args.command in ("train", "export"):
        return run(lambda: args.func(args))
    func, kwargs = verb_call(args)
    return run(lambda: func(**kwargs))


def verb_call(args: argparse.Namespace) -> tuple[Callable[..., int], dict[str, Any]]:
    """The function (hypertf.cli.commands and the other verb modules) a parsed verb runs,
    and its keyword arguments."""
    kwargs = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    if args.command in ("cluster", "lab", "inventory"):
        kwargs.pop("action")  # the sub-verb, already chosen as func
    return args.func, kwargs

